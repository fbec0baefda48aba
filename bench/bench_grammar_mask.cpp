// Structured outputs' per-step cost (engine/grammar.h): grammar_mask over a
// tokenizer's whole vocabulary from typical states of a json_schema
// response and a constrained tool call, against the scalar reference
// (every token fed from scratch) that the trie walk replaces. One mask runs
// per generated token on the CPU. Figures: microseconds per mask and
// tokens decided per microsecond.
// Usage: bench_grammar_mask [MODEL_DIR] (default: the tiny-qwen3moe fixture
// under build/fixtures; its tokenizer is Qwen3's 151,669 tokens).
// Never passes or fails on time.
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "configs/error.h"
#include "engine/text/json_schema.h"
#include "engine/text/tokenizer/tokenizer.h"

using namespace hmoe;

namespace {
double time_us(int reps, const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "fixtures/tiny-qwen3moe";
  try {
    const auto t = tok::Tokenizer::from_dir(dir);
    const JsonVocab v(*t);
    const int64_t V = v.size();
    const auto schema = nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"short":{"type":"string","maxLength":8},"age":{"type":"integer"},
      "role":{"enum":["admin","user","guest"]},"tags":{"type":"array","items":{"type":"string"}},
      "boss":{"anyOf":[{"type":"null"},{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}]}},
      "required":["name","short","age","role","tags","boss"],"additionalProperties":false})");
    const auto g = json_schema_grammar(schema);
    const auto tool = tool_call_grammar({{"get_weather", nlohmann::ordered_json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"), false},
                                         {"search", nlohmann::ordered_json::parse(R"({"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"}},"required":["q"]})"), false}});
    std::printf("tokenizer %s: %lld tokens\n", dir.c_str(), static_cast<long long>(V));
    std::printf("%-44s %8s %12s %14s %12s\n", "state (output so far)", "allowed", "us per mask", "reference us", "tokens/us");
    const std::vector<int32_t> ends = {151645};
    std::vector<float> row(static_cast<size_t>(V));
    struct Case {
      const Grammar* g;
      const char* prefix;
    };
    const std::vector<Case> cases = {
        {g.get(), ""},
        {g.get(), "{\"na"},
        {g.get(), "{\"name\": \"Ali"},
        {g.get(), "{\"name\": \"Al\", \"short\": \"abc"},
        {g.get(), "{\"name\": \"Al\", \"short\": \"a\", \"age\": 4"},
        {g.get(), "{\"name\": \"Al\", \"short\": \"a\", \"age\": 4, \"role\": \"a"},
        {g.get(), "{\"name\": \"A\", \"short\": \"a\", \"age\": 4, \"role\": \"user\", \"tags\": [\"x\", "},
        {g.get(), "{\"name\": \"A\", \"short\": \"a\", \"age\": 4, \"role\": \"user\", \"tags\": [], \"boss\": "},
        {tool.get(), "\n"},
        {tool.get(), "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par"},
        {tool.get(), "{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}"},
    };
    for (const Case& c : cases) {
      GrammarState st(c.g);
      if (!st.feed(std::string(c.prefix))) fail(ErrorKind::internal, std::string("bench: prefix not accepted: ") + c.prefix);
      int64_t allowed = 0;
      const double us = time_us(20, [&] {
        std::fill(row.begin(), row.end(), 1.0f);
        allowed = grammar_mask(v, st, ends, row.data(), V);
      });
      const double ref = time_us(1, [&] {
        std::fill(row.begin(), row.end(), 1.0f);
        grammar_mask_reference(v, st, ends, row.data(), V);
      });
      std::string label = std::string("'") + c.prefix + "'";
      for (auto& ch : label)
        if (ch == '\n') ch = ' ';
      std::printf("%-44s %8lld %12.1f %14.1f %12.1f\n", label.substr(0, 44).c_str(), static_cast<long long>(allowed), us, ref,
                  static_cast<double>(V) / us);
    }
    std::printf("(each mask also refills the row here: a %lld-float fill costs a few us of the figure)\n", static_cast<long long>(V));
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_grammar_mask: %s\n", e.what());
    return 1;
  }
  return 0;
}
