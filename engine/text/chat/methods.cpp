// Python methods on str, dict and list values, plus loop.cycle. Mutating
// list/dict methods are refused as transformers' ImmutableSandboxedEnvironment
// refuses them.
#include <algorithm>
#include <array>
#include <charconv>

#include "engine/text/chat/builtins.h"
#include "engine/text/chat/strings.h"

namespace hmoe::chat {
namespace {

constexpr std::array kStrMethods = {
    "startswith", "endswith", "split",  "rsplit",  "splitlines", "strip",   "lstrip",     "rstrip",
    "replace",    "upper",    "lower",  "title",   "capitalize", "find",    "rfind",      "index",
    "count",      "join",     "format", "isdigit", "isalpha",    "isalnum", "isspace",    "isupper",
    "islower",    "removeprefix", "removesuffix", "zfill", "ljust", "rjust", "center", "__mod__", "partition",
    "swapcase", "isnumeric", "isdecimal", "istitle"};
constexpr std::array kDictMethods = {"items", "keys", "values", "get", "copy"};
constexpr std::array kListMethods = {"index", "count", "copy"};
constexpr std::array kUnsafe = {"append", "extend", "insert", "pop", "remove", "clear", "sort",
                                "reverse", "update", "setdefault", "popitem", "add", "discard"};

template <size_t N>
bool in_list(const std::array<const char*, N>& a, std::string_view name) {
  return std::any_of(a.begin(), a.end(), [&](const char* m) { return name == m; });
}

std::vector<Value> strings_to_values(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

bool affix_match(const Value& arg, const std::string& s, bool prefix) {
  auto one = [&](const Value& x) {
    if (x.type != Type::string)
      raise_error("TypeError", std::string(prefix ? "startswith" : "endswith") +
                                   " first arg must be str or a tuple of str, not " + type_name(x));
    const std::string& a = x.s;
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (arg.type == Type::list) {
    for (auto& x : arg.u.list->items)
      if (one(x)) return true;
    return false;
  }
  return one(arg);
}

// "{} {0} {name}".format(...): fields without format specs, or with specs ignored.
std::string str_format(Interpreter& in, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    char c = fmt[k];
    if (c == '{' && k + 1 < fmt.size() && fmt[k + 1] == '{') { out.push_back('{'); ++k; continue; }
    if (c == '}' && k + 1 < fmt.size() && fmt[k + 1] == '}') { out.push_back('}'); ++k; continue; }
    if (c != '{') { out.push_back(c); continue; }
    size_t close = fmt.find('}', k);
    if (close == std::string::npos) raise_error("ValueError", "Single '{' encountered in format string");
    std::string field = fmt.substr(k + 1, close - k - 1);
    bool as_repr = false;
    size_t colon = field.find(':');
    if (colon != std::string::npos) field.resize(colon);
    size_t bang = field.find('!');
    if (bang != std::string::npos) {
      as_repr = field.substr(bang + 1) == "r";
      field.resize(bang);
    }
    Value v;
    if (field.empty()) {
      if (auto_idx >= args.args.size()) raise_error("IndexError", "Replacement index out of range");
      v = args.args[auto_idx++];
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      // Not std::stoul: an index of 20+ digits would throw std::out_of_range out of the render.
      size_t i = 0;
      if (std::from_chars(field.data(), field.data() + field.size(), i).ec != std::errc() || i >= args.args.size()) raise_error("IndexError", "Replacement index out of range");
      v = args.args[i];
    } else {
      const Value* kv = args.kwarg(field);
      if (!kv) raise_error("KeyError", "'" + field + "'");
      v = *kv;
    }
    out += as_repr ? repr(v) : to_str(v);
    in.check_string(out.size());
    k = close;
  }
  return out;
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : utf8_decode(s))
    if (!pred(c)) return false;
  return true;
}

}  // namespace

bool Interpreter::is_method(const Value& self, std::string_view name) const {
  switch (self.type) {
    case Type::string: return in_list(kStrMethods, name);
    case Type::dict: return in_list(kDictMethods, name) || in_list(kUnsafe, name);
    case Type::list: return in_list(kListMethods, name) || in_list(kUnsafe, name);
    case Type::object: return self.u.obj->kind == Object::Kind::callable && name == "cycle";
    default: return false;
  }
}

Value Interpreter::method(const Value& self, const std::string& name, CallArgs& args) {
  ArgReader a(args, name);
  if (in_list(kUnsafe, name) && (self.type == Type::list || self.type == Type::dict))
    raise_error("SecurityError", "access to attribute '" + name + "' of '" + type_name(self) +
                                     "' object is unsafe (templates cannot modify values)");
  if (self.type == Type::string) {
    const std::string& s = self.s;
    auto opt_str = [&](size_t pos, const char* nm, std::string& holder) -> const std::string* {
      const Value* v = a.get(pos, nm);
      if (!v || v->is_none() || v->is_undefined()) return nullptr;
      holder = to_str(*v);
      return &holder;
    };
    std::string h;
    if (name == "startswith" || name == "endswith") return Value::boolean(affix_match(a.required(0, "prefix"), s, name == "startswith"));
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value::string(py_strip(s, opt_str(0, "chars", h), name != "rstrip", name != "lstrip"));
    if (name == "split" || name == "rsplit") {
      const std::string* sep = opt_str(0, "sep", h);
      if (sep && sep->empty()) raise_error("ValueError", "empty separator");
      int64_t maxsplit = a.integer(1, "maxsplit", -1);
      auto parts = name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit);
      arena.charge(parts.size());
      return Value::of(arena.list(strings_to_values(std::move(parts))));
    }
    if (name == "splitlines") {
      auto parts = py_splitlines(s, a.boolean(0, "keepends", false));
      arena.charge(parts.size());
      return Value::of(arena.list(strings_to_values(std::move(parts))));
    }
    if (name == "replace") {
      std::string out = py_replace(s, to_str(a.required(0, "old")), to_str(a.required(1, "new")), a.integer(2, "count", -1));
      check_string(out.size());
      return Value::string(std::move(out));
    }
    if (name == "upper") return Value::string(py_upper(s));
    if (name == "lower") return Value::string(py_lower(s));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "swapcase") {
      std::string out = s;
      for (char& c : out) c = c >= 'a' && c <= 'z' ? char(c - 32) : c >= 'A' && c <= 'Z' ? char(c + 32) : c;
      return Value::string(out);
    }
    if (name == "find" || name == "rfind" || name == "index") {
      std::string sub = to_str(a.required(0, "sub"));
      size_t pos = name == "rfind" ? s.rfind(sub) : s.find(sub);
      if (pos == std::string::npos) {
        if (name == "index") raise_error("ValueError", "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(int64_t(utf8_length(std::string_view(s).substr(0, pos))));
    }
    if (name == "count") return Value::integer(py_count(s, to_str(a.required(0, "sub"))));
    if (name == "join") {
      std::string out;
      bool first = true;
      for (auto& x : iterate(a.required(0, "iterable"))) {
        if (x.type != Type::string) raise_error("TypeError", "sequence item: expected str instance, " + type_name(x) + " found");
        if (!first) out += s;
        first = false;
        out += x.s;
        check_string(out.size());
      }
      return Value::string(std::move(out));
    }
    if (name == "format") return Value::string(str_format(*this, s, args));
    if (name == "__mod__") return percent_format(s, a.required(0, "args"), *this);
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
      return Value::boolean(all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
    if (name == "isalpha")
      return Value::boolean(all_chars(s, [](char32_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }));
    if (name == "isalnum")
      return Value::boolean(all_chars(s, [](char32_t c) { return ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9'); }));
    if (name == "isspace") return Value::boolean(all_chars(s, py_isspace));
    if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
    if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
    if (name == "istitle") return Value::boolean(py_title(s) == s && py_lower(s) != s);
    if (name == "removeprefix") {
      std::string p = to_str(a.required(0, "prefix"));
      return Value::string(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
    }
    if (name == "removesuffix") {
      std::string p = to_str(a.required(0, "suffix"));
      bool hit = !p.empty() && p.size() <= s.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
      return Value::string(hit ? s.substr(0, s.size() - p.size()) : s);
    }
    if (name == "partition") {
      std::string sep = to_str(a.required(0, "sep"));
      size_t pos = s.find(sep);
      std::vector<Value> parts = pos == std::string::npos
          ? std::vector<Value>{Value::string(s), Value::string(""), Value::string("")}
          : std::vector<Value>{Value::string(s.substr(0, pos)), Value::string(sep), Value::string(s.substr(pos + sep.size()))};
      return Value::of(arena.list(std::move(parts), true));
    }
    if (name == "zfill" || name == "ljust" || name == "rjust" || name == "center") {
      int64_t width = std::min<int64_t>(a.integer(0, "width", 0), int64_t(limits.max_output_bytes));
      int64_t len = int64_t(utf8_length(s));
      if (width <= len) return self;
      std::string fill = name == "zfill" ? "0" : a.str(1, "fillchar", " ");
      size_t pad = size_t(width - len);
      std::string p;
      for (size_t k = 0; k < pad; ++k) p += fill;
      if (name == "ljust") return Value::string(s + p);
      if (name == "center") {
        size_t left = pad / 2 + (pad & size_t(width) & 1);
        std::string l, r;
        for (size_t k = 0; k < left; ++k) l += fill;
        for (size_t k = left; k < pad; ++k) r += fill;
        return Value::string(l + s + r);
      }
      if (name == "zfill" && !s.empty() && (s[0] == '-' || s[0] == '+')) return Value::string(s.substr(0, 1) + p + s.substr(1));
      return Value::string(p + s);
    }
  }
  if (self.type == Type::dict) {
    const Dict* d = self.u.dict;
    if (name == "get") {
      const Value* v = d->find(a.required(0, "key"));
      if (v) return *v;
      const Value* dflt = a.get(1, "default");
      return dflt ? *dflt : Value::none();
    }
    std::vector<Value> out;
    arena.charge(d->items.size());
    if (name == "copy") {
      Dict* c = arena.dict();
      c->items = d->items;
      c->depth = d->depth;
      return Value::of(c);
    }
    for (auto& kv : d->items) {
      if (name == "keys") out.push_back(kv.first);
      else if (name == "values") out.push_back(kv.second);
      else out.push_back(Value::of(arena.list({kv.first, kv.second}, true)));
    }
    return Value::of(arena.list(std::move(out)));
  }
  if (self.type == Type::list) {
    const auto& items = self.u.list->items;
    if (name == "copy") return Value::of(arena.list(items, self.u.list->is_tuple));
    const Value& x = a.required(0, "value");
    if (name == "count")
      return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& y) { return equals(x, y); }));
    for (size_t k = 0; k < items.size(); ++k)
      if (equals(items[k], x)) return Value::integer(int64_t(k));
    raise_error("ValueError", repr(x) + " is not in list");
  }
  if (self.type == Type::object && name == "cycle") {
    Value idx = get_attr(self, "index0");
    if (args.args.empty()) raise_error("TypeError", "no items for cycling given");
    return args.args[size_t(idx.u.i) % args.args.size()];
  }
  raise_error("AttributeError", "'" + type_name(self) + "' object has no attribute '" + name + "'");
}

}  // namespace hmoe::chat
