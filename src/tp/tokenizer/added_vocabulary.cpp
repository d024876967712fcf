#include "tp/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <cctype>

#include "tp/tokenizer/utf8.h"

namespace tp {

namespace {

// Rust's char::is_whitespace (Unicode White_Space), used by lstrip/rstrip.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Byte length of the whitespace run ending at `end` (walking back).
size_t white_space_before(std::string_view s, size_t end) {
  size_t i = end;
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    size_t k = j;
    if (!is_white_space(utf8::next(s, k))) break;
    i = j;
  }
  return end - i;
}

size_t white_space_after(std::string_view s, size_t begin) {
  size_t i = begin;
  while (i < s.size()) {
    size_t k = i;
    if (!is_white_space(utf8::next(s, k))) break;
    i = k;
  }
  return i - begin;
}

bool is_word_char(char32_t c) {
  return c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !is_white_space(c));
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens) {
  nodes_.assign(1, Node{});
  first_byte_.fill(false);
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    first_byte_[static_cast<unsigned char>(t->content[0])] = true;
    int32_t node = 0;
    for (const char ch : t->content) {
      const auto b = static_cast<unsigned char>(ch);
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& kids = nodes_[node].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0})), {b, next});
      }
      node = next;
    }
    // The first token registered for a content wins, like the first entry in
    // Hugging Face's added vocabulary.
    if (!nodes_[node].token) nodes_[node].token = t;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  const auto& kids = nodes_[node].children;
  const auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{0}));
  return it != kids.end() && it->first == b ? it->second : -1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  if (empty()) {
    if (!text.empty()) out.push_back({std::string(text)});
    return;
  }
  size_t emitted = 0;  // text before this has been placed in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest token starting at pos.
    const AddedToken* best = nullptr;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token) {
        best = nodes_[node].token;
        best_end = i + 1;
      }
    }
    if (best && best->single_word) {
      size_t before = pos, k = best_end;
      bool ok = true;
      if (pos > 0) {
        while (before > 0 && (static_cast<unsigned char>(text[before - 1]) & 0xC0) == 0x80) --before;
        if (before > 0) --before;
        ok = !is_word_char(utf8::next(text, before));
      }
      if (ok && k < text.size()) ok = !is_word_char(utf8::next(text, k));
      if (!ok) best = nullptr;
    }
    if (!best) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = best_end;
    if (best->lstrip) begin -= std::min(begin - emitted, white_space_before(text, begin));
    if (best->rstrip) end += white_space_after(text, end);
    if (begin > emitted) out.push_back({std::string(text.substr(emitted, begin - emitted))});
    out.push_back({std::string(text.substr(begin, end - begin)), best->id});
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back({std::string(text.substr(emitted))});
}

}  // namespace tp
