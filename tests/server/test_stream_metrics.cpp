// /metrics carries the streamed-expert counters (hmoe_gpu_stream_*) for
// every architecture: the scheduler reads them from the one GPU runtime
// (engine/runtime/gpu_runtime.h), so DeepSeek-V3 reports them as Qwen3-MoE
// does. On a CPU build they are present and zero; with a GPU, a prompt
// longer than --gpu-prefill-min-batch-size with no resident MoE layer
// streams every MoE layer's experts, and the counters move.
#include <doctest/doctest.h>

#include <regex>
#include <string>

#include "gpu/device.h"
#include "tests/server/server_fixture.h"

using namespace hmoe;
using json = nlohmann::json;

namespace {

const char* const kStreamMetrics[] = {
    "hmoe_gpu_stream_passes_total",          "hmoe_gpu_stream_layers",
    "hmoe_gpu_stream_bytes_total",           "hmoe_gpu_stream_copy_seconds_total",
    "hmoe_gpu_stream_compute_seconds_total", "hmoe_gpu_stream_stall_seconds_total",
    "hmoe_gpu_stream_h2d_bytes_per_second",  "hmoe_gpu_stream_copy_hidden_fraction",
};

// The value of an unlabelled metric, or -1 when /metrics lacks it.
double metric(const std::string& body, const std::string& name) {
  std::smatch m;
  const std::string text = "\n" + body;
  if (!std::regex_search(text, m, std::regex("\n" + name + " ([0-9.e+-]+)\n"))) return -1;
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("metrics: DeepSeek-V3 serves the hmoe_gpu_stream_* counters; with a GPU a long prompt moves them") {
  Settings s = test::test_settings();
  const bool gpu = gpu::device_count() > 0;
  if (gpu) {
    s.gpu_resident_moe_layers = "none";   // every MoE layer's experts in host memory...
    s.gpu_prefill_min_batch_size = "8";   // ...streamed to the GPU for passes of >= 8 tokens
  }
  test::RunningServer srv(s, "tiny-deepseekv3");
  const test::HttpReply before = test::http(srv.port, "GET", "/metrics");
  REQUIRE(before.status == 200);
  for (const char* name : kStreamMetrics) CHECK_MESSAGE(metric(before.body, name) >= 0, name << " missing from /metrics");

  const json body = {{"prompt", "The latent attention of DeepSeek keeps one compressed vector per token in its cache"},
                     {"max_tokens", 2},
                     {"temperature", 0}};
  const test::HttpReply r = test::http(srv.port, "POST", "/v1/completions", body.dump());
  REQUIRE_MESSAGE(r.status == 200, r.body);
  const test::HttpReply after = test::http(srv.port, "GET", "/metrics");
  const double passes = metric(after.body, "hmoe_gpu_stream_passes_total"), bytes = metric(after.body, "hmoe_gpu_stream_bytes_total");
  MESSAGE("stream passes " << passes << ", bytes " << bytes << ", layers " << metric(after.body, "hmoe_gpu_stream_layers")
                           << std::string(gpu ? " (GPU)" : " (no GPU: present, not moving)"));
  if (gpu) {
    CHECK(passes >= 1);
    CHECK(bytes > 0);
    CHECK(metric(after.body, "hmoe_gpu_stream_layers") >= 1);
  } else {
    CHECK(passes == 0);
    CHECK(bytes == 0);
  }
}
