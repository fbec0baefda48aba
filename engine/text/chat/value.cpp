// Python semantics for interpreter values: str(), repr(), json.dumps, ==, <.
#include "engine/text/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "configs/error.h"

namespace hmoe::chat {

void raise_error(std::string_view py_type, const std::string& msg) {
  throw Error(ErrorKind::invalid_argument, std::string(py_type) + ": " + msg);
}

// ---- containers ------------------------------------------------------------

const Value* Dict::find(std::string_view key) const {
  for (auto& kv : items)
    if (kv.first.type == Type::string && kv.first.s == key) return &kv.second;
  return nullptr;
}

const Value* Dict::find(const Value& key) const {
  if (key.type == Type::string) return find(std::string_view(key.s));
  for (auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  depth = std::max<uint32_t>(depth, depth_of(value) + 1);
  for (auto& kv : items)
    if (equals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

Value* Namespace::find(std::string_view name) {
  for (auto& kv : attrs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

uint32_t depth_of(const Value& v) {
  if (v.type == Type::list) return v.u.list->depth;
  if (v.type == Type::dict) return v.u.dict->depth;
  return 0;
}

void Arena::charge(size_t n) {
  used_ += n;
  if (used_ > max_items_)
    raise_error("LimitError", "the template created more than " + std::to_string(max_items_) +
                                  " values (limit)");
}

List* Arena::list(std::vector<Value> items, bool tuple) {
  charge(items.size());
  uint32_t d = 0;
  for (auto& v : items) d = std::max(d, depth_of(v));
  if (d + 1 > uint32_t(max_depth_))
    raise_error("LimitError", "value nested deeper than " + std::to_string(max_depth_) + " levels");
  List* l = make<List>();
  l->items = std::move(items);
  l->depth = d + 1;
  l->is_tuple = tuple;
  return l;
}

Dict* Arena::dict() { return make<Dict>(); }

// ---- UTF-8 -----------------------------------------------------------------

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Invalid bytes decode to U+FFFD one byte at a time (never throws).
std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) { out.push_back(c); ++i; continue; }
    int len = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (c >= 0xF8) len = 0;
    char32_t cp = len == 4 ? c & 0x07 : len == 3 ? c & 0x0F : c & 0x1F;
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) { out.push_back(0xFFFD); ++i; continue; }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return utf8_decode(s).size();
}

bool py_isspace(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 ||
         c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---- str / repr ------------------------------------------------------------

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::undefined: case Type::none: return false;
    case Type::boolean: return v.u.b;
    case Type::integer: return v.u.i != 0;
    case Type::real: return v.u.d != 0.0;
    case Type::string: return !v.s.empty();
    case Type::list: return !v.u.list->items.empty();
    case Type::dict: return !v.u.dict->items.empty();
    case Type::object: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.type) {
    case Type::undefined: return "Undefined";
    case Type::none: return "NoneType";
    case Type::boolean: return "bool";
    case Type::integer: return "int";
    case Type::real: return "float";
    case Type::string: return "str";
    case Type::list: return v.u.list->is_tuple ? "tuple" : "list";
    case Type::dict: return "dict";
    case Type::object:
      switch (v.u.obj->kind) {
        case Object::Kind::ns: return "Namespace";
        case Object::Kind::loop: return "LoopContext";
        case Object::Kind::callable: return "function";
      }
  }
  return "object";
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX, shortest round-trip digits
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t k = 0; k < e; ++k)
    if (sci[k] != '.') digits.push_back(sci[k]);
  std::string out;
  if (exp >= -5 + 1 && exp < 16) {  // Python repr: fixed when -4 <= exp < 16
    int point = exp + 1;             // digits before the decimal point
    if (point <= 0) {
      out = "0." + std::string(size_t(-point), '0') + digits;
    } else if (size_t(point) >= digits.size()) {
      out = digits + std::string(size_t(point) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string repr_string(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == char32_t(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      char b[16];
      std::snprintf(b, sizeof b, "\\x%02x", unsigned(c));
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(q);
  return out;
}

// depth guards cycles (a namespace may hold itself) and deep nesting.
static void repr_into(std::string& out, const Value& v, bool top, int depth = 0) {
  if (depth > 1000) raise_error("RecursionError", "value nested too deeply (or cyclic) to print");
  switch (v.type) {
    case Type::string:
      if (top) out += v.s;
      else out += repr_string(v.s);
      return;
    case Type::list: {
      const List* l = v.u.list;
      out += l->is_tuple ? '(' : '[';
      for (size_t k = 0; k < l->items.size(); ++k) {
        if (k) out += ", ";
        repr_into(out, l->items[k], false, depth + 1);
      }
      if (l->is_tuple && l->items.size() == 1) out += ',';
      out += l->is_tuple ? ')' : ']';
      return;
    }
    case Type::dict: {
      out += '{';
      bool first = true;
      for (auto& kv : v.u.dict->items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, kv.first, false, depth + 1);
        out += ": ";
        repr_into(out, kv.second, false, depth + 1);
      }
      out += '}';
      return;
    }
    case Type::undefined: return;
    case Type::none: out += "None"; return;
    case Type::boolean: out += v.u.b ? "True" : "False"; return;
    case Type::integer: out += std::to_string(v.u.i); return;
    case Type::real: out += format_float(v.u.d); return;
    case Type::object:
      if (v.u.obj->kind == Object::Kind::ns) {
        out += "<Namespace {";
        bool first = true;
        for (auto& kv : static_cast<Namespace*>(v.u.obj)->attrs) {
          if (!first) out += ", ";
          first = false;
          out += repr_string(kv.first) + ": ";
          repr_into(out, kv.second, false, depth + 1);
        }
        out += "}>";
      } else if (v.u.obj->kind == Object::Kind::callable) {
        out += "<function " + static_cast<Callable*>(v.u.obj)->name() + ">";
      } else {
        out += "<LoopContext>";
      }
      return;
  }
}

std::string to_str(const Value& v) {
  if (v.type == Type::string) return v.s;
  std::string out;
  repr_into(out, v, true);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, false);
  return out;
}

// ---- comparison ------------------------------------------------------------

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Type::real && b.type != Type::real) {
      int64_t x = a.type == Type::boolean ? a.u.b : a.u.i;
      int64_t y = b.type == Type::boolean ? b.u.b : b.u.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::undefined: case Type::none: return true;
    case Type::string: return a.s == b.s;
    case Type::list: {
      auto& x = a.u.list->items;
      auto& y = b.u.list->items;
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equals(x[k], y[k])) return false;
      return true;
    }
    case Type::dict: {
      auto& x = a.u.dict->items;
      if (x.size() != b.u.dict->items.size()) return false;
      for (auto& kv : x) {
        const Value* o = b.u.dict->find(kv.first);
        if (!o || !equals(kv.second, *o)) return false;
      }
      return true;
    }
    case Type::object: return a.u.obj == b.u.obj;
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type != Type::real && b.type != Type::real) {
      int64_t x = a.type == Type::boolean ? a.u.b : a.u.i;
      int64_t y = b.type == Type::boolean ? b.u.b : b.u.i;
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type == Type::string && b.type == Type::string) {
    // Python compares code points; UTF-8 byte order is the same order.
    int c = a.s.compare(b.s);
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.type == Type::list && b.type == Type::list) {
    auto& x = a.u.list->items;
    auto& y = b.u.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (equals(x[k], y[k])) continue;
      return compare(x[k], y[k]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  raise_error("TypeError", "'<' not supported between instances of '" + type_name(a) + "' and '" +
                               type_name(b) + "'");
}

// ---- JSON ------------------------------------------------------------------

static void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  auto esc = [&](char32_t c) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
    out += b;
  };
  auto plain = [&](char32_t c) -> bool {
    switch (c) {
      case '"': out += "\\\""; return true;
      case '\\': out += "\\\\"; return true;
      case '\n': out += "\\n"; return true;
      case '\r': out += "\\r"; return true;
      case '\t': out += "\\t"; return true;
      case '\b': out += "\\b"; return true;
      case '\f': out += "\\f"; return true;
    }
    if (c < 0x20) { esc(c); return true; }
    return false;
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      unsigned char c = ch;
      if (c >= 0x80 || !plain(c)) out.push_back(ch);
    }
  } else {
    for (char32_t c : utf8_decode(s)) {
      if (plain(c)) continue;
      if (c < 0x7F + 1) {
        out.push_back(char(c));
      } else if (c < 0x10000) {
        esc(c);
      } else {
        char32_t v = c - 0x10000;
        esc(0xD800 + (v >> 10));
        esc(0xDC00 + (v & 0x3FF));
      }
    }
  }
  out.push_back('"');
}

