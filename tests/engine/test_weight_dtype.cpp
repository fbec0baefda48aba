// --dtype / HMOE_DTYPE (setting weight_dtype): plain float weights are held
// in host memory in the dtype asked for, converted as they are bound
// (engine/layers/weights.h). bf16 -> f32 is exact, so the fp32 CPU path
// gives the same next tokens with twice the host bytes; bad values are
// errors naming the flag.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "tests/model_run.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::unique_ptr<Model> load_with(const std::string& dir, const std::string& dtype) {
  std::vector<std::string> args = {"--progress", "none", "--dtype", dtype};
  Settings s = Settings::load(args);
  return Model::load(dir, s);
}

}  // namespace

TEST_CASE("--dtype f32 holds the bf16 fixture's weights as f32: same logits, twice the host bytes; --dtype bf16 changes nothing there") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  const std::vector<int32_t> ids = {151644, 872, 198, 9707, 11, 1246, 525, 498, 30};
  auto as_stored = load_with(dir, "auto");
  auto f32 = load_with(dir, "f32");
  auto bf16 = load_with(dir, "bf16");
  const std::vector<float> a = test::prompt_logits(*as_stored, ids), b = test::prompt_logits(*f32, ids), c = test::prompt_logits(*bf16, ids);
  REQUIRE(a.size() == b.size());
  MESSAGE("host weight bytes: auto " << as_stored->host_weight_bytes() << ", f32 " << f32->host_weight_bytes() << ", bf16 "
                                     << bf16->host_weight_bytes() << "; rel. logit error f32 vs auto " << test::rel_error(b, a));
  CHECK(test::rel_error(b, a) < 1e-5);
  CHECK(a == c);
  CHECK(f32->host_weight_bytes() == 2 * as_stored->host_weight_bytes());
  CHECK(bf16->host_weight_bytes() == as_stored->host_weight_bytes());
  const int64_t V = as_stored->config().vocab_size;
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto ra = a.begin() + static_cast<int64_t>(t) * V, rb = b.begin() + static_cast<int64_t>(t) * V;
    CHECK(std::max_element(ra, ra + V) - ra == std::max_element(rb, rb + V) - rb);
  }
}

TEST_CASE("--dtype with a value that is no weight dtype is an error naming the flag") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE(std::filesystem::exists(dir + "/config.json"));
  try {
    load_with(dir, "int8");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(std::string(e.what()).find("--dtype") != std::string::npos);
    CHECK(std::string(e.what()).find("int8") != std::string::npos);
  }
}
