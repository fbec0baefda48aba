// /metrics renders the split decode / GPU expert cache counters
// (hmoe_gpu_expert_cache_*, engine/layers/gpu_expert_cache.h) from the
// scheduler's totals: present and zero when the cache is off, the values
// given otherwise. (That the counters move on a GPU is
// tests/gpu/test_gpu_expert_cache.cpp's: the scheduler copies the cache's
// stats verbatim after each step.)
#include <doctest/doctest.h>

#include <regex>
#include <string>

#include "engine/serving/scheduler.h"
#include "server/metrics.h"

using namespace hmoe;

namespace {
double metric(const std::string& body, const std::string& name) {
  std::smatch m;
  const std::string text = "\n" + body;
  if (!std::regex_search(text, m, std::regex("\n" + name + " ([0-9.e+-]+)\n"))) return -1;
  return std::stod(m[1]);
}
}  // namespace

TEST_CASE("metrics: hmoe_gpu_expert_cache_* are present when off and carry the scheduler's totals when on") {
  server::Metrics metrics;
  SchedulerStats s;
  const std::string off = metrics.render(s, 0);
  CHECK(metric(off, "hmoe_gpu_expert_cache_enabled") == 0);
  for (const char* name : {"hmoe_gpu_expert_cache_hits_total", "hmoe_gpu_expert_cache_misses_total", "hmoe_gpu_expert_cache_evictions_total",
                           "hmoe_gpu_expert_cache_bytes_moved_total", "hmoe_gpu_expert_cache_copy_seconds_total"})
    CHECK_MESSAGE(metric(off, name) == 0, name);
  s.expert_cache = ExpertCacheTotals{true, 30, 12, 7, 4, 123456789, 50, 46, 24, 20, 99999, 0.25};
  const std::string on = metrics.render(s, 0);
  CHECK(metric(on, "hmoe_gpu_expert_cache_enabled") == 1);
  CHECK(metric(on, "hmoe_gpu_expert_cache_hits_total") == 30);
  CHECK(metric(on, "hmoe_gpu_expert_cache_misses_total") == 12);
  CHECK(metric(on, "hmoe_gpu_expert_cache_admissions_total") == 7);
  CHECK(metric(on, "hmoe_gpu_expert_cache_evictions_total") == 4);
  CHECK(metric(on, "hmoe_gpu_expert_cache_bytes_moved_total") == 123456789);
  CHECK(metric(on, "hmoe_gpu_expert_cache_gpu_pairs_total") == 50);
  CHECK(metric(on, "hmoe_gpu_expert_cache_cpu_pairs_total") == 46);
  CHECK(metric(on, "hmoe_gpu_expert_cache_slots") == 24);
  CHECK(metric(on, "hmoe_gpu_expert_cache_slots_used") == 20);
  CHECK(metric(on, "hmoe_gpu_expert_cache_copy_seconds_total") == doctest::Approx(0.25));
  CHECK(on.find("# TYPE hmoe_gpu_expert_cache_hits_total counter") != std::string::npos);
}
