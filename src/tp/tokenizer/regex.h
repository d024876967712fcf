#pragma once
// PCRE2 (UTF + UCP + JIT) with the matching rules of the Oniguruma engine that
// Hugging Face tokenizers uses, so that pre-tokenizer patterns split the same way.
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tp {

class Regex {
 public:
  // `what` names the pattern in errors ("pre_tokenizer Split pattern").
  Regex(std::string_view pattern, std::string_view what);
  // A pattern matching `literal` exactly (the {"String": ...} form).
  static Regex literal(std::string_view literal, std::string_view what);

  // Calls fn(begin, end) for each non-overlapping match in `text`, left to
  // right, as byte offsets; empty matches are included (callers drop empty
  // pieces). Streaming, so a long input allocates nothing per match.
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& fn) const;
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  // `text` with every match replaced by `content` (no group references).
  std::string replace_all(std::string_view text, std::string_view content) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<Code> code_;
};

// Rewrites `\s` and `\S` to Oniguruma's White_Space set: PCRE2's UCP \s also
// matches U+180E, which Oniguruma (and Unicode since 6.3) does not.
std::string onig_compatible_pattern(std::string_view pattern);

// A tokenizer.json pattern: {"String": s} is literal, {"Regex": r} a regex;
// `what` names its owner in errors.
Regex pattern_from_json(const nlohmann::json& p, std::string_view what);

// Escapes every regex metacharacter in `s`.
std::string regex_escape(std::string_view s);

}  // namespace tp
