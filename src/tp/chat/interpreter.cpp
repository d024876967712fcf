#include "tp/chat/interpreter.h"

#include <charconv>
#include <cmath>
#include <ctime>
#include <optional>
#include <unordered_set>

#include "tp/chat/builtins.h"
#include "tp/chat/source_error.h"
#include "tp/core/error.h"

namespace tp::chat {

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent_) {
    auto it = s->vars_.find(name);
    if (it != s->vars_.end()) return &it->second;
  }
  return nullptr;
}

namespace {

using K = Node::Kind;

// raise_exception(msg) from the template: reported as the template's own message.
struct RaisedException : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct BreakSignal {};
struct ContinueSignal {};

constexpr double kMaxRange = 1e6;

Value range(const Args& a, Scope&) {
  auto integer = [&](size_t i) {
    if (a.positional[i].kind() != Value::Kind::Int) builtin_error("range() takes integers, got {}", a.positional[i].type_name());
    return a.positional[i].as_int();
  };
  if (a.positional.empty() || a.positional.size() > 3) builtin_error("range() takes 1 to 3 integers");
  int64_t start = 0, stop = integer(0), step = 1;
  if (a.positional.size() >= 2) {
    start = stop;
    stop = integer(1);
  }
  if (a.positional.size() == 3) step = integer(2);
  if (step == 0) builtin_error("range() step must not be zero");
  const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step));
  if (count > kMaxRange) builtin_error("range() of {} items is not supported (at most {})", count, kMaxRange);
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return Value::list(std::move(out));
}

Value make_namespace(const Args& a, Scope&) {
  if (a.positional.size() > 1) builtin_error("namespace() takes at most 1 positional argument, got {}", a.positional.size());
  Dict entries;
  auto put = [&](const std::string& k, const Value& v) {
    for (auto& [key, old] : entries)
      if (key == k) {
        old = v;
        return;
      }
    entries.emplace_back(k, v);
  };
  if (!a.positional.empty()) {
    const Value& src = a.positional[0];
    if (src.kind() != Value::Kind::Dict) builtin_error("namespace() takes a dict, got {}", src.type_name());
    for (const auto& [k, v] : src.entries()) put(k, v);
  }
  for (const auto& [k, v] : a.keyword) put(k, v);
  return Value::namespace_(std::move(entries));
}

// %Y %m %d %b %B %H %M %% of the local time, the subset @huggingface/jinja formats.
Value strftime_now(const Args& a, Scope&) {
  if (a.positional.empty() || !a.positional[0].is_string()) builtin_error("strftime_now() takes a format string");
  const std::string& f = a.positional[0].as_string();
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%' || i + 1 >= f.size() || std::string_view("YmdbBHM%").find(f[i + 1]) == std::string_view::npos) {
      out += f[i];
      continue;
    }
    char buf[64];
    const char spec[3] = {'%', f[++i], 0};
    out.append(buf, std::strftime(buf, sizeof buf, spec, &tm));
  }
  return Value(out);
}

// Whether `v` is or contains (through lists, dicts and namespaces) the mapping
// `target`. Containers are shared, so an assignment that put a namespace inside
// itself would make a cycle: nothing could print it, and it would never be freed.
bool holds(const Value& v, const Dict* target, std::unordered_set<const void*>& seen) {
  if (v.is_mapping()) {
    if (&v.entries() == target) return true;
    if (!seen.insert(&v.entries()).second) return false;
    for (const auto& [key, item] : v.entries())
      if (holds(item, target, seen)) return true;
  } else if (v.is_list()) {
    if (!seen.insert(&v.items()).second) return false;
    for (const Value& item : v.items())
      if (holds(item, target, seen)) return true;
  }
  return false;
}

// JS's === on values: same type and value; lists and dicts by identity.
bool strictly_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::Bool: return a.as_bool() == b.as_bool();
    case Value::Kind::String: return a.as_string() == b.as_string();
    default: return loosely_equal(a, b);
  }
}

class Interpreter {
 public:
  Interpreter(std::string_view source, std::string_view name) : ref_{source, name} {}

  std::string block(const Block& nodes, Scope& scope) {
    std::string out;
    for (const NodePtr& n : nodes) {
      statement(*n, scope, out);
      check_size(*n, out);
    }
    return out;
  }

 private:
  // A runaway template (s = s ~ s in a loop) is an error, not an out-of-memory.
  void check_size(const Node& n, const std::string& text) {
    if (text.size() > kMaxText) fail_at(ref_, n.offset, "the template's text grows past {} MiB", kMaxText >> 20);
  }

