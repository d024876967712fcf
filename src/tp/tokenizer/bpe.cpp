#include "tp/tokenizer/bpe.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <queue>

#include "tp/core/error.h"
#include "tp/tokenizer/utf8.h"

namespace tp {

using nlohmann::json;

Bpe::Bpe(const json& model) : hot_(kHotSlots) {
  if (model.contains("dropout") && !model.at("dropout").is_null()) {
    const double p = model.at("dropout").get<double>();
    TP_CHECK(p == 0.0, "BPE dropout {} is not supported (it makes encoding random); supported: null or 0", p);
  }
  const json& vocab = model.at("vocab");
  TP_CHECK(vocab.is_object(), "BPE vocab must be an object {{token: id}}, got a {}", vocab.type_name());
  int64_t max_id = -1;
  for (const auto& [token, id_json] : vocab.items()) {
    const int64_t id = id_json.get<int64_t>();
    TP_CHECK(id >= 0 && id < (int64_t{1} << 31), "BPE vocab id {} of token '{}' is out of range [0, 2^31)", id, token);
    max_id = std::max(max_id, id);
  }
  TP_CHECK(max_id < 16 * 1024 * 1024, "BPE vocab id {} is implausibly large (more than 16M tokens)", max_id);
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    TP_CHECK(utf8::is_valid(token), "BPE vocab token with id {} is not valid UTF-8", id);
    vocab_.emplace(token, id);
    id_to_token_[id] = token;
    has_id_[id] = true;
  }

  if (model.contains("continuing_subword_prefix") && model.at("continuing_subword_prefix").is_string())
    continuing_subword_prefix_ = model.at("continuing_subword_prefix").get<std::string>();
  if (model.contains("end_of_word_suffix") && model.at("end_of_word_suffix").is_string())
    end_of_word_suffix_ = model.at("end_of_word_suffix").get<std::string>();
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    const auto unk = model.at("unk_token").get<std::string>();
    const auto it = vocab_.find(unk);
    TP_CHECK(it != vocab_.end(), "BPE unk_token '{}' is not in the vocab", unk);
    unk_id_ = it->second;
  }
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      const std::string name = fmt::format("<0x{:02X}>", b);
      const auto it = vocab_.find(name);
      TP_CHECK(it != vocab_.end(), "BPE byte_fallback is set but the vocab has no token '{}'", name);
      byte_fallback_ids_[b] = it->second;
    }
  }

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...].
  const json& merges = model.at("merges");
  TP_CHECK(merges.is_array(), "BPE merges must be an array, got a {}", merges.type_name());
  merges_.reserve(merges.size());
  const size_t prefix_len = continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string a, b;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const size_t space = s.find(' ');
      TP_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
               "BPE merge {} \"{}\" must be two tokens separated by one space", rank, s);
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else {
      TP_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
               "BPE merge {} must be \"a b\" or [\"a\", \"b\"], got {}", rank, m.dump());
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    TP_CHECK(ia != vocab_.end(), "BPE merge {} (\"{}\" \"{}\") names token \"{}\", which is not in the vocab", rank, a,
             b, a);
    TP_CHECK(ib != vocab_.end(), "BPE merge {} (\"{}\" \"{}\") names token \"{}\", which is not in the vocab", rank, a,
             b, b);
    const std::string merged =
        a + (prefix_len && b.compare(0, prefix_len, continuing_subword_prefix_) == 0 ? b.substr(prefix_len) : b);
    const auto im = vocab_.find(merged);
    TP_CHECK(im != vocab_.end(), "BPE merge {} (\"{}\" \"{}\") makes \"{}\", which is not in the vocab", rank, a, b,
             merged);
    // A repeated pair takes its last rank, as Hugging Face's map collect does.
    merges_.insert_or_assign(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), im->second});
  }
}

std::optional<int64_t> Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(id_to_token_.size()) || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void Bpe::encode_word(std::string_view word, std::vector<int64_t>& ids) const {
  if (word.empty()) return;
  if (word.size() > sizeof(HotSlot::key)) {
    encode_uncached_hot(word, ids);
    return;
  }
  const uint64_t h = std::hash<std::string_view>{}(word);
  HotSlot& slot = hot_[h & (kHotSlots - 1)];
  {
    std::lock_guard lock(cache_mutex_);
    if (slot.n && slot.hash == h && slot.len == word.size() && std::memcmp(slot.key, word.data(), word.size()) == 0) {
      ids.insert(ids.end(), slot.ids, slot.ids + slot.n);
      return;
    }
  }
  const size_t mark = ids.size();
  encode_uncached_hot(word, ids);
  const size_t n = ids.size() - mark;
  if (n == 0 || n > std::size(slot.ids)) return;
  std::lock_guard lock(cache_mutex_);
  slot.hash = h;
  slot.len = static_cast<uint8_t>(word.size());
  slot.n = static_cast<uint8_t>(n);
  std::memcpy(slot.key, word.data(), word.size());
  for (size_t i = 0; i < n; ++i) slot.ids[i] = static_cast<int32_t>(ids[mark + i]);
}

void Bpe::encode_uncached_hot(std::string_view word, std::vector<int64_t>& ids) const {
  if (ignore_merges_) {
    const auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (word.size() > kMaxCachedBytes) {
    merge_word(word, ids);
    return;
  }
  {
    std::lock_guard lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t mark = ids.size();
  merge_word(word, ids);
  std::lock_guard lock(cache_mutex_);
  // Like Hugging Face, a full cache stops taking new words instead of evicting.
  if (cache_.size() < kMaxCacheEntries) cache_.emplace(std::string(word), std::vector<int32_t>(ids.begin() + mark, ids.end()));
}

void Bpe::merge_word(std::string_view word, std::vector<int64_t>& ids) const {
  // Symbols of the word: one per character (or byte-fallback byte), linked.
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if (n > 0) sym[n - 1].next = n;
  };
  bool last_was_unk = false;
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    utf8::next(word, i);
    piece.clear();
    if (start > 0) piece += continuing_subword_prefix_;
    piece.append(word.substr(start, i - start));
    if (i == word.size()) piece += end_of_word_suffix_;
    const auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      push(it->second);
      last_was_unk = false;
    } else if (byte_fallback_) {
      for (size_t k = start; k < i; ++k) push(byte_fallback_ids_[static_cast<unsigned char>(word[k])]);
      last_was_unk = false;
    } else if (unk_id_) {
      if (!(fuse_unk_ && last_was_unk)) push(*unk_id_);
      last_was_unk = true;
    }
    // Without unk or byte fallback an unknown character is dropped, as in
    // Hugging Face tokenizers.
  }

  struct Candidate {
    int32_t rank, pos, new_id;
    int32_t right_id;  // the right symbol's id when queued, to detect stale entries
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> storage;
  storage.reserve(sym.size() * 2);  // one growth step at most for long words
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap(std::greater<>{}, std::move(storage));
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end()) heap.push({it->second.rank, left, it->second.new_id, sym[right].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // Stale: either side changed since the pair was queued.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (right.id != c.right_id || it == merges_.end() || it->second.rank != c.rank) continue;
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

}  // namespace tp
