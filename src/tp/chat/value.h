#pragma once
// The values a chat template computes with. The semantics are those of
// @huggingface/jinja (the engine Transformers.js renders chat templates with),
// so that output is byte-identical to it:
//  - undefined (a missing variable or key) and none both render as "";
//  - booleans render "true"/"false", floats with a ".0" when integral;
//  - lists, dicts and namespaces render as JSON (Python's json.dumps spacing);
//  - lists and dicts are shared by reference (a namespace's attribute set is
//    seen by every holder of it), as in Jinja.
// Strings are UTF-8; lengths, indices and slices count code points.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tp::chat {

class Value;
class Scope;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Jinja iterates

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  Dict keyword;
  const Value* get(size_t index, std::string_view name) const;  // positional[index] or keyword `name`
};

// A callable: a global (namespace, range, ...), a method bound to its object, or a macro.
// `caller` is the scope of the call site (macros see it, as in @huggingface/jinja).
using Function = std::function<Value(const Args& args, Scope& caller)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double f);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items = {});
  static Value dict(Dict items = {});
  static Value namespace_(Dict items = {});
  static Value function(Function f);
  // JSON -> value: integral numbers (also 1.0) become ints, as JS numbers do.
  static Value from_json(const nlohmann::json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_mapping() const { return kind_ == Kind::Dict || kind_ == Kind::Namespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const;  // int, float or bool as a double
  const std::string& as_string() const { return s_; }
  const List& items() const { return *list_; }
  List& items() { return *list_; }
  const Dict& entries() const { return *dict_; }
  Dict& entries() { return *dict_; }
  const Function& as_function() const { return *fn_; }

  // A dict's or namespace's entry, nullptr when absent.
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);  // dicts and namespaces

  bool truthy() const;
  // What `{{ v }}` prints (undefined and none print nothing).
  std::string render() const;
  // `tojson`: compact or indented JSON like Python's json.dumps (", " and ": ").
  std::string to_json(int indent = 0, bool ensure_ascii = false, bool sort_keys = false) const;
  // "string", "integer", ... for messages.
  std::string type_name() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Function> fn_;
};

// `==` as @huggingface/jinja evaluates it (JS loose equality of the values):
// numbers and booleans compare numerically, none equals undefined, strings by
// bytes; lists and dicts only equal themselves.
bool loosely_equal(const Value& a, const Value& b);

// An integral double as an int when int64 holds it, else as a float (JS numbers have no int type).
Value integral_value(double d);

// Float formatting of JS's Number#toString (shortest round-trip digits).
std::string format_number(double v);

}  // namespace tp::chat
