#pragma once
// Added tokens ("added_tokens" in tokenizer.json): strings matched in the input
// before normalization and BPE (leftmost, then longest), with the lstrip /
// rstrip / single_word options. Tokens with normalized=false match the raw
// input; tokens with normalized=true match the normalized text.
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tp {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// One piece of split input: either an added token (id >= 0) or text.
struct Segment {
  std::string text;
  int64_t added_id = -1;
};

// Leftmost-longest matcher over a set of added tokens (a byte trie).
class AddedTokenMatcher {
 public:
  void build(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return nodes_.size() <= 1; }
  // Splits `text` into text and token segments, appending to `out`.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    const AddedToken* token = nullptr;
  };
  int32_t child(int32_t node, unsigned char b) const;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace tp
