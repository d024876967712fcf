#include "tp/chat/lexer.h"

#include <array>
#include <utility>

#include "tp/chat/source_error.h"

namespace tp::chat {

size_t js_space_at(std::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= '\t' && c <= '\r')) return 1;
  const auto at = [&](std::string_view seq) { return s.substr(i, seq.size()) == seq; };
  if (at("\xC2\xA0")) return 2;  // U+00A0
  static constexpr std::array<std::string_view, 6> three = {
      "\xE1\x9A\x80", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80", "\xEF\xBB\xBF",  // 1680 202F 205F 3000 FEFF
      "\xE2\x80\xA8"};                                                               // 2028
  for (std::string_view seq : three)
    if (at(seq)) return 3;
  // U+2000..U+200A, U+2029
  if (i + 2 < s.size() && c == 0xE2 && static_cast<unsigned char>(s[i + 1]) == 0x80) {
    const auto t = static_cast<unsigned char>(s[i + 2]);
    if ((t >= 0x80 && t <= 0x8A) || t == 0xA9) return 3;
  }
  return 0;
}

size_t js_space_before(std::string_view s, size_t end) {
  for (size_t len = 1; len <= 3 && len <= end; ++len)
    if (js_space_at(s, end - len) == len) return len;
  return 0;
}

namespace {

// Text after a preprocessing step, with the source offset of each byte.
struct Mapped {
  std::string text;
  std::vector<size_t> origin;
  void push(char c, size_t from) {
    text += c;
    origin.push_back(from);
  }
  void copy(const Mapped& m, size_t i) { push(m.text[i], m.origin[i]); }
};

bool line_start(const std::string& t, size_t i) {
  return i == 0 || t[i - 1] == '\n' || t[i - 1] == '\r' ||
         (i >= 3 && (t.compare(i - 3, 3, "\xE2\x80\xA8") == 0 || t.compare(i - 3, 3, "\xE2\x80\xA9") == 0));
}

Mapped lstrip_blocks(const Mapped& in) {
  Mapped out;
  const std::string& t = in.text;
  for (size_t i = 0; i < t.size();) {
    if (line_start(t, i)) {
      size_t j = i;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j + 1 < t.size() && t[j] == '{' && (t[j + 1] == '%' || t[j + 1] == '#' || t[j + 1] == '-')) i = j;
    }
    out.copy(in, i++);
  }
  return out;
}

Mapped trim_blocks(const Mapped& in) {
  Mapped out;
  const std::string& t = in.text;
  for (size_t i = 0; i < t.size(); ++i) {
    out.copy(in, i);
    if ((t[i] == '%' || t[i] == '#' || t[i] == '-') && i + 2 < t.size() && t[i + 1] == '}' && t[i + 2] == '\n') {
      out.copy(in, ++i);
      ++i;  // the newline
    }
  }
  return out;
}

// Matches "{%-? generation|endgeneration -?%}" at t[i]; returns its end (0: no
// match) and whether it strips on either side.
size_t match_generation_tag(const std::string& t, size_t i, bool& strip_before, bool& strip_after) {
  if (t.compare(i, 2, "{%") != 0) return 0;
  size_t j = i + 2;
  strip_before = j < t.size() && t[j] == '-';
  if (strip_before) ++j;
  while (size_t n = js_space_at(t, j)) j += n;
  if (t.compare(j, 3, "end") == 0) j += 3;
  if (t.compare(j, 10, "generation") != 0) return 0;
  j += 10;
  while (size_t n = js_space_at(t, j)) j += n;
  strip_after = j < t.size() && t[j] == '-';
  if (strip_after) ++j;
  if (t.compare(j, 2, "%}") != 0) return 0;
  return j + 2;
}

Mapped remove_generation_tags(const Mapped& in) {
  Mapped out;
  const std::string& t = in.text;
  size_t kept_from = 0;  // whitespace before a tag is taken from here on (matches do not overlap)
  for (size_t i = 0; i < t.size();) {
    bool strip_before = false, strip_after = false;
    const size_t end = match_generation_tag(t, i, strip_before, strip_after);
    if (end == 0) {
      out.copy(in, i++);
      continue;
    }
    if (strip_before) {
      size_t ws_start = i;
      while (ws_start > kept_from) {
        const size_t n = js_space_before(t, ws_start);
        if (n == 0) break;
        ws_start -= n;
      }
      const size_t drop = i - ws_start;
      out.text.resize(out.text.size() - drop);
      out.origin.resize(out.origin.size() - drop);
    }
    i = end;
    const size_t ws_begin = i;
    while (size_t n = js_space_at(t, i)) i += n;
    if (!strip_after)
      for (size_t k = ws_begin; k < i; ++k) out.copy(in, k);
    kept_from = i;
  }
  return out;
}

