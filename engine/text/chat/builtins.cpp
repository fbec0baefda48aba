// Jinja2 filters, tests and global functions, with transformers' additions
// (tojson with json.dumps options, raise_exception, strftime_now).
#include "engine/text/chat/builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>

#include "configs/error.h"
#include "engine/text/chat/strings.h"

namespace hmoe::chat {

// ---- argument helpers -------------------------------------------------------

const Value* ArgReader::get(size_t pos, const char* name) const {
  if (pos < args_.args.size()) return &args_.args[pos];
  return name ? args_.kwarg(name) : nullptr;
}

std::string ArgReader::str(size_t pos, const char* name, const std::string& dflt) const {
  const Value* v = get(pos, name);
  if (!v || v->is_undefined()) return dflt;
  return to_str(*v);
}

int64_t ArgReader::integer(size_t pos, const char* name, int64_t dflt) const {
  const Value* v = get(pos, name);
  if (!v || v->is_undefined() || v->is_none()) return dflt;
  if (v->type == Type::integer) return v->u.i;
  if (v->type == Type::boolean) return v->u.b;
  if (v->type == Type::real) return int64_t(v->u.d);
  raise_error("TypeError", fn_ + "(): '" + std::string(name ? name : "argument") +
                               "' must be an integer, not '" + type_name(*v) + "'");
}

bool ArgReader::boolean(size_t pos, const char* name, bool dflt) const {
  const Value* v = get(pos, name);
  return v && !v->is_undefined() ? truthy(*v) : dflt;
}

const Value& ArgReader::required(size_t pos, const char* name) const {
  const Value* v = get(pos, name);
  if (!v) raise_error("TypeError", fn_ + "() missing required argument '" + std::string(name) + "'");
  return *v;
}

void ArgReader::max_positional(size_t n) const {
  if (args_.args.size() > n)
    raise_error("TypeError", fn_ + "() takes at most " + std::to_string(n) + " positional arguments (" +
                                 std::to_string(args_.args.size()) + " given)");
}

Value lookup_path(Interpreter& in, const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    // Digits index a list; more digits than an int64_t holds (std::stoll would throw) stay a key.
    int64_t index = 0;
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) &&
                  std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    cur = digits ? in.get_item(cur, Value::integer(index)) : in.get_item(cur, Value::string(part));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

namespace {

List* new_list(Interpreter& in, std::vector<Value> items) { return in.arena.list(std::move(items)); }

int64_t py_len(const Value& v) {
  switch (v.type) {
    case Type::string: return int64_t(utf8_length(v.s));
    case Type::list: return int64_t(v.u.list->items.size());
    case Type::dict: return int64_t(v.u.dict->items.size());
    case Type::undefined: return 0;
    case Type::object:
      if (v.u.obj->kind == Object::Kind::ns) return int64_t(static_cast<Namespace*>(v.u.obj)->attrs.size());
      [[fallthrough]];
    default: raise_error("TypeError", "object of type '" + type_name(v) + "' has no len()");
  }
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// Python int(str): optional sign, digits, underscores between digits, surrounding whitespace.
bool parse_int(const std::string& s, int64_t base, int64_t& out) {
  std::string t = py_strip(s, nullptr, true, true);
  if (t.empty()) return false;
  size_t k = 0;
  bool neg = false;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    ++k;
  }
  if (k >= t.size()) return false;
  __int128 v = 0;
  for (; k < t.size(); ++k) {
    char c = t[k];
    if (c == '_') continue;
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : c >= 'A' && c <= 'Z' ? c - 'A' + 10 : 99;
    if (d >= base) return false;
    v = v * base + d;
    if (v > INT64_MAX) return false;
  }
  out = neg ? -int64_t(v) : int64_t(v);
  return true;
}

bool parse_float(const std::string& s, double& out) {
  std::string t = py_strip(s, nullptr, true, true);
  if (t.empty()) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

// sort key compare with jinja's case_sensitive=False default for strings.
int sort_compare(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.type == Type::string && b.type == Type::string) {
    std::string x = py_lower(a.s), y = py_lower(b.s);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return compare(a, b);
}

Value select_like(Interpreter& in, const Value& seq, CallArgs& args, bool attr_mode, bool keep) {
  std::vector<Value> out;
  size_t first = 0;
  std::string attr;
  if (attr_mode) {
    if (args.args.empty()) raise_error("TypeError", "missing attribute argument");
    attr = to_str(args.args[0]);
    first = 1;
  }
  std::string test_name;
  CallArgs test_args;
  if (args.args.size() > first) {
    test_name = to_str(args.args[first]);
    test_args.args.assign(args.args.begin() + long(first) + 1, args.args.end());
  }
  for (auto& v : in.iterate(seq)) {
    in.count_iterations(1);
    Value x = attr_mode ? lookup_path(in, v, attr) : v;
    bool r = test_name.empty() ? truthy(x) : in.test(test_name, x, test_args);
    if (r == keep) out.push_back(v);
  }
  return Value::of(new_list(in, std::move(out)));
}

}  // namespace

// ---- filters ----------------------------------------------------------------

bool known_filter(std::string_view name) {
  static const char* names[] = {
      "tojson", "length", "count", "trim", "upper", "lower", "capitalize", "title", "default", "d",
      "join", "first", "last", "items", "list", "string", "safe", "forceescape", "escape", "e", "int",
      "float", "abs", "round", "replace", "reverse", "selectattr", "rejectattr", "select", "reject",
      "map", "sort", "unique", "min", "max", "dictsort", "sum", "attr", "indent", "center",
      "wordcount", "format"};
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

bool known_test(std::string_view name) {
  static const char* names[] = {
      "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number",
      "string", "mapping", "iterable", "sequence", "callable", "escaped", "lower", "upper", "odd",
      "even", "divisibleby", "eq", "equalto", "==", "ne", "!=", "sameas", "in", "lt", "lessthan",
      "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">="};
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

Value Interpreter::filter(const std::string& name, const Value& v, CallArgs& args) {
  ArgReader a(args, name);
  auto need_str = [&]() -> std::string {
    if (v.is_undefined()) return "";
    return to_str(v);
  };
  if (name == "tojson") {
    JsonOptions opt;
    opt.ensure_ascii = a.boolean(0, "ensure_ascii", false);
    const Value* indent = a.get(1, "indent");
    if (indent && !indent->is_none() && !indent->is_undefined()) {
      opt.indent = int(std::clamp<int64_t>(a.integer(1, "indent", 0), 0, 64));
      opt.item_sep = ",";
    }
    const Value* sep = a.get(2, "separators");
    if (sep && sep->type == Type::list && sep->u.list->items.size() == 2) {
      opt.item_sep = to_str(sep->u.list->items[0]);
      opt.key_sep = to_str(sep->u.list->items[1]);
    }
    opt.sort_keys = a.boolean(3, "sort_keys", false);
    std::string s = to_json(v, opt);
    check_string(s.size());
    return Value::string(std::move(s));
  }
  if (name == "length" || name == "count") return Value::integer(py_len(v));
  if (name == "trim") {
    const Value* chars = a.get(0, "chars");
    std::string set = chars && !chars->is_none() && !chars->is_undefined() ? to_str(*chars) : "";
    return Value::string(py_strip(need_str(), set.empty() && !chars ? nullptr : &set, true, true));
  }
  if (name == "upper") return Value::string(py_upper(need_str()));
  if (name == "lower") return Value::string(py_lower(need_str()));
  if (name == "capitalize") return Value::string(py_capitalize(need_str()));
  if (name == "title") return Value::string(py_title(need_str()));
  if (name == "default" || name == "d") {
    bool boolean = a.boolean(1, "boolean", false);
    if (v.is_undefined() || (boolean && !truthy(v))) {
      const Value* d = a.get(0, "default_value");
      return d ? *d : Value::string("");
    }
    return v;
  }
  if (name == "join") {
    std::string sep = a.str(0, "d", "");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (auto& x : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(attr ? lookup_path(*this, x, to_str(*attr)) : x);
      check_string(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::of(new_list(*this, {}));
    if (v.type != Type::dict) raise_error("TypeError", "can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (auto& kv : v.u.dict->items) out.push_back(Value::of(arena.list({kv.first, kv.second}, true)));
    return Value::of(new_list(*this, std::move(out)));
  }
  if (name == "list") return Value::of(new_list(*this, iterate(v)));
  if (name == "string") return Value::string(to_str(v));
  if (name == "safe" || name == "forceescape" || name == "escape" || name == "e") {
    if (name == "safe") return v;
    return Value::string(html_escape(to_str(v)));
  }
  if (name == "int") {
    int64_t dflt = a.integer(0, "default", 0), base = a.integer(1, "base", 10);
    if (v.type == Type::integer) return v;
    if (v.type == Type::boolean) return Value::integer(v.u.b);
    if (v.type == Type::real) return std::isfinite(v.u.d) ? Value::integer(int64_t(v.u.d)) : Value::integer(dflt);
    if (v.type == Type::string) {
      int64_t x;
      if (parse_int(v.s, base, x)) return Value::integer(x);
      double d;
      if (parse_float(v.s, d) && std::isfinite(d)) return Value::integer(int64_t(d));
    }
    return Value::integer(dflt);
  }
  if (name == "float") {
    const Value* d = a.get(0, "default");
    if (v.type == Type::real) return v;
    if (v.is_number()) return Value::real(v.as_double());
    double x;
    if (v.type == Type::string && parse_float(v.s, x)) return Value::real(x);
    return d ? *d : Value::real(0.0);
  }
  if (name == "abs") {
    if (v.type == Type::real) return Value::real(std::fabs(v.u.d));
    if (v.type == Type::integer) return Value::integer(v.u.i < 0 ? -v.u.i : v.u.i);
    raise_error("TypeError", "bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "round") {
    int64_t prec = a.integer(0, "precision", 0);
    std::string method = a.str(1, "method", "common");
    double m = std::pow(10.0, double(prec)), x = v.as_double() * m;
    x = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value::real(x / m);
  }
  if (name == "replace") {
    if (v.is_undefined()) return Value::string("");
    std::string s = to_str(v);
    std::string out = py_replace(s, to_str(a.required(0, "old")), to_str(a.required(1, "new")), a.integer(2, "count", -1));
    check_string(out.size());
    return Value::string(std::move(out));
  }
  if (name == "reverse") {
    if (v.type == Type::string) {
      std::u32string cps = utf8_decode(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(utf8_encode(cps));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::of(new_list(*this, std::move(items)));
  }
  if (name == "selectattr") return select_like(*this, v, args, true, true);
  if (name == "rejectattr") return select_like(*this, v, args, true, false);
  if (name == "select") return select_like(*this, v, args, false, true);
  if (name == "reject") return select_like(*this, v, args, false, false);
  if (name == "map") {
    std::vector<Value> out;
    const Value* attr = args.kwarg("attribute");
    const Value* dflt = args.kwarg("default");
    std::string fname;
    CallArgs fargs;
    if (!attr) {
      if (args.args.empty()) raise_error("TypeError", "map() needs a filter name or attribute=");
      fname = to_str(args.args[0]);
      fargs.args.assign(args.args.begin() + 1, args.args.end());
      fargs.kwargs = args.kwargs;
    }
    for (auto& x : iterate(v)) {
      count_iterations(1);
      if (attr) {
        Value r = lookup_path(*this, x, to_str(*attr));
        out.push_back(r.is_undefined() && dflt ? *dflt : r);
      } else {
        CallArgs copy = fargs;
        out.push_back(filter(fname, x, copy));
      }
    }
    return Value::of(new_list(*this, std::move(out)));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max" || name == "dictsort") {
    bool reverse = a.boolean(0, "reverse", false);
    bool cs = a.boolean(name == "sort" ? 1 : 0, "case_sensitive", false);
    const Value* attr = args.kwarg("attribute");
    if (name == "sort" && !attr && args.args.size() > 2) attr = &args.args[2];
    std::vector<Value> items;
    if (name == "dictsort") {
      if (v.type != Type::dict) raise_error("TypeError", "dictsort expects a mapping");
      for (auto& kv : v.u.dict->items) items.push_back(Value::of(arena.list({kv.first, kv.second}, true)));
      std::string by = a.str(1, "by", "key");
      bool rev = a.boolean(2, "reverse", false);
      size_t idx = by == "value" ? 1 : 0;
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        int c = sort_compare(x.u.list->items[idx], y.u.list->items[idx], cs);
        return rev ? c > 0 : c < 0;
      });
      return Value::of(new_list(*this, std::move(items)));
    }
    items = iterate(v);
    count_iterations(items.size());
    auto key = [&](const Value& x) { return attr ? lookup_path(*this, x, to_str(*attr)) : x; };
    if (name == "unique") {
      std::vector<Value> out;
      for (auto& x : items) {
        bool seen = false;
        for (auto& y : out) {
          Value kx = key(x), ky = key(y);
          if (!cs && kx.is_string() && ky.is_string() ? py_lower(kx.s) == py_lower(ky.s) : equals(kx, ky)) {
            seen = true;
            break;
          }
        }
        if (!seen) out.push_back(x);
      }
      return Value::of(new_list(*this, std::move(out)));
    }
    if (name == "min" || name == "max") {
      if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      Value best = items[0];
      for (auto& x : items) {
        int c = sort_compare(key(x), key(best), cs);
        if (name == "min" ? c < 0 : c > 0) best = x;
      }
      return best;
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      int c = sort_compare(key(x), key(y), cs);
      return reverse ? c > 0 : c < 0;
    });
    return Value::of(new_list(*this, std::move(items)));
  }
  if (name == "sum") {
    const Value* attr = a.get(0, "attribute");
    Value total = a.get(1, "start") ? *a.get(1, "start") : Value::integer(0);
    for (auto& x : iterate(v)) total = py_add(total, attr ? lookup_path(*this, x, to_str(*attr)) : x, *this);
    return total;
  }
  if (name == "attr") return get_attr(v, to_str(a.required(0, "name")));
  if (name == "indent") {
    int64_t width = a.integer(0, "width", 4);
    bool first = a.boolean(1, "first", false), blank = a.boolean(2, "blank", false);
    std::string pad(size_t(std::clamp<int64_t>(width, 0, 1024)), ' ');
    const Value* wv = a.get(0, "width");
    if (wv && wv->is_string()) pad = wv->s;
    std::vector<std::string> lines = py_splitlines(need_str(), false);
    std::string s = need_str(), out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += "\n";
      bool add = (k > 0 || first) && (blank || !py_strip(lines[k], nullptr, true, true).empty());
      if (add) out += pad;
      out += lines[k];
    }
    if (!s.empty() && (s.back() == '\n')) out += "\n";
    check_string(out.size());
    return Value::string(std::move(out));
  }
  if (name == "center") {
    int64_t width = std::clamp<int64_t>(a.integer(0, "width", 80), 0, 1 << 20);
    std::string s = need_str();
    int64_t len = int64_t(utf8_length(s));
    if (len >= width) return Value::string(s);
    int64_t total = width - len, left = total / 2 + (total & width & 1);
    return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(total - left), ' '));
  }
  if (name == "wordcount") return Value::integer(int64_t(py_split(need_str(), nullptr, -1).size()));
  if (name == "format") {
    if (!args.kwargs.empty()) {
      Dict* d = arena.dict();
      for (auto& kv : args.kwargs) d->set(Value::string(kv.first), kv.second);
      return percent_format(need_str(), Value::of(d), *this);
    }
    return percent_format(need_str(), Value::of(arena.list(args.args, true)), *this);
  }
  raise_error("TemplateAssertionError", "no filter named '" + name + "'");
}

// ---- tests ------------------------------------------------------------------

bool Interpreter::test(const std::string& name, const Value& v, CallArgs& args) {
  ArgReader a(args, name);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.type == Type::boolean;
  if (name == "true") return v.type == Type::boolean && v.u.b;
  if (name == "false") return v.type == Type::boolean && !v.u.b;
  if (name == "integer") return v.type == Type::integer;
  if (name == "float") return v.type == Type::real;
  if (name == "number") return v.is_number();
  if (name == "string") return v.type == Type::string;
  if (name == "mapping") return v.type == Type::dict;
  if (name == "iterable")
    return v.type == Type::string || v.type == Type::list || v.type == Type::dict || v.is_undefined();
  if (name == "sequence") return v.type == Type::string || v.type == Type::list || v.type == Type::dict;
  if (name == "callable")  // jinja2's Undefined defines __call__ (which fails)
    return v.is_undefined() || (v.type == Type::object && v.u.obj->kind == Object::Kind::callable);
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && py_lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && py_upper(v.s) == v.s;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.type != Type::integer && v.type != Type::boolean)
      raise_error("TypeError", "test '" + name + "' needs an integer, not '" + type_name(v) + "'");
    int64_t x = v.type == Type::integer ? v.u.i : v.u.b;
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    int64_t d = a.integer(0, "num", 1);
    if (d == 0) raise_error("ZeroDivisionError", "integer division or modulo by zero");
    return x % d == 0;
  }
  const Value* other = a.get(0, nullptr);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, a.required(0, "b"));
  if (name == "ne" || name == "!=") return !equals(v, a.required(0, "b"));
  if (name == "sameas") return other && (v.type == other->type) && (v.is_none() || v.type == Type::boolean ? equals(v, *other) : false);
  if (name == "in") return contains(a.required(0, "seq"), v);
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, a.required(0, "b")) < 0;
  if (name == "le" || name == "<=") return compare(v, a.required(0, "b")) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, a.required(0, "b")) > 0;
  if (name == "ge" || name == ">=") return compare(v, a.required(0, "b")) >= 0;
  raise_error("TemplateAssertionError", "no test named '" + name + "'");
}

