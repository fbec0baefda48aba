// The HTTP server end to end (in-process, raw sockets): the fixture's greedy
// texts, streaming, 32 concurrent streams against single-stream runs, stop
// strings, seeds, logprobs, and the bad-input suite with /health checked
// throughout.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

#include "tests/server/server_fixture.h"

using namespace hmoe;
using namespace hmoe::test;
using nlohmann::json;

namespace {
HttpReply post(uint16_t port, const std::string& path, const json& body, const std::string& headers = "") {
  return http(port, "POST", path, body.dump(), headers);
}
json body_json(const HttpReply& r) { return json::parse(r.body); }

// Checks an OpenAI-shaped error body and returns it.
json expect_error(const HttpReply& r, int status) {
  CAPTURE(r.body);
  CHECK(r.status == status);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  REQUIRE(j.contains("error"));
  const json& e = j["error"];
  CHECK(e["message"].is_string());
  CHECK(!e["message"].get<std::string>().empty());
  CHECK(e["type"].is_string());
  CHECK(e.contains("param"));
  CHECK(e.contains("code"));
  return e;
}

double metric(uint16_t port, const std::string& name) {
  HttpReply r = http(port, "GET", "/metrics");
  std::smatch m;
  std::regex re("\n" + name + " ([0-9.e+-]+)\n");
  std::string body = "\n" + r.body;
  if (!std::regex_search(body, m, re)) return -1;
  return std::stod(m[1]);
}
}  // namespace

TEST_CASE("http: chat completions at temperature 0 return the fixture's greedy_text") {
  auto& srv = default_server();
  const auto& chats = hf_reference()["chats"];
  for (size_t i = 0; i < chats.size(); ++i) {
    CAPTURE(i);
    HttpReply r = post(srv.port, "/v1/chat/completions", chat_body(i));
    REQUIRE(r.status == 200);
    json j = body_json(r);
    CHECK(j["object"] == "chat.completion");
    CHECK(j["choices"][0]["message"]["role"] == "assistant");
    CHECK(j["choices"][0]["message"]["content"] == chats[i]["greedy_text"]);
    CHECK(j["choices"][0]["finish_reason"] == "length");
    CHECK(j["usage"]["prompt_tokens"] == chats[i]["ids"].size());
    CHECK(j["usage"]["completion_tokens"] == 32);
    CHECK(j["usage"]["total_tokens"] == chats[i]["ids"].size() + 32);

    // Streaming gives the same text, then a usage chunk and [DONE].
    json sb = chat_body(i);
    sb["stream"] = true;
    sb["stream_options"] = {{"include_usage", true}};
    HttpReply s = post(srv.port, "/v1/chat/completions", sb);
    REQUIRE(s.status == 200);
    CHECK(s.headers["content-type"] == "text/event-stream");
    StreamResult st = collect_stream(s);
    CHECK(st.done);
    CHECK(st.content == chats[i]["greedy_text"]);
    CHECK(st.finish_reason == "length");
    CHECK(st.usage["prompt_tokens"] == chats[i]["ids"].size());
    CHECK(st.usage["completion_tokens"] == 32);
  }
  // The completions endpoint on the same token ids.
  json cb = {{"prompt", chats[1]["ids"]}, {"temperature", 0}, {"max_tokens", 32}};
  HttpReply c = post(srv.port, "/v1/completions", cb);
  REQUIRE(c.status == 200);
  CHECK(body_json(c)["choices"][0]["text"] == chats[1]["greedy_text"]);
  CHECK(body_json(c)["usage"]["prompt_tokens"] == chats[1]["ids"].size());
}

