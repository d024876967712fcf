#include "tp/tokenizer/byte_level.h"

#include "tp/tokenizer/utf8.h"

namespace tp::byte_level {

namespace {

struct Tables {
  std::array<std::string, 256> to_chars;
  std::array<int, 0x144> to_byte{};  // code point -> byte, -1 when none
  Tables() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(0x100 + extra++);
      utf8::append(to_chars[b], cp);
      to_byte[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_to_chars() { return tables().to_chars; }

std::optional<unsigned char> char_to_byte(char32_t cp) {
  if (cp >= tables().to_byte.size() || tables().to_byte[cp] < 0) return std::nullopt;
  return static_cast<unsigned char>(tables().to_byte[cp]);
}

void encode_into(std::string_view s, std::string& out) {
  const auto& t = tables().to_chars;
  out.clear();
  out.reserve(s.size() * 2);
  for (const char c : s) out += t[static_cast<unsigned char>(c)];
}

std::string encode(std::string_view s) {
  std::string out;
  encode_into(s, out);
  return out;
}

void decode_token(std::string_view token, std::string& bytes) {
  const size_t mark = bytes.size();
  for (size_t i = 0; i < token.size();) {
    const auto b = char_to_byte(utf8::next(token, i));
    if (!b) {
      bytes.resize(mark);
      bytes.append(token);
      return;
    }
    bytes.push_back(static_cast<char>(*b));
  }
}

}  // namespace tp::byte_level
