// bench_experts: the full routed-expert sweep of issue 5 in one binary —
// Qwen3-30B-A3B and DeepSeek-V3 expert shapes, bf16 / int8 / int4, at 1, 4,
// 16, 64 and 512 tokens, for every thread count 1..N — against a STREAM triad
// over all threads measured in the same run, and oneDNN's sgemm peak for the
// 512-token rows. Prints a markdown table (numa/expert_bench.h has the
// definitions). `hmoe bench experts` runs single points and a shorter sweep.
//
// Usage: bench_experts [--threads-max N] [--seconds S] [--shapes a,b] [--dtypes a,b] [--tokens 1,4,..]
// Environment: HMOE_TOPOLOGY / HMOE_THREAD_BINDING / HMOE_POWER_SAVING apply.
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "configs/error.h"
#include "configs/settings.h"
#include "numa/expert_bench.h"
#include "numa/kernels.h"

using namespace hmoe;

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> args(argv + 1, argv + argc);
  Settings s = Settings::load(args);
  int threads_max = 0;
  double secs = 0.5;
  std::string shapes = "qwen3-30b-a3b,deepseek-v3", dtypes = "bf16,int8,int4", tokens = "1,4,16,64,512";
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--threads-max") threads_max = static_cast<int>(parse_int(args[i], args[i + 1]));
    else if (args[i] == "--seconds") secs = parse_float(args[i], args[i + 1]);
    else if (args[i] == "--shapes") shapes = args[i + 1];
    else if (args[i] == "--dtypes") dtypes = args[i + 1];
    else if (args[i] == "--tokens") tokens = args[i + 1];
    else fail(ErrorKind::invalid_argument, "bench_experts: unknown argument '" + args[i] + "'");
  }
  numa::PoolOptions po = numa::PoolOptions::from_settings(s);
  numa::NodePools all(po);
  if (threads_max <= 0) threads_max = all.threads();
  double stream_cpu = 0;
  const double stream = numa::stream_triad_gbps(all, 256u << 20, 5, &stream_cpu);
  const double peak = numa::dnnl_sgemm_gflops(2048, 2048, 2048);
  std::printf("# bench_experts: %s; isa %s%s; STREAM triad (%d threads) %.1f GB/s (%.1f over CPU time); oneDNN sgemm 2048^3 %.1f GFLOP/s\n\n",
              all.topology().describe().c_str(), cpu::isa_name(cpu::best_isa()), cpu::has_bf16_dot() ? " +avx512_bf16" : "", all.threads(),
              stream, stream_cpu, peak);
  std::printf("| shape | dtype | tokens | threads | ms/step | weight GB/s | / STREAM | GB/s (CPU time) | / STREAM (CPU time) | GFLOP/s | / oneDNN peak | experts held |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int t = 1; t <= threads_max; ++t) {
    numa::PoolOptions pt = po;
    pt.threads = t;
    pt.quiet = true;
    numa::NodePools pools(pt);
    for (const auto& sh : split_list(shapes))
      for (const auto& dt : split_list(dtypes))
        for (const auto& tk : split_list(tokens)) {
          numa::ExpertBenchConfig cfg;
          cfg.shape = sh;
          cfg.dtype = dt;
          cfg.tokens = parse_int("--tokens", tk);
          cfg.min_seconds = secs;
          cfg.bf16_dot = s.cpu_bf16_dot;
          cfg.int8_act = s.cpu_int8_act;
          cfg.onednn_min_tokens = s.cpu_onednn_min_tokens;
          const auto r = numa::run_expert_bench(cfg, pools, stream, stream_cpu);
          std::printf("| %s | %s | %lld | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %lld of %lld |\n", sh.c_str(), dt.c_str(),
                      static_cast<long long>(cfg.tokens), r.threads, r.seconds_per_step * 1e3, r.weight_gbps, r.bandwidth_ratio, r.weight_gbps_cpu,
                      r.bandwidth_ratio_cpu, r.gflops,
                      peak > 0 ? r.gflops / peak : 0.0, static_cast<long long>(r.experts_held), static_cast<long long>(r.shape.experts));
          std::fflush(stdout);
        }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_experts: %s\n", e.what());
  return 1;
}
