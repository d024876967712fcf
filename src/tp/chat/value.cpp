#include "tp/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "tp/core/error.h"
#include "tp/tokenizer/utf8.h"

namespace tp::chat {

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double f) : kind_(Kind::Float), f_(f) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::List;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::dict(Dict items) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::namespace_(Dict items) {
  Value v = dict(std::move(items));
  v.kind_ = Kind::Namespace;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind_ = Kind::Function;
  v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return none();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_float: {
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.007199254740992e15)
        return Value(static_cast<int64_t>(d));
      return Value(d);
    }
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& x : j) items.push_back(from_json(x));
      return list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict items;
      for (const auto& [k, x] : j.items()) items.emplace_back(k, from_json(x));
      return dict(std::move(items));
    }
    default: fail("chat template variables: JSON value of type {} is not supported", j.type_name());
  }
}

double Value::as_number() const {
  if (kind_ == Kind::Int) return static_cast<double>(i_);
  if (kind_ == Kind::Bool) return b_ ? 1 : 0;
  return f_;
}

const Value* Value::find(std::string_view key) const {
  if (!dict_) return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  for (auto& [k, old] : *dict_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  dict_->emplace_back(key, std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0 && !std::isnan(f_);
    case Kind::String: return !s_.empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->empty();
    case Kind::Namespace:
    case Kind::Function: return true;
  }
  return false;
}

Value integral_value(double d) {
  if (std::isfinite(d) && std::fabs(d) < 9.2e18) return Value(static_cast<int64_t>(d));
  return Value(d);
}

std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return "0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // d.ddde±XX
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int n = std::stoi(sci.substr(e_pos + 1)) + 1;  // where the decimal point goes
  const int k = static_cast<int>(digits.size());
  std::string out = v < 0 ? "-" : "";
  if (k <= n && n <= 21) {
    out += digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(-n, '0') + digits;
  } else {
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{}", n - 1 >= 0 ? "+" : "-", std::abs(n - 1));
  }
  return out;
}

namespace {

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && ensure_ascii) {
      const char32_t cp = utf8::next(s, i);
      if (cp >= 0x10000) {
        const char32_t u = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (u >> 10), 0xDC00 + (u & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(cp));
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || (c == 0x7f && ensure_ascii)) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// `undefined_as`: "null" for tojson, "undefined" when a container is printed.
// Lists, dicts and namespaces are shared, so `{% set ns.me = ns %}` makes a value
// that holds itself: printing stops at this depth with an error instead of recursing
// until the stack runs out (JavaScript's JSON.stringify refuses a cycle too).
constexpr int kMaxValueDepth = 256;
// A JSON text is built whole before the template's output can refuse it: it
// stops at the output's own limit (a list of a million items, or a wide indent,
// must not take the machine's memory first).
constexpr size_t kMaxJsonBytes = size_t{64} << 20;

void check_json_size(const std::string& out) {
  if (out.size() > kMaxJsonBytes) fail("a value's JSON text grows past {} MiB", kMaxJsonBytes >> 20);
}

void append_json(std::string& out, const Value& v, int indent, bool ensure_ascii, bool sort_keys, int depth,
                 const char* undefined_as) {
  if (depth > kMaxValueDepth)
    fail(
        "a value nested deeper than {} levels cannot be printed or converted to JSON (does a namespace, list or "
        "dict hold itself?)",
        kMaxValueDepth);
  const std::string item_sep = indent > 0 ? "," : ", ";
  const std::string pad = "\n" + std::string(static_cast<size_t>(indent * depth), ' ');
  const std::string child_pad = pad + std::string(static_cast<size_t>(indent), ' ');
  switch (v.kind()) {
    case Value::Kind::Undefined: out += undefined_as; return;
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: out += format_number(v.as_number()); return;
    case Value::Kind::String: append_json_string(out, v.as_string(), ensure_ascii); return;
    case Value::Kind::List: {
      out += '[';
      const List& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent > 0) out += child_pad;
        append_json(out, items[i], indent, ensure_ascii, sort_keys, depth + 1, undefined_as);
        check_json_size(out);
      }
      if (indent > 0 && !items.empty()) out += pad;
      out += ']';
      return;
    }
    case Value::Kind::Dict:
    case Value::Kind::Namespace: {
      out += '{';
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.entries()) entries.push_back(&e);
      if (sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent > 0) out += child_pad;
        append_json_string(out, entries[i]->first, ensure_ascii);
        out += ": ";
        append_json(out, entries[i]->second, indent, ensure_ascii, sort_keys, depth + 1, undefined_as);
        check_json_size(out);
      }
      if (indent > 0 && !entries.empty()) out += pad;
      out += '}';
      return;
    }
    case Value::Kind::Function: fail("a function cannot be converted to JSON");
  }
}

}  // namespace

std::string Value::render() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return "";
    case Kind::Bool: return b_ ? "true" : "false";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: {
      if (f_ == 0 && std::signbit(f_)) return "-0.0";
      const std::string s = format_number(f_);
      return std::isfinite(f_) && f_ == std::floor(f_) && s.find('e') == std::string::npos ? s + ".0" : s;
    }
    case Kind::String: return s_;
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace: {
      std::string out;
      append_json(out, *this, 0, false, false, 0, "undefined");
      return out;
    }
    case Kind::Function: return "[function]";
  }
  return "";
}

std::string Value::to_json(int indent, bool ensure_ascii, bool sort_keys) const {
  std::string out;
  append_json(out, *this, indent, ensure_ascii, sort_keys, 0, "null");
  return out;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "boolean";
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

bool loosely_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool a_nullish = a.is_none() || a.is_undefined(), b_nullish = b.is_none() || b.is_undefined();
  if (a_nullish || b_nullish) return a_nullish && b_nullish;
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == K::Bool; };
  if (numeric(a) && numeric(b)) return a.as_number() == b.as_number();
  if (a.is_string() && b.is_string()) return a.as_string() == b.as_string();
  // JS coerces a string compared with a number: "1" == 1.
  if (a.is_string() != b.is_string() && (numeric(a) || numeric(b))) {
    const std::string& s = a.is_string() ? a.as_string() : b.as_string();
    const double n = a.is_string() ? b.as_number() : a.as_number();
    double parsed = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), parsed);
    if (s.empty()) return n == 0;
    return r.ec == std::errc() && r.ptr == s.data() + s.size() && parsed == n;
  }
  if (a.kind() != b.kind()) return false;
  if (a.is_list()) return &a.items() == &b.items();
  if (a.is_mapping()) return &a.entries() == &b.entries();
  return false;
}

}  // namespace tp::chat
