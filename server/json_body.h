// check_json_body: the checks every request body gets on its raw bytes
// before it is parsed (engine/json_guard.h says why): nesting deeper than
// kMaxJsonDepth, a NUL byte, a duplicate object key. Each is a 400 ApiError
// whose param is the path of the offending field.
//
// Thread safety: pure.
#pragma once
#include <string_view>

namespace hmoe::server {

// Objects and arrays open at once in a request body. Tool JSON Schemas nest
// two levels per schema level, so this leaves room for ~60 schema levels.
inline constexpr int kMaxJsonDepth = 128;

void check_json_body(std::string_view body);

}  // namespace hmoe::server
