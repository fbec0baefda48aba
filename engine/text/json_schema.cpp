#include "engine/text/json_schema.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <map>
#include <set>

namespace hmoe {

namespace {
using ojson = nlohmann::ordered_json;

constexpr size_t kMaxNodes = 4096, kMaxProps = 64, kMaxEnum = 1024, kMaxAlts = 16, kMaxDepth = 64;

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title",    "description", "default",  "examples",  "$schema", "$id",
                                          "$comment", "deprecated",  "readOnly", "writeOnly", "strict"};
  return s;
}
const std::set<std::string>& enforced() {
  static const std::set<std::string> s = {"type",     "properties", "required",  "additionalProperties", "items", "minItems", "maxItems",
                                          "minLength", "maxLength", "enum",      "const",                "anyOf", "$ref",     "$defs",
                                          "definitions"};
  return s;
}

std::string compact(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::strict); }

class Compiler {
 public:
  Compiler(Grammar& g, const ojson& root, bool strict) : g_(g), root_(root), strict_(strict) {}

  int32_t compile(const ojson& s, const std::string& at, int depth) {
    if (depth > static_cast<int>(kMaxDepth)) throw SchemaError("", at, "the schema is nested deeper than 64 levels at " + at);
    if (g_.nodes.size() > kMaxNodes) throw SchemaError("", at, "the schema has more than 4096 nodes");
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw SchemaError("false", at, "the schema 'false' at " + at + " matches nothing");
      return g_.any();
    }
    if (!s.is_object()) throw SchemaError("", at, "a schema must be an object or a boolean, at " + at);
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!enforced().count(it.key()) && !annotations().count(it.key()) && strict_)
        throw SchemaError(it.key(), at,
                          "JSON Schema keyword '" + it.key() + "' at " + at +
                              " cannot be enforced (supported: type, properties, required, additionalProperties, items, minItems, maxItems, "
                              "minLength, maxLength, enum, const, anyOf, $ref, $defs)");
    if (auto r = s.find("$ref"); r != s.end()) {
      if (!r->is_string()) throw SchemaError("$ref", at, "'$ref' at " + at + " must be a string");
      if (strict_)
        for (auto it = s.begin(); it != s.end(); ++it)
          if (it.key() != "$ref" && it.key() != "$defs" && it.key() != "definitions" && !annotations().count(it.key()))
            throw SchemaError(it.key(), at, "keyword '" + it.key() + "' next to '$ref' at " + at + " cannot be enforced");
      GrammarNode alias;
      alias.kind = GrammarNode::Kind::any_of;
      alias.alts.push_back(ref(r->get<std::string>(), at, depth));
      return g_.add(std::move(alias));
    }
    if (auto c = s.find("const"); c != s.end()) return literal_node(ojson::array({*c}), at);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) throw SchemaError("enum", at, "'enum' at " + at + " must be a non-empty array");
      return literal_node(*e, at);
    }
    if (auto a = s.find("anyOf"); a != s.end()) {
      if (!a->is_array() || a->empty()) throw SchemaError("anyOf", at, "'anyOf' at " + at + " must be a non-empty array");
      if (a->size() > kMaxAlts) throw SchemaError("anyOf", at, "'anyOf' at " + at + " has more than 16 alternatives");
      if (strict_)
        for (auto it = s.begin(); it != s.end(); ++it)
          if (it.key() != "anyOf" && it.key() != "$defs" && it.key() != "definitions" && !annotations().count(it.key()))
            throw SchemaError(it.key(), at, "keyword '" + it.key() + "' next to 'anyOf' at " + at + " cannot be enforced");
      GrammarNode n;
      n.kind = GrammarNode::Kind::any_of;
      for (size_t i = 0; i < a->size(); ++i) n.alts.push_back(compile((*a)[i], at + "/anyOf/" + std::to_string(i), depth + 1));
      return g_.add(std::move(n));
    }
    return value_node(s, at, depth);
  }

  // Alias chains of any_of nodes that come back to themselves would never consume a byte.
  void check_cycles() const {
    std::vector<int> state(g_.nodes.size(), 0);
    std::function<void(int32_t)> visit = [&](int32_t id) {
      const GrammarNode& n = g_.nodes[static_cast<size_t>(id)];
      if (n.kind != GrammarNode::Kind::any_of) return;
      if (state[static_cast<size_t>(id)] == 1) throw SchemaError("$ref", "", "the schema's $ref / anyOf chain refers to itself without a value in between");
      if (state[static_cast<size_t>(id)] == 2) return;
      state[static_cast<size_t>(id)] = 1;
      for (int32_t a : n.alts) visit(a);
      state[static_cast<size_t>(id)] = 2;
    };
    for (size_t i = 0; i < g_.nodes.size(); ++i) visit(static_cast<int32_t>(i));
  }

 private:
  int32_t ref(const std::string& r, const std::string& at, int depth) {
    if (r.empty() || r[0] != '#') throw SchemaError("$ref", at, "'$ref' '" + r + "' at " + at + " is not a local reference (only '#...' is supported)");
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    const ojson* cur = &root_;
    size_t i = 1;
    while (i < r.size()) {
      if (r[i] != '/') throw SchemaError("$ref", at, "'$ref' '" + r + "' at " + at + " is not a JSON pointer");
      size_t j = r.find('/', i + 1);
      if (j == std::string::npos) j = r.size();
      std::string tok = r.substr(i + 1, j - i - 1);
      for (size_t k = 0; (k = tok.find('~', k)) != std::string::npos; ++k) {
        if (k + 1 < tok.size() && tok[k + 1] == '1') tok.replace(k, 2, "/");
        else if (k + 1 < tok.size() && tok[k + 1] == '0') tok.replace(k, 2, "~");
      }
      // An array index is parsed without std::stoul: 20+ digits would throw std::out_of_range.
      size_t idx = 0;
      const bool index = cur->is_array() && !tok.empty() && tok.find_first_not_of("0123456789") == std::string::npos &&
                         std::from_chars(tok.data(), tok.data() + tok.size(), idx).ec == std::errc() && idx < cur->size();
      if (cur->is_object() && cur->contains(tok)) cur = &(*cur)[tok];
      else if (index) cur = &(*cur)[idx];
      else throw SchemaError("$ref", at, "'$ref' '" + r + "' at " + at + " does not resolve");
      i = j;
    }
    // Reserve the node first: the target may refer back to itself.
    GrammarNode alias;
    alias.kind = GrammarNode::Kind::any_of;
    const int32_t id = g_.add(std::move(alias));
    refs_[r] = id;
    const int32_t target = compile(*cur, r, depth + 1);
    g_.nodes[static_cast<size_t>(id)].alts.push_back(target);
    return id;
  }

  int32_t literal_node(const ojson& values, const std::string& at) {
    if (values.size() > kMaxEnum) throw SchemaError("enum", at, "'enum' at " + at + " has more than 1024 values");
    GrammarNode n;
    n.kind = GrammarNode::Kind::literal;
    for (const auto& v : values) {
      std::string t;
      try {
        t = compact(v);
      } catch (const std::exception&) {
        throw SchemaError("enum", at, "an enum/const value at " + at + " is not valid UTF-8");
      }
      if (t.size() > 4096) throw SchemaError("enum", at, "an enum/const value at " + at + " is longer than 4096 bytes");
      n.literals.push_back(std::move(t));
    }
    std::sort(n.literals.begin(), n.literals.end());
    n.literals.erase(std::unique(n.literals.begin(), n.literals.end()), n.literals.end());
    return g_.add(std::move(n));
  }

  uint32_t count_of(const ojson& s, const char* key, const std::string& at, uint32_t def) {
    auto it = s.find(key);
    if (it == s.end()) return def;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 0x7FFFFFFF)
      throw SchemaError(key, at, "'" + std::string(key) + "' at " + at + " must be a non-negative integer");
    return static_cast<uint32_t>(it->get<int64_t>());
  }

  int32_t value_node(const ojson& s, const std::string& at, int depth) {
    GrammarNode n;
    if (auto t = s.find("type"); t != s.end()) {
      n.types = 0;
      const ojson names = t->is_array() ? *t : ojson::array({*t});
      if (names.empty()) throw SchemaError("type", at, "'type' at " + at + " is an empty array");
      for (const auto& nm : names) {
        const std::string x = nm.is_string() ? nm.get<std::string>() : "";
        if (x == "null") n.types |= GrammarNode::t_null;
        else if (x == "boolean") n.types |= GrammarNode::t_bool;
        else if (x == "integer") n.types |= GrammarNode::t_integer;
        else if (x == "number") n.types |= GrammarNode::t_number;
        else if (x == "string") n.types |= GrammarNode::t_string;
        else if (x == "array") n.types |= GrammarNode::t_array;
        else if (x == "object") n.types |= GrammarNode::t_object;
        else throw SchemaError("type", at, "'type' at " + at + " names an unknown type " + nm.dump());
      }
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      n.types = GrammarNode::t_object;
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      n.types = GrammarNode::t_array;
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      n.types = GrammarNode::t_string;
    }
    const int32_t id = g_.add(GrammarNode{});  // reserved: children are added after it
    // object
    bool has_props = false;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) throw SchemaError("properties", at, "'properties' at " + at + " must be an object");
      if (p->size() > kMaxProps) throw SchemaError("properties", at, "'properties' at " + at + " has more than 64 properties");
      has_props = true;
      for (auto it = p->begin(); it != p->end(); ++it) {
        const std::string key = compact(ojson(it.key()));
        if (key.size() != it.key().size() + 2)
          throw SchemaError("properties", at, "property name " + key + " at " + at + " needs escapes, which are not supported in property names");
        n.prop_names.push_back(it.key());
        n.prop_nodes.push_back(compile(it.value(), at + "/properties/" + it.key(), depth + 1));
      }
    }
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) throw SchemaError("required", at, "'required' at " + at + " must be an array of names");
      for (const auto& nm : *r) {
        auto pos = nm.is_string() ? std::find(n.prop_names.begin(), n.prop_names.end(), nm.get<std::string>()) : n.prop_names.end();
        if (pos == n.prop_names.end()) {
          if (strict_) throw SchemaError("required", at, "'required' at " + at + " names " + nm.dump() + ", which is not in 'properties'");
          continue;
        }
        n.required |= uint64_t{1} << (pos - n.prop_names.begin());
      }
    }
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (a->is_boolean()) n.additional = a->get<bool>() ? g_.any() : -1;
      else n.additional = compile(*a, at + "/additionalProperties", depth + 1);
    } else {
      n.additional = has_props ? -1 : g_.any();
    }
    // array
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) throw SchemaError("items", at, "'items' at " + at + " is an array (tuple form); use one schema");
      n.items = compile(*it, at + "/items", depth + 1);
    } else {
      n.items = g_.any();
    }
    n.min_items = count_of(s, "minItems", at, 0);
    n.max_items = count_of(s, "maxItems", at, UINT32_MAX);
    n.min_len = count_of(s, "minLength", at, 0);
    n.max_len = count_of(s, "maxLength", at, UINT32_MAX);
    if (n.min_items > n.max_items) throw SchemaError("minItems", at, "'minItems' > 'maxItems' at " + at);
    if (n.min_len > n.max_len) throw SchemaError("minLength", at, "'minLength' > 'maxLength' at " + at);
    g_.nodes[static_cast<size_t>(id)] = std::move(n);
    return id;
  }

  Grammar& g_;
  const ojson& root_;
  bool strict_;
  std::map<std::string, int32_t> refs_;
};
}  // namespace

