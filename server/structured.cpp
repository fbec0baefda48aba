#include "server/structured.h"

#include "engine/text/json_schema.h"
#include "server/api_error.h"

namespace hmoe::server {

using ojson = nlohmann::ordered_json;

void apply_json_schema(const ojson& spec, const ModelInfo& m, GenSpec& g, const std::string& param) {
  if (!m.json_vocab) throw ApiError(400, "structured outputs are not available on this server", param, "unsupported_value");
  if (!spec.is_object()) throw ApiError(400, "'" + param + "' json_schema must be an object with 'name' and 'schema'", param, "invalid_type");
  auto nm = spec.find("name");
  if (nm != spec.end() && !nm->is_string()) throw ApiError(400, "'" + param + "' json_schema 'name' must be a string", param, "invalid_type");
  auto sc = spec.find("schema");
  if (sc == spec.end() || sc->is_null()) throw ApiError(400, "'" + param + "' json_schema needs a 'schema'", param, "missing_required_parameter");
  if (auto st = spec.find("strict"); st != spec.end() && !st->is_null() && !st->is_boolean())
    throw ApiError(400, "'" + param + "' json_schema 'strict' must be a boolean", param, "invalid_type");
  try {
    g.sampling.grammar = json_schema_grammar(*sc);
  } catch (const SchemaError& e) {
    throw ApiError(400, param + ": " + e.what(), param, e.keyword.empty() ? "invalid_schema" : "unsupported_schema_keyword");
  }
  g.sampling.json = m.json_vocab->get();
  g.sampling.json_end_ids = g.stop_ids;
  g.sampling.grammar_trigger.clear();
}

void constrain_tool_calls(const ojson& tools, const std::string& choice, const std::string& forced_name, const ModelInfo& m, GenSpec& g) {
  if (!m.json_vocab || choice == "none") return;
  std::vector<ToolSchema> list;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& fn = tools[i]["function"];
    ToolSchema t;
    t.name = fn["name"].get<std::string>();
    if (choice == "named" && t.name != forced_name) continue;
    if (auto p = fn.find("parameters"); p != fn.end()) t.parameters = *p;
    if (auto s = fn.find("strict"); s != fn.end() && s->is_boolean()) t.strict = s->get<bool>();
    if (!t.strict && !t.parameters.is_null()) {
      // A tool not marked strict whose schema cannot be compiled at all (a broken $ref, an
      // unknown type) still gets calls: its arguments are then any object.
      try {
        Grammar scratch;
        compile_json_schema(scratch, t.parameters, false);
      } catch (const SchemaError&) {
        t.parameters = nullptr;
      }
    }
    list.push_back(std::move(t));
  }
  if (list.empty()) return;
  try {
    g.sampling.grammar = tool_call_grammar(list);
  } catch (const SchemaError& e) {
    throw ApiError(400, "tools: " + std::string(e.what()), "tools", e.keyword.empty() ? "invalid_schema" : "unsupported_schema_keyword");
  }
  g.sampling.json = m.json_vocab->get();
  g.sampling.json_end_ids = g.stop_ids;
  g.sampling.grammar_trigger = choice == "auto" ? "<tool_call>" : "";
}

}  // namespace hmoe::server
