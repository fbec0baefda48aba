// Values of the Jinja2 interpreter, with Python semantics: str(), repr(),
// truthiness, equality and json.dumps formatting are Python's, because the
// reference output is produced by Python's jinja2.
//
// Containers live in a per-render Arena and are referred to by raw pointer:
// one render owns everything it creates, destruction is flat (no recursive
// destructors on deeply nested values, no reference cycles through
// namespaces), and the arena enforces the render's memory limits.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace hmoe::chat {

struct List;
struct Dict;
class Object;

enum class Type : uint8_t { undefined, none, boolean, integer, real, string, list, dict, object };

struct Value {
  Type type = Type::undefined;
  union {
    bool b;
    int64_t i;
    double d;
    List* list;
    Dict* dict;
    Object* obj;
  } u{};
  std::string s;  // the string; for undefined, the name looked up (for messages)

  static Value undefined(std::string hint = {}) {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() { Value v; v.type = Type::none; return v; }
  static Value boolean(bool x) { Value v; v.type = Type::boolean; v.u.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.type = Type::integer; v.u.i = x; return v; }
  static Value real(double x) { Value v; v.type = Type::real; v.u.d = x; return v; }
  static Value string(std::string x) { Value v; v.type = Type::string; v.s = std::move(x); return v; }
  static Value of(List* l) { Value v; v.type = Type::list; v.u.list = l; return v; }
  static Value of(Dict* d) { Value v; v.type = Type::dict; v.u.dict = d; return v; }
  static Value of(Object* o) { Value v; v.type = Type::object; v.u.obj = o; return v; }

  bool is_undefined() const { return type == Type::undefined; }
  bool is_none() const { return type == Type::none; }
  bool is_string() const { return type == Type::string; }
  bool is_number() const { return type == Type::integer || type == Type::real || type == Type::boolean; }
  double as_double() const {
    return type == Type::real ? u.d : type == Type::integer ? double(u.i) : double(u.b);
  }
};

// Everything an arena owns derives from this.
struct HeapItem {
  virtual ~HeapItem() = default;
};

struct List : HeapItem {
  std::vector<Value> items;
  uint32_t depth = 1;
  bool is_tuple = false;
};

struct Dict : HeapItem {
  std::vector<std::pair<Value, Value>> items;  // insertion order, as Python
  uint32_t depth = 1;
  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;
  void set(Value key, Value value);
};

class Interpreter;
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  const Value* kwarg(std::string_view name) const {
    for (auto& kv : kwargs)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
};

class Object : public HeapItem {
 public:
  enum class Kind : uint8_t { ns, loop, callable };
  explicit Object(Kind k) : kind(k) {}
  const Kind kind;
};

struct Namespace : Object {
  Namespace() : Object(Kind::ns) {}
  std::vector<std::pair<std::string, Value>> attrs;
  Value* find(std::string_view name);
};

struct LoopInfo : Object {
  LoopInfo() : Object(Kind::loop) {}
  const List* items = nullptr;  // the (filtered) sequence iterated
  int64_t index0 = 0;
  int64_t depth0 = 0;
};

struct Callable : Object {
  Callable() : Object(Kind::callable) {}
  virtual Value call(Interpreter& in, CallArgs& args) = 0;
  virtual std::string name() const = 0;
};

// Per-render owner of all containers; enforces limits on what a render may create.
class Arena {
 public:
  Arena(size_t max_items, int max_depth) : max_items_(max_items), max_depth_(max_depth) {}
  template <class T, class... A>
  T* make(A&&... a) {
    charge(1);
    auto p = std::make_unique<T>(std::forward<A>(a)...);
    T* raw = p.get();
    items_.push_back(std::move(p));
    return raw;
  }
  List* list(std::vector<Value> items, bool tuple = false);  // computes depth, checks limits
  Dict* dict();
  void charge(size_t n);  // throws past max_items
  int max_depth() const { return max_depth_; }

 private:
  std::vector<std::unique_ptr<HeapItem>> items_;
  size_t used_ = 0;
  size_t max_items_;
  int max_depth_;
};

uint32_t depth_of(const Value& v);

// Throws hmoe::Error(invalid_argument, "<py_type>: <msg>"); the interpreter
// adds the template line.
[[noreturn]] void raise_error(std::string_view py_type, const std::string& msg);

// Python semantics.
bool truthy(const Value& v);
std::string type_name(const Value& v);            // Python's: 'str', 'int', 'NoneType', ...
std::string to_str(const Value& v);               // str(v); undefined is ""
std::string repr(const Value& v);                 // repr(v)
std::string repr_string(std::string_view s);      // repr of a str
std::string format_float(double d);               // repr(float)
bool equals(const Value& a, const Value& b);      // ==
int compare(const Value& a, const Value& b);      // <0, 0, >0; throws TypeError for mixed types

struct JsonOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) with Python's formatting; throws on undefined and objects.
std::string to_json(const Value& v, const JsonOptions& opt);

// Request JSON into values (depth-limited).
Value from_json(const nlohmann::ordered_json& j, Arena& arena);

// UTF-8 helpers: strings index and slice by code point, as Python's str does.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
bool is_ascii(std::string_view s);
size_t utf8_length(std::string_view s);
bool py_isspace(char32_t c);

}  // namespace hmoe::chat
