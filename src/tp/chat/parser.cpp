#include "tp/chat/parser.h"

#include <charconv>
#include <initializer_list>

#include "tp/chat/lexer.h"
#include "tp/chat/source_error.h"

namespace tp::chat {
namespace {

using K = Node::Kind;
using T = TokenType;

NodePtr make(K kind, size_t offset) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->offset = offset;
  return n;
}

const char* describe(T type) {
  switch (type) {
    case T::Text: return "text";
    case T::Number: return "a number";
    case T::String: return "a string";
    case T::Identifier: return "a name";
    case T::OpenStatement: return "'{%'";
    case T::CloseStatement: return "'%}'";
    case T::OpenExpression: return "'{{'";
    case T::CloseExpression: return "'}}'";
    case T::OpenParen: return "'('";
    case T::CloseParen: return "')'";
    case T::OpenBracket: return "'['";
    case T::CloseBracket: return "']'";
    case T::OpenBrace: return "'{'";
    case T::CloseBrace: return "'}'";
    case T::Comma: return "','";
    case T::Dot: return "'.'";
    case T::Colon: return "':'";
    case T::Pipe: return "'|'";
    case T::Equals: return "'='";
    default: return "an operator";
  }
}

class Parser {
 public:
  Parser(std::string_view source, std::string_view name) : ref_{source, name}, tokens_(tokenize(source, name)) {}

  Block run() {
    Block program;
    while (i_ < tokens_.size()) program.push_back(any());
    return program;
  }

 private:
  template <class... Args>
  [[noreturn]] void fail_here(fmt::format_string<Args...> format, Args&&... args) {
    fail_at(ref_, here_offset(), format, std::forward<Args>(args)...);
  }
  size_t here_offset() const { return i_ < tokens_.size() ? tokens_[i_].offset : ref_.source.size(); }
  std::string here_text() const {
    if (i_ >= tokens_.size()) return "the end of the template";
    const Token& t = tokens_[i_];
    return t.type == T::Identifier ? fmt::format("'{}'", t.value) : describe(t.type);
  }

  bool is(T type) const { return i_ < tokens_.size() && tokens_[i_].type == type; }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return i_ + ahead < tokens_.size() && tokens_[i_ + ahead].type == T::Identifier && tokens_[i_ + ahead].value == name;
  }
  // At "{% name" for one of the names?
  bool at_tag(std::initializer_list<std::string_view> names) const {
    if (!is(T::OpenStatement)) return false;
    for (std::string_view n : names)
      if (is_name(n, 1)) return true;
    return false;
  }
  const Token& expect(T type, std::string_view context) {
    if (!is(type)) fail_here("expected {} {}, got {}", describe(type), context, here_text());
    return tokens_[i_++];
  }
  void expect_end_tag(std::string_view end, const Node& opener) {
    if (i_ >= tokens_.size()) {
      const SourcePosition p = position_of(ref_.source, opener.offset);
      fail_here("missing {{% {} %}} for the tag at line {}, column {}", end, p.line, p.column);
    }
    expect(T::OpenStatement, fmt::format("before '{}'", end));
    if (!is_name(end)) fail_here("expected '{}', got {}", end, here_text());
    ++i_;
    expect(T::CloseStatement, fmt::format("after '{}'", end));
  }
  // Parses statements until "{% one-of-names"; errors at the end of the template.
  Block block_until(std::initializer_list<std::string_view> names, const Node& opener, std::string_view end) {
    Block b;
    while (!at_tag(names)) {
      if (i_ >= tokens_.size()) {
        const SourcePosition p = position_of(ref_.source, opener.offset);
        fail_here("missing {{% {} %}} for the tag at line {}, column {}", end, p.line, p.column);
      }
      b.push_back(any());
    }
    return b;
  }

  NodePtr any() {
    const Token& t = tokens_[i_];
    switch (t.type) {
      case T::Text: {
        NodePtr n = make(K::Text, t.offset);
        n->literal = Value(t.value);
        ++i_;
        return n;
      }
      case T::OpenStatement: return statement();
      case T::OpenExpression: {
        NodePtr n = make(K::Output, t.offset);
        ++i_;
        n->kids.push_back(expression());
        expect(T::CloseExpression, "to end the expression");
        return n;
      }
      default: fail_here("unexpected {} outside a tag", describe(t.type));
    }
  }

  NodePtr statement() {
    DepthGuard guard(*this);
    const size_t open = tokens_[i_++].offset;
    if (!is(T::Identifier)) fail_here("expected a tag name after '{{%', got {}", here_text());
    const std::string name = tokens_[i_++].value;
    if (name == "if") {
      NodePtr n = if_statement(open);
      expect_end_tag("endif", *n);
      return n;
    }
    if (name == "for") return for_statement(open);
    if (name == "set") return set_statement(open);
    if (name == "macro") return macro_statement(open);
    if (name == "break" || name == "continue") {
      expect(T::CloseStatement, fmt::format("after '{}'", name));
      return make(name == "break" ? K::Break : K::Continue, open);
    }
    --i_;
    fail_here("unsupported tag '{}' (supported: if, elif, else, for, set, macro, break, continue)", name);
  }

