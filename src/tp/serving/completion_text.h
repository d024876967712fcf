#pragma once
// The text of one completion as its tokens arrive: streamed decoding (special
// tokens skipped, as vLLM's default) followed by the stop-string cut. Tokens
// after the one that completed a stop string are not part of the completion.
#include <optional>
#include <string>
#include <vector>

#include "tp/serving/stop_strings.h"
#include "tp/tokenizer/streaming_decoder.h"

namespace tp::serving {

class CompletionText {
 public:
  // No tokenizer: each token's text is its id and a space.
  CompletionText(const Tokenizer* tokenizer, const std::vector<int64_t>& prompt, std::vector<std::string> stops);
  // The text that became final with `tokens`.
  std::string push(const std::vector<int64_t>& tokens);
  // The generation ended: what was still held back.
  std::string finish();
  bool stopped() const { return stop_.stopped(); }
  const std::vector<int64_t>& tokens() const { return tokens_; }

 private:
  std::optional<StreamingDecoder> decoder_;
  StopMatcher stop_;
  std::vector<int64_t> tokens_;
};

}  // namespace tp::serving
