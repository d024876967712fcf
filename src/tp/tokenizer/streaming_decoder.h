#pragma once
// Streaming decode: ids arrive one at a time (generation); push() returns the
// text that became final. Text ending in U+FFFD (an incomplete UTF-8 sequence
// so far) is held back until the next id completes it.
//
// Like Hugging Face's DecodeStream, it decodes a short window of ids (those
// since the last emitted text, plus the ones before them for context, so that
// decoders that look at neighbours, e.g. Metaspace's leading space, agree with
// a full decode) and emits the window's new suffix: O(1) amortized per id.
// Streams never apply clean_up_tokenization_spaces: it can rewrite text that
// was already emitted (" 's" across a boundary). The concatenated output
// equals decode(ids, skip_special_tokens, /*clean_up=*/false).
#include <cstdint>
#include <string>
#include <vector>

#include "tp/tokenizer/tokenizer.h"

namespace tp {

class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // Ids whose text is already out (a prompt): the next pushes are decoded after
  // them, so e.g. Llama 2's first generated word keeps its leading space.
  void prime(const std::vector<int64_t>& context);
  std::string push(int64_t id);
  // Whatever is still held back (an incomplete sequence decodes to U+FFFD).
  std::string flush();

 private:
  Tokenizer tokenizer_;  // a handle: shares the loaded state
  bool skip_special_;
  std::vector<int64_t> ids_;  // the window
  std::string prefix_;        // decode of the window as of the last emission
  size_t prefix_index_ = 0;   // ids before this are dropped at the next emission
};

}  // namespace tp
