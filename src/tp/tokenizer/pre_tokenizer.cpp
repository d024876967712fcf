#include "tp/tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "tp/core/error.h"
#include "tp/tokenizer/byte_level.h"
#include "tp/tokenizer/regex.h"

namespace tp {

namespace {

using nlohmann::json;

// How a Split keeps the matches (Hugging Face SplitDelimiterBehavior).
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  fail("Split behavior '{}' is not supported; supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, "
       "Contiguous",
       s);
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Splits `text` at the matches of `regex` following `behavior` and emits the
// non-empty pieces. Mirrors NormalizedString::split. Isolated and Removed
// stream; the merging behaviours look at neighbours and collect spans first.
void split_by(std::string_view text, const Regex& regex, Behavior behavior, bool invert, const EmitPiece& emit) {
  auto piece = [&](size_t b, size_t e) {
    if (e > b) emit(text.substr(b, e - b));
  };
  if (behavior == Behavior::Isolated || behavior == Behavior::Removed) {
    const bool keep_matches = behavior == Behavior::Isolated || invert;
    const bool keep_gaps = behavior == Behavior::Isolated || !invert;
    size_t prev = 0;
    regex.for_each_match(text, [&](size_t b, size_t e) {
      if (keep_gaps) piece(prev, b);
      if (keep_matches) piece(b, e);
      prev = e;
    });
    if (keep_gaps) piece(prev, text.size());
    return;
  }
  std::vector<Span> spans;
  size_t prev = 0;
  regex.for_each_match(text, [&](size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  });
  if (prev < text.size()) spans.push_back({prev, text.size(), invert});

  std::vector<std::pair<size_t, size_t>> pieces;
  bool previous_match = false;
  if (behavior == Behavior::MergedWithPrevious) {
    for (const auto& s : spans) {
      if (s.is_match && !previous_match && !pieces.empty())
        pieces.back().second = s.end;
      else
        pieces.emplace_back(s.begin, s.end);
      previous_match = s.is_match;
    }
  } else if (behavior == Behavior::MergedWithNext) {
    for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
      if (it->is_match && !previous_match && !pieces.empty())
        pieces.back().first = it->begin;
      else
        pieces.emplace_back(it->begin, it->end);
      previous_match = it->is_match;
    }
    std::reverse(pieces.begin(), pieces.end());
  } else {  // Contiguous
    for (size_t i = 0; i < spans.size(); ++i) {
      if (i > 0 && spans[i].is_match == previous_match)
        pieces.back().second = spans[i].end;
      else
        pieces.emplace_back(spans[i].begin, spans[i].end);
      previous_match = spans[i].is_match;
    }
  }
  for (const auto& [b, e] : pieces) piece(b, e);
}

class Split final : public PreTokenizer {
 public:
  Split(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::string_view text, bool, const EmitPiece& emit) const override {
    split_by(text, regex_, behavior_, invert_, emit);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, "ByteLevel pre-tokenizer");
  }
  void pre_tokenize(std::string_view text, bool, const EmitPiece& emit) const override {
    std::string prefixed;
    if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    std::string mapped;
    auto map_and_emit = [&](std::string_view piece) {
      byte_level::encode_into(piece, mapped);
      emit(mapped);
    };
    if (regex_)
      split_by(text, *regex_, Behavior::Isolated, false, map_and_emit);
    else if (!text.empty())
      map_and_emit(text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual)
      : regex_("\\p{N}", "Digits pre-tokenizer"), behavior_(individual ? Behavior::Isolated : Behavior::Contiguous) {}
  void pre_tokenize(std::string_view text, bool, const EmitPiece& emit) const override {
    split_by(text, regex_, behavior_, false, emit);
  }

 private:
  Regex regex_;
  Behavior behavior_;
};

// SentencePiece-style: spaces become `replacement` (usually "▁"), optionally
// prepended, and each piece starts at a replacement.
class Metaspace final : public PreTokenizer {
 public:
  Metaspace(std::string replacement, std::string prepend_scheme, bool split)
      : replacement_(std::move(replacement)),
        prepend_scheme_(std::move(prepend_scheme)),
        split_(split),
        regex_(Regex::literal(replacement_, "Metaspace pre-tokenizer")) {}
  void pre_tokenize(std::string_view text, bool first_section, const EmitPiece& emit) const override {
    std::string s;
    for (const char c : text) {
      if (c == ' ')
        s += replacement_;
      else
        s += c;
    }
    const bool prepend = prepend_scheme_ == "always" || (prepend_scheme_ == "first" && first_section);
    if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s.insert(0, replacement_);
    if (split_)
      split_by(s, regex_, Behavior::MergedWithNext, false, emit);
    else if (!s.empty())
      emit(s);
  }

 private:
  std::string replacement_, prepend_scheme_;
  bool split_;
  Regex regex_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> items) : items_(std::move(items)) {}
  void pre_tokenize(std::string_view text, bool first_section, const EmitPiece& emit) const override {
    run(0, text, first_section, emit);
  }

 private:
  // Stage i's pieces feed stage i + 1; the last stage's go to `emit`.
  void run(size_t i, std::string_view text, bool first_section, const EmitPiece& emit) const {
    if (i == items_.size()) {
      emit(text);
      return;
    }
    items_[i]->pre_tokenize(text, first_section, [&](std::string_view piece) { run(i + 1, piece, first_section, emit); });
  }
  std::vector<std::unique_ptr<PreTokenizer>> items_;
};

}  // namespace

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const json& j) {
  if (j.is_null()) return nullptr;
  TP_CHECK(j.is_object() && j.contains("type"), "pre_tokenizer must be an object with a \"type\", got {}",
           j.dump().substr(0, 200));
  const std::string type = j.at("type").get<std::string>();
  if (type == "Split")
    return std::make_unique<Split>(pattern_from_json(j.at("pattern"), "pre_tokenizer Split"),
                                   parse_behavior(j.at("behavior").get<std::string>()), j.value("invert", false));
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j.value("add_prefix_space", true), j.value("use_regex", true));
  if (type == "Digits") return std::make_unique<Digits>(j.value("individual_digits", false));
  if (type == "Metaspace") {
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    TP_CHECK(scheme == "always" || scheme == "first" || scheme == "never",
             "Metaspace prepend_scheme '{}' is not supported; supported: always, first, never", scheme);
    return std::make_unique<Metaspace>(j.value("replacement", std::string("\xE2\x96\x81")), scheme,
                                       j.value("split", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> items;
    for (const auto& p : j.at("pretokenizers")) items.push_back(from_json(p));
    std::erase(items, nullptr);
    return std::make_unique<Sequence>(std::move(items));
  }
  fail("pre_tokenizer type '{}' is not supported; supported: Split, ByteLevel, Digits, Metaspace, Sequence", type);
}

}  // namespace tp