  NodePtr if_statement(size_t open) {
    NodePtr n = make(K::If, open);
    n->kids.push_back(expression());
    expect(T::CloseStatement, "after the if condition");
    n->body = block_until({"elif", "else", "endif"}, *n, "endif");
    if (is_name("elif", 1)) {
      const size_t elif = tokens_[i_].offset;
      i_ += 2;
      n->alternate.push_back(if_statement(elif));
    } else if (is_name("else", 1)) {
      i_ += 2;
      expect(T::CloseStatement, "after 'else'");
      n->alternate = block_until({"endif"}, *n, "endif");
    }
    return n;
  }

  NodePtr for_statement(size_t open) {
    NodePtr n = make(K::For, open);
    n->kids.push_back(sequence(/*primary=*/true));
    if (n->kids[0]->kind != K::Identifier && n->kids[0]->kind != K::Tuple)
      fail_at(ref_, n->kids[0]->offset, "the loop variable must be a name or names separated by commas");
    if (!is_name("in")) fail_here("expected 'in' after the loop variable, got {}", here_text());
    ++i_;
    NodePtr iterable = expression();
    if (iterable->kind == K::Select) {  // for x in xs if cond
      n->kids.push_back(std::move(iterable->kids[0]));
      n->kids.push_back(std::move(iterable->kids[1]));
    } else {
      n->kids.push_back(std::move(iterable));
      n->kids.push_back(nullptr);
    }
    expect(T::CloseStatement, "after the for loop's iterable");
    n->body = block_until({"else", "endfor"}, *n, "endfor");
    if (is_name("else", 1)) {
      i_ += 2;
      expect(T::CloseStatement, "after 'else'");
      n->alternate = block_until({"endfor"}, *n, "endfor");
    }
    expect_end_tag("endfor", *n);
    return n;
  }

  NodePtr set_statement(size_t open) {
    NodePtr n = make(K::Set, open);
    n->kids.push_back(sequence(false));
    const K target = n->kids[0]->kind;
    if (target != K::Identifier && target != K::Tuple && target != K::Attribute)
      fail_at(ref_, n->kids[0]->offset, "set: can only assign to a name, names or a namespace attribute (ns.x)");
    if (is(T::Equals)) {
      ++i_;
      n->kids.push_back(sequence(false));
      expect(T::CloseStatement, "after the set value");
    } else {
      expect(T::CloseStatement, "or '=' after the set target");
      n->kids.push_back(nullptr);
      n->body = block_until({"endset"}, *n, "endset");
      expect_end_tag("endset", *n);
    }
    return n;
  }

  NodePtr macro_statement(size_t open) {
    NodePtr n = make(K::Macro, open);
    if (!is(T::Identifier)) fail_here("expected the macro's name, got {}", here_text());
    n->name = tokens_[i_++].value;
    n->kids = arguments(/*parameters=*/true);
    expect(T::CloseStatement, "after the macro's parameters");
    n->body = block_until({"endmacro"}, *n, "endmacro");
    expect_end_tag("endmacro", *n);
    return n;
  }

  // a, b, c (a Tuple) or a single expression.
  NodePtr sequence(bool primary) {
    const size_t start = here_offset();
    NodePtr first = primary ? primary_expression() : expression();
    if (!is(T::Comma)) return first;
    NodePtr tuple = make(K::Tuple, start);
    tuple->kids.push_back(std::move(first));
    while (is(T::Comma)) {
      ++i_;
      tuple->kids.push_back(primary ? primary_expression() : expression());
    }
    return tuple;
  }