static void json_into(std::string& out, const Value& v, const JsonOptions& opt, int level) {
  if (level > 1000) raise_error("ValueError", "value too deeply nested for tojson");
  auto newline = [&](int lvl) {
    out.push_back('\n');
    out.append(size_t(opt.indent) * size_t(lvl), ' ');
  };
  switch (v.type) {
    case Type::none: out += "null"; return;
    case Type::boolean: out += v.u.b ? "true" : "false"; return;
    case Type::integer: out += std::to_string(v.u.i); return;
    case Type::real:
      if (std::isnan(v.u.d)) out += "NaN";
      else if (std::isinf(v.u.d)) out += v.u.d > 0 ? "Infinity" : "-Infinity";
      else out += format_float(v.u.d);
      return;
    case Type::string: json_string(out, v.s, opt.ensure_ascii); return;
    case Type::list: {
      auto& items = v.u.list->items;
      if (items.empty()) { out += "[]"; return; }
      out.push_back('[');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent >= 0) newline(level + 1);
        json_into(out, items[k], opt, level + 1);
      }
      if (opt.indent >= 0) newline(level);
      out.push_back(']');
      return;
    }
    case Type::dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (auto& kv : v.u.dict->items) items.push_back(&kv);
      if (items.empty()) { out += "{}"; return; }
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return compare(a->first, b->first) < 0; });
      out.push_back('{');
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += opt.item_sep;
        first = false;
        if (opt.indent >= 0) newline(level + 1);
        const Value& k = kv->first;
        switch (k.type) {  // json.dumps coerces basic keys to strings
          case Type::string: json_string(out, k.s, opt.ensure_ascii); break;
          case Type::integer: out += '"' + std::to_string(k.u.i) + '"'; break;
          case Type::real: out += '"' + format_float(k.u.d) + '"'; break;
          case Type::boolean: out += k.u.b ? "\"true\"" : "\"false\""; break;
          case Type::none: out += "\"null\""; break;
          default:
            raise_error("TypeError", "keys must be str, int, float, bool or None, not " + type_name(k));
        }
        out += opt.key_sep;
        json_into(out, kv->second, opt, level + 1);
      }
      if (opt.indent >= 0) newline(level);
      out.push_back('}');
      return;
    }
    case Type::undefined:
      raise_error("TypeError", "Object of type Undefined is not JSON serializable");
    case Type::object:
      raise_error("TypeError", "Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_into(out, v, opt, 0);
  return out;
}

