#include "server/http_headers.h"

#include <algorithm>
#include <cctype>

#include "configs/error.h"
#include "engine/serving/random_id.h"

namespace hmoe::server {

namespace {
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}
bool visible_ascii(std::string_view s) {
  for (char c : s)
    if (c < 0x21 || c > 0x7e) return false;
  return true;
}
bool const_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}
}  // namespace

Cors::Cors(const std::string& origins) {
  std::string_view rest = origins;
  while (!rest.empty()) {
    const size_t c = rest.find(',');
    std::string_view o = trim(rest.substr(0, c));
    rest = c == std::string_view::npos ? std::string_view() : rest.substr(c + 1);
    if (o.empty()) continue;
    if (o == "*") {
      any_ = true;
      continue;
    }
    const size_t sep = o.find("://");
    if (sep == std::string_view::npos || sep == 0 || sep + 3 >= o.size() || o.back() == '/' || !visible_ascii(o) ||
        o.find('/', sep + 3) != std::string_view::npos)
      fail(ErrorKind::invalid_argument, "--cors-origins: '" + std::string(o) + "' is not an origin (scheme://host[:port], no path) or *");
    origins_.emplace_back(o);
  }
}

bool Cors::allowed(std::string_view origin) const {
  if (origin.empty() || !visible_ascii(origin)) return false;
  if (any_) return true;
  for (const auto& o : origins_)
    if (o.size() == origin.size() && std::equal(o.begin(), o.end(), origin.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); }))
      return true;
  return false;
}

std::string Cors::response_headers(std::string_view origin) const {
  if (!allowed(origin)) return {};
  return "Access-Control-Allow-Origin: " + (any_ ? std::string("*") : std::string(origin)) +
         "\r\nAccess-Control-Expose-Headers: X-Request-Id\r\nVary: Origin\r\n";
}

std::string Cors::preflight_headers(std::string_view origin, std::string_view request_headers) const {
  if (!allowed(origin)) return {};
  // Echo the requested header names when they are plain tokens; a fixed list otherwise.
  std::string hdrs = "Authorization, Content-Type, X-Request-Id";
  request_headers = trim(request_headers);
  bool token_list = !request_headers.empty() && request_headers.size() <= 1024;
  for (char c : request_headers)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' || c == ' ')) token_list = false;
  if (token_list) hdrs = std::string(request_headers);
  return response_headers(origin) + "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: " + hdrs +
         "\r\nAccess-Control-Max-Age: 600\r\n";
}

std::string request_id(std::string_view v) {
  if (!v.empty() && v.size() <= 128 && visible_ascii(v)) return std::string(v);
  return random_alnum(32);
}

bool bearer_matches(std::string_view auth, const std::string& key) {
  auth = trim(auth);
  constexpr std::string_view kScheme = "bearer";
  bool scheme = auth.size() > kScheme.size() && (auth[kScheme.size()] == ' ' || auth[kScheme.size()] == '\t');
  for (size_t i = 0; scheme && i < kScheme.size(); ++i) scheme = std::tolower(static_cast<unsigned char>(auth[i])) == kScheme[i];
  std::string_view token = scheme ? trim(auth.substr(kScheme.size())) : std::string_view();
  return const_time_equal(token, key) && scheme;
}

}  // namespace hmoe::server
