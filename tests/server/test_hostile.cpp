// The hostile-input suite (issue 22): a live `hmoe serve` process on the
// tiny fixture gets what a hostile or broken client sends - JSON nested
// 100,000 deep in every place a body can nest, numbers out of range,
// invalid UTF-8 and lone surrogates, NUL bytes, duplicate keys, a wrong type
// at every field of chat and completions requests, 10,000 tools, 10,000
// stop strings, huge stop strings, bad logit_bias ids, header floods,
// label injection into /metrics, idle-socket floods - and must answer each
// with a 4xx OpenAI error naming the field, keep answering /health after
// every one, and never die (the server is a child process: a crash is seen
// here as its exit). Also the protocol items: HTTP/1.0 streams, half-closed
// requests, X-Request-Id, CORS, Bearer case, echo + logprobs scoring the
// prompt, and the --max-model-len checks.
#include <doctest/doctest.h>
#include <sys/socket.h>

#include <chrono>
#include <set>
#include <thread>

#include "engine/text/output_parser.h"
#include "tests/server/serve_process.h"
#include "tests/server/server_fixture.h"

using namespace hmoe;
using namespace hmoe::test;
using nlohmann::json;

namespace {

const std::string kKey = "sk-hostile-1";
const std::string kAuth = "Authorization: Bearer " + kKey + "\r\n";
const std::string kOrigin = "https://app.example.com";

// The one server of this file: API key and CORS on, so that every request
// also goes through both.
ServeProcess& hostile_server() {
  static ServeProcess srv({"--api-key", kKey, "--cors-origins", kOrigin + ",http://localhost:3000", "--max-connections", "1024"});
  return srv;
}

HttpReply req(const std::string& method, const std::string& path, const std::string& body, const std::string& headers = kAuth) {
  return http(hostile_server().port, method, path, body, headers);
}
HttpReply post(const std::string& path, const std::string& body) { return req("POST", path, body); }

bool alive_and_healthy() {
  ServeProcess& s = hostile_server();
  int status = 0;
  if (s.pid > 0 && ::waitpid(s.pid, &status, WNOHANG) == s.pid) {
    s.pid = -1;
    return false;
  }
  return healthy(s.port);
}

// A 4xx with an OpenAI error body whose param starts with `param` (exactly
// equal when exact), then /health.
json expect_4xx(const HttpReply& r, const std::string& param, bool exact = true, int status = 400) {
  CAPTURE(r.status);
  CAPTURE(r.body.substr(0, 600));
  CHECK(r.status == status);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  REQUIRE(j.contains("error"));
  const json& e = j["error"];
  CHECK(e["message"].is_string());
  CHECK(!e["message"].get<std::string>().empty());
  if (!param.empty()) {
    REQUIRE(e["param"].is_string());
    const std::string p = e["param"];
    CAPTURE(p);
    if (exact) CHECK(p == param);
    else CHECK(p.rfind(param, 0) == 0);
  }
  CHECK(alive_and_healthy());
  return e;
}

std::string deep(size_t levels, const std::string& leaf = "1") {
  std::string s;
  s.reserve(levels * 6 + leaf.size());
  for (size_t i = 0; i < levels; ++i) s += i % 2 ? "[" : "{\"a\":";
  s += leaf;
  for (size_t i = levels; i-- > 0;) s += i % 2 ? "]" : "}";
  return s;
}

const std::string kMsgs = R"([{"role":"user","content":"hi"}])";
std::string chat_with(const std::string& key, const std::string& raw_value) {
  return R"({"messages":)" + kMsgs + R"(,"max_tokens":2,")" + key + "\":" + raw_value + "}";
}
std::string completion_with(const std::string& key, const std::string& raw_value) {
  return R"({"prompt":"hi","max_tokens":2,")" + key + "\":" + raw_value + "}";
}

}  // namespace

