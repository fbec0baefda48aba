// Statement execution and expression evaluation with jinja2's semantics:
// for-loops and macros get their own scope, if/set do not; undefined values
// print as "" but fail when used as objects; attribute lookup tries the
// Python attribute first and the item second (subscripts the other way).
#include "engine/text/chat/interpreter.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "configs/error.h"
#include "engine/text/chat/parser.h"

namespace hmoe::chat {

// ---- scopes and callables -----------------------------------------------------

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent)
    for (auto& kv : s->vars)
      if (kv.first == name) return &kv.second;
  return nullptr;
}

void Scope::set(std::string_view name, Value v) {
  for (auto& kv : vars)
    if (kv.first == name) {
      kv.second = std::move(v);
      return;
    }
  vars.emplace_back(std::string(name), std::move(v));
}

namespace {

struct CallDepth {
  Interpreter& in;
  explicit CallDepth(Interpreter& i) : in(i) {
    if (++in.call_depth > in.limits.max_call_depth)
      raise_error("RecursionError", "macro calls nested deeper than " +
                                        std::to_string(in.limits.max_call_depth));
  }
  ~CallDepth() { --in.call_depth; }
};

// A macro, or the caller() of a call block.
struct Macro : Callable {
  const Node* def = nullptr;
  Scope* closure = nullptr;
  Value caller;  // set for macros invoked from a call block
  std::string name_;
  std::string name() const override { return name_; }

  Value call(Interpreter& in, CallArgs& args) override {
    CallDepth guard(in);
    Scope* s = in.arena.make<Scope>();
    s->parent = closure;
    size_t np = def->params.size();
    std::vector<Value> extra;
    for (size_t k = 0; k < args.args.size(); ++k) {
      if (k < np) s->set(def->params[k].first, args.args[k]);
      else extra.push_back(args.args[k]);
    }
    Dict* kw = in.arena.dict();
    for (auto& kv : args.kwargs) {
      if (kv.first == "caller") {
        s->set("caller", kv.second);
        continue;
      }
      bool is_param = false;
      for (auto& p : def->params) is_param |= p.first == kv.first;
      if (is_param) s->set(kv.first, kv.second);
      else kw->set(Value::string(kv.first), kv.second);
    }
    for (size_t k = 0; k < np; ++k) {
      const auto& p = def->params[k];
      bool bound = false;
      for (auto& kv : s->vars) bound |= kv.first == p.first;
      if (!bound)
        s->set(p.first, p.second ? in.eval(*p.second, s)
                                 : Value::undefined("parameter '" + p.first + "' was not provided"));
    }
    s->set("varargs", Value::of(in.arena.list(std::move(extra), true)));
    s->set("kwargs", Value::of(kw));
    if (!caller.is_undefined()) s->set("caller", caller);
    return Value::string(in.capture(def->body, s));
  }
};

struct BoundMethod : Callable {
  Value self;
  std::string method;
  std::string name() const override { return method; }
  Value call(Interpreter& in, CallArgs& args) override { return in.method(self, method, args); }
};

struct GlobalFunction : Callable {
  std::string fn;
  std::string name() const override { return fn; }
  Value call(Interpreter& in, CallArgs& args) override { return in.call_global(fn, args); }
};

}  // namespace

// Loop objects are callable for recursive loops: loop(children).
struct LoopObject : Callable {
  LoopInfo info;
  const Node* node = nullptr;
  Scope* scope = nullptr;
  std::string name() const override { return "loop"; }
  Value call(Interpreter& in, CallArgs& args) override {
    if (!node || !node->recursive) raise_error("TypeError", "'LoopContext' object is not callable");
    if (args.args.size() != 1) raise_error("TypeError", "loop() takes exactly one argument");
    CallDepth guard(in);
    std::string out;
    in.exec_for(*node, scope, out, args.args[0], int(info.depth0) + 1);
    return Value::string(std::move(out));
  }
};

// ---- interpreter ------------------------------------------------------------

Interpreter::Interpreter(const RenderLimits& l)
    : arena(l.max_heap_items, l.max_value_depth), limits(l) {}

void Interpreter::append(std::string& out, std::string_view s) {
  if (out.size() + s.size() > limits.max_output_bytes)
    raise_error("LimitError", "rendered text exceeds " + std::to_string(limits.max_output_bytes) + " bytes");
  out.append(s);
}

void Interpreter::check_string(size_t bytes) {
  if (bytes > limits.max_output_bytes)
    raise_error("LimitError", "string exceeds " + std::to_string(limits.max_output_bytes) + " bytes");
}