Mapped preprocess(std::string_view source) {
  Mapped m;
  m.text = source;
  for (size_t i = 0; i < source.size(); ++i) m.origin.push_back(i);
  if (!m.text.empty() && m.text.back() == '\n') {
    m.text.pop_back();
    m.origin.pop_back();
  }
  return remove_generation_tags(trim_blocks(lstrip_blocks(m)));
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  Lexer(std::string_view source, std::string_view name) : ref_{source, name}, m_(preprocess(source)), t_(m_.text) {}

  std::vector<Token> run() {
    while (pos_ < t_.size()) {
      if (outside_tags()) {
        const size_t start = pos_;
        while (pos_ < t_.size() && !at_tag_open()) ++pos_;
        if (pos_ > start) {
          push(TokenType::Text, t_.substr(start, pos_ - start), start);
          continue;
        }
      }
      if (t_.compare(pos_, 2, "{#") == 0) {
        comment();
        continue;
      }
      if (t_.compare(pos_, 3, "{%-") == 0 || t_.compare(pos_, 3, "{{-") == 0) {
        strip_trailing_text();
        const bool statement = t_[pos_ + 1] == '%';
        push(statement ? TokenType::OpenStatement : TokenType::OpenExpression, statement ? "{%" : "{{", pos_);
        if (!statement) brace_depth_ = 0;
        pos_ += 3;
        continue;
      }
      while (size_t n = js_space_at(t_, pos_)) pos_ += n;
      if (pos_ >= t_.size()) break;
      if (t_.compare(pos_, 3, "-%}") == 0 || t_.compare(pos_, 3, "-}}") == 0) {
        const bool statement = t_[pos_ + 1] == '%';
        push(statement ? TokenType::CloseStatement : TokenType::CloseExpression, statement ? "%}" : "}}", pos_);
        pos_ += 3;
        while (size_t n = js_space_at(t_, pos_)) pos_ += n;
        continue;
      }
      if (symbol()) continue;
      const char c = t_[pos_];
      if (c == '\'' || c == '"') {
        string_literal(c);
      } else if (is_digit(c)) {
        number();
      } else if (is_word(c)) {
        const size_t start = pos_;
        while (pos_ < t_.size() && is_word(t_[pos_])) ++pos_;
        push(TokenType::Identifier, t_.substr(start, pos_ - start), start);
      } else {
        fail_here(pos_, "unexpected character '{}' inside a tag", t_.substr(pos_, 1));
      }
    }
    if (!tokens_.empty() && !outside_tags())
      fail_at(ref_, ref_.source.size(), "the template ends inside a tag (missing '%}' or '}}')");
    return std::move(tokens_);
  }

 private:
  template <class... Args>
  [[noreturn]] void fail_here(size_t pos, fmt::format_string<Args...> format, Args&&... args) {
    fail_at(ref_, source_offset(pos), format, std::forward<Args>(args)...);
  }
  size_t source_offset(size_t pos) const { return pos < m_.origin.size() ? m_.origin[pos] : ref_.source.size(); }

  void push(TokenType type, std::string value, size_t pos) {
    tokens_.push_back({type, std::move(value), source_offset(pos)});
  }

  bool outside_tags() const {
    if (tokens_.empty()) return true;
    const TokenType last = tokens_.back().type;
    return last == TokenType::CloseStatement || last == TokenType::CloseExpression || last == TokenType::Text;
  }
  bool at_tag_open() const {
    return t_[pos_] == '{' && pos_ + 1 < t_.size() && (t_[pos_ + 1] == '%' || t_[pos_ + 1] == '{' || t_[pos_ + 1] == '#');
  }

  void strip_trailing_text() {
    if (tokens_.empty() || tokens_.back().type != TokenType::Text) return;
    std::string& v = tokens_.back().value;
    while (size_t n = js_space_before(v, v.size())) v.resize(v.size() - n);
    if (v.empty()) tokens_.pop_back();
  }

  void comment() {
    const size_t open = pos_;
    pos_ += 2;
    if (pos_ < t_.size() && t_[pos_] == '-') {
      strip_trailing_text();
      ++pos_;
    }
    const size_t close = t_.find("#}", pos_);
    if (close == std::string::npos) fail_here(open, "comment '{{#' is never closed with '#}}'");
    const bool strip_after = close > pos_ && t_[close - 1] == '-';
    pos_ = close + 2;
    if (strip_after)
      while (size_t n = js_space_at(t_, pos_)) pos_ += n;
    // A comment ends a text run like a tag does: mark it with an empty close.
    push(TokenType::CloseStatement, "", open);
    tokens_.back().value = "#}";
  }

  bool symbol() {
    struct Symbol {
      std::string_view text;
      TokenType type;
    };
    static constexpr Symbol kSymbols[] = {
        {"{%", TokenType::OpenStatement}, {"%}", TokenType::CloseStatement}, {"{{", TokenType::OpenExpression},
        {"}}", TokenType::CloseExpression}, {"(", TokenType::OpenParen}, {")", TokenType::CloseParen},
        {"{", TokenType::OpenBrace}, {"}", TokenType::CloseBrace}, {"[", TokenType::OpenBracket},
        {"]", TokenType::CloseBracket}, {",", TokenType::Comma}, {".", TokenType::Dot}, {":", TokenType::Colon},
        {"|", TokenType::Pipe}, {"<=", TokenType::Comparison}, {">=", TokenType::Comparison},
        {"==", TokenType::Comparison}, {"!=", TokenType::Comparison}, {"<", TokenType::Comparison},
        {">", TokenType::Comparison}, {"+", TokenType::Additive}, {"-", TokenType::Additive},
        {"~", TokenType::Additive}, {"**", TokenType::Power}, {"*", TokenType::Multiplicative},
        {"//", TokenType::Multiplicative}, {"/", TokenType::Multiplicative}, {"%", TokenType::Multiplicative},
        {"=", TokenType::Equals}};
    for (const Symbol& s : kSymbols) {
      if (s.text == "}}" && brace_depth_ > 0) continue;  // inside a dict literal
      if (t_.compare(pos_, s.text.size(), s.text) != 0) continue;
      push(s.type, std::string(s.text), pos_);
      if (s.type == TokenType::OpenExpression) brace_depth_ = 0;
      if (s.type == TokenType::OpenBrace) ++brace_depth_;
      if (s.type == TokenType::CloseBrace) --brace_depth_;
      pos_ += s.text.size();
      return true;
    }
    return false;
  }

  void string_literal(char quote) {
    const size_t open = pos_++;
    std::string value;
    while (true) {
      if (pos_ >= t_.size()) fail_here(open, "string literal is never closed (missing {})", quote);
      const char c = t_[pos_];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++pos_;
        continue;
      }
      if (++pos_ >= t_.size()) fail_here(open, "string literal is never closed (missing {})", quote);
      const char e = t_[pos_++];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\'': case '"': case '\\': value += e; break;
        case 'x': case 'u': {
          const size_t len = e == 'x' ? 2 : 4;
          char32_t cp = 0;
          for (size_t k = 0; k < len; ++k) {
            const int h = pos_ + k < t_.size() ? hex_value(t_[pos_ + k]) : -1;
            if (h < 0) fail_here(pos_ - 2, "invalid escape \\{}: expected {} hex digits", e, len);
            cp = cp * 16 + static_cast<char32_t>(h);
          }
          pos_ += len;
          if (cp >= 0xD800 && cp <= 0xDFFF) fail_here(pos_ - len - 2, "escape \\u{:04x} is a lone surrogate", static_cast<unsigned>(cp));
          append_utf8(value, cp);
          break;
        }
        default:
          fail_here(pos_ - 2, "unsupported escape '\\{}' in a string literal (supported: \\n \\t \\r \\b \\f \\v \\' \\\" \\\\ \\xHH \\uHHHH)", e);
      }
    }
    ++pos_;
    push(TokenType::String, std::move(value), open);
  }

  void number() {
    const size_t start = pos_;
    while (pos_ < t_.size() && is_digit(t_[pos_])) ++pos_;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == TokenType::Dot;  // x.0.1 is two lookups
    if (!after_dot && pos_ + 1 < t_.size() && t_[pos_] == '.' && is_digit(t_[pos_ + 1])) {
      ++pos_;
      while (pos_ < t_.size() && is_digit(t_[pos_])) ++pos_;
    }
    push(TokenType::Number, t_.substr(start, pos_ - start), start);
  }

  SourceRef ref_;
  Mapped m_;
  const std::string& t_;
  size_t pos_ = 0;
  int brace_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, std::string_view name) {
  std::vector<Token> tokens = Lexer(source, name).run();
  // Comments only delimit text runs; drop their markers.
  std::vector<Token> out;
  for (Token& t : tokens)
    if (!(t.type == TokenType::CloseStatement && t.value == "#}")) out.push_back(std::move(t));
  return out;
}

}  // namespace tp::chat
