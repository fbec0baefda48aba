// Tree-walking Jinja2 interpreter. A Template is parsed once and is
// immutable; each render creates an Interpreter that owns all values the
// render makes (its Arena) and enforces the RenderLimits. Errors are thrown
// as hmoe::Error(invalid_argument) naming the template line.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/chat/ast.h"
#include "engine/text/chat/chat_template.h"
#include "engine/text/chat/value.h"

namespace hmoe::chat {

class Template {
 public:
  explicit Template(const std::string& source);  // throws hmoe::Error(bad_model)
  // context: a JSON object of the template's variables.
  std::string render(const nlohmann::ordered_json& context, const RenderLimits& limits) const;

 private:
  Body body_;
};

struct Scope : HeapItem {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value v);
};

enum class Flow : uint8_t { normal, break_, continue_ };

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits);

  Arena arena;
  const RenderLimits limits;

  Flow exec(const Body& body, Scope* scope, std::string& out);
  Value eval(const Expr& e, Scope* scope);
  // Renders a body into a fresh string, in a child scope (macros, blocks).
  std::string capture(const Body& body, Scope* scope);

  Value get_attr(const Value& obj, std::string_view name);
  Value get_item(const Value& obj, const Value& key);
  Value call(const Value& callee, CallArgs& args);
  void append(std::string& out, std::string_view s);
  void count_iterations(size_t n);
  void check_string(size_t bytes);
  [[noreturn]] void undefined_error(const Value& undef);
  std::vector<Value> iterate(const Value& v);  // Python iter(): list items, dict keys, str chars

  // builtins.cpp
  Value filter(const std::string& name, const Value& operand, CallArgs& args);
  bool test(const std::string& name, const Value& operand, CallArgs& args);
  Value method(const Value& self, const std::string& name, CallArgs& args);
  bool is_method(const Value& self, std::string_view name) const;
  bool is_global_function(std::string_view name) const;
  Value call_global(const std::string& name, CallArgs& args);
  bool contains(const Value& container, const Value& item);

  int call_depth = 0;
  int current_line() const { return line_; }

 private:
  Flow exec_node(const Node& n, Scope* scope, std::string& out);
  Flow exec_for(const Node& n, Scope* scope, std::string& out, const Value& iterable, int depth);
  Value eval_binary(const Expr& e, Scope* scope);
  Value eval_slice(const Expr& e, Scope* scope);
  Value eval_call(const Expr& e, Scope* scope);
  void eval_args(const Expr& e, size_t first, Scope* scope, CallArgs& args);
  friend struct LoopObject;

  size_t iterations_ = 0;
  int line_ = 0;
};

// Python arithmetic (used by the interpreter and by filters such as sum).
Value py_add(const Value& a, const Value& b, Interpreter& in);
// fmt % arg (printf-style: %s %r %d %i %f %e %g %%, %(name)s with a dict).
Value percent_format(const std::string& fmt, const Value& arg, Interpreter& in);

}  // namespace hmoe::chat