TEST_CASE("hostile: JSON nested 100,000 deep anywhere is a 400 naming the field; the server stays up") {
  REQUIRE(hostile_server().port != 0);
  const std::string d = deep(100000);
  struct Case {
    const char* name;
    std::string path, body, param;
  };
  const std::string call = R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":)";
  const std::vector<Case> cases = {
      {"extra message key", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi","extra":)" + d + "}]}", "messages[0].extra"},
      {"tool parameters", "/v1/chat/completions",
       R"({"messages":)" + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" + d + "}}]}", "tools[0].function.parameters"},
      {"chat_template_kwargs", "/v1/chat/completions", chat_with("chat_template_kwargs", R"({"x":)" + d + "}"), "chat_template_kwargs.x"},
      {"tool call arguments (object)", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"},)" + call + d + "}}]}]}", "messages[1].tool_calls[0].function"},
      {"tool call arguments (JSON string)", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"},)" + call + json(d).dump() + "}}]}]}", "messages[1].tool_calls[0].function.arguments"},
      {"/tokenize with tools", "/tokenize", R"({"messages":)" + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" + d + "}}]}",
       "tools[0].function.parameters"},
      {"/tokenize prompt", "/tokenize", R"({"prompt":)" + d + "}", "prompt"},
      {"/detokenize tokens", "/detokenize", R"({"tokens":)" + deep(100000, "[1]") + "}", "tokens"},
      {"completions prompt", "/v1/completions", completion_with("extra", d), "extra"},
      {"logit_bias", "/v1/chat/completions", chat_with("logit_bias", d), "logit_bias"},
      {"stop", "/v1/chat/completions", chat_with("stop", d), "stop"},
      {"response_format", "/v1/chat/completions", chat_with("response_format", d), "response_format"},
      {"message content parts", "/v1/chat/completions", R"({"messages":[{"role":"user","content":[)" + d + "]}]}", "messages[0].content"},
      {"top level array", "/v1/chat/completions", deep(100000, "1").substr(5), ""},
      {"/v1/responses input item", "/v1/responses", R"({"input":[{"role":"user","content":"hi","extra":)" + d + "}]}", "input[0].extra"},
      {"/v1/responses tool parameters", "/v1/responses", R"({"input":"hi","tools":[{"type":"function","name":"f","parameters":)" + d + "}]}",
       "tools[0].parameters"},
      {"/v1/responses text.format", "/v1/responses", R"({"input":"hi","text":{"format":)" + d + "}}", "text.format"},
      {"/v1/responses top level array", "/v1/responses", deep(100000, "1").substr(5), ""},
      {"n > 1 chat", "/v1/chat/completions", R"({"n":2,"messages":[{"role":"user","content":"hi","extra":)" + d + "}]}", "messages[0].extra"},
      {"unclosed, 1,000,000 brackets", "/v1/chat/completions", std::string(1000000, '['), ""},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.name));
    json e = expect_4xx(post(c.path, c.body), c.param, false);
    if (!c.param.empty()) CHECK(e["code"] == "json_too_deep");
  }
  // 128 levels are fine (a deep but sane tool schema renders).
  HttpReply ok = post("/tokenize", R"({"messages":)" + kMsgs + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" + deep(120) + "}}]}");
  CHECK(ok.status == 200);
}

