// Header-level policies of the HTTP server, kept apart from the connection
// state machine (server/http_server.cpp):
// - Cors: opt-in cross-origin access (--cors-origins): which Origin a
//   response may name in Access-Control-Allow-Origin, and the headers of an
//   OPTIONS preflight reply. Off (no header ever sent) when the list is empty.
// - request_id(): X-Request-Id echoed when the client sent a sane one
//   (1..128 visible ASCII characters), else a fresh random one.
// - bearer_matches(): "Authorization: Bearer <key>" with the scheme
//   case-insensitive (RFC 7235) and the key compared in constant time.
//
// Thread safety: Cors is immutable after construction; the functions are pure.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace hmoe::server {

class Cors {
 public:
  // origins: comma-separated list of exact origins ("https://app.example.com")
  // or "*"; empty: CORS off. Throws hmoe::Error(invalid_argument) for an
  // entry that is not "*" or scheme://host[:port].
  explicit Cors(const std::string& origins);
  bool enabled() const { return any_ || !origins_.empty(); }
  // Header lines ("Name: value\r\n"...) for a response to a request with this
  // Origin; empty when CORS is off, no Origin was sent or it is not allowed.
  std::string response_headers(std::string_view origin) const;
  // Header lines of the 204 reply to a preflight; empty when not allowed.
  // request_headers: the preflight's Access-Control-Request-Headers.
  std::string preflight_headers(std::string_view origin, std::string_view request_headers) const;

 private:
  bool allowed(std::string_view origin) const;
  bool any_ = false;
  std::vector<std::string> origins_;
};

std::string request_id(std::string_view client_value);
bool bearer_matches(std::string_view authorization, const std::string& key);

}  // namespace hmoe::server