  // Bounds the recursion of nested expressions and blocks (a crafted template
  // must not overflow the stack).
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail_here("nesting deeper than {} levels is not supported", kMaxDepth);
    }
    ~DepthGuard() { --p.depth_; }
  };
  static constexpr int kMaxDepth = 256;

  NodePtr expression() {
    DepthGuard guard(*this);
    NodePtr a = or_expression();
    if (!is_name("if")) return a;
    const size_t at = tokens_[i_++].offset;
    NodePtr test = or_expression();
    if (is_name("else")) {
      ++i_;
      NodePtr n = make(K::Ternary, at);
      n->kids.push_back(std::move(test));
      n->kids.push_back(std::move(a));
      n->kids.push_back(expression());
      return n;
    }
    NodePtr n = make(K::Select, at);
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(test));
    return n;
  }

  NodePtr binary(std::string op, size_t at, NodePtr left, NodePtr right) {
    NodePtr n = make(K::Binary, at);
    n->name = std::move(op);
    n->kids.push_back(std::move(left));
    n->kids.push_back(std::move(right));
    return n;
  }

  NodePtr or_expression() {
    NodePtr left = and_expression();
    while (is_name("or")) {
      const size_t at = tokens_[i_++].offset;
      left = binary("or", at, std::move(left), and_expression());
    }
    return left;
  }
  NodePtr and_expression() {
    NodePtr left = not_expression();
    while (is_name("and")) {
      const size_t at = tokens_[i_++].offset;
      left = binary("and", at, std::move(left), not_expression());
    }
    return left;
  }
  NodePtr not_expression() {
    if (!is_name("not")) return comparison();
    DepthGuard guard(*this);
    NodePtr n = make(K::Unary, tokens_[i_++].offset);
    n->name = "not";
    n->kids.push_back(not_expression());
    return n;
  }
  NodePtr comparison() {
    NodePtr left = additive();
    while (true) {
      std::string op;
      const size_t at = here_offset();
      if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        i_ += 2;
      } else if (is_name("in") || is(T::Comparison)) {
        op = tokens_[i_++].value;
      } else {
        return left;
      }
      left = binary(op, at, std::move(left), additive());
    }
  }
  NodePtr additive() {
    NodePtr left = multiplicative();
    while (is(T::Additive)) {
      const Token& t = tokens_[i_++];
      left = binary(t.value, t.offset, std::move(left), multiplicative());
    }
    return left;
  }
  NodePtr multiplicative() {
    NodePtr left = power();
    while (is(T::Multiplicative)) {
      const Token& t = tokens_[i_++];
      left = binary(t.value, t.offset, std::move(left), power());
    }
    return left;
  }
  NodePtr power() {
    NodePtr left = test_expression();
    while (is(T::Power)) {
      const Token& t = tokens_[i_++];
      left = binary("**", t.offset, std::move(left), test_expression());
    }
    return left;
  }
  NodePtr test_expression() {
    NodePtr operand = filter_expression();
    while (is_name("is")) {
      NodePtr n = make(K::Test, tokens_[i_++].offset);
      if (is_name("not")) {
        n->negate = true;
        ++i_;
      }
      // none/true/false are names here, not the constants.
      if (!is(T::Identifier)) fail_here("expected a test name after 'is', got {}", here_text());
      n->name = tokens_[i_++].value;
      if (is(T::OpenParen)) fail_here("tests with arguments (is {}(...)) are not supported", n->name);
      n->kids.push_back(std::move(operand));
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr filter_expression() {
    NodePtr operand = unary();
    while (is(T::Pipe)) {
      ++i_;
      if (!is(T::Identifier)) fail_here("expected a filter name after '|', got {}", here_text());
      NodePtr n = make(K::Filter, tokens_[i_].offset);
      n->name = tokens_[i_++].value;
      n->kids.push_back(std::move(operand));
      if (is(T::OpenParen))
        for (NodePtr& a : arguments(false)) n->kids.push_back(std::move(a));
      operand = std::move(n);
    }
    return operand;
  }
  NodePtr unary() {
    DepthGuard guard(*this);  // - - - x and not not x recurse here
    if (is(T::Additive) && (tokens_[i_].value == "-" || tokens_[i_].value == "+")) {
      NodePtr n = make(K::Unary, tokens_[i_].offset);
      n->name = tokens_[i_++].value;
      n->kids.push_back(unary());
      return n;
    }
    return postfix(primary_expression());
  }

  // Calls, .attributes and [subscripts] / [slices] after a primary.
  NodePtr postfix(NodePtr object) {
    while (true) {
      if (is(T::OpenParen)) {
        NodePtr n = make(K::Call, object->offset);  // errors point at the callee
        n->kids.push_back(std::move(object));
        for (NodePtr& a : arguments(false)) n->kids.push_back(std::move(a));
        object = std::move(n);
      } else if (is(T::Dot)) {
        ++i_;
        NodePtr n = make(K::Attribute, here_offset());
        if (is(T::Identifier) || is(T::Number)) {
          n->name = tokens_[i_++].value;
        } else {
          fail_here("expected an attribute name after '.', got {}", here_text());
        }
        n->kids.push_back(std::move(object));
        object = std::move(n);
      } else if (is(T::OpenBracket)) {
        object = subscript(std::move(object));
      } else {
        return object;
      }
    }
  }

  NodePtr subscript(NodePtr object) {
    const size_t at = tokens_[i_++].offset;
    std::vector<NodePtr> parts(1);
    bool slice = false;
    while (!is(T::CloseBracket)) {
      if (i_ >= tokens_.size()) fail_here("expected ']'");
      if (is(T::Colon)) {
        ++i_;
        slice = true;
        parts.emplace_back();
        if (parts.size() > 3) fail_here("a slice takes at most 3 parts (start:stop:step)");
      } else {
        if (parts.back()) fail_here("expected ':' or ']' in a subscript, got {}", here_text());
        parts.back() = expression();
      }
    }
    ++i_;
    NodePtr n = make(slice ? K::Slice : K::Subscript, at);
    if (!slice && !parts[0]) fail_at(ref_, at, "empty subscript []");
    n->kids.push_back(std::move(object));
    if (slice) parts.resize(3);
    for (NodePtr& p : parts) n->kids.push_back(std::move(p));
    return n;
  }

  // (a, b, k=v): positional then keyword arguments; `parameters`: a macro's names with defaults.
  std::vector<NodePtr> arguments(bool parameters) {
    expect(T::OpenParen, parameters ? "to open the macro's parameters" : "to open the arguments");
    std::vector<NodePtr> args;
    bool keyword_seen = false;
    while (!is(T::CloseParen)) {
      if (i_ >= tokens_.size()) fail_here("expected ')'");
      if (is(T::Multiplicative) || is(T::Power)) fail_here("argument unpacking (* / **) is not supported");
      NodePtr a = expression();
      if (is(T::Equals)) {
        ++i_;
        if (a->kind != K::Identifier) fail_at(ref_, a->offset, "a keyword argument needs a name before '='");
        NodePtr kw = make(K::Keyword, a->offset);
        kw->name = a->name;
        kw->kids.push_back(expression());
        a = std::move(kw);
        keyword_seen = true;
      } else if (keyword_seen) {
        fail_at(ref_, a->offset, parameters ? "a parameter without default follows one with a default"
                                            : "a positional argument follows a keyword argument");
      }
      if (parameters && a->kind != K::Identifier && a->kind != K::Keyword)
        fail_at(ref_, a->offset, "a macro parameter must be a name (or name=default)");
      args.push_back(std::move(a));
      if (is(T::Comma)) {
        ++i_;
      } else if (!is(T::CloseParen)) {
        fail_here("expected ',' or ')' in the arguments, got {}", here_text());
      }
    }
    ++i_;
    return args;
  }

  NodePtr primary_expression() {
    if (i_ >= tokens_.size()) fail_here("expected an expression, got the end of the template");
    const Token& t = tokens_[i_++];
    switch (t.type) {
      case T::Number: {
        NodePtr n = make(K::Literal, t.offset);
        if (t.value.find('.') != std::string::npos) {
          double d = 0;
          const auto r = std::from_chars(t.value.data(), t.value.data() + t.value.size(), d);
          if (r.ec != std::errc()) fail_at(ref_, t.offset, "number literal {} is out of range", t.value);
          n->literal = Value(d);
        } else {
          int64_t v = 0;
          const auto r = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
          if (r.ec != std::errc()) fail_at(ref_, t.offset, "integer literal {} is out of range", t.value);
          n->literal = Value(v);
        }
        return n;
      }
      case T::String: {
        NodePtr n = make(K::Literal, t.offset);
        std::string s = t.value;
        while (is(T::String)) s += tokens_[i_++].value;  // 'a' 'b' is 'ab'
        n->literal = Value(std::move(s));
        return n;
      }
      case T::Identifier: {
        NodePtr n = make(K::Identifier, t.offset);
        n->name = t.value;
        return n;
      }
      case T::OpenParen: {
        NodePtr n = sequence(false);
        expect(T::CloseParen, "to close the parenthesis");
        return n;
      }
      case T::OpenBracket: {
        NodePtr n = make(K::List, t.offset);
        while (!is(T::CloseBracket)) {
          n->kids.push_back(expression());
          if (is(T::Comma)) {
            ++i_;
          } else if (!is(T::CloseBracket)) {
            fail_here("expected ',' or ']' in a list, got {}", here_text());
          }
        }
        ++i_;
        return n;
      }
      case T::OpenBrace: {
        NodePtr n = make(K::Dict, t.offset);
        while (!is(T::CloseBrace)) {
          n->kids.push_back(expression());
          expect(T::Colon, "between a key and its value");
          n->kids.push_back(expression());
          if (is(T::Comma)) {
            ++i_;
          } else if (!is(T::CloseBrace)) {
            fail_here("expected ',' or '}}' in a dict, got {}", here_text());
          }
        }
        ++i_;
        return n;
      }
      default: --i_; fail_here("expected an expression, got {}", here_text());
    }
  }

  SourceRef ref_;
  std::vector<Token> tokens_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Block parse_template(std::string_view source, std::string_view name) { return Parser(source, name).run(); }

}  // namespace tp::chat
