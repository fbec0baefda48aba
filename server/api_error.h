// ApiError: a request that cannot be served, with the HTTP status and the
// fields of an OpenAI error body {"error": {"message", "type", "param",
// "code"}}. Thrown by request parsing; the HTTP layer turns it into a reply.
#pragma once
#include <stdexcept>
#include <string>

namespace hmoe::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {}, std::string type = {})
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)), type(std::move(type)) {
    if (this->type.empty()) this->type = default_type(status);
  }
  static std::string default_type(int status) {
    switch (status) {
      case 401: return "authentication_error";
      case 403: return "permission_error";
      case 404: return "not_found_error";
      case 413:
      case 431:
      case 400: return "invalid_request_error";
      case 429: return "rate_limit_error";
      default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
  int status;
  std::string param, code, type;
};

// The JSON error body; empty param/code become null.
std::string error_body(int status, const std::string& message, const std::string& param = {}, const std::string& code = {},
                       const std::string& type = {});
inline std::string error_body(const ApiError& e) { return error_body(e.status, e.what(), e.param, e.code, e.type); }

}  // namespace hmoe::server
