// JSON Schema -> Grammar (engine/grammar.h) for structured outputs
// (response_format json_schema) and constrained tool calls.
//
// Enforced keywords: type (a name or an array of names), properties,
// required, additionalProperties (false, true or a schema), items,
// minItems, maxItems, minLength, maxLength, enum, const, anyOf, $ref (local
// JSON pointers: "#", "#/$defs/...", "#/definitions/..."; recursion allowed),
// $defs / definitions. Annotations are ignored: title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly,
// writeOnly, strict. Any other keyword (pattern, format, minimum, oneOf,
// allOf, prefixItems, ...) cannot be enforced: strict compilation throws
// SchemaError naming it; lenient compilation (tools not marked strict)
// leaves it out and enforces the rest.
//
// Outputs are a sound subset of what the schema allows: properties come in
// the schema's order; an object with `properties` and no
// `additionalProperties` takes only its listed keys (an object without
// `properties` takes any keys); integers are written without fraction or
// exponent; numbers have at most 20 integer and 20 fraction digits.
//
// Limits (SchemaError when passed): 4,096 nodes, 64 properties per object,
// 1,024 enum values, 16 anyOf alternatives, schema nesting 64.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/text/grammar.h"

namespace hmoe {

class SchemaError : public Error {
 public:
  SchemaError(std::string keyword, std::string where, const std::string& msg)
      : Error(ErrorKind::invalid_argument, msg), keyword(std::move(keyword)), where(std::move(where)) {}
  std::string keyword;  // the offending keyword ("" when it is not one keyword)
  std::string where;    // JSON pointer inside the schema
};

// Adds the schema's nodes to g; returns the root node.
int32_t compile_json_schema(Grammar& g, const nlohmann::ordered_json& schema, bool strict);

// The whole output is one JSON value matching `schema` (strict).
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);

struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;  // null: any object
  bool strict = false;
};
// A Hermes tool call body and its end: {"name": NAME, "arguments": ARGS}
// for one of `tools`, then "\n</tool_call>" (the "<tool_call>" before it is
// in the prompt or already generated). With more than 16 tools only the
// name is held to the list and the arguments to any object.
std::shared_ptr<const Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools);

}  // namespace hmoe
