// Structured outputs and constrained tool calls for request parsing: turns
// a JSON Schema (response_format json_schema, Responses text.format) or the
// request's tools into a Grammar on the GenSpec's sampling parameters
// (engine/grammar.h, engine/json_schema.h). Schemas with keywords that
// cannot be enforced are refused with a 400 naming the keyword.
//
// Thread safety: pure functions of their arguments.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace hmoe::server {

// {"name", "schema", "strict", "description"} of a json_schema response
// format; `param` names the field in errors ("response_format" or "text").
void apply_json_schema(const nlohmann::ordered_json& spec, const ModelInfo& m, GenSpec& g, const std::string& param);

// The request's tools (chat format: [{"type":"function","function":{...}}])
// under tool_choice "required"/"named" (forced: the output is exactly one
// call, the prompt already opened it) or "auto" (a call the model starts
// with <tool_call> is constrained until it is closed). A tool marked
// "strict" must have an enforceable schema (400 otherwise); for the others
// unenforceable keywords are left out, and a schema that cannot be
// compiled at all leaves the arguments as any object.
void constrain_tool_calls(const nlohmann::ordered_json& tools, const std::string& choice, const std::string& forced_name, const ModelInfo& m,
                          GenSpec& g);

}  // namespace hmoe::server