static Value from_json_at(const nlohmann::ordered_json& j, Arena& arena, int depth) {
  if (depth > arena.max_depth())
    raise_error("ValueError", "request JSON nested deeper than " + std::to_string(arena.max_depth()) +
                                  " levels");
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: case T::discarded: return Value::none();
    case T::boolean: return Value::boolean(j.get<bool>());
    case T::number_integer: return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t x = j.get<uint64_t>();
      return x > uint64_t(INT64_MAX) ? Value::real(double(x)) : Value::integer(int64_t(x));
    }
    case T::number_float: return Value::real(j.get<double>());
    case T::string: return Value::string(j.get<std::string>());
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (auto& e : j) items.push_back(from_json_at(e, arena, depth + 1));
      return Value::of(arena.list(std::move(items)));
    }
    case T::object: {
      Dict* d = arena.dict();
      arena.charge(j.size());
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        Value v = from_json_at(it.value(), arena, depth + 1);
        d->depth = std::max<uint32_t>(d->depth, depth_of(v) + 1);
        d->items.emplace_back(Value::string(it.key()), std::move(v));  // keys are unique
      }
      return Value::of(d);
    }
    case T::binary: return Value::none();
  }
  return Value::none();
}

Value from_json(const nlohmann::ordered_json& j, Arena& arena) { return from_json_at(j, arena, 0); }

}  // namespace hmoe::chat