TEST_CASE("hostile: numbers, UTF-8, surrogates, NUL bytes and duplicate keys") {
  REQUIRE(hostile_server().port != 0);
  struct Case {
    const char* name;
    std::string path, body, param;
  };
  const std::vector<Case> cases = {
      {"1e999 temperature", "/v1/chat/completions", chat_with("temperature", "1e999"), "temperature"},
      {"-1e999 top_p", "/v1/chat/completions", chat_with("top_p", "-1e999"), "top_p"},
      {"1e999 max_tokens", "/v1/chat/completions", chat_with("max_tokens", "1e999").replace(chat_with("max_tokens", "1e999").find("\"max_tokens\":2,"), 15, ""), "max_tokens"},
      {"1e400 seed", "/v1/completions", completion_with("seed", "1e400"), "seed"},
      {"integer beyond 64 bits", "/v1/completions", completion_with("seed", "123456789012345678901234567890"), "seed"},
      {"max_tokens 2^64", "/v1/completions", R"({"prompt":"hi","max_tokens":18446744073709551616})", "max_tokens"},
      // Once accepted: 2^63 as a float cast to INT64_MIN, and prompt + INT64_MAX wrapped below the context.
      {"max_tokens 2^63 as a float", "/v1/completions", R"({"prompt":"hi","max_tokens":9223372036854775808.0})", "max_tokens"},
      {"max_tokens INT64_MAX", "/v1/completions", R"({"prompt":"hi","max_tokens":9223372036854775807})", "max_tokens"},
      {"max_completion_tokens INT64_MAX", "/v1/chat/completions", R"({"messages":)" + kMsgs + R"(,"max_completion_tokens":9223372036854775807})", "max_completion_tokens"},
      {"seed 2^63 as a float", "/v1/completions", completion_with("seed", "9223372036854775808.0"), "seed"},
      // Once a 500 "internal error: stoul": a JSON pointer's array index of 23 digits.
      {"$ref with a 23-digit array index", "/v1/chat/completions",
       chat_with("response_format", R"({"type":"json_schema","json_schema":{"name":"x","schema":{"anyOf":[{"type":"string"}],"$ref":"#/anyOf/99999999999999999999999"}}})"),
       "response_format"},
      {"1e999 logit_bias value", "/v1/chat/completions", chat_with("logit_bias", R"({"5":1e999})"), "logit_bias.5"},
      {"1e999 in a message", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi","n":1e999}]})", "messages[0].n"},
      {"invalid UTF-8", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfe\"}]}", "messages[0].content"},
      {"overlong UTF-8", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", "messages[0].content"},
      {"lone high surrogate", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"\ud800"}]})", "messages[0].content"},
      {"lone low surrogate", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x\udc00y"}]})", "messages[0].content"},
      {"high surrogate then text", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"\ud83dabc"}]})", "messages[0].content"},
      {"invalid UTF-8 in a key", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"\xff\":1}]}", "messages[0].role"},
      {"bad escape", "/v1/completions", R"({"prompt":"a\x41"})", "prompt"},
      {"NUL after the body", "/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"hi"}]})") + '\0' + "garbage", ""},
      {"NUL inside a string", "/v1/chat/completions", std::string(R"({"messages":[{"role":"user","content":"h)") + '\0' + R"(i"}]})", "messages[0].content"},
      {"NUL in the middle", "/v1/completions", std::string(R"({"prompt":"hi",)") + '\0' + R"("max_tokens":2})", "prompt"},
      {"duplicate top-level key", "/v1/chat/completions", R"({"messages":)" + kMsgs + R"(,"max_tokens":2,"max_tokens":3})", "max_tokens"},
      {"duplicate key in a message", "/v1/chat/completions", R"({"messages":[{"role":"user","role":"system","content":"x"}]})", "messages[0].role"},
      {"duplicate key through an escape", "/v1/completions", R"({"prompt":"a","\u0070rompt":"b"})", "prompt"},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.name));
    expect_4xx(post(c.path, c.body), c.param);
  }
}

