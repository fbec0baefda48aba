// The prefill streaming settings and cost model (engine/placement/prefill_cost.h): bad
// values are errors naming the flag or variable and the value; the
// break-even is where the CPU side becomes the slower one. CPU only.
#include <doctest/doctest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "configs/error.h"
#include "engine/placement/prefill_cost.h"

using namespace hmoe;

namespace {
Settings with(std::vector<std::string> args) { return Settings::load(args); }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("gpu prefill settings: values and errors naming the variable and value") {
  CHECK(parse_prefill_min_batch(with({})) == -1);  // auto by default
  CHECK(parse_prefill_min_batch(with({"--gpu-prefill-min-batch-size", "0"})) == 0);
  CHECK(parse_prefill_min_batch(with({"--gpu-prefill-min-batch-size=512"})) == 512);
  CHECK(parse_prefetch_window(with({"--gpu-prefetch-window", "3"})) == 3);
  for (const char* bad : {"-1", "12x", "many", "", "1.5"}) {
    const std::string e = error_of([&] { parse_prefill_min_batch(with({"--gpu-prefill-min-batch-size", bad})); });
    CHECK_MESSAGE(e.find("--gpu-prefill-min-batch-size") != std::string::npos, e);
    CHECK_MESSAGE(e.find(std::string("'") + bad + "'") != std::string::npos, e);
  }
  for (const char* bad : {"0", "9", "-2"}) {
    const std::string e = error_of([&] { parse_prefetch_window(with({"--gpu-prefetch-window", bad})); });
    CHECK_MESSAGE(e.find(std::string("--gpu-prefetch-window=") + bad) != std::string::npos, e);
  }
  ::setenv("HMOE_GPU_PREFILL_MIN_BATCH_SIZE", "lots", 1);
  const std::string e = error_of([&] { parse_prefill_min_batch(with({})); });
  ::unsetenv("HMOE_GPU_PREFILL_MIN_BATCH_SIZE");
  CHECK_MESSAGE(e.find("HMOE_GPU_PREFILL_MIN_BATCH_SIZE") != std::string::npos, e);
  CHECK_MESSAGE(e.find("'lots'") != std::string::npos, e);
  ::setenv("HMOE_GPU_PREFETCH_WINDOW", "12", 1);
  const std::string e2 = error_of([&] { parse_prefetch_window(with({})); });
  ::unsetenv("HMOE_GPU_PREFETCH_WINDOW");
  CHECK_MESSAGE(e2.find("HMOE_GPU_PREFETCH_WINDOW=12") != std::string::npos, e2);
}

TEST_CASE("prefill break-even: the smallest batch where streamed experts beat the CPU") {
  ModelConfig c;
  c.hidden_size = 2048;
  c.moe_intermediate_size = 768;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  PrefillCost m{560e9, 100e9, 50e9, 200e12};
  const int64_t n = prefill_break_even(c, m);
  MESSAGE("Qwen3-30B-A3B shapes, CPU 560 GFLOP/s, PCIe 50 GB/s: break-even " << n << " tokens");
  REQUIRE(n > 1);
  CHECK(streamed_expert_seconds(c, m, n) < cpu_expert_seconds(c, m, n));
  CHECK(streamed_expert_seconds(c, m, n - 1) >= cpu_expert_seconds(c, m, n - 1));
  // Copy-bound estimate: all experts' bytes / PCIe * CPU FLOP/s / FLOP per token.
  const double est = 6.0 * 128 * 2048 * 768 / 50e9 * 560e9 / (6.0 * 2048 * 768 * 8);
  CHECK(std::abs(static_cast<double>(n) - est) < 2.0);
  // A faster link lowers it; a CPU as fast as the GPU never breaks even.
  PrefillCost fast = m;
  fast.pcie_bandwidth = 100e9;
  CHECK(prefill_break_even(c, fast) < n);
  PrefillCost strong = m;
  strong.cpu_expert_flops = 200e12;
  CHECK(prefill_break_even(c, strong) == 0);
}
