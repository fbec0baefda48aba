// Python's binary operators on interpreter values (+ - * / // % ** ~ and or,
// `in`), with Python's error messages so template authors recognise them.
#include <cmath>
#include <cstdio>

#include "engine/text/chat/interpreter.h"

namespace hmoe::chat {
namespace {

int64_t as_int(const Value& v) { return v.type == Type::boolean ? int64_t(v.u.b) : v.u.i; }
bool is_intlike(const Value& v) { return v.type == Type::integer || v.type == Type::boolean; }

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  raise_error("TypeError", "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                               type_name(b) + "'");
}

Value repeat(const Value& seq, int64_t n, Interpreter& in) {
  if (n < 0) n = 0;
  if (seq.type == Type::string) {
    in.check_string(seq.s.size() * size_t(n));
    std::string out;
    out.reserve(seq.s.size() * size_t(n));
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(std::move(out));
  }
  auto& items = seq.u.list->items;
  in.arena.charge(items.size() * size_t(n));
  std::vector<Value> out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), items.begin(), items.end());
  return Value::of(in.arena.list(std::move(out), seq.u.list->is_tuple));
}

}  // namespace

// "%s and %d" % args: the conversions templates use.
Value percent_format(const std::string& fmt, const Value& arg, Interpreter& in) {
  std::vector<Value> args;
  const Dict* named = nullptr;
  if (arg.type == Type::list && arg.u.list->is_tuple) args = arg.u.list->items;
  else if (arg.type == Type::dict) named = arg.u.dict;
  else args.push_back(arg);
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out.push_back(fmt[k]);
      continue;
    }
    if (++k >= fmt.size()) raise_error("ValueError", "incomplete format");
    const Value* v = nullptr;
    if (fmt[k] == '(' && named) {
      size_t close = fmt.find(')', k);
      if (close == std::string::npos) raise_error("ValueError", "incomplete format key");
      v = named->find(std::string_view(fmt).substr(k + 1, close - k - 1));
      if (!v) raise_error("KeyError", fmt.substr(k + 1, close - k - 1));
      k = close + 1;
    }
    std::string spec;
    while (k < fmt.size() && (std::isdigit((unsigned char)fmt[k]) || fmt[k] == '.' || fmt[k] == '-' ||
                              fmt[k] == '+' || fmt[k] == ' ' || fmt[k] == '0'))
      spec.push_back(fmt[k++]);
    if (k >= fmt.size()) raise_error("ValueError", "incomplete format");
    char c = fmt[k];
    if (c == '%') {
      out.push_back('%');
      continue;
    }
    if (!v) {
      if (next >= args.size()) raise_error("TypeError", "not enough arguments for format string");
      v = &args[next++];
    }
    char buf[512];
    switch (c) {
      case 's': out += to_str(*v); break;
      case 'r': out += repr(*v); break;
      case 'd': case 'i':
        if (!v->is_number()) raise_error("TypeError", "%d format: a real number is required, not " + type_name(*v));
        std::snprintf(buf, sizeof buf, ("%" + spec + "lld").c_str(),
                      (long long)(v->type == Type::real ? int64_t(v->u.d) : as_int(*v)));
        out += buf;
        break;
      case 'f': case 'e': case 'g':
        if (!v->is_number()) raise_error("TypeError", "must be real number, not " + type_name(*v));
        std::snprintf(buf, sizeof buf, ("%" + spec + c).c_str(), v->as_double());
        out += buf;
        break;
      default: raise_error("ValueError", std::string("unsupported format character '") + c + "'");
    }
    in.check_string(out.size());
  }
  if (!named && next < args.size() && arg.type == Type::list && arg.u.list->is_tuple)
    raise_error("TypeError", "not all arguments converted during string formatting");
  return Value::string(std::move(out));
}