TEST_CASE("hostile: a wrong type at every field of chat and completions requests") {
  REQUIRE(hostile_server().port != 0);
  struct F {
    const char* key;
    const char* bad;
    const char* param;  // nullptr: the key
  };
  const std::vector<F> common = {
      {"model", "7", nullptr},           {"n", "\"2\"", nullptr},          {"best_of", "[]", nullptr},
      {"stream", "\"yes\"", nullptr},    {"stream_options", "5", nullptr}, {"stream_options", R"({"include_usage":"x"})", "include_usage"},
      {"temperature", "\"hot\"", nullptr}, {"top_p", "{}", nullptr},      {"top_k", "\"5\"", nullptr},
      {"min_p", "[0.1]", nullptr},       {"presence_penalty", "true", nullptr}, {"frequency_penalty", "\"0\"", nullptr},
      {"repetition_penalty", "{}", nullptr}, {"seed", "\"1\"", nullptr},  {"logit_bias", "[1]", nullptr},
      {"logit_bias", R"({"5":"x"})", "logit_bias"}, {"stop", "5", nullptr}, {"stop", "[1]", nullptr},
      {"stop", "{}", nullptr},           {"ignore_eos", "1", nullptr},     {"stop_token_ids", "\"x\"", nullptr},
      {"stop_token_ids", "[\"x\"]", nullptr}, {"skip_special_tokens", "\"no\"", nullptr}, {"response_format", "\"json\"", nullptr},
      {"response_format", R"({"type":5})", nullptr}, {"max_tokens", "\"2\"", nullptr}, {"max_completion_tokens", "[2]", nullptr},
  };
  for (const F& f : common) {
    const std::string param = f.param ? f.param : f.key;
    CAPTURE(std::string(f.key));
    CAPTURE(std::string(f.bad));
    {
      std::string b = chat_with(f.key, f.bad);
      if (std::string(f.key) == "max_tokens") b = R"({"messages":)" + kMsgs + R"(,"max_tokens":)" + f.bad + "}";
      expect_4xx(post("/v1/chat/completions", b), param);
    }
    {
      std::string b = completion_with(f.key, f.bad);
      if (std::string(f.key) == "max_tokens") b = R"({"prompt":"hi","max_tokens":)" + std::string(f.bad) + "}";
      expect_4xx(post("/v1/completions", b), param);
    }
  }
  const std::vector<F> chat = {
      {"messages", "\"hi\"", nullptr},   {"logprobs", "1", nullptr},       {"top_logprobs", "\"3\"", nullptr},
      {"tools", "{}", nullptr},          {"tools", "[5]", "tools[0]"},     {"tools", R"([{"type":"function","function":{"name":5}}])", "tools[0].function.name"},
      {"tool_choice", "3", nullptr},     {"tool_choice", "[]", nullptr},   {"chat_template_kwargs", "[]", nullptr},
      {"add_generation_prompt", "\"no\"", nullptr},
  };
  for (const F& f : chat) {
    CAPTURE(std::string(f.key));
    CAPTURE(std::string(f.bad));
    std::string b = std::string(f.key) == "messages" ? R"({"messages":"hi"})" : chat_with(f.key, f.bad);
    expect_4xx(post("/v1/chat/completions", b), f.param ? f.param : f.key);
  }
  const std::vector<std::pair<std::string, std::string>> msgs = {
      {R"([5])", "messages[0]"},
      {R"([{"role":5,"content":"x"}])", "messages[0].role"},
      {R"([{"role":"user","content":5}])", "messages[0].content"},
      {R"([{"role":"user","content":[5]}])", "messages[0].content"},
      {R"([{"role":"user","content":[{"type":"text","text":5}]}])", "messages[0].content"},
      {R"([{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":"x"}])", "messages[1].tool_calls"},
      {R"([{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"function":{"name":5}}]}])", "messages[1].tool_calls"},
      {R"([{"role":"user","content":"x"},{"role":"tool","content":"r","tool_call_id":5}])", "messages[1].tool_call_id"},
  };
  for (const auto& [m, param] : msgs) {
    CAPTURE(m);
    expect_4xx(post("/v1/chat/completions", R"({"messages":)" + m + "}"), param);
  }
  const std::vector<F> completion = {
      {"prompt", "5", nullptr}, {"prompt", "[1.5]", nullptr}, {"prompt", "{}", nullptr}, {"prompt", "[[\"a\"]]", nullptr},
      {"echo", "\"yes\"", nullptr}, {"suffix", "5", nullptr}, {"logprobs", "\"2\"", nullptr},
  };
  for (const F& f : completion) {
    CAPTURE(std::string(f.key));
    CAPTURE(std::string(f.bad));
    std::string b = std::string(f.key) == "prompt" ? std::string(R"({"prompt":)") + f.bad + "}" : completion_with(f.key, f.bad);
    expect_4xx(post("/v1/completions", b), f.param ? f.param : f.key);
  }
  expect_4xx(post("/tokenize", R"({"prompt":5})"), "prompt");
  expect_4xx(post("/detokenize", R"({"tokens":"x"})"), "tokens");
  expect_4xx(post("/detokenize", R"({"tokens":[1.5]})"), "tokens");
}

