// An in-process hmoe server on the tiny Qwen3-MoE fixture, on a free port,
// running in a background thread for the duration of the test binary.
#pragma once
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/server.h"
#include "tests/server/http_client.h"
#include "tests/test_util.h"

namespace hmoe::test {

struct RunningServer {
  std::unique_ptr<server::ServerStack> stack;
  std::thread thread;
  uint16_t port = 0;
  explicit RunningServer(Settings s, const std::string& model = "tiny-qwen3moe") {
    stack = server::make_server(s, fixture_model(model));
    port = stack->http->port();
    thread = std::thread([this] { stack->http->run(false); });
  }
  ~RunningServer() {
    stack->http->stop();
    thread.join();
  }
};

inline Settings test_settings() {
  Settings s = Settings::defaults();
  s.threads = 2;
  s.progress = "none";
  s.port = 0;
  s.kv_cache_memory_bytes = 64ull << 20;
  s.max_body_bytes = 64ull << 10;
  s.header_timeout = 1.0;
  s.max_num_seqs = 32;
  s.max_queue = 32;
  return s;
}

// The shared default server (no API key).
inline RunningServer& default_server() {
  static RunningServer srv(test_settings());
  return srv;
}

inline const nlohmann::json& hf_reference() {
  static nlohmann::json ref = [] {
    std::ifstream f(fixture_ref("tiny-qwen3moe/hf_reference.json"));
    return nlohmann::json::parse(f);
  }();
  return ref;
}

// The chat request body of reference chat i.
inline nlohmann::json chat_body(size_t i, int max_tokens = 32) {
  const auto& c = hf_reference()["chats"][i];
  nlohmann::json b = {{"model", "tiny-qwen3moe"}, {"messages", c["messages"]}, {"temperature", 0}, {"max_tokens", max_tokens}};
  b["chat_template_kwargs"] = {{"enable_thinking", c["enable_thinking"]}};
  if (!c["tools"].is_null()) b["tools"] = c["tools"];
  return b;
}

// Concatenated delta content of an SSE chat stream; usage from its last chunk.
struct StreamResult {
  std::string content, finish_reason;
  std::string error_code;  // an error event's error.code
  nlohmann::json usage;
  bool done = false;
  int chunks = 0;
};
inline StreamResult collect_stream(const HttpReply& r) {
  StreamResult s;
  for (const auto& e : r.events) {
    if (e == "[DONE]") {
      s.done = true;
      continue;
    }
    auto j = nlohmann::json::parse(e);
    ++s.chunks;
    if (j.contains("error") && j["error"].is_object() && j["error"]["code"].is_string()) s.error_code = j["error"]["code"];
    if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
    if (!j.contains("choices")) continue;
    for (const auto& ch : j["choices"]) {
      if (ch.contains("delta") && ch["delta"].contains("content") && ch["delta"]["content"].is_string()) s.content += ch["delta"]["content"].get<std::string>();
      if (ch.contains("text")) s.content += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) s.finish_reason = ch["finish_reason"];
    }
  }
  return s;
}

inline bool healthy(uint16_t port) { return http(port, "GET", "/health").status == 200; }

}  // namespace hmoe::test
