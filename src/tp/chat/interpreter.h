#pragma once
// Renders a syntax tree over variables, with @huggingface/jinja's runtime
// semantics (see value.h). Errors (a failed raise_exception, a type error, an
// unsupported filter or method) are tp::Errors naming the template, line and column.
#include <map>
#include <string>
#include <string_view>

#include "tp/chat/ast.h"
#include "tp/chat/value.h"

namespace tp::chat {

// Variables of one block level; lookups go outwards. A for loop opens one;
// if blocks do not (as in Jinja, `set` inside an if is seen after it).
class Scope {
 public:
  explicit Scope(Scope* parent = nullptr) : parent_(parent) {}
  const Value* lookup(const std::string& name) const;
  void set(const std::string& name, Value v) { vars_[name] = std::move(v); }

 private:
  Scope* parent_;
  std::map<std::string, Value, std::less<>> vars_;
};

// Globals every template sees: namespace, range, raise_exception, strftime_now,
// true/false/none (and True/False/None).
void add_globals(Scope& scope);

std::string render(const Block& program, Scope& globals, std::string_view source, std::string_view name);

}  // namespace tp::chat