TEST_CASE("hostile: 10,000 tools, 10,000 stop strings, huge stop strings, bad logit_bias ids") {
  REQUIRE(hostile_server().port != 0);
  json tools = json::array();
  for (int i = 0; i < 10000; ++i)
    tools.push_back({{"type", "function"},
                     {"function", {{"name", "tool_" + std::to_string(i)}, {"description", "d"}, {"parameters", {{"type", "object"}}}}}});
  json b = {{"messages", json::parse(kMsgs)}, {"tools", tools}, {"max_tokens", 2}};
  json e = expect_4xx(post("/v1/chat/completions", b.dump()), "messages");  // the rendered prompt is far beyond the 4096-token context
  CHECK(e["code"] == "context_length_exceeded");

  json stops = json::array();
  for (int i = 0; i < 10000; ++i) stops.push_back("s" + std::to_string(i));
  expect_4xx(post("/v1/chat/completions", chat_with("stop", stops.dump())), "stop");
  expect_4xx(post("/v1/completions", completion_with("stop", json(std::string(100000, 'x')).dump())), "stop");
  expect_4xx(post("/v1/completions", completion_with("stop", json::array({"a", std::string(5000, 'y')}).dump())), "stop");

  for (const char* id : {"-1", "151936", "999999999", "99999999999999999999999", "abc", "1.5", "", " 5", "5 ", "0x10", "+5"}) {
    CAPTURE(std::string(id));
    expect_4xx(post("/v1/chat/completions", chat_with("logit_bias", json{{id, 1}}.dump())), std::string("logit_bias"), false);
  }
  expect_4xx(post("/v1/chat/completions", chat_with("logit_bias", R"({"5":101})")), "logit_bias");
  expect_4xx(post("/v1/completions", completion_with("stop_token_ids", json(std::vector<int>(100000, 5)).dump())), "stop_token_ids");
  json many = json::object();
  for (int i = 0; i < 2000; ++i) many[std::to_string(i)] = 1;
  expect_4xx(post("/v1/chat/completions", chat_with("logit_bias", many.dump())), "logit_bias");
}

TEST_CASE("hostile: header floods, request-line floods, /metrics label injection and series growth") {
  REQUIRE(hostile_server().port != 0);
  std::string many;
  for (int i = 0; i < 10000; ++i) many += "X-F" + std::to_string(i) + ": 1\r\n";
  CHECK(http(hostile_server().port, "GET", "/health", "", many).status == 431);
  CHECK(alive_and_healthy());
  CHECK(http(hostile_server().port, "GET", "/health", "", "X-Big: " + std::string(1 << 20, 'a') + "\r\n").status == 431);
  CHECK(alive_and_healthy());
  CHECK(http(hostile_server().port, "GET", "/" + std::string(100000, 'p'), "").status == 431);
  CHECK(alive_and_healthy());
  {
    int fd = connect_raw(hostile_server().port);  // a header line that never ends
    send_all(fd, "GET /health HTTP/1.1\r\nX: " + std::string(100000, 'z'));
    HttpReply r = parse_reply(recv_all(fd, 10000));
    ::close(fd);
    CHECK(r.status == 431);
  }
  CHECK(alive_and_healthy());

  // Label injection: the path never reaches a label; unknown paths share "other".
  for (const char* path : {"/v1/x\"}", "/v1/x%22%7D\\n", "/v1/x\\\"} 1\nfake_metric{a=\"b\"} 9"}) {
    const int st = req("GET", path, "").status;
    CHECK((st == 404 || st == 400));
  }
  const size_t before = req("GET", "/metrics", "").body.size();
  for (int i = 0; i < 2000; ++i) req("GET", "/v1/unknown-" + std::to_string(i), "");
  const std::string page = req("GET", "/metrics", "").body;
  CHECK(page.find("x\"}") == std::string::npos);
  CHECK(page.find("unknown-") == std::string::npos);
  CHECK(page.find("endpoint=\"other\",status=\"404\"") != std::string::npos);
  CHECK(page.size() < before + 512);  // no new series
  for (size_t p = page.find("endpoint=\""); p != std::string::npos; p = page.find("endpoint=\"", p + 1)) {
    const std::string label = page.substr(p + 10, page.find('"', p + 10) - p - 10);
    CAPTURE(label);
    CHECK((label == "other" || label.rfind("/", 0) == 0));
  }
  CHECK(alive_and_healthy());
}

TEST_CASE("hostile: 1,100 idle sockets and a slowloris crowd do not starve a streaming client") {
  REQUIRE(hostile_server().port != 0);
  std::vector<int> idle;
  for (int i = 0; i < 1100; ++i) {
    int fd = connect_raw(hostile_server().port);
    if (fd >= 0) idle.push_back(fd);
    if (i % 2 == 0 && fd >= 0) send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");  // half a header (slowloris)
  }
  CHECK(idle.size() == 1100);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(healthy(hostile_server().port));
  json b = chat_body(0, 16);
  b["stream"] = true;
  HttpReply r = post("/v1/chat/completions", b.dump());
  CHECK(r.status == 200);
  StreamResult s = collect_stream(r);
  CHECK(s.done);
  CHECK(s.finish_reason == "length");
  for (int fd : idle) ::close(fd);
  CHECK(alive_and_healthy());
}