void Interpreter::count_iterations(size_t n) {
  iterations_ += n;
  if (iterations_ > limits.max_loop_iterations)
    raise_error("LimitError", "more than " + std::to_string(limits.max_loop_iterations) +
                                  " loop iterations in one render");
}

void Interpreter::undefined_error(const Value& undef) {
  raise_error("UndefinedError", undef.s.empty() ? "value is undefined" : undef.s);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.type) {
    case Type::list: return v.u.list->items;
    case Type::dict: {
      std::vector<Value> keys;
      keys.reserve(v.u.dict->items.size());
      for (auto& kv : v.u.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Type::string: {
      std::vector<Value> chars;
      std::u32string cps = utf8_decode(v.s);
      arena.charge(cps.size());
      chars.reserve(cps.size());
      for (char32_t c : cps) {
        std::string ch;
        utf8_append(ch, c);
        chars.push_back(Value::string(std::move(ch)));
      }
      return chars;
    }
    case Type::undefined: return {};
    default: raise_error("TypeError", "'" + type_name(v) + "' object is not iterable");
  }
}

std::string Interpreter::capture(const Body& body, Scope* scope) {
  std::string out;
  Flow f = exec(body, scope, out);
  (void)f;
  return out;
}

Flow Interpreter::exec(const Body& body, Scope* scope, std::string& out) {
  for (auto& n : body) {
    Flow f = exec_node(*n, scope, out);
    if (f != Flow::normal) return f;
  }
  return Flow::normal;
}

static void assign_targets(Interpreter& in, Scope* s, const std::vector<std::string>& targets,
                           const Value& v) {
  if (targets.size() == 1) {
    s->set(targets[0], v);
    return;
  }
  std::vector<Value> items = in.iterate(v);
  if (items.size() != targets.size())
    raise_error("ValueError", "cannot unpack " + std::to_string(items.size()) + " values into " +
                                  std::to_string(targets.size()) + " names");
  for (size_t k = 0; k < targets.size(); ++k) s->set(targets[k], items[k]);
}

Flow Interpreter::exec_for(const Node& n, Scope* scope, std::string& out, const Value& iterable,
                           int depth) {
  std::vector<Value> items = iterate(iterable);
  if (n.filter) {  // {% for x in xs if cond %}: the filter runs before loop.* exists
    std::vector<Value> kept;
    for (auto& v : items) {
      count_iterations(1);
      Scope* fs = arena.make<Scope>();
      fs->parent = scope;
      assign_targets(*this, fs, n.targets, v);
      if (truthy(eval(*n.filter, fs))) kept.push_back(v);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (!n.else_body.empty()) {
      Scope* es = arena.make<Scope>();
      es->parent = scope;
      exec(n.else_body, es, out);
    }
    return Flow::normal;
  }
  LoopObject* loop = arena.make<LoopObject>();
  List* seq = arena.list(std::move(items));
  loop->info.items = seq;
  loop->info.depth0 = depth;
  loop->node = &n;
  loop->scope = scope;
  for (size_t k = 0; k < seq->items.size(); ++k) {
    count_iterations(1);
    loop->info.index0 = int64_t(k);
    Scope* s = arena.make<Scope>();
    s->parent = scope;
    s->set("loop", Value::of(static_cast<Object*>(loop)));
    assign_targets(*this, s, n.targets, seq->items[k]);
    if (exec(n.body, s, out) == Flow::break_) break;
  }
  return Flow::normal;
}

Flow Interpreter::exec_node(const Node& n, Scope* scope, std::string& out) {
  line_ = n.line;
  switch (n.kind) {
    case NodeKind::text: append(out, n.text); return Flow::normal;
    case NodeKind::output: {
      Value v = eval(*n.expr, scope);
      if (v.type == Type::string) append(out, v.s);
      else if (v.type != Type::undefined) append(out, to_str(v));
      return Flow::normal;
    }
    case NodeKind::if_:
      for (auto& [cond, body] : n.branches)
        if (truthy(eval(*cond, scope))) return exec(body, scope, out);
      return exec(n.else_body, scope, out);
    case NodeKind::for_: {
      Value it = eval(*n.expr, scope);
      line_ = n.line;
      return exec_for(n, scope, out, it, 0);
    }
    case NodeKind::set: {
      Value v = eval(*n.expr, scope);
      if (n.attr.empty()) {
        assign_targets(*this, scope, n.targets, v);
        return Flow::normal;
      }
      const Value* target = scope->find(n.targets[0]);
      if (!target || target->type != Type::object || target->u.obj->kind != Object::Kind::ns)
        raise_error("TemplateRuntimeError", "cannot assign attribute on non-namespace object '" +
                                                n.targets[0] + "'");
      auto* ns = static_cast<Namespace*>(target->u.obj);
      if (Value* slot = ns->find(n.attr)) *slot = std::move(v);
      else ns->attrs.emplace_back(n.attr, std::move(v));
      return Flow::normal;
    }
    case NodeKind::set_block: {
      Scope* s = arena.make<Scope>();
      s->parent = scope;
      Value v = Value::string(capture(n.body, s));
      if (n.filter) {
        Scope* fs = arena.make<Scope>();
        fs->parent = scope;
        fs->set("\x01block", v);
        v = eval(*n.filter, fs);
      }
      scope->set(n.targets[0], std::move(v));
      return Flow::normal;
    }
    case NodeKind::macro: {
      Macro* m = arena.make<Macro>();
      m->def = &n;
      m->closure = scope;
      m->name_ = n.text;
      scope->set(n.text, Value::of(static_cast<Object*>(m)));
      return Flow::normal;
    }
    case NodeKind::call_block: {
      Macro* caller = arena.make<Macro>();
      caller->def = &n;
      caller->closure = scope;
      caller->name_ = "caller";
      const Expr& call = *n.expr;
      Value callee = eval(*call.args[0], scope);
      CallArgs args;
      eval_args(call, 1, scope, args);
      args.kwargs.emplace_back("caller", Value::of(static_cast<Object*>(caller)));
      Value v = this->call(callee, args);
      append(out, to_str(v));
      return Flow::normal;
    }
    case NodeKind::filter_block: {
      Scope* s = arena.make<Scope>();
      s->parent = scope;
      Value body = Value::string(capture(n.body, s));
      s->set("\x01block", body);
      append(out, to_str(eval(*n.filter, s)));
      return Flow::normal;
    }
    case NodeKind::break_: return Flow::break_;
    case NodeKind::continue_: return Flow::continue_;
    case NodeKind::scope: {
      if (!n.new_scope) return exec(n.body, scope, out);
      Scope* s = arena.make<Scope>();
      s->parent = scope;
      for (auto& [name, e] : n.params) s->set(name, eval(*e, scope));
      return exec(n.body, s, out);
    }
  }
  return Flow::normal;
}

// ---- expressions ------------------------------------------------------------

Value Interpreter::get_attr(const Value& obj, std::string_view name) {
  switch (obj.type) {
    case Type::undefined: undefined_error(obj);
    case Type::dict:
      if (is_method(obj, name)) break;
      if (const Value* v = obj.u.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + std::string(name) + "'");
    case Type::object:
      if (obj.u.obj->kind == Object::Kind::ns) {
        if (Value* v = static_cast<Namespace*>(obj.u.obj)->find(name)) return *v;
      }
      break;
    default: break;
  }
  if (obj.type == Type::object && obj.u.obj->kind == Object::Kind::callable) {
    if (auto* lo = dynamic_cast<LoopObject*>(obj.u.obj)) {
      const LoopInfo& L = lo->info;
      int64_t n = int64_t(L.items->items.size()), i = L.index0;
      if (name == "index") return Value::integer(i + 1);
      if (name == "index0") return Value::integer(i);
      if (name == "revindex") return Value::integer(n - i);
      if (name == "revindex0") return Value::integer(n - i - 1);
      if (name == "first") return Value::boolean(i == 0);
      if (name == "last") return Value::boolean(i == n - 1);
      if (name == "length") return Value::integer(n);
      if (name == "depth") return Value::integer(L.depth0 + 1);
      if (name == "depth0") return Value::integer(L.depth0);
      if (name == "previtem")
        return i > 0 ? L.items->items[size_t(i - 1)] : Value::undefined("there is no previous item");
      if (name == "nextitem")
        return i + 1 < n ? L.items->items[size_t(i + 1)] : Value::undefined("there is no next item");
    }
  }
  if (is_method(obj, name)) {
    BoundMethod* m = arena.make<BoundMethod>();
    m->self = obj;
    m->method = std::string(name);
    return Value::of(static_cast<Object*>(m));
  }
  std::string tn = obj.type == Type::object && dynamic_cast<LoopObject*>(obj.u.obj) ? "LoopContext"
                                                                                  : type_name(obj);
  return Value::undefined("'" + tn + " object' has no attribute '" + std::string(name) + "'");
}

static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

Value Interpreter::get_item(const Value& obj, const Value& key) {
  switch (obj.type) {
    case Type::undefined: undefined_error(obj);
    case Type::dict:
      if (const Value* v = obj.u.dict->find(key)) return *v;
      break;
    case Type::list:
      if (key.type == Type::integer || key.type == Type::boolean) {
        auto& items = obj.u.list->items;
        int64_t i = norm_index(key.type == Type::integer ? key.u.i : key.u.b, int64_t(items.size()));
        if (i >= 0 && i < int64_t(items.size())) return items[size_t(i)];
        return Value::undefined(std::string(obj.u.list->is_tuple ? "tuple" : "list") +
                                " object has no element " + to_str(key));
      }
      break;
    case Type::string:
      if (key.type == Type::integer) {
        if (is_ascii(obj.s)) {
          int64_t i = norm_index(key.u.i, int64_t(obj.s.size()));
          if (i >= 0 && i < int64_t(obj.s.size())) return Value::string(std::string(1, obj.s[size_t(i)]));
        } else {
          std::u32string cps = utf8_decode(obj.s);
          int64_t i = norm_index(key.u.i, int64_t(cps.size()));
          if (i >= 0 && i < int64_t(cps.size())) return Value::string(utf8_encode(cps.substr(size_t(i), 1)));
        }
        return Value::undefined("str object has no element " + to_str(key));
      }
      break;
    default: break;
  }
  if (key.type == Type::string) return get_attr(obj, key.s);
  return Value::undefined("'" + type_name(obj) + " object' has no element " + repr(key));
}

template <class T>
static std::vector<T> py_slice(const std::vector<T>& v, const Value& a, const Value& b, const Value& c) {
  int64_t n = int64_t(v.size());
  auto num = [](const Value& x, const char* what) -> std::optional<int64_t> {
    if (x.is_undefined() || x.is_none()) return std::nullopt;
    if (x.type == Type::integer) return x.u.i;
    if (x.type == Type::boolean) return int64_t(x.u.b);
    raise_error("TypeError", std::string("slice ") + what + " must be an integer or None");
  };
  int64_t step = num(c, "step").value_or(1);
  if (step == 0) raise_error("ValueError", "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt, int64_t lo, int64_t hi) {
    if (!x) return dflt;
    int64_t i = *x < 0 ? *x + n : *x;
    return std::clamp(i, lo, hi);
  };
  std::vector<T> out;
  if (step > 0) {
    int64_t start = clamp(num(a, "start"), 0, 0, n), stop = clamp(num(b, "stop"), n, 0, n);
    for (int64_t i = start; i < stop; i += step) out.push_back(v[size_t(i)]);
  } else {
    int64_t start = clamp(num(a, "start"), n - 1, -1, n - 1), stop = clamp(num(b, "stop"), -1, -1, n - 1);
    for (int64_t i = start; i > stop; i += step) out.push_back(v[size_t(i)]);
  }
  return out;
}

Value Interpreter::eval_slice(const Expr& e, Scope* scope) {
  Value obj = eval(*e.args[0], scope);
  Value parts[3];
  for (int k = 0; k < 3; ++k)
    if (e.args[size_t(k) + 1]) parts[k] = eval(*e.args[size_t(k) + 1], scope);
  if (obj.type == Type::undefined) undefined_error(obj);
  if (obj.type == Type::list) {
    auto items = py_slice(obj.u.list->items, parts[0], parts[1], parts[2]);
    count_iterations(items.size() / 64);
    return Value::of(arena.list(std::move(items), obj.u.list->is_tuple));
  }
  if (obj.type == Type::string) {
    std::u32string cps = utf8_decode(obj.s);
    std::vector<char32_t> v(cps.begin(), cps.end());
    auto out = py_slice(v, parts[0], parts[1], parts[2]);
    return Value::string(utf8_encode(std::u32string(out.begin(), out.end())));
  }
  raise_error("TypeError", "'" + type_name(obj) + "' object is not subscriptable");
}

void Interpreter::eval_args(const Expr& e, size_t first, Scope* scope, CallArgs& args) {
  for (size_t k = first; k < e.args.size(); ++k) args.args.push_back(eval(*e.args[k], scope));
  for (auto& [name, x] : e.kwargs) args.kwargs.emplace_back(name, eval(*x, scope));
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.type == Type::object && callee.u.obj->kind == Object::Kind::callable)
    return static_cast<Callable*>(callee.u.obj)->call(*this, args);
  if (callee.type == Type::undefined) undefined_error(callee);
  raise_error("TypeError", "'" + type_name(callee) + "' object is not callable");
}

Value Interpreter::eval_call(const Expr& e, Scope* scope) {
  const Expr& target = *e.args[0];
  CallArgs args;
  if (target.kind == ExprKind::attr) {  // obj.method(...) without a bound-method object
    Value self = eval(*target.args[0], scope);
    if (self.type != Type::undefined && is_method(self, target.name) &&
        !(self.type == Type::object && self.u.obj->kind == Object::Kind::ns)) {
      eval_args(e, 1, scope, args);
      line_ = e.line;
      return method(self, target.name, args);
    }
    Value callee = get_attr(self, target.name);
    eval_args(e, 1, scope, args);
    return call(callee, args);
  }
  if (target.kind == ExprKind::name && !scope->find(target.name) && is_global_function(target.name)) {
    eval_args(e, 1, scope, args);
    line_ = e.line;
    return call_global(target.name, args);
  }
  Value callee = eval(target, scope);
  eval_args(e, 1, scope, args);
  return call(callee, args);
}

Value Interpreter::eval(const Expr& e, Scope* scope) {
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::literal: return e.literal;
    case ExprKind::name: {
      if (const Value* v = scope->find(e.name)) return *v;
      if (is_global_function(e.name)) {
        GlobalFunction* f = arena.make<GlobalFunction>();
        f->fn = e.name;
        return Value::of(static_cast<Object*>(f));
      }
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::attr: return get_attr(eval(*e.args[0], scope), e.name);
    case ExprKind::item: {
      Value obj = eval(*e.args[0], scope);
      return get_item(obj, eval(*e.args[1], scope));
    }
    case ExprKind::slice: return eval_slice(e, scope);
    case ExprKind::call: return eval_call(e, scope);
    case ExprKind::filter: {
      Value operand = e.args[0] ? eval(*e.args[0], scope) : *scope->find("\x01block");
      CallArgs args;
      eval_args(e, 1, scope, args);
      line_ = e.line;
      return filter(e.name, operand, args);
    }
    case ExprKind::test: {
      Value operand = eval(*e.args[0], scope);
      CallArgs args;
      eval_args(e, 1, scope, args);
      line_ = e.line;
      return Value::boolean(test(e.name, operand, args) != e.negated);
    }
    case ExprKind::unary: {
      Value v = eval(*e.args[0], scope);
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (v.type == Type::undefined) undefined_error(v);
      if (!v.is_number()) raise_error("TypeError", "bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.type == Type::boolean ? Value::integer(v.u.b) : v;
      if (v.type == Type::real) return Value::real(-v.u.d);
      int64_t x = v.type == Type::boolean ? v.u.b : v.u.i;
      if (x == INT64_MIN) raise_error("OverflowError", "integer overflow");
      return Value::integer(-x);
    }
    case ExprKind::binary: return eval_binary(e, scope);
    case ExprKind::compare: {
      Value left = eval(*e.args[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1], scope);
        const std::string& op = e.ops[k];
        bool r;
        if (op == "==") r = equals(left, right);
        else if (op == "!=") r = !equals(left, right);
        else if (op == "in") r = contains(right, left);
        else if (op == "notin") r = !contains(right, left);
        else {
          if (left.is_undefined()) undefined_error(left);
          if (right.is_undefined()) undefined_error(right);
          int c = compare(left, right);
          r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::cond:
      if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    case ExprKind::list:
    case ExprKind::tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (auto& a : e.args) items.push_back(eval(*a, scope));
      return Value::of(arena.list(std::move(items), e.kind == ExprKind::tuple));
    }
    case ExprKind::dict: {
      Dict* d = arena.dict();
      arena.charge(e.args.size() / 2);
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], scope);
        d->set(std::move(key), eval(*e.args[k + 1], scope));
      }
      if (d->depth > uint32_t(limits.max_value_depth))
        raise_error("LimitError", "value nested too deeply");
      return Value::of(d);
    }
  }
  return Value::undefined();
}

// ---- Template ---------------------------------------------------------------

Template::Template(const std::string& source) : body_(parse_template(source)) {}

std::string Template::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  Interpreter in(limits);
  try {
    Scope* globals = in.arena.make<Scope>();
    for (auto it = context.begin(); it != context.end(); ++it)
      globals->set(it.key(), from_json(it.value(), in.arena));
    return in.capture(body_, globals);
  } catch (const Error& e) {
    throw Error(ErrorKind::invalid_argument,
                std::string("chat template line ") + std::to_string(in.current_line()) + ": " + e.what());
  }
}

}  // namespace hmoe::chat
