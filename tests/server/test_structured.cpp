// Issue 22's API half against a live server on the tiny fixture (random
// weights, so only the constraints make the output well-formed):
// tool_choice required / named give a call of an offered tool whose
// arguments validate, 20 of 20 at temperature 1; response_format
// json_schema replies validate, 50 of 50; unsupported keywords are a 400
// naming them; a call the model starts under "auto" is parsed and never
// leaks; n > 1 (chat and completions, streamed and not) with usage as
// OpenAI counts it and the prompt's KV blocks shared; /v1/models/{id};
// /v1/responses (body and events).
#include <doctest/doctest.h>

#include <regex>
#include <set>

#include "tests/schema_validator.h"
#include "tests/server/server_fixture.h"

using namespace hmoe::test;
using nlohmann::json;

namespace {
HttpReply post(uint16_t port, const std::string& path, const json& body) { return http(port, "POST", path, body.dump()); }

json expect_error(const HttpReply& r, int status) {
  CAPTURE(r.body);
  CHECK(r.status == status);
  json j = json::parse(r.body, nullptr, false);
  REQUIRE(j.is_object());
  REQUIRE(j.contains("error"));
  return j["error"];
}

double metric(uint16_t port, const std::string& name) {
  HttpReply r = http(port, "GET", "/metrics");
  std::smatch m;
  std::regex re("\n" + name + " ([0-9.e+-]+)\n");
  std::string body = "\n" + r.body;
  if (!std::regex_search(body, m, re)) return -1;
  return std::stod(m[1]);
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]},
                  "days": {"type": "integer"}}, "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "search", "description": "Search the web",
   "parameters": {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 10},
                  "filters": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 4}, "on": {"type": "boolean"}}, "required": ["k", "on"]}}},
                  "required": ["query"]}}}
])");

const json* tool_schema(const std::string& name) {
  for (const auto& t : kTools)
    if (t["function"]["name"] == name) return &t["function"]["parameters"];
  return nullptr;
}

json chat(const std::string& text) { return json::array({{{"role", "user"}, {"content", text}}}); }
}  // namespace

TEST_CASE("structured: tool_choice required and named give a valid call of an offered tool, 20 of 20 at temperature 1") {
  auto& srv = default_server();
  for (const std::string mode : {"required", "named"}) {
    int ok = 0;
    std::set<std::string> names;
    for (int run = 0; run < 20; ++run) {
      json req = {{"messages", chat("Weather in Paris, or search?")}, {"tools", kTools}, {"temperature", 1.0}, {"seed", 1000 + run}, {"max_tokens", 200}};
      req["tool_choice"] = mode == "required" ? json("required") : json{{"type", "function"}, {"function", {{"name", "search"}}}};
      const bool stream = run % 4 == 3;
      if (stream) req["stream"] = true;
      HttpReply r = post(srv.port, "/v1/chat/completions", req);
      CAPTURE(mode);
      CAPTURE(run);
      CAPTURE(r.body);
      REQUIRE(r.status == 200);
      json calls = json::array();
      std::string content, finish;
      if (stream) {
        for (const auto& e : r.events) {
          if (e == "[DONE]") continue;
          const json c = json::parse(e)["choices"][0];
          if (c["delta"].contains("tool_calls")) calls.insert(calls.end(), c["delta"]["tool_calls"].begin(), c["delta"]["tool_calls"].end());
          if (c["delta"].contains("content") && c["delta"]["content"].is_string()) content += c["delta"]["content"].get<std::string>();
          if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
        }
      } else {
        const json c = json::parse(r.body)["choices"][0];
        if (c["message"].contains("tool_calls")) calls = c["message"]["tool_calls"];
        if (c["message"]["content"].is_string()) content = c["message"]["content"];
        finish = c["finish_reason"];
      }
      CHECK(content.find("<tool_call>") == std::string::npos);
      CHECK(content.find("</tool_call>") == std::string::npos);
      if (calls.size() != 1 || finish != "tool_calls") continue;
      const std::string name = calls[0]["function"]["name"];
      const json* schema = tool_schema(name);
      if (!schema || (mode == "named" && name != "search")) continue;
      const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>(), nullptr, false);
      CAPTURE(args.dump());
      CHECK(schema_violation(args, *schema) == "");
      if (schema_violation(args, *schema).empty() && calls[0]["id"].get<std::string>().rfind("call_", 0) == 0) ++ok;
      names.insert(name);
    }
    CAPTURE(mode);
    CHECK(ok == 20);
    MESSAGE(mode << ": " << ok << "/20 valid calls; tools called: " << names.size());
  }
  CHECK(healthy(srv.port));
}