TEST_CASE("hostile: small protocol items (HTTP/1.0, half-close, NUL, tool_call_id, kwargs, auth, request id, CORS)") {
  REQUIRE(hostile_server().port != 0);
  const uint16_t port = hostile_server().port;
  // HTTP/1.0 client: a close-delimited stream, no chunked encoding.
  {
    json b = chat_body(1, 8);
    b["stream"] = true;
    const std::string body = b.dump();
    int fd = connect_raw(port);
    send_all(fd, "POST /v1/chat/completions HTTP/1.0\r\n" + kAuth + "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\n\r\n" + body);
    const std::string raw = recv_all(fd, 30000);
    ::close(fd);
    CAPTURE(raw.substr(0, 400));
    HttpReply r = parse_reply(raw);
    CHECK(r.status == 200);
    CHECK(raw.find("Transfer-Encoding") == std::string::npos);
    CHECK(r.headers["connection"] == "close");
    StreamResult s = collect_stream(r);
    CHECK(s.done);
    CHECK(s.content == hf_reference()["chats"][1]["greedy_text"].get<std::string>().substr(0, s.content.size()));
    CHECK(!s.content.empty());
  }
  // HTTP/1.0 with n = 2 choices and on /v1/responses: close-delimited too, every choice ends.
  {
    json b = chat_body(1, 8);
    b["stream"] = true;
    b["n"] = 2;
    json rb{{"input", b["messages"]}, {"max_output_tokens", 8}, {"temperature", 0}, {"stream", true}};
    for (const auto& [path, body] : {std::pair<std::string, std::string>{"/v1/chat/completions", b.dump()}, {"/v1/responses", rb.dump()}}) {
      CAPTURE(path);
      int fd = connect_raw(port);
      send_all(fd, "POST " + path + " HTTP/1.0\r\n" + kAuth + "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\n\r\n" + body);
      const std::string raw = recv_all(fd, 30000);
      ::close(fd);
      CAPTURE(raw.substr(0, 400));
      HttpReply r = parse_reply(raw);
      CHECK(r.status == 200);
      CHECK(raw.find("Transfer-Encoding") == std::string::npos);
      CHECK(r.headers["connection"] == "close");
      REQUIRE(!r.events.empty());
      if (path == "/v1/responses") {
        const json last = json::parse(r.events.back());
        CHECK(last["type"] == "response.incomplete");
        CHECK(last["response"]["usage"]["output_tokens"] == 8);
        const std::string id = last["response"]["id"];
        CHECK(id.size() == 5 + 24);
        CHECK(id.rfind("resp_", 0) == 0);
      } else {
        CHECK(r.events.back() == "[DONE]");
        std::set<int> finished;
        for (const auto& e : r.events) {
          if (e == "[DONE]") continue;
          const json chunk = json::parse(e);
          for (const auto& ch : chunk["choices"])
            if (!ch["finish_reason"].is_null()) finished.insert(ch["index"].get<int>());
        }
        CHECK(finished == std::set<int>{0, 1});
        const std::string id = json::parse(r.events[0])["id"];
        CHECK(id.size() == 9 + 24);
        CHECK(id.rfind("chatcmpl-", 0) == 0);
      }
    }
  }
  // Half-closed request: the client shuts its write side after the body and still gets the whole reply.
  for (bool stream : {false, true}) {
    CAPTURE(stream);
    json b = chat_body(2, 8);
    b["stream"] = stream;
    int fd = connect_raw(port);
    send_all(fd, make_request("POST", "/v1/chat/completions", b.dump(), kAuth));
    ::shutdown(fd, SHUT_WR);
    HttpReply r = parse_reply(recv_all(fd, 30000));
    ::close(fd);
    CHECK(r.status == 200);
    if (stream) CHECK(collect_stream(r).done);
    else CHECK(json::parse(r.body)["usage"]["completion_tokens"] == 8);
  }
  {
    json rb{{"input", "hi"}, {"max_output_tokens", 8}, {"temperature", 0}};
    int fd = connect_raw(port);
    send_all(fd, make_request("POST", "/v1/responses", rb.dump(), kAuth));
    ::shutdown(fd, SHUT_WR);
    HttpReply r = parse_reply(recv_all(fd, 30000));
    ::close(fd);
    CHECK(r.status == 200);
    CHECK(json::parse(r.body)["usage"]["output_tokens"] == 8);
  }
  // A tool message must name its call; chat_template_kwargs cannot replace the template's variables.
  expect_4xx(post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"},{"role":"tool","content":"r"}]})"), "messages[1].tool_call_id");
  for (const char* k : {"messages", "tools", "add_generation_prompt", "bos_token", "raise_exception"}) {
    CAPTURE(std::string(k));
    expect_4xx(post("/v1/chat/completions", chat_with("chat_template_kwargs", json{{k, "x"}}.dump())), std::string("chat_template_kwargs.") + k);
  }
  // Bearer: the scheme in any case; a wrong key or scheme is 401.
  const std::string ok_body = chat_with("temperature", "0");
  CHECK(http(port, "POST", "/v1/chat/completions", ok_body, "Authorization: bearer " + kKey + "\r\n").status == 200);
  CHECK(http(port, "POST", "/v1/chat/completions", ok_body, "Authorization: BEARER  " + kKey + "\r\n").status == 200);
  expect_4xx(http(port, "POST", "/v1/chat/completions", ok_body, "Authorization: Basic " + kKey + "\r\n"), "", true, 401);
  expect_4xx(http(port, "POST", "/v1/chat/completions", ok_body, "Authorization: Bearer " + kKey + "x\r\n"), "", true, 401);
  expect_4xx(http(port, "POST", "/v1/chat/completions", ok_body, ""), "", true, 401);
  // X-Request-Id: echoed when sane, generated otherwise (every reply, errors too).
  HttpReply a = req("GET", "/health", "", "X-Request-Id: abc-123\r\n");
  CHECK(a.headers["x-request-id"] == "abc-123");
  HttpReply g = req("GET", "/health", "");
  CHECK(g.headers["x-request-id"].size() == 32);
  CHECK(req("GET", "/health", "").headers["x-request-id"] != g.headers["x-request-id"]);
  HttpReply bad = req("GET", "/health", "", "X-Request-Id: " + std::string(300, 'q') + "\r\n");
  CHECK(bad.headers["x-request-id"].size() == 32);
  CHECK(post("/v1/chat/completions", "{").headers.count("x-request-id") == 1);
  // CORS: allowed origins get the header and a preflight; others neither.
  HttpReply c = req("GET", "/v1/models", "", kAuth + "Origin: " + kOrigin + "\r\n");
  CHECK(c.status == 200);
  CHECK(c.headers["access-control-allow-origin"] == kOrigin);
  CHECK(req("GET", "/v1/models", "", kAuth + "Origin: https://evil.example\r\n").headers.count("access-control-allow-origin") == 0);
  HttpReply pf = http(port, "OPTIONS", "/v1/chat/completions", "",
                      "Origin: http://localhost:3000\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n");
  CHECK(pf.status == 204);
  CHECK(pf.headers["access-control-allow-origin"] == "http://localhost:3000");
  CHECK(pf.headers["access-control-allow-methods"].find("POST") != std::string::npos);
  CHECK(pf.headers["access-control-allow-headers"] == "authorization, content-type");
  expect_4xx(http(port, "OPTIONS", "/v1/chat/completions", "", "Origin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\n"), "", true, 403);
  CHECK(alive_and_healthy());
}

