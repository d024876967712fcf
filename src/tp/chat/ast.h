#pragma once
// The syntax tree of a template: one node type; what its fields hold depends
// on its kind (listed next to each kind).
#include <memory>
#include <string>
#include <vector>

#include "tp/chat/value.h"

namespace tp::chat {

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Block = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    // statements
    Text,      // literal: the text
    Output,    // {{ kids[0] }}
    If,        // kids[0]: test; body; alternate (elif is a nested If)
    For,       // kids[0]: target (Identifier/Tuple), kids[1]: iterable, kids[2]: `if` filter or null; body; alternate: else
    Set,       // kids[0]: target (Identifier/Tuple/Member), kids[1]: value, or null and the body renders the value
    Macro,     // name; kids: parameters (Identifier or Keyword with the default); body
    Break,
    Continue,
    // expressions
    Literal,     // literal
    Identifier,  // name
    List,        // kids
    Tuple,       // kids
    Dict,        // kids: key0, value0, key1, value1, ...
    Attribute,   // kids[0].name
    Subscript,   // kids[0][kids[1]]
    Slice,       // kids[0][kids[1]:kids[2]:kids[3]], each bound may be null
    Call,        // kids[0](kids[1..]); keyword arguments are Keyword nodes
    Keyword,     // name=kids[0]
    Filter,      // kids[0] | name(kids[1..])
    Test,        // kids[0] is [not] name (negate)
    Unary,       // name: "not", "-", "+"; kids[0]
    Binary,      // kids[0] name kids[1]
    Ternary,     // kids[1] if kids[0] else kids[2]
    Select,      // kids[0] if kids[1] (undefined when false)
  };
  Kind kind;
  size_t offset = 0;  // in the source, for errors
  std::string name;
  Value literal;
  bool negate = false;
  std::vector<NodePtr> kids;
  Block body, alternate;
};

}  // namespace tp::chat