TEST_CASE("structured: response_format json_schema replies validate, 50 of 50 at temperature 1") {
  auto& srv = default_server();
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "title": {"type": "string", "maxLength": 8},
      "rating": {"type": "integer"},
      "score": {"type": ["number", "null"]},
      "genre": {"enum": ["drama", "comedy", "horror"]},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
      "director": {"anyOf": [{"$ref": "#/$defs/person"}, {"type": "null"}]},
      "ok": {"type": "boolean"},
      "kind": {"const": "movie"}
    },
    "required": ["title", "rating", "genre", "director", "kind"],
    "additionalProperties": false,
    "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "mentor": {"anyOf": [{"$ref": "#/$defs/person"}, {"type": "null"}]}},
                         "required": ["name", "mentor"], "additionalProperties": false}}
  })");
  int ok = 0;
  for (int run = 0; run < 50; ++run) {
    json req = {{"messages", chat("Describe a movie as JSON.")},
                {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "movie"}, {"strict", true}, {"schema", schema}}}}},
                {"temperature", 1.0},
                {"seed", run},
                {"max_tokens", 400}};
    HttpReply r = post(srv.port, "/v1/chat/completions", req);
    CAPTURE(run);
    CAPTURE(r.body);
    REQUIRE(r.status == 200);
    const json c = json::parse(r.body)["choices"][0];
    CHECK(c["finish_reason"] == "stop");
    const json doc = json::parse(c["message"]["content"].get<std::string>(), nullptr, false);
    CHECK(!doc.is_discarded());
    if (!doc.is_discarded() && schema_violation(doc, schema).empty()) ++ok;
    else CHECK(schema_violation(doc, schema) == "");
  }
  CHECK(ok == 50);
  MESSAGE("json_schema: " << ok << "/50 replies validate");
  // A stream carries the same constrained reply.
  json req = {{"messages", chat("JSON please")},
              {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "movie"}, {"schema", schema}}}}},
              {"temperature", 1.0},
              {"seed", 7},
              {"max_tokens", 400},
              {"stream", true}};
  StreamResult s = collect_stream(post(srv.port, "/v1/chat/completions", req));
  CAPTURE(s.content);
  CHECK(s.finish_reason == "stop");
  CHECK(schema_violation(json::parse(s.content), schema) == "");
}

