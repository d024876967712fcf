#pragma once
// Template text -> tokens, with whitespace control applied as @huggingface/jinja
// does when Transformers.js renders a chat template (trim_blocks and
// lstrip_blocks on, as Transformers also compiles them):
//  1. one trailing newline of the template is dropped;
//  2. lstrip_blocks: spaces and tabs from a line start up to "{%" / "{#" go;
//  3. trim_blocks: the newline right after "%}" / "#}" goes;
//  4. Transformers' {% generation %} / {% endgeneration %} tags are removed;
//  5. "{%-", "{{-", "{#-" strip the whitespace before them, "-%}", "-}}",
//     "-#}" the whitespace after them.
// Every token keeps the offset of its first character in the original source,
// so errors name the line and column the author sees.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tp::chat {

enum class TokenType {
  Text, Number, String, Identifier,
  OpenStatement, CloseStatement, OpenExpression, CloseExpression,
  OpenParen, CloseParen, OpenBracket, CloseBracket, OpenBrace, CloseBrace,
  Comma, Dot, Colon, Pipe, Equals,
  Additive,        // + - ~
  Multiplicative,  // * / // %
  Power,           // **
  Comparison,      // == != < > <= >=
};

struct Token {
  TokenType type;
  std::string value;  // text, literal value (escapes resolved) or operator
  size_t offset;      // in the original source
};

// Throws tp::Error "chat template 'NAME' line L, column C: ..." on bad input.
std::vector<Token> tokenize(std::string_view source, std::string_view name);

// Length in bytes of the JS whitespace character (\s) starting at s[i], 0 if none.
size_t js_space_at(std::string_view s, size_t i);
// Length of the one ending right before s[end], 0 if none.
size_t js_space_before(std::string_view s, size_t end);

}  // namespace tp::chat