Value py_add(const Value& a, const Value& b, Interpreter& in) {
  if (a.is_undefined()) in.undefined_error(a);
  if (b.is_undefined()) in.undefined_error(b);
  if (is_intlike(a) && is_intlike(b)) {
    int64_t r;
    if (__builtin_add_overflow(as_int(a), as_int(b), &r)) return Value::real(a.as_double() + b.as_double());
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::real(a.as_double() + b.as_double());
  if (a.type == Type::string) {
    if (b.type != Type::string)
      raise_error("TypeError", "can only concatenate str (not \"" + type_name(b) + "\") to str");
    in.check_string(a.s.size() + b.s.size());
    return Value::string(a.s + b.s);
  }
  if (a.type == Type::list && b.type == Type::list && a.u.list->is_tuple == b.u.list->is_tuple) {
    std::vector<Value> items = a.u.list->items;
    items.insert(items.end(), b.u.list->items.begin(), b.u.list->items.end());
    return Value::of(in.arena.list(std::move(items), a.u.list->is_tuple));
  }
  if (a.type == Type::list)
    raise_error("TypeError", "can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " +
                                 type_name(a));
  unsupported("+", a, b);
}

bool Interpreter::contains(const Value& container, const Value& item) {
  switch (container.type) {
    case Type::string:
      if (item.type != Type::string)
        raise_error("TypeError", "'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Type::list:
      for (auto& v : container.u.list->items)
        if (equals(v, item)) return true;
      return false;
    case Type::dict: return container.u.dict->find(item) != nullptr;
    case Type::undefined: return false;
    case Type::object:
      if (container.u.obj->kind == Object::Kind::ns)
        return item.type == Type::string && static_cast<Namespace*>(container.u.obj)->find(item.s);
      [[fallthrough]];
    default:
      raise_error("TypeError", "argument of type '" + type_name(container) + "' is not iterable");
  }
}

Value Interpreter::eval_binary(const Expr& e, Scope* scope) {
  const std::string& op = e.name;
  if (op == "and") {
    Value a = eval(*e.args[0], scope);
    return truthy(a) ? eval(*e.args[1], scope) : a;
  }
  if (op == "or") {
    Value a = eval(*e.args[0], scope);
    return truthy(a) ? a : eval(*e.args[1], scope);
  }
  Value a = eval(*e.args[0], scope);
  Value b = eval(*e.args[1], scope);
  line_ = e.line;
  if (op == "~") {
    std::string s = to_str(a);
    std::string t = to_str(b);
    check_string(s.size() + t.size());
    return Value::string(s + t);
  }
  if (op == "+") return py_add(a, b, *this);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (op == "*") {
    if ((a.type == Type::string || a.type == Type::list) && is_intlike(b)) return repeat(a, as_int(b), *this);
    if ((b.type == Type::string || b.type == Type::list) && is_intlike(a)) return repeat(b, as_int(a), *this);
  }
  if (op == "%" && a.type == Type::string) return percent_format(a.s, b, *this);
  if (!a.is_number() || !b.is_number()) unsupported(op, a, b);
  bool ints = is_intlike(a) && is_intlike(b);
  double x = a.as_double(), y = b.as_double();
  if (op == "-") {
    int64_t r;
    if (ints && !__builtin_sub_overflow(as_int(a), as_int(b), &r)) return Value::integer(r);
    return Value::real(x - y);
  }
  if (op == "*") {
    int64_t r;
    if (ints && !__builtin_mul_overflow(as_int(a), as_int(b), &r)) return Value::integer(r);
    return Value::real(x * y);
  }
  if (op == "/") {
    if (y == 0) raise_error("ZeroDivisionError", "division by zero");
    return Value::real(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) raise_error("ZeroDivisionError", "integer division or modulo by zero");
    if (ints) {
      int64_t p = as_int(a), q = as_int(b);
      if (p == INT64_MIN && q == -1) return Value::real(-double(p));
      int64_t d = p / q, m = p % q;
      if (m != 0 && ((m < 0) != (q < 0))) {
        --d;
        m += q;
      }
      return Value::integer(op == "//" ? d : m);
    }
    double d = std::floor(x / y);
    return Value::real(op == "//" ? d : x - d * y);
  }
  if (op == "**") {
    if (ints && as_int(b) >= 0) {
      int64_t base = as_int(a), e = as_int(b), r = 1;
      while (e > 0) {  // square-and-multiply: O(log e) even for 0, 1, -1
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return Value::real(std::pow(x, y));
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) return Value::real(std::pow(x, y));
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(x, y));
  }
  unsupported(op, a, b);
}

}  // namespace hmoe::chat
