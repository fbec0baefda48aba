// Default sampling from generation_config.json (engine/loading/generation_config.h):
// the keys vLLM reads, null and absent keys, the auto/none/path setting, and
// bad files named with the key and value.
#include <doctest/doctest.h>

#include <string>

#include "configs/error.h"
#include "engine/loading/generation_config.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::string error_of(const std::string& setting, const std::string& model) {
  try {
    load_generation_defaults(setting, model);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("generation_config.json: sampling keys become request defaults; other keys are ignored") {
  test::TempDir dir("gencfg");
  test::write_file(dir.str() + "/generation_config.json",
                   R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": null, "repetition_penalty": 1.05,
                       "max_new_tokens": 100, "eos_token_id": [1, 2]})");
  const GenerationDefaults d = load_generation_defaults("auto", dir.str());
  CHECK(d.source == dir.str() + "/generation_config.json");
  CHECK(d.temperature == 0.6);
  CHECK(d.top_p == 0.95);
  CHECK(d.top_k == 20);
  CHECK(!d.min_p);
  CHECK(d.repetition_penalty == 1.05);
  CHECK(d.describe() == "temperature 0.6, top_p 0.95, top_k 20, repetition_penalty 1.05");
  SamplingParams base;
  base.min_p = 0.1;
  const SamplingParams p = d.apply(base);
  CHECK(p.temperature == 0.6);
  CHECK(p.top_k == 20);
  CHECK(p.min_p == 0.1);  // not in the file: untouched
  CHECK(p.presence_penalty == 0.0);
  // The same file named by directory or by path; none reads nothing.
  CHECK(load_generation_defaults(dir.str(), "/nonexistent").top_k == 20);
  CHECK(load_generation_defaults(dir.str() + "/generation_config.json", "/nonexistent").top_k == 20);
  CHECK(load_generation_defaults("none", dir.str()).empty());
}

TEST_CASE("generation_config: auto without a file, or for a GGUF file, reads nothing; the fixture sets no sampling") {
  test::TempDir dir("gencfg-empty");
  CHECK(load_generation_defaults("auto", dir.str()).empty());
  CHECK(load_generation_defaults("auto", dir.str() + "/model.gguf").empty());
  const GenerationDefaults f = load_generation_defaults("auto", test::fixture_model("tiny-qwen3moe"));
  CHECK(f.empty());  // do_sample false and eos ids only
}

TEST_CASE("generation_config: bad files and settings are errors naming the file, the key and the value") {
  test::TempDir dir("gencfg-bad");
  const std::string f = dir.str() + "/generation_config.json";
  auto with = [&](const std::string& body) {
    test::write_file(f, body);
    return error_of("auto", dir.str());
  };
  CHECK(with(R"({"temperature": "hot"})").find("'temperature' must be a number in [0, 2], got \"hot\"") != std::string::npos);
  CHECK(with(R"({"temperature": 2.5})").find("'temperature'") != std::string::npos);
  CHECK(with(R"({"top_p": 0})").find("'top_p' must be a number in (0, 1], got 0") != std::string::npos);
  CHECK(with(R"({"repetition_penalty": 0})").find("'repetition_penalty'") != std::string::npos);
  CHECK(with(R"({"min_p": -0.1})").find("'min_p'") != std::string::npos);
  CHECK(with(R"({"top_k": 1.5})").find("'top_k' must be an integer >= -1") != std::string::npos);
  CHECK(with(R"({"top_k": -2})").find("'top_k'") != std::string::npos);
  CHECK(with(R"([1, 2])").find("must be a JSON object") != std::string::npos);
  const std::string bad_json = with(R"({"temperature": )");
  CHECK(bad_json.find(f + ": not valid JSON") != std::string::npos);
  CHECK(with(R"({"temperature": 0.7})").empty());  // and a good one loads
  CHECK(error_of(dir.str() + "/missing.json", dir.str()).find("does not exist") != std::string::npos);
}
