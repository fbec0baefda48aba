// A small blocking HTTP/1.1 client over POSIX sockets for the server tests:
// one request per connection (Connection: close), chunked bodies decoded,
// SSE events split out. Raw access (connect_raw) for the slow and broken
// clients of the robustness tests.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hmoe::test {

struct HttpReply {
  int status = 0;  // 0: no reply (connection closed or timed out)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  std::vector<std::string> events;             // SSE "data:" payloads
};

inline int connect_raw(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the peer closes or timeout_ms passes without data.
inline std::string recv_all(int fd, int timeout_ms = 60000) {
  std::string out;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

inline HttpReply parse_reply(const std::string& raw) {
  HttpReply r;
  const size_t he = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || he == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  size_t pos = raw.find("\r\n") + 2;
  while (pos < he) {
    size_t e = raw.find("\r\n", pos);
    std::string line = raw.substr(pos, e - pos);
    size_t c = line.find(':');
    if (c != std::string::npos) {
      std::string k = line.substr(0, c), v = line.substr(c + 1);
      for (auto& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      r.headers[k] = v;
    }
    pos = e + 2;
  }
  std::string body = raw.substr(he + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    std::string dec;
    size_t p = 0;
    while (p < body.size()) {
      size_t e = body.find("\r\n", p);
      if (e == std::string::npos) break;
      size_t n = std::stoul(body.substr(p, e - p), nullptr, 16);
      if (n == 0) break;
      dec += body.substr(e + 2, n);
      p = e + 2 + n + 2;
    }
    body = dec;
  } else if (r.headers.count("content-length")) {
    body = body.substr(0, std::stoul(r.headers["content-length"]));
  }
  r.body = body;
  size_t p = 0;
  while ((p = r.body.find("data: ", p)) != std::string::npos) {
    size_t e = r.body.find("\n\n", p);
    if (e == std::string::npos) break;
    r.events.push_back(r.body.substr(p + 6, e - p - 6));
    p = e + 2;
  }
  return r;
}

inline std::string make_request(const std::string& method, const std::string& path, const std::string& body,
                                const std::string& extra_headers = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST") r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

inline HttpReply http(uint16_t port, const std::string& method, const std::string& path, const std::string& body = "",
                      const std::string& extra_headers = "") {
  int fd = connect_raw(port);
  if (fd < 0) return {};
  send_all(fd, make_request(method, path, body, extra_headers));
  std::string raw = recv_all(fd);
  ::close(fd);
  return parse_reply(raw);
}

}  // namespace hmoe::test
