// A small JSON Schema validator for tests, written from the specification
// independently of engine/json_schema.cpp: type, properties, required,
// additionalProperties, items, minItems, maxItems, minLength, maxLength
// (code points), enum, const, anyOf, $ref (local pointers), $defs.
// Returns "" when `v` is valid, else where and why it is not.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace hmoe::test {

inline std::string schema_violation(const nlohmann::json& v, const nlohmann::json& s, const nlohmann::json& root, const std::string& at = "$") {
  using nlohmann::json;
  if (s.is_boolean()) return s.get<bool>() ? "" : at + ": false schema";
  if (s.contains("$ref")) {
    std::string r = s["$ref"];
    return schema_violation(v, root.at(json::json_pointer(r.substr(1))), root, at);
  }
  if (s.contains("const") && v != s["const"]) return at + ": not the const";
  if (s.contains("enum")) {
    bool hit = false;
    for (const auto& e : s["enum"]) hit = hit || e == v;
    if (!hit) return at + ": not in the enum";
  }
  if (s.contains("anyOf")) {
    for (const auto& alt : s["anyOf"])
      if (schema_violation(v, alt, root, at).empty()) return "";
    return at + ": matches no anyOf alternative";
  }
  if (s.contains("type")) {
    json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = false;
    for (const auto& t : types) {
      const std::string n = t;
      ok = ok || (n == "null" && v.is_null()) || (n == "boolean" && v.is_boolean()) || (n == "string" && v.is_string()) ||
           (n == "array" && v.is_array()) || (n == "object" && v.is_object()) || (n == "number" && v.is_number()) ||
           (n == "integer" && (v.is_number_integer() || (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<long long>(v.get<double>())))));
    }
    if (!ok) return at + ": wrong type " + v.dump();
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.dump();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (s.contains("properties") && s["properties"].contains(it.key())) {
        std::string e = schema_violation(it.value(), s["properties"][it.key()], root, at + "." + it.key());
        if (!e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        std::string e = schema_violation(it.value(), s["additionalProperties"], root, at + "." + it.key());
        if (!e.empty()) return e;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
    if (s.contains("items"))
      for (size_t i = 0; i < v.size(); ++i) {
        std::string e = schema_violation(v[i], s["items"], root, at + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
  }
  if (v.is_string()) {
    size_t cps = 0;
    for (unsigned char c : v.get<std::string>()) cps += (c & 0xC0) != 0x80;
    if (s.contains("minLength") && cps < s["minLength"].get<size_t>()) return at + ": string too short";
    if (s.contains("maxLength") && cps > s["maxLength"].get<size_t>()) return at + ": string too long";
  }
  return "";
}

inline std::string schema_violation(const nlohmann::json& v, const nlohmann::json& schema) { return schema_violation(v, schema, schema); }

}  // namespace hmoe::test
