// CompletionBuilder with the real Qwen3 tokenizer: a model output with a
// <tool_call> block becomes OpenAI tool_calls (streamed and not), <think>
// becomes reasoning_content, and stop strings end the text; the token events
// are the tokenizer's ids of a chosen text, fed in random groups.
#include <doctest/doctest.h>

#include <random>

#include "engine/text/tokenizer/tokenizer.h"
#include "server/completion.h"
#include "tests/test_util.h"

using namespace hmoe;
using namespace hmoe::server;
using nlohmann::json;

namespace {

const tok::Tokenizer& tokenizer() {
  static auto t = tok::Tokenizer::from_dir(test::fixture_model("tiny-qwen3moe"));
  return *t;
}

std::vector<TokenEvent> events_of(const std::string& text, bool eos) {
  std::vector<TokenEvent> out;
  for (int32_t id : tokenizer().encode(text)) out.push_back({id, -0.5f, {}});
  if (eos) out.push_back({*tokenizer().token_to_id("<|im_end|>"), -0.1f, {}});
  return out;
}

ModelInfo info() {
  ModelInfo m;
  m.name = "m";
  m.context = 4096;
  m.vocab = 151936;
  m.tokenizer = &tokenizer();
  return m;
}

// Streams `evs` in random groups; returns the parsed SSE events.
std::vector<json> stream(CompletionBuilder& b, const std::vector<TokenEvent>& evs, FinishReason fin, std::mt19937_64& rng) {
  std::string sse;
  size_t i = 0;
  while (i < evs.size()) {
    size_t n = std::min<size_t>(1 + rng() % 3, evs.size() - i);
    sse += b.on_tokens(std::vector<TokenEvent>(evs.begin() + static_cast<std::ptrdiff_t>(i), evs.begin() + static_cast<std::ptrdiff_t>(i + n)));
    i += n;
  }
  sse += b.on_finish(fin, "");
  std::vector<json> out;
  size_t p = 0;
  while ((p = sse.find("data: ", p)) != std::string::npos) {
    size_t e = sse.find("\n\n", p);
    std::string d = sse.substr(p + 6, e - p - 6);
    if (d != "[DONE]") out.push_back(json::parse(d));
    p = e + 2;
  }
  return out;
}

}  // namespace

TEST_CASE("completion builder: tool calls and reasoning, streamed and whole") {
  const ModelInfo m = info();
  GenSpec spec;
  spec.chat = true;
  spec.parse_tools = true;
  spec.parse_reasoning = true;
  spec.prompt = {1, 2, 3};
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n</tool_call>";
  const auto evs = events_of(text, true);
  std::mt19937_64 rng(1);
  for (int rep = 0; rep < 20; ++rep) {
    CompletionBuilder b(spec, m, "chatcmpl-x", 1, 5);
    auto chunks = stream(b, evs, FinishReason::eos, rng);
    std::string content, reasoning, finish;
    std::vector<json> calls;
    for (const auto& c : chunks) {
      const json& d = c["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const auto& t : d["tool_calls"]) calls.push_back(t);
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    CHECK(reasoning == "\nThe user wants weather.\n");
    CHECK(content == "\n\nChecking.\n");
    CHECK(finish == "tool_calls");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0]["index"] == 0);
    CHECK(calls[0]["type"] == "function");
    CHECK(calls[0]["function"]["name"] == "get_weather");
    CHECK(json::parse(calls[0]["function"]["arguments"].get<std::string>()) == json{{"city", "Paris"}, {"unit", "c"}});
    CHECK(b.completion_tokens() == static_cast<int64_t>(evs.size()));
  }
  CompletionBuilder whole(spec, m, "chatcmpl-y", 1, 5);
  whole.add_tokens(evs);
  json j = whole.body(FinishReason::eos);
  const json& msg = j["choices"][0]["message"];
  CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
  CHECK(msg["content"] == "\n\nChecking.\n");
  CHECK(msg["reasoning_content"] == "\nThe user wants weather.\n");
  CHECK(msg["tool_calls"][0]["function"]["name"] == "get_weather");
  CHECK(j["usage"]["completion_tokens"] == evs.size());
  CHECK(j["usage"]["prompt_tokens"] == 3);
}

// tool_choice "required" / a named function: the prompt already holds the
// opening of the call (spec.forced_prefix), so the model's text starts inside
// it; the builder must still return exactly one tool call and no content.
TEST_CASE("completion builder: forced tool calls (tool_choice required and named)") {
  const ModelInfo m = info();
  struct Case {
    const char* prefix;
    const char* output;
    const char* name;
  };
  const Case cases[] = {{"<tool_call>\n", "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>", "get_time"},
                        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", "{\"city\": \"Paris\"}}\n</tool_call>", "get_weather"},
                        {"\n</think>\n\n<tool_call>\n", "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", "get_time"}};
  for (const Case& c : cases) {
    CAPTURE(c.prefix);
    GenSpec spec;
    spec.chat = true;
    spec.parse_tools = true;
    spec.parse_reasoning = true;
    spec.start_in_reasoning = std::string(c.prefix).find("</think>") != std::string::npos;
    spec.forced_prefix = c.prefix;
    spec.prompt = {1, 2, 3};
    const auto evs = events_of(c.output, true);
    std::mt19937_64 rng(3);
    CompletionBuilder sb(spec, m, "chatcmpl-s", 1, 5);
    std::vector<json> calls;
    std::string content, reasoning;
    for (const auto& ch : stream(sb, evs, FinishReason::eos, rng)) {
      const json& d = ch["choices"][0]["delta"];
      if (d.contains("tool_calls"))
        for (const auto& t : d["tool_calls"]) calls.push_back(t);
      if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    }
    REQUIRE(calls.size() == 1);
    CHECK(calls[0]["function"]["name"] == c.name);
    CHECK(content.empty());
    CHECK(reasoning.empty());
    CompletionBuilder whole(spec, m, "chatcmpl-w", 1, 5);
    whole.add_tokens(evs);
    json j = whole.body(FinishReason::eos);
    CHECK(j["choices"][0]["finish_reason"] == "tool_calls");
    CHECK(j["choices"][0]["message"]["tool_calls"].size() == 1);
    CHECK(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == c.name);
  }
}

TEST_CASE("completion builder: stop strings and multi-byte characters split across tokens") {
  const ModelInfo m = info();
  GenSpec spec;
  spec.chat = false;
  spec.prompt = {1};
  spec.stop = {"世界!"};
  const std::string text = "Hello 世界! and more";  // the CJK characters are several byte-level tokens
  const auto evs = events_of(text, false);
  std::mt19937_64 rng(2);
  for (int rep = 0; rep < 20; ++rep) {
    CompletionBuilder b(spec, m, "cmpl-x", 1);
    auto chunks = stream(b, evs, FinishReason::length, rng);
    std::string got, finish;
    for (const auto& c : chunks) {
      got += c["choices"][0]["text"].get<std::string>();
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    CHECK(got == "Hello ");
    CHECK(finish == "stop");
    CHECK(b.stop_hit());
  }
  // Without the stop string the text comes back whole (every chunk valid UTF-8 JSON).
  spec.stop.clear();
  CompletionBuilder b(spec, m, "cmpl-y", 1);
  std::string got;
  for (const auto& c : stream(b, evs, FinishReason::length, rng)) got += c["choices"][0]["text"].get<std::string>();
  CHECK(got == text);
}