TEST_CASE("http: 32 concurrent streams equal their single-stream outputs") {
  auto& srv = default_server();
  const size_t N = 32;
  std::vector<json> bodies;
  std::mt19937_64 rng(5);
  for (size_t i = 0; i < N; ++i) {
    json b;
    if (i % 2 == 0) {
      b = chat_body(i / 2 % 4, 8 + static_cast<int>(i % 7) * 4);
    } else {
      std::vector<int> ids(2 + rng() % 30);
      for (auto& t : ids) t = static_cast<int>(rng() % 150000);
      b = {{"prompt", ids}, {"temperature", 0}, {"max_tokens", 8 + static_cast<int>(i % 5) * 6}};
    }
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
    bodies.push_back(b);
  }
  auto path = [&](size_t i) { return i % 2 == 0 ? "/v1/chat/completions" : "/v1/completions"; };
  std::vector<StreamResult> single(N), together(N);
  for (size_t i = 0; i < N; ++i) single[i] = collect_stream(post(srv.port, path(i), bodies[i]));
  std::vector<std::thread> ts;
  for (size_t i = 0; i < N; ++i) ts.emplace_back([&, i] { together[i] = collect_stream(post(srv.port, path(i), bodies[i])); });
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < N; ++i) {
    CAPTURE(i);
    CHECK(together[i].done);
    CHECK(!together[i].content.empty());
    CHECK(together[i].content == single[i].content);
    CHECK(together[i].finish_reason == single[i].finish_reason);
    // Token counts match; cached_tokens depends on what the prefix cache held (the second run reuses the first's blocks).
    for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) CHECK(together[i].usage[k] == single[i].usage[k]);
    CHECK(together[i].usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>() >= single[i].usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>());
    if (single[i].finish_reason == "length") CHECK(together[i].usage["completion_tokens"] == bodies[i]["max_tokens"]);
  }
  CHECK(healthy(srv.port));
}

TEST_CASE("http: stop strings across token boundaries, seeds, logprobs") {
  auto& srv = default_server();
  const std::string text = hf_reference()["chats"][0]["greedy_text"];
  // " puppet" and "closure rewrite" each span several tokens of the output.
  for (const std::string stop : {"pet", "closure rew", "pilotspok"}) {
    CAPTURE(stop);
    const size_t at = text.find(stop);
    REQUIRE(at != std::string::npos);
    json b = chat_body(0);
    b["stop"] = json::array({"never-appears", stop});
    HttpReply r = post(srv.port, "/v1/chat/completions", b);
    REQUIRE(r.status == 200);
    CHECK(body_json(r)["choices"][0]["message"]["content"] == text.substr(0, at));
    CHECK(body_json(r)["choices"][0]["finish_reason"] == "stop");
    b["stream"] = true;
    StreamResult s = collect_stream(post(srv.port, "/v1/chat/completions", b));
    CHECK(s.content == text.substr(0, at));
    CHECK(s.finish_reason == "stop");
  }
  json b = chat_body(2, 16);
  b["temperature"] = 1.0;
  b["seed"] = 42;
  auto content = [&](const json& x) { return body_json(post(srv.port, "/v1/chat/completions", x))["choices"][0]["message"]["content"]; };
  const json a1 = content(b), a2 = content(b);
  CHECK(a1 == a2);
  b["seed"] = 43;
  CHECK(content(b) != a1);
  b["top_k"] = 1;  // top_k 1 is greedy whatever the seed
  CHECK(content(b) == text.substr(0, 0) + content(chat_body(2, 16)).get<std::string>());

  json lb = chat_body(0, 4);
  lb["logprobs"] = true;
  lb["top_logprobs"] = 3;
  json lj = body_json(post(srv.port, "/v1/chat/completions", lb));
  const json& lc = lj["choices"][0]["logprobs"]["content"];
  REQUIRE(lc.size() == 4);
  for (const auto& e : lc) {
    REQUIRE(e["top_logprobs"].size() == 3);
    CHECK(e["token"] == e["top_logprobs"][0]["token"]);  // greedy picks the top entry
    CHECK(e["logprob"].get<double>() <= 0.0);
    CHECK(e["top_logprobs"][0]["logprob"].get<double>() >= e["top_logprobs"][1]["logprob"].get<double>());
  }
}

