// The host-side pieces of `hmoe bench --decode-breakdown` (GPU-free): the
// kernel names of the graph table and the expected experts a decode step
// touches, which the weight bytes per step are computed from.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/runtime/gpu_runtime.h"
#include "engine/runtime/segment_graphs.h"

using namespace hmoe;

TEST_CASE("kernel_short_name drops return type, parameters and qualifiers, keeps template arguments") {
  CHECK(kernel_short_name("void hmoe::gpu::(anonymous namespace)::gg_kernel<hmoe::gpu::detail::gguf::Q4K, 1, 0>(hmoe::gpu::(anonymous namespace)::Params)") ==
        "gg_kernel<Q4K, 1, 0>");
  CHECK(kernel_short_name("void hmoe::gpu::(anonymous namespace)::router_kernel<true>((anonymous namespace)::RouterArgs)") == "router_kernel<true>");
  CHECK(kernel_short_name("hmoe::gpu::(anonymous namespace)::add_kernel(float const*, float const*, long, float*)") == "add_kernel");
  CHECK(kernel_short_name("void gemv2T_kernel_val<int, int, float, 128, 16, 4, 4, false, true>(cublasGemvParamsEx<int, float const*>, float, float)") ==
        "gemv2T_kernel_val<int, int, float, 128, 16, 4, 4, false, true>");
  CHECK(kernel_short_name("?") == "?");
  CHECK(kernel_short_name("") == "");
}

TEST_CASE("expected_experts_touched: k at one token, e(1 - (1 - k/e)^t) after, never above e") {
  CHECK(expected_experts_touched(128, 8, 1) == 8);
  CHECK(expected_experts_touched(128, 8, 8) == doctest::Approx(128.0 * (1.0 - std::pow(120.0 / 128.0, 8.0))));
  CHECK(expected_experts_touched(128, 8, 8) == doctest::Approx(51.6).epsilon(0.01));
  CHECK(expected_experts_touched(16, 4, 1000) == doctest::Approx(16.0));
  CHECK(expected_experts_touched(8, 16, 3) == 8);  // k > e: every expert
  CHECK(expected_experts_touched(128, 8, 0) == 0);
  CHECK(expected_experts_touched(0, 8, 4) == 0);
}