  void statement(const Node& n, Scope& scope, std::string& out) {
    switch (n.kind) {
      case K::Text: out += n.literal.as_string(); return;
      case K::Output: out += eval(*n.kids[0], scope).render(); return;
      case K::If: out += block(eval(*n.kids[0], scope).truthy() ? n.body : n.alternate, scope); return;
      case K::For: for_loop(n, scope, out); return;
      case K::Set: assign(n, scope); return;
      case K::Macro: define_macro(n, scope); return;
      case K::Break: throw BreakSignal{};
      case K::Continue: throw ContinueSignal{};
      default: out += eval(n, scope).render();
    }
  }

  void bind(const Node& target, const Value& v, Scope& scope) {
    if (target.kind == K::Identifier) {
      scope.set(target.name, v);
      return;
    }
    if (!v.is_list()) fail_at(ref_, target.offset, "cannot unpack a {} into {} names", v.type_name(), target.kids.size());
    if (v.items().size() != target.kids.size())
      fail_at(ref_, target.offset, "cannot unpack {} values into {} names", v.items().size(), target.kids.size());
    for (size_t i = 0; i < target.kids.size(); ++i) {
      if (target.kids[i]->kind != K::Identifier) fail_at(ref_, target.kids[i]->offset, "can only unpack into names");
      scope.set(target.kids[i]->name, v.items()[i]);
    }
  }