TEST_CASE("http: routes, models, metrics") {
  auto& srv = default_server();
  HttpReply m = http(srv.port, "GET", "/v1/models");
  REQUIRE(m.status == 200);
  CHECK(body_json(m)["data"][0]["id"] == "tiny-qwen3moe");
  expect_error(http(srv.port, "GET", "/nope"), 404);
  expect_error(http(srv.port, "GET", "/v1/chat/completions"), 405);
  expect_error(http(srv.port, "DELETE", "/v1/models"), 405);
  HttpReply me = http(srv.port, "GET", "/metrics");
  CHECK(me.status == 200);
  for (const char* name : {"hmoe_requests_total", "hmoe_prompt_tokens_total", "hmoe_generation_tokens_total", "hmoe_time_to_first_token_seconds_bucket",
                           "hmoe_time_per_output_token_seconds_bucket", "hmoe_num_requests_running", "hmoe_num_requests_waiting", "hmoe_kv_blocks_used"})
    CHECK(me.body.find(name) != std::string::npos);
}

TEST_CASE("http: /metrics of an Engram model show the PLE table per module") {
  TempDir tmp("http-engram");
  Settings s = test_settings();
  s.ple_table = tmp.str() + "/t.hmoe";
  s.ple_ram_modules = "0";  // module 0 in memory, module 1 read from the file
  RunningServer srv(s, "tiny-qwen3moe-engram");
  HttpReply r = post(srv.port, "/v1/completions", {{"prompt", "The n-gram memory"}, {"max_tokens", 4}, {"temperature", 0}});
  REQUIRE(r.status == 200);
  // The engine thread copies its counters after the step that sent the last
  // token: wait for that copy (running back to 0) before reading them.
  std::string body = http(srv.port, "GET", "/metrics").body;
  for (int i = 0; i < 250 && body.find("\nhmoe_num_requests_running 0\n") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    body = http(srv.port, "GET", "/metrics").body;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the PLE counters are copied just after
  body = http(srv.port, "GET", "/metrics").body;
  CAPTURE(body);
  auto value = [&](const std::string& series) {
    const size_t at = body.find("\n" + series + " ");
    if (at == std::string::npos) return -1.0;
    return std::stod(body.substr(at + series.size() + 2));
  };
  const std::string b = "backend=\"io_uring\"";
  CHECK(value("hmoe_ple_rows_requested_total{" + b + "}") > 0);
  CHECK(value("hmoe_ple_waits_total{" + b + "}") >= 2 * 4);  // 2 modules; the prompt pass (first token) and 3 decode steps at least
  CHECK(value("hmoe_ple_module_in_ram{" + b + ",module=\"0\"}") == 1);
  CHECK(value("hmoe_ple_module_in_ram{" + b + ",module=\"1\"}") == 0);
  CHECK(value("hmoe_ple_reads_total{" + b + ",module=\"0\"}") == 0);
  CHECK(value("hmoe_ple_reads_total{" + b + ",module=\"1\"}") > 0);
  CHECK(value("hmoe_ple_issue_seconds_total{" + b + ",module=\"1\"}") >= 0);
  CHECK(value("hmoe_ple_issue_seconds_total{" + b + ",module=\"1\"}") <= value("hmoe_ple_io_seconds_total{" + b + ",module=\"1\"}"));
  const double hidden = value("hmoe_ple_hidden_fraction{" + b + "}");
  CHECK(hidden >= 0);
  CHECK(hidden <= 1);
  // The default server's model has no PLE table: no such series.
  CHECK(http(default_server().port, "GET", "/metrics").body.find("hmoe_ple_") == std::string::npos);
}

TEST_CASE("http: bad inputs get the right status and an OpenAI error; /health keeps answering") {
  auto& srv = default_server();
  const json ok_msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  struct Bad {
    std::string name, body;
    int status;
    std::string param;
  };
  auto with = [&](const char* key, json v) {
    json b = {{"messages", ok_msgs}, {"max_tokens", 2}};
    b[key] = v;
    return b.dump();
  };
  const std::vector<Bad> cases = {
      {"malformed JSON", "{\"messages\": [", 400, ""},
      {"not an object", "[1,2,3]", 400, ""},
      {"empty body", "", 400, ""},
      {"invalid UTF-8", std::string("{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfe\"}]}"), 400, ""},
      {"lone surrogate escape", R"({"messages":[{"role":"user","content":"\ud800"}]})", 400, ""},
      {"missing messages", R"({"max_tokens": 2})", 400, "messages"},
      {"empty messages", R"({"messages": []})", 400, "messages"},
      {"messages not an array", R"({"messages": "hi"})", 400, "messages"},
      {"message not an object", R"({"messages": [1]})", 400, "messages[0]"},
      {"bad role", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "messages[0].role"},
      {"content wrong type", R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {"image part", R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})", 400, "messages[0].content"},
      {"temperature string", with("temperature", "hot"), 400, "temperature"},
      {"temperature negative", with("temperature", -1), 400, "temperature"},
      {"temperature huge", with("temperature", 1e308), 400, "temperature"},
      {"top_p zero", with("top_p", 0), 400, "top_p"},
      {"top_k wrong type", with("top_k", "5"), 400, "top_k"},
      {"min_p above 1", with("min_p", 1.5), 400, "min_p"},
      {"presence_penalty", with("presence_penalty", 3), 400, "presence_penalty"},
      {"max_tokens negative", with("max_tokens", -5), 400, "max_tokens"},
      {"max_tokens zero", with("max_tokens", 0), 400, "max_tokens"},
      {"max_tokens fractional", with("max_tokens", 2.5), 400, "max_tokens"},
      {"max_tokens above context", with("max_tokens", 100000), 400, "max_tokens"},
      {"max_tokens huge", with("max_tokens", 1e30), 400, "max_tokens"},
      {"max_completion_tokens huge", with("max_completion_tokens", 18446744073709551615ull), 400, "max_completion_tokens"},
      {"n=17", with("n", 17), 400, "n"},
      {"n=0", with("n", 0), 400, "n"},
      {"stream not bool", with("stream", "yes"), 400, "stream"},
      {"stop wrong type", with("stop", 5), 400, "stop"},
      {"stop empty string", with("stop", ""), 400, "stop"},
      {"logprobs wrong type", with("logprobs", 1), 400, "logprobs"},
      {"top_logprobs too many", R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":50})", 400, "top_logprobs"},
      {"logit_bias bad key", with("logit_bias", {{"abc", 1}}), 400, "logit_bias"},
      {"tools wrong", with("tools", json::array({{{"type", "function"}}})), 400, "tools[0].function.name"},
      {"tool_choice required without tools", with("tool_choice", "required"), 400, "tool_choice"},
      {"tool_choice unknown string", with("tool_choice", "always"), 400, "tool_choice"},
      {"tool_choice wrong type", with("tool_choice", 3), 400, "tool_choice"},
      {"tool_choice object without a name", with("tool_choice", {{"type", "function"}}), 400, "tool_choice"},
      {"response_format json_schema without json_schema", with("response_format", {{"type", "json_schema"}}), 400, "response_format"},
      {"response_format json_schema with pattern",
       with("response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "^a"}}}}}}), 400,
       "response_format"},
      {"response_format unknown type", with("response_format", {{"type", "yaml"}}), 400, "response_format"},
      {"unknown model", with("model", "gpt-4"), 404, "model"},
      {"model wrong type", with("model", 7), 400, "model"},
  };
  for (const Bad& c : cases) {
    CAPTURE(c.name);
    HttpReply r = http(srv.port, "POST", "/v1/chat/completions", c.body);
    json e = expect_error(r, c.status);
    if (!c.param.empty()) CHECK(e["param"] == c.param);
    CHECK(healthy(srv.port));
  }
  // Unknown fields are ignored (as in vLLM and OpenAI).
  HttpReply u = http(srv.port, "POST", "/v1/chat/completions", with("some_vendor_field", {{"x", 1}}));
  CHECK(u.status == 200);
  // Prompt longer than the context.
  std::string longp;
  for (int i = 0; i < 5000; ++i) longp += " hello";
  json e = expect_error(post(srv.port, "/v1/completions", {{"prompt", longp}, {"max_tokens", 1}}), 400);
  CHECK(e["code"] == "context_length_exceeded");
  expect_error(post(srv.port, "/v1/completions", {{"prompt", json::array({1, -3})}}), 400);
  expect_error(post(srv.port, "/v1/completions", {{"prompt", json::array({"a", "b"})}}), 400);
  // Oversize body (the test server allows 64 KiB): declared length and chunked.
  std::string big(100 << 10, 'x');
  expect_error(http(srv.port, "POST", "/v1/chat/completions", "{\"messages\":\"" + big + "\"}"), 413);
  {
    int fd = connect_raw(srv.port);
    std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 20; ++i) req += "1000\r\n" + std::string(0x1000, 'y') + "\r\n";
    send_all(fd, req);
    HttpReply r = parse_reply(recv_all(fd, 10000));
    ::close(fd);
    expect_error(r, 413);
  }
  // Too many header fields, too large a header.
  std::string many;
  for (int i = 0; i < 150; ++i) many += "X-F" + std::to_string(i) + ": 1\r\n";
  expect_error(http(srv.port, "GET", "/health", "", many), 431);
  expect_error(http(srv.port, "GET", "/health", "", "X-Big: " + std::string(20000, 'a') + "\r\n"), 431);
  // Garbage instead of HTTP.
  {
    int fd = connect_raw(srv.port);
    send_all(fd, "\x01\x02 garbage\r\n\r\n");
    HttpReply r = parse_reply(recv_all(fd, 5000));
    ::close(fd);
    CHECK(r.status == 400);
  }
  CHECK(healthy(srv.port));
}

TEST_CASE("http: slow-header client gets 408 while others are served") {
  auto& srv = default_server();
  int fd = connect_raw(srv.port);
  REQUIRE(fd >= 0);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");  // never finishes its header
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(healthy(srv.port));
  HttpReply r = parse_reply(recv_all(fd, 10000));
  ::close(fd);
  CHECK(r.status == 408);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8));  // header_timeout is 1 s
  // A client that connects and sends nothing is dropped too.
  int idle = connect_raw(srv.port);
  std::string got = recv_all(idle, 10000);
  ::close(idle);
  CHECK(healthy(srv.port));
}

