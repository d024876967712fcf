#include "tp/serving/completion_text.h"

#include <fmt/format.h>

namespace tp::serving {

CompletionText::CompletionText(const Tokenizer* tokenizer, const std::vector<int64_t>& prompt,
                               std::vector<std::string> stops)
    : stop_(std::move(stops)) {
  if (tokenizer != nullptr) {
    decoder_.emplace(*tokenizer, /*skip_special_tokens=*/true);
    // The completion decodes after its prompt, so its first word keeps its leading space.
    decoder_->prime(prompt);
  }
}

std::string CompletionText::push(const std::vector<int64_t>& tokens) {
  std::string out;
  for (int64_t t : tokens) {
    if (stop_.stopped()) break;
    tokens_.push_back(t);
    out += stop_.push(decoder_ ? decoder_->push(t) : fmt::format("{} ", t));
  }
  return out;
}

std::string CompletionText::finish() {
  if (stop_.stopped()) return {};
  std::string out = decoder_ ? stop_.push(decoder_->flush()) : std::string();
  return out + stop_.flush();
}

}  // namespace tp::serving
