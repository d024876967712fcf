#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocab,
// ranked merges, byte_fallback, ignore_merges, unk/fuse_unk and the
// continuing_subword_prefix / end_of_word_suffix decorations.
//
// A word of n symbols is merged in O(n log n): symbols form a linked list and
// candidate pairs sit in a min-heap keyed by (rank, position), so the lowest
// rank merges first and equal ranks merge left to right, as in Hugging Face
// tokenizers. Words up to kMaxCachedBytes are cached.
#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tp {

// Hash and equality that let string maps be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class Bpe {
 public:
  static constexpr size_t kMaxCachedBytes = 256;
  static constexpr size_t kMaxCacheEntries = 200'000;

  explicit Bpe(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int64_t>& ids) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  // nullptr when the model has no such id.
  const std::string* id_to_token(int64_t id) const;
  int64_t max_id() const { return static_cast<int64_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int64_t>& ids) const;
  void encode_uncached_hot(std::string_view word, std::vector<int64_t>& ids) const;

  // Hot-word cache in front of the maps: direct-mapped, one 64-byte slot per
  // entry (1 MiB, fits L2), so a frequent word costs one cache line instead of
  // the two or three misses of a node-based hash map over a 128K vocab.
  struct HotSlot {
    uint64_t hash = 0;
    uint8_t len = 0, n = 0;  // n == 0: empty
    char key[30];
    int32_t ids[6];
  };
  static constexpr size_t kHotSlots = 1 << 14;
  mutable std::vector<HotSlot> hot_;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" and absent for holes in the id range
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  std::array<int32_t, 256> byte_fallback_ids_{};

  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace tp
