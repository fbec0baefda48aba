// Syntax tree of a parsed chat template. Built once by the parser, read-only
// while rendering (so one Template serves concurrent renders).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/chat/value.h"

namespace hmoe::chat {

enum class ExprKind : uint8_t {
  literal,  // scalar constant in `literal`
  name,     // variable `name`
  attr,     // args[0].name
  item,     // args[0][args[1]]
  slice,    // args[0][args[1]:args[2]:args[3]], absent parts null
  call,     // args[0](args[1..], kwargs)
  filter,   // args[0] | name(args[1..], kwargs)
  test,     // args[0] is [not] name(args[1..])
  unary,    // name: "-" "+" "not"; args[0]
  binary,   // name: + - * / // % ** ~ and or in notin; args[0], args[1]
  compare,  // args[0] ops[0] args[1] ops[1] args[2] ...
  cond,     // args[1] if args[0] else args[2] (null: undefined)
  list,     // [args...]
  tuple,    // (args...)
  dict,     // {args[0]: args[1], ...}
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // compare
  bool negated = false;          // test
};

enum class NodeKind : uint8_t {
  text,          // text
  output,        // {{ expr }}
  if_,           // branches, else_body
  for_,          // targets in expr [if filter] body [else else_body]
  set,           // targets (or attr on targets[0]) = expr
  set_block,     // {% set targets[0] %}body{% endset %} [| filter]
  macro,         // {% macro text(params) %}body
  call_block,    // {% call(params) expr %}body
  filter_block,  // {% filter expr %}body; expr's operand is null
  break_,
  continue_,
  scope,         // body in its own scope ({% with %}) or none (generation)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro/call params; with-assignments
  bool recursive = false;
  bool new_scope = false;
};

}  // namespace hmoe::chat