TEST_CASE("structured: schemas with keywords that cannot be enforced are a 400 naming the keyword") {
  auto& srv = default_server();
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"type", "string"}, {"pattern", "^[a-z]+$"}}, "pattern"},
      {{{"type", "object"}, {"properties", {{"email", {{"type", "string"}, {"format", "email"}}}}}}, "format"},
      {{{"type", "integer"}, {"minimum", 0}}, "minimum"},
      {{{"oneOf", json::array({{{"type", "string"}}})}}, "oneOf"},
      {{{"type", "array"}, {"uniqueItems", true}}, "uniqueItems"},
      {{{"$ref", "#/$defs/nope"}}, "$ref"},
  };
  for (const auto& [schema, keyword] : cases) {
    CAPTURE(schema.dump());
    json req = {{"messages", chat("x")}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
    json e = expect_error(post(srv.port, "/v1/chat/completions", req), 400);
    CHECK(e["param"] == "response_format");
    CHECK(e["message"].get<std::string>().find("'" + keyword + "'") != std::string::npos);
  }
  // A tool marked strict is held to the same rule; one that is not has the keyword left out.
  json strict_tool = {{"type", "function"},
                      {"function", {{"name", "f"}, {"strict", true}, {"parameters", {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}, {"minimum", 1}}}}}}}}}};
  json req = {{"messages", chat("x")}, {"tools", json::array({strict_tool})}, {"tool_choice", "required"}, {"max_tokens", 30}};
  json e = expect_error(post(srv.port, "/v1/chat/completions", req), 400);
  CHECK(e["param"] == "tools");
  CHECK(e["message"].get<std::string>().find("'minimum'") != std::string::npos);
  strict_tool["function"]["strict"] = false;
  req["tools"] = json::array({strict_tool});
  CHECK(post(srv.port, "/v1/chat/completions", req).status == 200);
  // A non-strict tool whose schema does not compile at all still gets calls (any-object arguments).
  json broken = {{"type", "function"}, {"function", {{"name", "g"}, {"parameters", {{"$ref", "#/nowhere"}}}}}};
  req = {{"messages", chat("x")}, {"tools", json::array({broken})}, {"tool_choice", "required"}, {"max_tokens", 60}, {"temperature", 0}};
  HttpReply br = post(srv.port, "/v1/chat/completions", req);
  CAPTURE(br.body);
  CHECK(br.status == 200);
  // Many tools: the call names one of them.
  json many = json::array();
  for (int i = 0; i < 40; ++i)
    many.push_back(json::parse(R"({"type": "function", "function": {"name": "tool_)" + std::to_string(i) +
                               R"(", "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}}}})"));
  req = {{"messages", chat("x")}, {"tools", many}, {"tool_choice", "required"}, {"max_tokens", 80}, {"temperature", 1.0}, {"seed", 4}};
  HttpReply mr = post(srv.port, "/v1/chat/completions", req);
  CAPTURE(mr.body);
  REQUIRE(mr.status == 200);
  const json mc = json::parse(mr.body)["choices"][0]["message"];
  REQUIRE(mc.contains("tool_calls"));
  CHECK(mc["tool_calls"][0]["function"]["name"].get<std::string>().rfind("tool_", 0) == 0);
  json both = {{"messages", chat("x")}, {"tools", kTools}, {"tool_choice", "required"},
               {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}}}};
  CHECK(expect_error(post(srv.port, "/v1/chat/completions", both), 400)["param"] == "response_format");
  CHECK(healthy(srv.port));
}

TEST_CASE("structured: under tool_choice auto a call the model starts is constrained, parsed and never leaks") {
  auto& srv = default_server();
  for (int run = 0; run < 4; ++run) {
    // logit_bias makes the random model open a call (<tool_call> is token 151657); the grammar then writes it.
    json req = {{"messages", chat("Weather?")}, {"tools", kTools}, {"temperature", 1.0}, {"seed", run}, {"max_tokens", 120},
                {"logit_bias", {{"151657", 100}}}};
    HttpReply r = post(srv.port, "/v1/chat/completions", req);
    CAPTURE(r.body);
    REQUIRE(r.status == 200);
    const json msg = json::parse(r.body)["choices"][0]["message"];
    const std::string content = msg["content"].is_string() ? msg["content"].get<std::string>() : "";
    CHECK(content.find("<tool_call>") == std::string::npos);
    REQUIRE(msg.contains("tool_calls"));
    CHECK(msg["tool_calls"].size() >= 1);
    for (const auto& call : msg["tool_calls"]) {
      const json* schema = tool_schema(call["function"]["name"]);
      REQUIRE(schema != nullptr);
      CHECK(schema_violation(json::parse(call["function"]["arguments"].get<std::string>()), *schema) == "");
    }
  }
}

