#pragma once
// Tokens -> syntax tree, with @huggingface/jinja's operator precedence (lowest
// first): `a if b else c`, or, and, not, comparisons and `in` / `not in`,
// + - ~, * / // %, **, `is` tests, | filters, unary - +, calls / attributes /
// subscripts. Tags: if/elif/else, for (with `if` filter and else), set (also
// the block form and namespace attributes), macro, break, continue. Anything
// else is a tp::Error naming the template, the line and column and the tag.
#include <string_view>

#include "tp/chat/ast.h"

namespace tp::chat {

Block parse_template(std::string_view source, std::string_view name);

}  // namespace tp::chat
