#pragma once
// Filters, tests, attributes and methods of template values, as
// @huggingface/jinja defines them. They throw BuiltinError; the interpreter
// adds the template name, line and column.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "tp/chat/value.h"

namespace tp::chat {

struct BuiltinError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void builtin_error(fmt::format_string<Args...> format, Args&&... args) {
  throw BuiltinError(fmt::format(format, std::forward<Args>(args)...));
}

// x | name(args): trim, length, tojson, string, upper, lower, title, capitalize,
// first, last, join, default, replace, list, int, float, abs, items, keys,
// values, reverse, indent, safe, selectattr, rejectattr, map(attribute=...).
Value apply_filter(const std::string& name, const Value& operand, const Args& args);

// x is name: defined, undefined, none, string, number, integer, boolean,
// mapping, iterable, sequence, callable, true, false, odd, even, lower, upper.
bool apply_test(const std::string& name, const Value& operand);

// x.name / x['name']: a dict's entry, else a method (strings: strip, lstrip,
// rstrip, split, startswith, endswith, upper, lower, title, capitalize,
// replace; dicts: get, items, keys, values) or `length`; undefined otherwise.
Value get_attribute(const Value& object, const std::string& name);

// The text JS's String(value) gives, used by `~` and by `+` on strings (so
// 2.0 gives "2" here while {{ 2.0 }} prints "2.0").
std::string concat_text(const Value& v);

// Code points of a UTF-8 string, and back.
std::u32string code_points(const std::string& s);
std::string from_code_points(const std::u32string& s);

}  // namespace tp::chat