int32_t compile_json_schema(Grammar& g, const nlohmann::ordered_json& schema, bool strict) {
  Compiler c(g, schema, strict);
  const int32_t root = c.compile(schema, "#", 0);
  c.check_cycles();
  return root;
}

std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  auto g = std::make_shared<Grammar>();
  const int32_t root = compile_json_schema(*g, schema, true);
  g->items.push_back(Grammar::Item{false, {}, root});
  return g;
}

std::shared_ptr<const Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools) {
  auto g = std::make_shared<Grammar>();
  if (tools.size() > kMaxAlts) {
    // More tools than alternatives the state follows at once: the name is one of them, the
    // arguments any object (still a parseable call of an offered tool).
    GrammarNode names;
    names.kind = GrammarNode::Kind::literal;
    for (const ToolSchema& t : tools) names.literals.push_back(compact(ojson(t.name)));
    std::sort(names.literals.begin(), names.literals.end());
    names.literals.erase(std::unique(names.literals.begin(), names.literals.end()), names.literals.end());
    const int32_t name_id = g->add(std::move(names));
    GrammarNode any_object;
    any_object.types = GrammarNode::t_object;
    any_object.additional = g->any();
    any_object.items = g->any();
    const int32_t args = g->add(std::move(any_object));
    GrammarNode call;
    call.types = GrammarNode::t_object;
    call.prop_names = {"name", "arguments"};
    call.prop_nodes = {name_id, args};
    call.required = 3;
    g->items.push_back(Grammar::Item{false, {}, g->add(std::move(call))});
    g->items.push_back(Grammar::Item{true, "\n</tool_call>", -1});
    return g;
  }
  GrammarNode calls;
  calls.kind = GrammarNode::Kind::any_of;
  for (const ToolSchema& t : tools) {
    GrammarNode name;
    name.kind = GrammarNode::Kind::literal;
    name.literals.push_back(compact(ojson(t.name)));
    const int32_t name_id = g->add(std::move(name));
    int32_t args;
    if (t.parameters.is_null()) {
      GrammarNode any_object;
      any_object.types = GrammarNode::t_object;
      any_object.additional = g->any();
      any_object.items = g->any();
      args = g->add(std::move(any_object));
    } else {
      int32_t root = compile_json_schema(*g, t.parameters, t.strict);
      if (root == g->any_node) {  // the shared any-value node: arguments get their own any-object node
        GrammarNode any_object;
        any_object.types = GrammarNode::t_object;
        any_object.additional = g->any();
        any_object.items = g->any();
        root = g->add(std::move(any_object));
      }
      GrammarNode& r = g->nodes[static_cast<size_t>(root)];
      if (r.kind == GrammarNode::Kind::value) r.types &= GrammarNode::t_object;  // arguments are an object
      if (r.kind == GrammarNode::Kind::value && r.types == 0) throw SchemaError("type", "#", "the parameters of tool '" + t.name + "' do not allow an object");
      args = root;
    }
    GrammarNode call;
    call.types = GrammarNode::t_object;
    call.prop_names = {"name", "arguments"};
    call.prop_nodes = {name_id, args};
    call.required = 3;
    call.additional = -1;
    calls.alts.push_back(g->add(std::move(call)));
  }
  const int32_t root = calls.alts.size() == 1 ? calls.alts[0] : g->add(std::move(calls));
  g->items.push_back(Grammar::Item{false, {}, root});
  g->items.push_back(Grammar::Item{true, "\n</tool_call>", -1});
  return g;
}

}  // namespace hmoe