TEST_CASE("structured: n > 1 returns n choices, counts usage as OpenAI does and shares the prompt's KV blocks") {
  auto& srv = default_server();
  // A prompt nobody sent before (its blocks are not cached yet), several blocks long.
  std::string text = "Count the choices, please: ";
  for (int i = 0; i < 12; ++i) text += "alpha" + std::to_string(i * 7919 % 1000) + " ";
  const double hits0 = metric(srv.port, "hmoe_prefix_cache_hit_tokens_total");
  json req = {{"messages", chat(text)}, {"n", 3}, {"temperature", 1.0}, {"seed", 3}, {"max_tokens", 6}};
  HttpReply r = post(srv.port, "/v1/chat/completions", req);
  REQUIRE(r.status == 200);
  json j = json::parse(r.body);
  REQUIRE(j["choices"].size() == 3);
  int64_t completion = 0;
  for (int i = 0; i < 3; ++i) {
    CHECK(j["choices"][i]["index"] == i);
    CHECK(j["choices"][i]["finish_reason"] == "length");
    completion += 6;
  }
  const int64_t prompt = j["usage"]["prompt_tokens"];
  CHECK(j["usage"]["completion_tokens"] == completion);
  CHECK(j["usage"]["total_tokens"] == prompt + completion);
  CHECK(prompt > 40);
  // The two later choices attached the first one's full prompt blocks.
  const double hits = metric(srv.port, "hmoe_prefix_cache_hit_tokens_total") - hits0;
  CHECK(hits >= 2.0 * static_cast<double>((prompt - 1) / 16 * 16));
  MESSAGE("n=3: " << hits << " prompt tokens of " << prompt << " reused from the prefix cache by the later choices");
  CHECK(j["choices"][0]["message"]["content"] != j["choices"][1]["message"]["content"]);  // different draws

  // Greedy choices are identical; streamed, each choice has its own chunks and finish, and usage comes once.
  json g = {{"messages", chat("Hi")}, {"n", 2}, {"temperature", 0}, {"max_tokens", 5}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  HttpReply s = post(srv.port, "/v1/chat/completions", g);
  REQUIRE(s.status == 200);
  std::string text_of[2];
  int finishes = 0, usages = 0;
  for (const auto& e : s.events) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    if (!c["usage"].is_null()) {
      ++usages;
      CHECK(c["usage"]["completion_tokens"] == 10);
    }
    for (const auto& ch : c["choices"]) {
      const int i = ch["index"];
      REQUIRE((i == 0 || i == 1));
      if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) text_of[i] += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) ++finishes;
    }
  }
  CHECK(s.events.back() == "[DONE]");
  CHECK(finishes == 2);
  CHECK(usages == 1);
  CHECK(text_of[0] == text_of[1]);
  CHECK(!text_of[0].empty());

  // Completions too.
  json c = {{"prompt", "Once upon a time"}, {"n", 2}, {"max_tokens", 4}, {"temperature", 0}};
  json cj = json::parse(post(srv.port, "/v1/completions", c).body);
  REQUIRE(cj["choices"].size() == 2);
  CHECK(cj["choices"][1]["index"] == 1);
  CHECK(cj["choices"][0]["text"] == cj["choices"][1]["text"]);
  CHECK(cj["usage"]["completion_tokens"] == 8);
  CHECK(healthy(srv.port));
}

TEST_CASE("structured: /v1/models/{id}") {
  auto& srv = default_server();
  HttpReply r = http(srv.port, "GET", "/v1/models/tiny-qwen3moe");
  REQUIRE(r.status == 200);
  json m = json::parse(r.body);
  CHECK(m["id"] == "tiny-qwen3moe");
  CHECK(m["object"] == "model");
  json e = expect_error(http(srv.port, "GET", "/v1/models/gpt-4o"), 404);
  CHECK(e["code"] == "model_not_found");
  CHECK(e["message"].get<std::string>().find("gpt-4o") != std::string::npos);
  CHECK(http(srv.port, "POST", "/v1/models/tiny-qwen3moe", "{}").status == 405);
}