TEST_CASE("hostile: a 7 MB prompt is tokenized off the I/O thread: /health answers before it") {
  REQUIRE(hostile_server().port != 0);
  std::string text;
  text.reserve(7 << 20);
  while (text.size() < (7u << 20)) text += "The quick brown fox jumps over the lazy dog. ";
  const std::string body = json{{"prompt", text}, {"max_tokens", 1}}.dump();
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> big_done{false};
  Clock::time_point big_at;
  HttpReply big;
  std::thread t([&] {
    big = post("/v1/completions", body);
    big_at = Clock::now();
    big_done = true;
  });
  // Wait until the body is surely uploaded and being worked on, then ask for /health.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const bool was_busy = !big_done;
  const Clock::time_point health_sent = Clock::now();
  CHECK(healthy(hostile_server().port));
  const Clock::time_point health_at = Clock::now();
  t.join();
  // /health answered first, or answered at once while the big request ended in between (on a loaded machine it
  // can finish during the /health round trip; an I/O thread busy tokenizing would hold /health until it is done).
  const bool health_first = health_at < big_at || health_at - health_sent < std::chrono::milliseconds(50);
  json e = expect_4xx(big, "prompt");
  CHECK(e["code"] == "context_length_exceeded");
  if (was_busy) CHECK(health_first);
  else MESSAGE("the 7 MB prompt finished within 300 ms: ordering not checked");
}

