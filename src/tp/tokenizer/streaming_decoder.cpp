#include "tp/tokenizer/streaming_decoder.h"

#include "tp/tokenizer/utf8.h"

namespace tp {

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

void StreamingDecoder::prime(const std::vector<int64_t>& context) {
  ids_ = context;
  prefix_ = tokenizer_.decode(ids_, skip_special_, /*clean_up_tokenization_spaces=*/false);
  prefix_index_ = ids_.size();
}

std::string StreamingDecoder::push(int64_t id) {
  ids_.push_back(id);
  const std::string text = tokenizer_.decode(ids_, skip_special_, /*clean_up_tokenization_spaces=*/false);
  const bool incomplete = text.size() >= utf8::kReplacement.size() &&
                          text.compare(text.size() - utf8::kReplacement.size(), std::string::npos,
                                       utf8::kReplacement) == 0;
  if (text.size() <= prefix_.size() || incomplete) return {};
  // The window's earlier text normally stays a prefix; if a decoder rewrote it
  // (e.g. clean-up spaces across the boundary), emit from where they differ.
  size_t common = 0;
  while (common < prefix_.size() && text[common] == prefix_[common]) ++common;
  std::string out = text.substr(common);
  // Slide the window: keep the ids from the previous emission on, as context.
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_.decode(ids_, skip_special_, /*clean_up_tokenization_spaces=*/false);
  prefix_index_ = new_prefix_index;
  return out;
}

std::string StreamingDecoder::flush() {
  const std::string text = tokenizer_.decode(ids_, skip_special_, /*clean_up_tokenization_spaces=*/false);
  std::string out = text.size() > prefix_.size() ? text.substr(prefix_.size()) : std::string();
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return out;
}

}  // namespace tp