TEST_CASE("http: disconnect mid-stream cancels the sequence and frees its KV blocks") {
  auto& srv = default_server();
  json b = chat_body(0, 3000);
  b["stream"] = true;
  int fd = connect_raw(srv.port);
  send_all(fd, make_request("POST", "/v1/chat/completions", b.dump()));
  std::string got;
  char buf[4096];
  // " motifs" may share an SSE chunk with the tokens around it when the reader lags.
  while (got.find(" motifs") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  CHECK(metric(srv.port, "hmoe_num_requests_running") == 1);
  ::close(fd);
  double running = 1, kv = 1;
  for (int i = 0; i < 500 && (running != 0 || kv != 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    running = metric(srv.port, "hmoe_num_requests_running");
    kv = metric(srv.port, "hmoe_kv_blocks_used");
  }
  CHECK(running == 0);
  CHECK(kv == 0);
  CHECK(http(srv.port, "GET", "/metrics").body.find("status=\"499\"") != std::string::npos);
  CHECK(healthy(srv.port));
}

TEST_CASE("http: a burst of 1000 requests gets 200 or 503 + Retry-After, never a dropped connection") {
  auto& srv = default_server();
  const int threads = 250, per = 4;
  std::atomic<int> ok{0}, busy{0}, other{0};
  std::atomic<bool> health_ok{true};
  std::vector<std::thread> ts;
  const std::string body = json{{"prompt", "hello"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < per; ++i) {
        HttpReply r = http(srv.port, "POST", "/v1/completions", body);
        if (r.status == 200 && json::parse(r.body)["usage"]["completion_tokens"] == 2) ++ok;
        else if (r.status == 503 && r.headers.count("retry-after") && json::parse(r.body)["error"]["code"] == "queue_full") ++busy;
        else ++other;
      }
    });
  std::thread watcher([&] {
    for (int i = 0; i < 20; ++i) {
      if (!healthy(srv.port)) health_ok = false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  for (auto& t : ts) t.join();
  watcher.join();
  MESSAGE("burst: " << ok.load() << " x 200, " << busy.load() << " x 503");
  CHECK(ok + busy == threads * per);
  CHECK(other == 0);
  CHECK(ok > 0);
  CHECK(health_ok);
  CHECK(healthy(srv.port));
}

TEST_CASE("http: API key") {
  Settings s = test_settings();
  s.api_key = "sk-test-123";
  RunningServer srv(s);
  const std::string body = json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 1}}.dump();
  json e = expect_error(http(srv.port, "POST", "/v1/chat/completions", body), 401);
  CHECK(e["code"] == "invalid_api_key");
  expect_error(http(srv.port, "POST", "/v1/chat/completions", body, "Authorization: Bearer sk-test-124\r\n"), 401);
  expect_error(http(srv.port, "GET", "/v1/models", "", "Authorization: Bearer sk-test-1234\r\n"), 401);
  expect_error(http(srv.port, "GET", "/v1/models", "", "Authorization: sk-test-123\r\n"), 401);
  CHECK(http(srv.port, "POST", "/v1/chat/completions", body, "Authorization: Bearer sk-test-123\r\n").status == 200);
  CHECK(http(srv.port, "GET", "/health").status == 200);  // /health needs no key
}

TEST_CASE("http: max connections, Expect: 100-continue, keep-alive") {
  Settings s = test_settings();
  s.max_connections = 3;
  s.header_timeout = 5;
  s.idle_timeout = 1;
  RunningServer srv(s);
  // Idle connections at the cap: a new client closes the oldest idle one instead of getting 503.
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(connect_raw(srv.port));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(healthy(srv.port));
  CHECK(recv_all(idle[0], 3000).empty());  // the oldest was closed (EOF, no reply)
  for (int fd : idle) ::close(fd);
  // Busy connections (each in the middle of sending its body) are never closed for a newcomer: 503.
  std::vector<int> busy;
  for (int i = 0; i < 3; ++i) {
    busy.push_back(connect_raw(srv.port));
    send_all(busy.back(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  json e = expect_error(http(srv.port, "GET", "/health"), 503);
  CHECK(e["code"] == "too_many_connections");
  for (int fd : busy) ::close(fd);
  bool ok = false;
  for (int i = 0; i < 100 && !ok; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ok = healthy(srv.port);
  }
  CHECK(ok);

  // curl sends "Expect: 100-continue" for larger bodies and waits for it.
  const std::string body = json{{"prompt", std::string(3000, 'a')}, {"max_tokens", 1}}.dump();
  int fd = connect_raw(srv.port);
  send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\n\r\n");
  char buf[256];
  pollfd p{fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 3000) == 1);
  ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  REQUIRE(n > 0);
  CHECK(std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 100 Continue\r\n\r\n", 0) == 0);
  send_all(fd, body);
  HttpReply r = parse_reply(recv_all(fd, 10000));
  ::close(fd);
  CHECK(r.status == 200);

  // Two requests on one keep-alive connection.
  fd = connect_raw(srv.port);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string first;
  while (first.find("\"ok\"}") == std::string::npos) {
    n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    first.append(buf, static_cast<size_t>(n));
  }
  CHECK(parse_reply(first).status == 200);
  send_all(fd, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  HttpReply second = parse_reply(recv_all(fd, 10000));
  ::close(fd);
  CHECK(second.status == 200);

  // A keep-alive connection that sends nothing more is closed after the idle timeout.
  fd = connect_raw(srv.port);
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  std::string all = recv_all(fd, 10000);  // returns when the server closes
  ::close(fd);
  CHECK(parse_reply(all).status == 200);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8));
}

TEST_CASE("http: generation_config defaults apply to requests that leave sampling out; a request's own value wins") {
  // A generation_config.json with temperature 0 makes the default greedy:
  // a chat request without "temperature" returns the fixture's greedy_text.
  test::TempDir dir("gencfg-server");
  test::write_file(dir.str() + "/generation_config.json", R"({"temperature": 0, "top_k": 5})");
  Settings s = test_settings();
  s.generation_config = dir.str();
  RunningServer srv(s);
  const auto& chats = hf_reference()["chats"];
  json b = chat_body(0);
  b.erase("temperature");
  HttpReply r = post(srv.port, "/v1/chat/completions", b);
  REQUIRE(r.status == 200);
  CHECK(body_json(r)["choices"][0]["message"]["content"] == chats[0]["greedy_text"]);
  // temperature 2 with a seed of its own: no longer the greedy text.
  b["temperature"] = 2.0;
  b["top_k"] = 0;
  b["seed"] = 7;
  HttpReply t = post(srv.port, "/v1/chat/completions", b);
  REQUIRE(t.status == 200);
  CHECK(body_json(t)["choices"][0]["message"]["content"] != chats[0]["greedy_text"]);
}

TEST_CASE("http: /tokenize and /detokenize give the fixture's ids and text; bad bodies are 400s") {
  auto& srv = default_server();
  const auto& chats = hf_reference()["chats"];
  for (size_t i = 0; i < chats.size(); ++i) {
    CAPTURE(i);
    HttpReply r = post(srv.port, "/tokenize", json{{"prompt", chats[i]["text"]}});
    REQUIRE(r.status == 200);
    json j = body_json(r);
    CHECK(j["tokens"] == chats[i]["ids"]);
    CHECK(j["count"] == chats[i]["ids"].size());
    CHECK(j["max_model_len"].get<int64_t>() > 0);
    // The chat form renders the template as /v1/chat/completions does.
    json cb = chat_body(i);
    HttpReply c = post(srv.port, "/tokenize", cb);
    REQUIRE(c.status == 200);
    CHECK(body_json(c)["tokens"] == chats[i]["ids"]);
    HttpReply d = post(srv.port, "/detokenize", json{{"tokens", chats[i]["ids"]}});
    REQUIRE(d.status == 200);
    CHECK(body_json(d)["prompt"] == chats[i]["text"]);
  }
  CHECK(post(srv.port, "/tokenize", json{{"content", "hello"}}).status == 200);  // llama.cpp's field name
  CHECK(post(srv.port, "/tokenize", json::object()).status == 400);
  CHECK(post(srv.port, "/tokenize", json{{"prompt", "a"}, {"messages", json::array()}}).status == 400);
  CHECK(post(srv.port, "/tokenize", json{{"prompt", 5}}).status == 400);
  CHECK(post(srv.port, "/tokenize", json{{"prompt", "a"}, {"model", "other"}}).status == 404);
  CHECK(post(srv.port, "/detokenize", json{{"tokens", json::array({1, -1})}}).status == 400);
  CHECK(post(srv.port, "/detokenize", json{{"tokens", json::array({1 << 30})}}).status == 400);
  CHECK(post(srv.port, "/detokenize", json{{"tokens", "1,2"}}).status == 400);
  CHECK(post(srv.port, "/detokenize", json::object()).status == 400);
  CHECK(http(srv.port, "GET", "/tokenize").status == 405);
  const HttpReply bad = post(srv.port, "/detokenize", json{{"tokens", json::array({1, -1})}});
  CHECK(body_json(bad)["error"]["message"].get<std::string>().find("outside the vocabulary") != std::string::npos);
  CHECK(http(srv.port, "GET", "/health").status == 200);
}

// tool_choice "required" and a named function: the rendered prompt ends by
// opening the tool call (seen through /tokenize's chat form; the grammar
// forces the rest, see test_structured.cpp), the request is
// served, and naming a function that is not in 'tools' is a 400.
TEST_CASE("http: tool_choice required and named open the tool call in the prompt") {
  auto& srv = default_server();
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "get_weather"},
                                     {"description", "Weather for a city"},
                                     {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  json base = {{"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})}, {"tools", tools}, {"max_tokens", 4}};
  auto detok_tail = [&](json body) {
    HttpReply t = post(srv.port, "/tokenize", body);
    REQUIRE(t.status == 200);
    HttpReply d = post(srv.port, "/detokenize", json{{"tokens", body_json(t)["tokens"]}});
    REQUIRE(d.status == 200);
    return body_json(d)["prompt"].get<std::string>();
  };
  json req = base;
  req["tool_choice"] = "required";
  std::string text = detok_tail(req);
  CHECK(text.size() > 12);
  CHECK(text.substr(text.size() - 12) == "<tool_call>\n");
  json named = base;
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  text = detok_tail(named);  // the name is forced by the grammar, not the prompt
  CHECK(text.substr(text.size() - 12) == "<tool_call>\n");
  json plain = base;
  CHECK(detok_tail(plain).find("<tool_call>\n", detok_tail(plain).size() - 12) == std::string::npos);  // auto: nothing forced
  CHECK(post(srv.port, "/v1/chat/completions", req).status == 200);
  CHECK(post(srv.port, "/v1/chat/completions", named).status == 200);
  json both = req;  // a forced tool call and JSON mode contradict each other
  both["response_format"] = {{"type", "json_object"}};
  CHECK(expect_error(post(srv.port, "/v1/chat/completions", both), 400)["param"] == "response_format");
  json unknown = base;
  unknown["tool_choice"] = {{"type", "function"}, {"function", {{"name", "send_email"}}}};
  HttpReply u = post(srv.port, "/v1/chat/completions", unknown);
  json e = expect_error(u, 400);
  CHECK(e["param"] == "tool_choice");
  CHECK(e["message"].get<std::string>().find("send_email") != std::string::npos);
  CHECK(healthy(srv.port));
}

// response_format json_object: the random fixture model's reply is a prefix
// of one JSON object (whole and parseable when it stopped on its own), in a
// stream as in one body; greedy JSON-mode replies are deterministic.
TEST_CASE("http: response_format json_object constrains the reply to one JSON object") {
  auto& srv = default_server();
  for (int seed = 1; seed <= 4; ++seed) {
    CAPTURE(seed);
    json req = {{"messages", json::array({{{"role", "user"}, {"content", "Reply in JSON."}}})},
                {"response_format", {{"type", "json_object"}}},
                {"max_tokens", 48},
                {"temperature", seed == 1 ? 0.0 : 1.0},
                {"seed", seed}};
    HttpReply r = post(srv.port, "/v1/chat/completions", req);
    REQUIRE(r.status == 200);
    json j = body_json(r);
    const std::string text = j["choices"][0]["message"]["content"].is_string() ? j["choices"][0]["message"]["content"].get<std::string>() : "";
    CAPTURE(text);
    JsonState st;
    CHECK(st.feed(text));
    if (j["choices"][0]["finish_reason"] == "stop") {
      CHECK(st.complete());
      CHECK(json::parse(text).is_object());
    }
    if (seed == 1) {  // greedy: the same reply again
      HttpReply again = post(srv.port, "/v1/chat/completions", req);
      CHECK(body_json(again)["choices"][0]["message"]["content"] == j["choices"][0]["message"]["content"]);
    }
  }
  CHECK(healthy(srv.port));
}