TEST_CASE("hostile: echo with logprobs scores the prompt (first token null), matching one-token completions of its prefixes") {
  REQUIRE(hostile_server().port != 0);
  const json ids = json::array({9707, 1879, 11, 419, 374, 264, 1273});
  HttpReply r = post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true}, {"logprobs", 3}}.dump());
  REQUIRE(r.status == 200);
  const json lp = json::parse(r.body)["choices"][0]["logprobs"];
  REQUIRE(lp["token_logprobs"].size() == ids.size() + 1);
  CHECK(lp["token_logprobs"][0].is_null());
  CHECK(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < ids.size(); ++i) {
    CAPTURE(i);
    // The model's distribution after prompt[:i], computed as a one-token completion.
    json prefix = json::array();
    for (size_t k = 0; k < i; ++k) prefix.push_back(ids[k]);
    HttpReply one = post("/v1/completions", json{{"prompt", prefix}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 3}}.dump());
    REQUIRE(one.status == 200);
    const json top = json::parse(one.body)["choices"][0]["logprobs"]["top_logprobs"][0];
    const json& mine = lp["top_logprobs"][i];
    REQUIRE(mine.size() == top.size());
    for (auto it = top.begin(); it != top.end(); ++it) {
      REQUIRE(mine.contains(it.key()));
      CHECK(mine[it.key()].get<double>() == doctest::Approx(it.value().get<double>()).epsilon(1e-4));
    }
    CHECK(lp["token_logprobs"][i].get<double>() <= 0.0);
  }
  // Streaming: the echo chunk carries the same prompt scores.
  HttpReply s = post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true}, {"logprobs", 3}, {"stream", true}}.dump());
  REQUIRE(s.status == 200);
  REQUIRE(!s.events.empty());
  const json first = json::parse(s.events[0])["choices"][0]["logprobs"];
  REQUIRE(first["token_logprobs"].size() == ids.size());
  for (size_t i = 1; i < ids.size(); ++i) CHECK(first["token_logprobs"][i].get<double>() == doctest::Approx(lp["token_logprobs"][i].get<double>()));
}

TEST_CASE("hostile: tool call ids are call_ + 24 random characters, never repeated") {
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {
    OutputParser p(true, false);
    ParsedDelta d = p.push("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
    d.append(p.finish());
    REQUIRE(d.tool_calls.size() == 1);
    const std::string& id = d.tool_calls[0].id;
    CHECK(id.size() == 5 + 24);
    CHECK(id.rfind("call_", 0) == 0);
    for (char c : id.substr(5)) CHECK(std::isalnum(static_cast<unsigned char>(c)));
    seen.insert(id);
  }
  CHECK(seen.size() == 2000);
  // Model output nested beyond reason stays text: no deep value is built.
  OutputParser p(true, false);
  ParsedDelta d = p.push("<tool_call>\n{\"name\": \"f\", \"arguments\": " + deep(100000) + "}\n</tool_call>");
  d.append(p.finish());
  CHECK(d.tool_calls.empty());
}

TEST_CASE("hostile: --max-model-len above the trained context or negative is an error; bad connection settings too") {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--max-model-len", "5000"}, {"--max-model-len", "-5"}, {"--max-connections-per-client", "-1"}, {"--http-worker-threads", "0"},
           {"--cors-origins", "not an origin"}, {"--idle-timeout", "0"}, {"--http-worker-nice", "20"}}) {
    CAPTURE(args[0] + " " + args[1]);
    ServeProcess p(args);
    CHECK(p.port == 0);
    CHECK(p.wait_exit(60) == 1);
    CAPTURE(p.err);
    CHECK(p.err.find(args[0]) != std::string::npos);
  }
  CHECK(alive_and_healthy());
}