// ---- global functions -------------------------------------------------------

bool Interpreter::is_global_function(std::string_view name) const {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now" || name == "lipsum" || name == "zip";
}

Value Interpreter::call_global(const std::string& name, CallArgs& args) {
  ArgReader a(args, name);
  if (name == "raise_exception") {
    throw Error(ErrorKind::invalid_argument, "TemplateError: " + a.str(0, "message", ""));
  }
  if (name == "range") {
    int64_t start = 0, stop = 0, step = 1;
    if (args.args.size() == 1) {
      stop = a.integer(0, nullptr, 0);
    } else {
      start = a.integer(0, nullptr, 0);
      stop = a.integer(1, nullptr, 0);
      step = a.integer(2, nullptr, 1);
    }
    if (step == 0) raise_error("ValueError", "range() arg 3 must not be zero");
    std::vector<Value> out;
    for (int64_t x = start; step > 0 ? x < stop : x > stop; x += step) {
      count_iterations(1);
      out.push_back(Value::integer(x));
    }
    return Value::of(new_list(*this, std::move(out)));
  }
  if (name == "namespace" || name == "dict") {
    std::vector<std::pair<std::string, Value>> attrs;
    for (auto& x : args.args) {
      if (x.type != Type::dict) raise_error("TypeError", name + "() positional argument must be a mapping");
      for (auto& kv : x.u.dict->items) attrs.emplace_back(to_str(kv.first), kv.second);
    }
    for (auto& kv : args.kwargs) attrs.push_back(kv);
    arena.charge(attrs.size());
    if (name == "dict") {
      Dict* d = arena.dict();
      for (auto& kv : attrs) d->set(Value::string(kv.first), kv.second);
      return Value::of(d);
    }
    Namespace* ns = arena.make<Namespace>();
    for (auto& kv : attrs) {
      if (Value* slot = ns->find(kv.first)) *slot = kv.second;
      else ns->attrs.push_back(kv);
    }
    return Value::of(static_cast<Object*>(ns));
  }
  if (name == "strftime_now") {
    std::string fmt = a.str(0, "format", "");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }
  if (name == "zip") {
    std::vector<std::vector<Value>> seqs;
    size_t n = SIZE_MAX;
    for (auto& x : args.args) {
      seqs.push_back(iterate(x));
      n = std::min(n, seqs.back().size());
    }
    std::vector<Value> out;
    for (size_t k = 0; k < n && !seqs.empty(); ++k) {
      std::vector<Value> row;
      for (auto& s : seqs) row.push_back(s[k]);
      out.push_back(Value::of(arena.list(std::move(row), true)));
    }
    return Value::of(new_list(*this, std::move(out)));
  }
  raise_error("TypeError", "'" + name + "' is not callable here");
}

}  // namespace hmoe::chat
