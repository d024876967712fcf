// libFuzzer target for the tokenizer loader and encoder. Self-contained: built
// from tests/tokenizer/CMakeLists.txt with clang, the tokenizer sources
// compiled in with coverage (see there).
//
// Input: the first byte picks a mode.
//   even: the rest is a tokenizer.json text; loading must either succeed or
//         throw tp::Error. A loaded tokenizer then encodes and decodes a fixed
//         text (exercising whatever components the input declared).
//   odd:  the rest is text for the tiny committed tokenizer (TP_FUZZ_TINY):
//         encode (any bytes, invalid UTF-8 included) then decode must round
//         trip to the UTF-8-repaired, NFC-normalized input, and streaming must agree.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tp/core/error.h"
#include "tp/tokenizer/streaming_decoder.h"
#include "tp/tokenizer/tokenizer.h"
#include "tp/tokenizer/utf8.h"

namespace {

const tp::Tokenizer& tiny() {
  static const tp::Tokenizer t = tp::Tokenizer::from_file(TP_FUZZ_TINY);
  return t;
}

void exercise(const tp::Tokenizer& t, std::string_view text) {
  const auto ids = t.encode(text);
  const std::string decoded = t.decode(ids, false, false);
  tp::StreamingDecoder stream(t);
  std::string streamed;
  for (const int64_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  if (streamed != decoded) std::abort();
  if (!tp::utf8::is_valid(decoded)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    try {
      const auto t = tp::Tokenizer::from_json_text(rest);
      exercise(t, "Hello world! 123 <|bos|> caf\xC3\xA9 \xF0\x9F\x98\x80 \xFF");
    } catch (const tp::Error&) {
      // Rejected with a message: the expected outcome for malformed files.
    }
    return 0;
  }
  exercise(tiny(), rest);
  // Round trip: the tiny tokenizer has no unknown characters (byte level).
  const std::string expected = tiny().decode(tiny().encode(tp::utf8::to_valid(rest), false), false, false);
  if (tiny().decode(tiny().encode(rest, false), false, false) != expected) std::abort();
  return 0;
}