  void for_loop(const Node& n, Scope& outer, std::string& out) {
    Scope scope(&outer);
    Value iterable = eval(*n.kids[1], scope);
    if (iterable.kind() == Value::Kind::Dict) {
      List keys;
      for (const auto& e : iterable.entries()) keys.emplace_back(e.first);
      iterable = Value::list(std::move(keys));
    }
    if (!iterable.is_list()) fail_at(ref_, n.kids[1]->offset, "for: cannot loop over a {} (lists and dicts only)", iterable.type_name());
    List items;
    for (const Value& item : iterable.items()) {
      if (n.kids[2]) {
        Scope test_scope(&scope);
        bind(*n.kids[0], item, test_scope);
        if (!eval(*n.kids[2], test_scope).truthy()) continue;
      }
      items.push_back(item);
    }
    bool iterated = false;
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++steps_ > kMaxSteps) fail_at(ref_, n.offset, "the template runs more than {} steps", kMaxSteps);
      scope.set("loop", Value::dict({{"index", Value(i + 1)},
                                     {"index0", Value(i)},
                                     {"revindex", Value(len - i)},
                                     {"revindex0", Value(len - i - 1)},
                                     {"first", Value(i == 0)},
                                     {"last", Value(i == len - 1)},
                                     {"length", Value(len)},
                                     {"previtem", i > 0 ? items[i - 1] : Value()},
                                     {"nextitem", i < len - 1 ? items[i + 1] : Value()}}));
      bind(*n.kids[0], items[i], scope);
      try {
        out += block(n.body, scope);
      } catch (const ContinueSignal&) {
        continue;
      } catch (const BreakSignal&) {
        break;
      }
      iterated = true;
    }
    if (!iterated) out += block(n.alternate, scope);
  }

  void assign(const Node& n, Scope& scope) {
    const Value v = n.kids[1] ? eval(*n.kids[1], scope) : Value(block(n.body, scope));
    const Node& target = *n.kids[0];
    if (target.kind != K::Attribute) {
      bind(target, v, scope);
      return;
    }
    Value object = eval(*target.kids[0], scope);
    if (object.kind() != Value::Kind::Namespace)
      fail_at(ref_, target.offset, "set: can only assign attributes of a namespace(), not of a {}", object.type_name());
    std::unordered_set<const void*> seen;
    if (holds(v, &object.entries(), seen))
      fail_at(ref_, target.offset,
              "set: the value for '{}' holds the namespace itself (a namespace cannot contain itself)", target.name);
    object.set(target.name, v);
  }

  void define_macro(const Node& n, Scope& scope) {
    const Node* node = &n;
    scope.set(n.name, Value::function([this, node](const Args& a, Scope& caller) {
      if (macro_depth_ >= kMaxMacroDepth) builtin_error("macro '{}': calls nested deeper than {}", node->name, kMaxMacroDepth);
      ++macro_depth_;
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{macro_depth_};
      Scope local(&caller);
      const auto& params = node->kids;
      if (a.positional.size() > params.size())
        builtin_error("macro '{}' takes at most {} arguments, got {}", node->name, params.size(), a.positional.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const Node& p = *params[i];
        if (const Value* given = a.get(i, p.name)) {
          local.set(p.name, *given);
        } else {
          local.set(p.name, p.kind == K::Keyword ? eval(*p.kids[0], local) : Value());
        }
      }
      for (const auto& [k, v] : a.keyword) {
        bool known = false;
        for (const NodePtr& p : params) known = known || p->name == k;
        if (!known) builtin_error("macro '{}' has no parameter '{}'", node->name, k);
      }
      return Value(block(node->body, local));
    }));
  }

  Args arguments(const Node& n, size_t first, Scope& scope) {
    Args a;
    for (size_t i = first; i < n.kids.size(); ++i) {
      const Node& k = *n.kids[i];
      if (k.kind == K::Keyword) {
        a.keyword.emplace_back(k.name, eval(*k.kids[0], scope));
      } else {
        a.positional.push_back(eval(k, scope));
      }
    }
    return a;
  }

  // Runs a builtin, turning its errors into errors at `n`.
  template <class F>
  Value at(const Node& n, F&& f) {
    try {
      return f();
    } catch (const BuiltinError& e) {
      fail_at(ref_, n.offset, "{}", e.what());
    } catch (const RaisedException& e) {
      fail_at(ref_, n.offset, "raise_exception: {}", e.what());
    }
  }

  Value eval(const Node& n, Scope& scope) {
    if (++steps_ > kMaxSteps) fail_at(ref_, n.offset, "the template runs more than {} steps", kMaxSteps);
    switch (n.kind) {
      case K::Literal: return n.literal;
      case K::Identifier: {
        const Value* v = scope.lookup(n.name);
        return v ? *v : Value();
      }
      case K::List:
      case K::Tuple: {
        List items;
        for (const NodePtr& k : n.kids) items.push_back(eval(*k, scope));
        return Value::list(std::move(items));
      }
      case K::Dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          const Value key = eval(*n.kids[i], scope);
          if (!key.is_string()) fail_at(ref_, n.kids[i]->offset, "dict keys must be strings, got {}", key.type_name());
          d.set(key.as_string(), eval(*n.kids[i + 1], scope));
        }
        return d;
      }
      case K::Attribute: {
        const Value object = eval(*n.kids[0], scope);
        if (object.is_list() && !n.name.empty() && std::isdigit(static_cast<unsigned char>(n.name[0]))) {
          int64_t i = 0;
          const auto r = std::from_chars(n.name.data(), n.name.data() + n.name.size(), i);
          return r.ec == std::errc() ? index(n, object, Value(i)) : Value();
        }
        return get_attribute(object, n.name);
      }
      case K::Subscript: return index(n, eval(*n.kids[0], scope), eval(*n.kids[1], scope));
      case K::Slice: return slice(n, scope);
      case K::Call: {
        Args a = arguments(n, 1, scope);
        const Value f = eval(*n.kids[0], scope);
        if (f.kind() != Value::Kind::Function)
          fail_at(ref_, n.offset, "cannot call a {} (it is not a function or method)", f.type_name());
        return at(n, [&] { return f.as_function()(a, scope); });
      }
      case K::Filter: {
        const Value operand = eval(*n.kids[0], scope);
        Args a = arguments(n, 1, scope);
        return at(n, [&] { return apply_filter(n.name, operand, a); });
      }
      case K::Test: {
        const Value operand = eval(*n.kids[0], scope);
        return at(n, [&] { return Value(apply_test(n.name, operand) != n.negate); });
      }
      case K::Unary: return unary(n, eval(*n.kids[0], scope));
      case K::Binary: return binary(n, scope);
      case K::Ternary: return eval(*n.kids[eval(*n.kids[0], scope).truthy() ? 1 : 2], scope);
      case K::Select: return eval(*n.kids[1], scope).truthy() ? eval(*n.kids[0], scope) : Value();
      default: fail_at(ref_, n.offset, "a tag cannot be used as an expression");
    }
  }

  Value index(const Node& n, const Value& object, const Value& key) {
    if (object.is_mapping()) {
      if (!key.is_string()) fail_at(ref_, n.offset, "a dict is indexed by strings, got {}", key.type_name());
      return get_attribute(object, key.as_string());
    }
    if ((object.is_list() || object.is_string()) && key.kind() == Value::Kind::Int) {
      if (object.is_list()) {
        const auto size = static_cast<int64_t>(object.items().size());
        const int64_t i = key.as_int() < 0 ? key.as_int() + size : key.as_int();
        return i >= 0 && i < size ? object.items()[static_cast<size_t>(i)] : Value();
      }
      const std::u32string cps = code_points(object.as_string());
      const auto size = static_cast<int64_t>(cps.size());
      const int64_t i = key.as_int() < 0 ? key.as_int() + size : key.as_int();
      return i >= 0 && i < size ? Value(from_code_points(cps.substr(static_cast<size_t>(i), 1))) : Value();
    }
    if (key.is_string()) return get_attribute(object, key.as_string());
    if (object.is_undefined() || object.is_none()) return Value();
    fail_at(ref_, n.offset, "cannot index a {} with a {}", object.type_name(), key.type_name());
  }

  Value slice(const Node& n, Scope& scope) {
    const Value object = eval(*n.kids[0], scope);
    std::optional<int64_t> bound[3];
    for (int i = 0; i < 3; ++i) {
      if (!n.kids[i + 1]) continue;
      const Value b = eval(*n.kids[i + 1], scope);
      if (b.is_undefined()) continue;
      if (b.kind() != Value::Kind::Int) fail_at(ref_, n.kids[i + 1]->offset, "slice bounds must be integers, got {}", b.type_name());
      bound[i] = b.as_int();
    }
    const int64_t step = bound[2].value_or(1);
    if (step == 0) fail_at(ref_, n.offset, "slice step cannot be zero");
    auto pick = [&](int64_t size, auto&& take) {
      int64_t start, stop;
      if (step > 0) {
        start = bound[0] ? (*bound[0] < 0 ? std::max<int64_t>(size + *bound[0], 0) : std::min(*bound[0], size)) : 0;
        stop = bound[1] ? (*bound[1] < 0 ? std::max<int64_t>(size + *bound[1], 0) : std::min(*bound[1], size)) : size;
        for (int64_t i = start; i < stop; i += step) take(i);
      } else {
        start = bound[0] ? (*bound[0] < 0 ? std::max<int64_t>(size + *bound[0], -1) : std::min(*bound[0], size - 1))
                         : size - 1;
        stop = bound[1] ? (*bound[1] < -1 ? std::max<int64_t>(size + *bound[1], -1) : std::min(*bound[1], size - 1))
                        : -1;
        for (int64_t i = start; i > stop; i += step) take(i);
      }
    };
    if (object.is_list()) {
      List out;
      pick(static_cast<int64_t>(object.items().size()), [&](int64_t i) { out.push_back(object.items()[i]); });
      return Value::list(std::move(out));
    }
    if (object.is_string()) {
      const std::u32string cps = code_points(object.as_string());
      std::u32string out;
      pick(static_cast<int64_t>(cps.size()), [&](int64_t i) { out += cps[i]; });
      return Value(from_code_points(out));
    }
    fail_at(ref_, n.offset, "cannot slice a {} (lists and strings only)", object.type_name());
  }

  Value unary(const Node& n, const Value& v) {
    if (n.name == "not") return Value(!v.truthy());
    if (v.kind() == Value::Kind::Float) return Value(n.name == "-" ? -v.as_number() : v.as_number());
    if (v.kind() == Value::Kind::Int || v.kind() == Value::Kind::Bool) {
      const int64_t i = v.kind() == Value::Kind::Int ? v.as_int() : (v.as_bool() ? 1 : 0);
      int64_t negated = 0;
      if (n.name == "+") return Value(i);
      return __builtin_sub_overflow(int64_t{0}, i, &negated) ? Value(-v.as_number()) : Value(negated);
    }
    fail_at(ref_, n.offset, "unary '{}' needs a number, got {}", n.name, v.type_name());
  }

  Value binary(const Node& n, Scope& scope) {
    const std::string& op = n.name;
    const Value a = eval(*n.kids[0], scope);
    if (op == "and") return a.truthy() ? eval(*n.kids[1], scope) : a;
    if (op == "or") return a.truthy() ? a : eval(*n.kids[1], scope);
    const Value b = eval(*n.kids[1], scope);
    if (op == "==") return Value(loosely_equal(a, b));
    if (op == "!=") return Value(!loosely_equal(a, b));
    const bool membership = op == "in" || op == "not in";
    if (a.is_undefined() || b.is_undefined()) {
      if (b.is_undefined() && membership) return Value(op == "not in");
      fail_at(ref_, n.offset, "'{}' on an undefined value (left: {}, right: {})", op, a.type_name(), b.type_name());
    }
    if (a.is_none() || b.is_none())
      fail_at(ref_, n.offset, "'{}' on none (left: {}, right: {})", op, a.type_name(), b.type_name());
    if (op == "~" || ((a.is_string() || b.is_string()) && op == "+")) {
      Value joined = at(n, [&] { return Value(concat_text(a) + concat_text(b)); });
      check_size(n, joined.as_string());
      return joined;
    }
    if (a.is_number() && b.is_number()) return arithmetic(n, a, b);
    if (op == "**" && (a.is_number() || a.kind() == Value::Kind::Bool) && (b.is_number() || b.kind() == Value::Kind::Bool))
      return arithmetic(n, Value(a.as_number()), Value(b.as_number()));
    if (a.is_list() && b.is_list() && op == "+") {
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out));
    }
    if (b.is_list() && membership) {
      bool found = false;
      for (const Value& x : b.items()) found = found || strictly_equal(x, a);
      return Value(found == (op == "in"));
    }
    if (a.is_string() && b.is_string() && membership)
      return Value((b.as_string().find(a.as_string()) != std::string::npos) == (op == "in"));
    if (a.is_string() && b.kind() == Value::Kind::Dict && membership) return Value((b.find(a.as_string()) != nullptr) == (op == "in"));
    fail_at(ref_, n.offset, "operator '{}' is not supported between a {} and a {}", op, a.type_name(), b.type_name());
  }

  Value arithmetic(const Node& n, const Value& a, const Value& b) {
    const std::string& op = n.name;
    const bool ints = a.kind() == Value::Kind::Int && b.kind() == Value::Kind::Int;
    const double x = a.as_number(), y = b.as_number();
    if (op == "<") return Value(x < y);
    if (op == ">") return Value(x > y);
    if (op == "<=") return Value(x <= y);
    if (op == ">=") return Value(x >= y);
    if (op == "/") return Value(x / y);
    if (ints) {
      const int64_t i = a.as_int(), j = b.as_int();
      int64_t r = 0;  // on overflow the double below, as JS numbers go
      if (op == "+" && !__builtin_add_overflow(i, j, &r)) return Value(r);
      if (op == "-" && !__builtin_sub_overflow(i, j, &r)) return Value(r);
      if (op == "*" && !__builtin_mul_overflow(i, j, &r)) return Value(r);
      if ((op == "//" || op == "%") && j == 0) fail_at(ref_, n.offset, "integer division by zero");
      if (op == "//") return integral_value(std::floor(x / y));
      if (op == "%") return Value(j == -1 ? int64_t{0} : i % j);  // the sign of the dividend, as in JS
      if (op == "**" && j >= 0) return integral_value(std::pow(x, y));
    }
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "//") return Value(std::floor(x / y));
    if (op == "%") return Value(std::fmod(x, y));
    if (op == "**") return Value(std::pow(x, y));
    fail_at(ref_, n.offset, "operator '{}' is not supported between numbers", op);
  }

  static constexpr size_t kMaxText = size_t{64} << 20;
  static constexpr int64_t kMaxSteps = 4'000'000;  // a runaway loop is an error, not a hang
  int64_t steps_ = 0;
  static constexpr int kMaxMacroDepth = 100;  // a recursive macro must not overflow the stack
  int macro_depth_ = 0;
  SourceRef ref_;
};

}  // namespace

void add_globals(Scope& scope) {
  scope.set("true", Value(true));
  scope.set("false", Value(false));
  scope.set("none", Value::none());
  scope.set("True", Value(true));
  scope.set("False", Value(false));
  scope.set("None", Value::none());
  scope.set("namespace", Value::function(make_namespace));
  scope.set("raise_exception", Value::function([](const Args& a, Scope&) -> Value {
    throw RaisedException(a.positional.empty() ? std::string() : concat_text(a.positional[0]));
  }));
  scope.set("range", Value::function(range));
  scope.set("strftime_now", Value::function(strftime_now));
}

std::string render(const Block& program, Scope& globals, std::string_view source, std::string_view name) {
  Interpreter interpreter(source, name);
  Scope top(&globals);
  try {
    return interpreter.block(program, top);
  } catch (const BreakSignal&) {
    fail("chat template '{}': 'break' outside a for loop", name);
  } catch (const ContinueSignal&) {
    fail("chat template '{}': 'continue' outside a for loop", name);
  }
}

}  // namespace tp::chat