TEST_CASE("structured: /v1/responses bodies, events and refusals") {
  auto& srv = default_server();
  json req = {{"model", "tiny-qwen3moe"}, {"input", "Hello"}, {"instructions", "Be brief."}, {"max_output_tokens", 5}, {"temperature", 0}};
  HttpReply r = post(srv.port, "/v1/responses", req);
  REQUIRE(r.status == 200);
  json j = json::parse(r.body);
  CHECK(j["object"] == "response");
  CHECK(j["id"].get<std::string>().rfind("resp_", 0) == 0);
  CHECK(j["status"] == "incomplete");
  CHECK(j["incomplete_details"]["reason"] == "max_output_tokens");
  CHECK(j["instructions"] == "Be brief.");
  CHECK(j["usage"]["output_tokens"] == 5);
  REQUIRE(j["output"].size() >= 1);
  const json& msg = j["output"].back();
  CHECK(msg["type"] == "message");
  CHECK(msg["content"][0]["type"] == "output_text");
  // Same greedy text as the chat completion of the same conversation.
  json chat_req = {{"messages", json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello"}}})},
                   {"max_tokens", 5}, {"temperature", 0}};
  json cj = json::parse(post(srv.port, "/v1/chat/completions", chat_req).body);
  CHECK(msg["content"][0]["text"] == cj["choices"][0]["message"]["content"]);

  // Streaming: the standard events in order, sequence numbers counting up, no [DONE].
  req["stream"] = true;
  HttpReply s = post(srv.port, "/v1/responses", req);
  REQUIRE(s.status == 200);
  std::vector<std::string> types;
  std::string deltas;
  int64_t seq = -1;
  for (const auto& e : s.events) {
    json ev = json::parse(e);
    types.push_back(ev["type"]);
    CHECK(ev["sequence_number"].get<int64_t>() == seq + 1);
    seq = ev["sequence_number"];
    if (ev["type"] == "response.output_text.delta") deltas += ev["delta"].get<std::string>();
    if (ev["type"] == "response.output_text.done") CHECK(ev["text"] == deltas);
  }
  REQUIRE(types.size() >= 8);
  CHECK(types[0] == "response.created");
  CHECK(types[1] == "response.in_progress");
  CHECK(std::find(types.begin(), types.end(), "response.output_item.added") != types.end());
  CHECK(std::find(types.begin(), types.end(), "response.content_part.added") != types.end());
  CHECK(std::find(types.begin(), types.end(), "response.content_part.done") != types.end());
  CHECK(std::find(types.begin(), types.end(), "response.output_item.done") != types.end());
  CHECK(types.back() == "response.incomplete");
  CHECK(deltas == msg["content"][0]["text"]);
  CHECK(s.body.find("event: response.created\ndata: ") != std::string::npos);

  // A forced tool call comes back as a function_call item, streamed with its argument events.
  json tools = json::array();
  for (const auto& t : kTools) tools.push_back(json{{"type", "function"}, {"name", t["function"]["name"]}, {"parameters", t["function"]["parameters"]}});
  json call = {{"input", "Weather in Paris?"}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
               {"temperature", 1.0}, {"max_output_tokens", 200}};
  json cr = json::parse(post(srv.port, "/v1/responses", call).body);
  CAPTURE(cr.dump());
  CHECK(cr["status"] == "completed");
  REQUIRE(cr["output"].size() == 1);
  CHECK(cr["output"][0]["type"] == "function_call");
  CHECK(cr["output"][0]["name"] == "get_weather");
  CHECK(cr["output"][0]["call_id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(schema_violation(json::parse(cr["output"][0]["arguments"].get<std::string>()), *tool_schema("get_weather")) == "");
  call["stream"] = true;
  HttpReply cs = post(srv.port, "/v1/responses", call);
  std::vector<std::string> ctypes;
  for (const auto& e : cs.events) ctypes.push_back(json::parse(e)["type"]);
  CHECK(std::find(ctypes.begin(), ctypes.end(), "response.function_call_arguments.delta") != ctypes.end());
  CHECK(std::find(ctypes.begin(), ctypes.end(), "response.function_call_arguments.done") != ctypes.end());
  CHECK(ctypes.back() == "response.completed");

  // text.format json_schema, and the refusals.
  json fmt = {{"input", "JSON"}, {"temperature", 1.0}, {"max_output_tokens", 200},
              {"text", {{"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", {{"type", "object"}, {"properties", {{"a", {{"type", "boolean"}}}}}, {"required", {"a"}}}}}}}}};
  json fr = json::parse(post(srv.port, "/v1/responses", fmt).body);
  CHECK(json::parse(fr["output"].back()["content"][0]["text"].get<std::string>())["a"].is_boolean());
  fmt["text"]["format"]["schema"]["properties"]["a"]["pattern"] = "x";
  CHECK(expect_error(post(srv.port, "/v1/responses", fmt), 400)["param"] == "text.format");
  json prev = {{"input", "hi"}, {"previous_response_id", "resp_123"}};
  json pe = expect_error(post(srv.port, "/v1/responses", prev), 400);
  CHECK(pe["param"] == "previous_response_id");
  CHECK(pe["message"].get<std::string>().find("does not store") != std::string::npos);
  CHECK(expect_error(post(srv.port, "/v1/responses", json{{"input", "hi"}, {"tools", {{{"type", "web_search"}}}}}), 400)["param"] == "tools[0].type");
  CHECK(expect_error(post(srv.port, "/v1/responses", json{{"instructions", "x"}}), 400)["param"] == "input");
  CHECK(expect_error(post(srv.port, "/v1/responses", json{{"input", json::array({{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}})}}), 400)["param"] ==
        "input[0].content[0].type");
  CHECK(healthy(srv.port));
}
