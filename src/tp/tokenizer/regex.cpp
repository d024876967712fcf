#include "tp/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "tp/core/error.h"

namespace tp {

namespace {

// Unicode White_Space, the set Oniguruma's \s matches in UTF-8 mode.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

// One JIT stack per thread, shared by all patterns (they never run concurrently
// on one thread). Large enough for the lookaheads in long whitespace runs.
pcre2_jit_stack* thread_jit_stack() {
  struct Holder {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    ~Holder() { pcre2_jit_stack_free(stack); }
  };
  thread_local Holder holder;
  return holder.stack;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

std::string onig_compatible_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        // \S inside a class has no simple rewrite; none of the supported
        // tokenizers use it, so PCRE2's meaning is kept.
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, std::string_view what) : pattern_(pattern), code_(std::make_shared<Code>()) {
  const std::string rewritten = onig_compatible_pattern(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  TP_CHECK(code_->code, "{} /{}/ does not compile at offset {}: {}", what, pattern, offset, pcre2_message(err));
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(std::string_view literal, std::string_view what) {
  return Regex(regex_escape(literal), what);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  for_each_match(text, [&](size_t b, size_t e) { out.emplace_back(b, e); });
  return out;
}

void Regex::for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& fn) const {
  // unique_ptr: `fn` may throw.
  const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md_owner(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), pcre2_match_data_free);
  const std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> ctx_owner(
      pcre2_match_context_create(nullptr), pcre2_match_context_free);
  pcre2_match_data* md = md_owner.get();
  pcre2_match_context* ctx = ctx_owner.get();
  if (code_->jit) pcre2_jit_stack_assign(ctx, nullptr, thread_jit_stack());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  int rc = 0;
  while (start <= text.size()) {
    // The tokenizer only hands valid UTF-8 to regexes, so the check is skipped.
    rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, ctx)
                    : pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, ctx);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    fn(b, e);
    if (e > b) {
      start = e;
    } else {
      // Empty match: step over one whole character.
      if (e >= text.size()) break;
      start = e + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  TP_CHECK(rc >= 0 || rc == PCRE2_ERROR_NOMATCH, "regex /{}/ failed on a {}-byte input: {}", pattern_, text.size(),
           pcre2_message(rc));
}

std::string Regex::replace_all(std::string_view text, std::string_view content) const {
  std::string out;
  size_t prev = 0;
  for_each_match(text, [&](size_t b, size_t e) {
    out.append(text.substr(prev, b - prev));
    out.append(content);
    prev = e;
  });
  out.append(text.substr(prev));
  return out;
}

Regex pattern_from_json(const nlohmann::json& p, std::string_view what) {
  TP_CHECK(p.is_object(), "{} pattern must be an object {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", what,
           p.dump());
  if (p.contains("String")) return Regex::literal(p.at("String").get<std::string>(), what);
  if (p.contains("Regex")) return Regex(p.at("Regex").get<std::string>(), what);
  fail("{} pattern {} has neither \"String\" nor \"Regex\"", what, p.dump());
}

}  // namespace tp
