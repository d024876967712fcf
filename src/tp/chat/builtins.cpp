#include "tp/chat/builtins.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <charconv>
#include <cmath>

#include "tp/chat/lexer.h"
#include "tp/tokenizer/utf8.h"

namespace tp::chat {
namespace {

// tojson's indent: a readable width (templates use 2 or 4), not one that makes
// every line of the text megabytes of spaces.
constexpr int64_t kMaxJsonIndent = 100;

std::string upper(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toUpper(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}
std::string lower(const std::string& s) {
  std::string out;
  icu::UnicodeString::fromUTF8(s).toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

bool is_ascii_word(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// JS /\b\w/g -> upper case: the first word character of every ASCII word; the rest is kept.
std::string title(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i)
    if (is_ascii_word(out[i]) && (i == 0 || !is_ascii_word(out[i - 1]))) out[i] = static_cast<char>(std::toupper(out[i]));
  return out;
}

std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  utf8::next(s, i);
  return upper(s.substr(0, i)) + s.substr(i);
}

// JS trim/trimStart/trimEnd: Unicode whitespace. Python's strip(chars) takes an
// argument; @huggingface/jinja ignores it (strip('\n') strips all whitespace),
// and output must match it.
std::string strip(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (size_t n = js_space_at(s, b)) b += n;
  if (right)
    while (e > b) {
      const size_t n = js_space_before(s, e);
      if (n == 0) break;
      e -= n;
    }
  return s.substr(b, e - b);
}

const std::string& string_arg(const Args& args, size_t i, std::string_view name, std::string_view what) {
  const Value* v = args.get(i, name);
  if (!v || !v->is_string()) builtin_error("{}: argument '{}' must be a string, got {}", what, name, v ? v->type_name() : "nothing");
  return v->as_string();
}

bool starts_or_ends(const std::string& s, const Value& pattern, bool start, const char* what) {
  auto match = [&](const std::string& p) {
    return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
  };
  if (pattern.is_string()) return match(pattern.as_string());
  if (pattern.is_list()) {
    for (const Value& p : pattern.items()) {
      if (!p.is_string()) builtin_error("{}() tuple elements must be strings", what);
      if (match(p.as_string())) return true;
    }
    return false;
  }
  builtin_error("{}() argument must be a string or a tuple of strings, got {}", what, pattern.type_name());
}

Value split(const std::string& s, const Args& args) {
  const Value* sep = args.get(0, "sep");
  const Value* max_v = args.get(1, "maxsplit");
  const int64_t maxsplit = max_v && max_v->kind() == Value::Kind::Int ? max_v->as_int() : -1;
  List parts;
  if (!sep || sep->is_none()) {
    const std::string text = strip(s, true, false);
    size_t i = 0;
    while (i < text.size()) {
      size_t j = i;
      while (j < text.size() && !js_space_at(text, j)) j += 1;
      if (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.emplace_back(text.substr(i));
        break;
      }
      parts.emplace_back(text.substr(i, j - i));
      i = j;
      while (size_t n = js_space_at(text, i)) i += n;
    }
    return Value::list(std::move(parts));
  }
  if (!sep->is_string()) builtin_error("split(): the separator must be a string or none, got {}", sep->type_name());
  const std::string& d = sep->as_string();
  if (d.empty()) builtin_error("split(): empty separator");
  size_t start = 0;
  while (true) {
    const size_t hit = s.find(d, start);
    if (hit == std::string::npos || (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit)) {
      parts.emplace_back(s.substr(start));
      break;
    }
    parts.emplace_back(s.substr(start, hit - start));
    start = hit + d.size();
  }
  return Value::list(std::move(parts));
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (count == 0) return s;
  std::string out;
  size_t done = 0;
  if (from.empty()) {  // between every code point, as Python and JS's /(?=)/gu
    size_t i = 0;
    while (true) {
      if (count < 0 || static_cast<int64_t>(done) < count) {
        out += to;
        ++done;
      }
      if (i >= s.size()) break;
      const size_t b = i;
      utf8::next(s, i);
      out += s.substr(b, i - b);
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t hit = s.find(from, start);
    if (hit == std::string::npos || (count >= 0 && static_cast<int64_t>(done) >= count)) break;
    out += s.substr(start, hit - start) + to;
    start = hit + from.size();
    ++done;
  }
  return out + s.substr(start);
}

Value replace_call(const std::string& s, const Args& args) {
  const std::string& from = string_arg(args, 0, "old", "replace()");
  const std::string& to = string_arg(args, 1, "new", "replace()");
  const Value* count = args.get(2, "count");
  if (count && !count->is_none() && count->kind() != Value::Kind::Int)
    builtin_error("replace(): count must be an integer or none, got {}", count->type_name());
  return Value(replace(s, from, to, count && !count->is_none() ? count->as_int() : -1));
}

Value string_attribute(const std::string& s, const std::string& name) {
  using Fn = std::string (*)(const std::string&);
  static const std::pair<const char*, Fn> unary[] = {
      {"upper", upper}, {"lower", lower}, {"title", title}, {"capitalize", capitalize},
      {"strip", [](const std::string& x) { return strip(x, true, true); }},
      {"lstrip", [](const std::string& x) { return strip(x, true, false); }},
      {"rstrip", [](const std::string& x) { return strip(x, false, true); }}};
  for (const auto& [n, fn] : unary)
    if (name == n) return Value::function([s, fn = fn](const Args&, Scope&) { return Value(fn(s)); });
  if (name == "length") return Value(static_cast<int64_t>(code_points(s).size()));
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return Value::function([s, start](const Args& a, Scope&) {
      if (a.positional.empty()) builtin_error("{}() needs an argument", start ? "startswith" : "endswith");
      return Value(starts_or_ends(s, a.positional[0], start, start ? "startswith" : "endswith"));
    });
  }
  if (name == "split") return Value::function([s](const Args& a, Scope&) { return split(s, a); });
  if (name == "replace") return Value::function([s](const Args& a, Scope&) { return replace_call(s, a); });
  return Value();
}

Value dict_items(const Value& d) {
  List items;
  for (const auto& [k, v] : d.entries()) items.push_back(Value::list({Value(k), v}));
  return Value::list(std::move(items));
}
Value dict_keys(const Value& d) {
  List keys;
  for (const auto& e : d.entries()) keys.emplace_back(e.first);
  return Value::list(std::move(keys));
}
Value dict_values(const Value& d) {
  List values;
  for (const auto& e : d.entries()) values.push_back(e.second);
  return Value::list(std::move(values));
}

Value dict_attribute(const Value& d, const std::string& name) {
  if (name == "items") return Value::function([d](const Args&, Scope&) { return dict_items(d); });
  if (name == "keys") return Value::function([d](const Args&, Scope&) { return dict_keys(d); });
  if (name == "values") return Value::function([d](const Args&, Scope&) { return dict_values(d); });
  if (name == "get")
    return Value::function([d](const Args& a, Scope&) {
      const Value* key = a.get(0, "key");
      if (!key || !key->is_string()) builtin_error("get(): the key must be a string");
      if (const Value* v = d.find(key->as_string()); v && !v->is_undefined()) return *v;
      const Value* fallback = a.get(1, "default");
      return fallback ? *fallback : Value::none();
    });
  return Value();
}

// The text JS's Array#join gives an element: "" for none and undefined.
std::string join_text(const Value& v) { return v.is_none() || v.is_undefined() ? "" : concat_text(v); }

Value join(const Value& operand, const Args& args) {
  const Value* sep_v = args.get(0, "d");
  if (sep_v && !sep_v->is_string()) builtin_error("join: the separator must be a string, got {}", sep_v->type_name());
  const std::string sep = sep_v ? sep_v->as_string() : "";
  std::string out;
  if (operand.is_string()) {
    const std::u32string cps = code_points(operand.as_string());
    for (size_t i = 0; i < cps.size(); ++i) out += (i ? sep : "") + from_code_points(cps.substr(i, 1));
    return Value(out);
  }
  if (!operand.is_list()) builtin_error("join: cannot join a {}", operand.type_name());
  const List& items = operand.items();
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + join_text(items[i]);
  return Value(out);
}

Value to_int(const Value& operand, const Value* fallback) {
  if (operand.is_string()) {
    const std::string t = strip(operand.as_string(), true, false);
    int64_t v = 0;
    const char* b = t.data();
    if (!t.empty() && t[0] == '+') ++b;
    const auto r = std::from_chars(b, t.data() + t.size(), v);  // parseInt: leading digits
    if (r.ec == std::errc()) return Value(v);
    return fallback ? *fallback : Value(int64_t{0});
  }
  if (operand.kind() == Value::Kind::Int) return operand;
  if (operand.kind() == Value::Kind::Float) return integral_value(std::floor(operand.as_number()));
  if (operand.kind() == Value::Kind::Bool) return Value(int64_t{operand.as_bool() ? 1 : 0});
  builtin_error("int: cannot convert a {}", operand.type_name());
}

Value select_or_reject(const Value& operand, const Args& args, bool select, const std::string& filter) {
  if (!operand.is_list()) builtin_error("{} needs a list, got {}", filter, operand.type_name());
  const Value* attr = args.get(0, "attr");
  const Value* test = args.get(1, "test");
  if (!attr || !attr->is_string() || (test && !test->is_string()))
    builtin_error("{} takes the attribute name and optionally a test name, as strings", filter);
  if (args.positional.size() > 2) builtin_error("{}: tests with arguments (e.g. 'equalto', x) are not supported", filter);
  List out;
  for (const Value& item : operand.items()) {
    if (!item.is_mapping()) builtin_error("{} can only be applied to a list of dicts, got a {} in it", filter, item.type_name());
    const Value* a = item.find(attr->as_string());
    const bool passed = a && (test ? apply_test(test->as_string(), *a) : a->truthy());
    if (passed == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value indent(const std::string& s, const Args& args) {
  const Value* width = args.get(0, "width");
  const Value* first = args.get(1, "first");
  const Value* blank = args.get(2, "blank");
  const int64_t w = width && width->kind() == Value::Kind::Int ? width->as_int() : 4;
  if (w < 0 || w > 1000) builtin_error("indent: width {} is not supported (0 to 1000)", w);
  const std::string pad(static_cast<size_t>(w), ' ');
  std::string out;
  size_t start = 0;
  for (size_t line = 0;; ++line) {
    const size_t nl = s.find('\n', start);
    const std::string piece = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    const bool keep = (line == 0 && !(first && first->truthy())) || (piece.empty() && !(blank && blank->truthy()));
    out += (keep ? "" : pad) + piece;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
  }
  return Value(out);
}

}  // namespace

std::u32string code_points(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    // A template's bytes need not be UTF-8: an ill-formed sequence reads as one U+FFFD (Python's
    // errors="replace"); utf8::next would not advance over it (fuzz_chat_template: a slice looped forever).
    size_t bad = 0;
    if (utf8::valid_sequence_length(s, i, &bad) == 0) {
      out += U'\uFFFD';
      i += bad;
      continue;
    }
    out += utf8::next(s, i);
  }
  return out;
}

std::string from_code_points(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) utf8::append(out, c);
  return out;
}

std::string concat_text(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: return v.as_string();
    case Value::Kind::Int: return std::to_string(v.as_int());
    case Value::Kind::Float: return format_number(v.as_number());
    case Value::Kind::Bool: return v.as_bool() ? "true" : "false";
    case Value::Kind::None: return "null";
    case Value::Kind::Undefined: return "undefined";
    default: builtin_error("cannot turn a {} into text here (use |tojson or |string)", v.type_name());
  }
}

Value get_attribute(const Value& object, const std::string& name) {
  if (object.kind() == Value::Kind::Dict) {
    if (const Value* v = object.find(name)) return *v;
    return dict_attribute(object, name);
  }
  if (object.kind() == Value::Kind::Namespace) {
    const Value* v = object.find(name);
    return v ? *v : Value();
  }
  if (object.is_string()) return string_attribute(object.as_string(), name);
  if (object.is_list() && name == "length") return Value(static_cast<int64_t>(object.items().size()));
  return Value();
}

bool apply_test(const std::string& name, const Value& v) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == K::Int;
  if (name == "boolean") return v.kind() == K::Bool;
  if (name == "true") return v.kind() == K::Bool && v.as_bool();
  if (name == "false") return v.kind() == K::Bool && !v.as_bool();
  if (name == "mapping") return v.kind() == K::Dict;
  if (name == "iterable") return v.is_list() || v.is_string();
  if (name == "sequence") return v.is_list() || v.kind() == K::Dict || v.is_string();
  if (name == "callable") return v.kind() == K::Function;
  if (name == "lower") return v.is_string() && v.as_string() == lower(v.as_string());
  if (name == "upper") return v.is_string() && v.as_string() == upper(v.as_string());
  if (name == "odd" || name == "even") {
    if (v.kind() != K::Int) builtin_error("test '{}' needs an integer, got {}", name, v.type_name());
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  builtin_error("unsupported test '{}' (supported: defined, undefined, none, string, number, integer, boolean, true, false, "
        "mapping, iterable, sequence, callable, lower, upper, odd, even)",
        name);
}

Value apply_filter(const std::string& name, const Value& x, const Args& args) {
  using K = Value::Kind;
  if (name == "safe") return x;
  if (name == "tojson") {
    const Value* indent_v = args.get(0, "indent");
    const Value* ascii = args.get(99, "ensure_ascii");
    const Value* sort = args.get(99, "sort_keys");
    if (args.get(99, "separators")) builtin_error("tojson: the separators argument is not supported");
    const int64_t indent_n = indent_v && indent_v->kind() == K::Int ? indent_v->as_int() : 0;
    if (indent_n < 0 || indent_n > kMaxJsonIndent)
      builtin_error("tojson: indent must be an integer from 0 to {}, got {}", kMaxJsonIndent, indent_n);
    return Value(x.to_json(static_cast<int>(indent_n), ascii && ascii->truthy(), sort && sort->truthy()));
  }
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    if (x.is_undefined() || (boolean && boolean->truthy() && !x.truthy())) return fallback ? *fallback : Value("");
    return x;
  }
  if (name == "join") return join(x, args);
  if (name == "string") return x.is_string() ? x : Value(x.render());
  if (name == "length" || name == "count") {
    if (x.is_string()) return Value(static_cast<int64_t>(code_points(x.as_string()).size()));
    if (x.is_list()) return Value(static_cast<int64_t>(x.items().size()));
    if (x.kind() == K::Dict) return Value(static_cast<int64_t>(x.entries().size()));
    builtin_error("length: a {} has no length", x.type_name());
  }
  if (name == "int") return to_int(x, args.get(0, "default"));
  if (name == "float") {
    if (x.is_number() || x.kind() == K::Bool) return Value(x.as_number());
    if (x.is_string()) {
      double d = 0;
      const std::string t = strip(x.as_string(), true, false);
      const auto r = std::from_chars(t.data(), t.data() + t.size(), d);
      if (r.ec == std::errc()) return Value(d);
      const Value* fallback = args.get(0, "default");
      return fallback ? *fallback : Value(0.0);
    }
    builtin_error("float: cannot convert a {}", x.type_name());
  }
  if (name == "abs" && x.is_number())
    return x.kind() == K::Int ? integral_value(std::fabs(x.as_number())) : Value(std::fabs(x.as_number()));
  if (x.is_list()) {
    const List& items = x.items();
    if (name == "list") return x;
    if (name == "first") return items.empty() ? Value() : items.front();
    if (name == "last") return items.empty() ? Value() : items.back();
    if (name == "reverse") return Value::list(List(items.rbegin(), items.rend()));
    if (name == "selectattr" || name == "rejectattr") return select_or_reject(x, args, name == "selectattr", name);
    if (name == "map") {
      const Value* attr = args.get(99, "attribute");
      if (!attr || !attr->is_string()) builtin_error("map: only map(attribute='name') is supported");
      const Value* fallback = args.get(99, "default");
      List out;
      for (const Value& item : items) {
        if (!item.is_mapping()) builtin_error("map: the items must be dicts, got a {}", item.type_name());
        const Value* v = item.find(attr->as_string());
        out.push_back(v && !v->is_undefined() ? *v : (fallback ? *fallback : Value()));
      }
      return Value::list(std::move(out));
    }
  }
  if (x.is_string()) {
    const std::string& s = x.as_string();
    if (name == "upper") return Value(upper(s));
    if (name == "lower") return Value(lower(s));
    if (name == "title") return Value(title(s));
    if (name == "capitalize") return Value(capitalize(s));
    if (name == "trim") return Value(strip(s, true, true));
    if (name == "replace") return replace_call(s, args);
    if (name == "indent") return indent(s, args);
    if (name == "list") {
      List chars;
      for (char32_t c : code_points(s)) chars.emplace_back(from_code_points(std::u32string(1, c)));
      return Value::list(std::move(chars));
    }
    if (name == "first" || name == "last") {
      const std::u32string cps = code_points(s);
      if (cps.empty()) return Value();
      return Value(from_code_points(std::u32string(1, name == "first" ? cps.front() : cps.back())));
    }
  }
  if (x.kind() == K::Dict) {
    if (name == "items") return dict_items(x);
    if (name == "keys") return dict_keys(x);
    if (name == "values") return dict_values(x);
  }
  static const char* kSupported =
      "safe, tojson, default, join, string, length, count, int, float, abs, list, first, last, reverse, selectattr, "
      "rejectattr, map, upper, lower, title, capitalize, trim, replace, indent, items, keys, values";
  if (fmt::format(", {},", kSupported).find(fmt::format(", {},", name)) != std::string::npos)
    builtin_error("filter '{}' cannot be applied to a {}", name, x.type_name());
  builtin_error("unsupported filter '{}' (supported: {})", name, kSupported);
}

}  // namespace tp::chat
