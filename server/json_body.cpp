#include "server/json_body.h"

#include <string>

#include "engine/text/json_guard.h"
#include "server/api_error.h"

namespace hmoe::server {

void check_json_body(std::string_view body) {
  const JsonScanIssue is = scan_json(body, kMaxJsonDepth, true);
  const std::string where = is.path.empty() ? std::string("the top level") : "'" + is.path + "'";
  switch (is.kind) {
    case JsonScanIssue::Kind::none: return;
    case JsonScanIssue::Kind::too_deep:
      throw ApiError(400, "request body nests objects and arrays deeper than " + std::to_string(kMaxJsonDepth) + " levels (at " + where + ", byte " +
                              std::to_string(is.offset) + ")",
                     is.path, "json_too_deep");
    case JsonScanIssue::Kind::nul_byte:
      throw ApiError(400, "request body contains a NUL byte at byte " + std::to_string(is.offset) + " (in " + where + ")", is.path, "invalid_json");
    case JsonScanIssue::Kind::duplicate_key:
      throw ApiError(400, "request body repeats the key '" + is.key + "' (at " + where + ", byte " + std::to_string(is.offset) + ")", is.path,
                     "duplicate_key");
  }
}

}  // namespace hmoe::server
