// The routed-expert benchmark shared by `hmoe bench experts` and
// bench/bench_experts: a STREAM triad (all threads of all node pools) as the
// machine's memory bandwidth, and one routed-expert layer at real shapes
// (random weights, random top-k routing over the experts held) timed through
// ExpertEngine. Reports weight bytes streamed per second (each active
// expert's bytes once per step), the ratio to the triad, and FLOP/s.
//
// Experts held: a model's full expert set may not fit (DeepSeek-V3: 256 x
// 88 MB in bf16); `experts_held` of them are allocated and routed over,
// enough that the working set far exceeds the caches. Results say so.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "numa/node_pools.h"

namespace hmoe::numa {

struct ExpertShape {
  std::string name;
  int64_t hidden, intermediate, experts, top_k;
};
// "qwen3-30b-a3b" or "deepseek-v3"; throws Error(invalid_argument) otherwise.
ExpertShape expert_shape(const std::string& name);

struct ExpertBenchConfig {
  std::string shape = "qwen3-30b-a3b";
  std::string dtype = "bf16";  // bf16, int8, int4 (group 128, asymmetric)
  int64_t tokens = 1;
  int64_t experts_held = 0;    // 0: all when they fit in 2 GiB, else as many as fit (at least 2*top_k)
  double min_seconds = 1.0;    // timed for at least this long (and at least 2 steps)
  bool bf16_dot = false;
  bool int8_act = true;           // EngineOptions::int8_act (HMOE_CPU_INT8_ACT)
  int64_t onednn_min_tokens = 0;  // EngineOptions::onednn_min_tokens (HMOE_CPU_ONEDNN_MIN_TOKENS)
};

struct ExpertBenchResult {
  ExpertBenchConfig cfg;
  ExpertShape shape;
  int64_t experts_held = 0;
  int threads = 0, nodes = 0;
  std::string isa;
  int64_t steps = 0;
  double seconds_per_step = 0;
  double weight_bytes_per_step = 0;  // mean over the timed steps
  double weight_gbps = 0, stream_gbps = 0, bandwidth_ratio = 0, gflops = 0;
  // The same over CPU time (see cpu_seconds_per_step), against the triad's CPU-time figure.
  double weight_gbps_cpu = 0, stream_gbps_cpu = 0, bandwidth_ratio_cpu = 0;
  // Process CPU time per step divided by the threads: close to
  // seconds_per_step on an idle machine, smaller when others preempt us
  // (spinning waits count as busy).
  double cpu_seconds_per_step = 0;
  std::string note;
  std::string json() const;
};

// STREAM triad a = b + s*c over three arrays of `bytes_per_array`, split over
// every node's workers (each touching its own part first); best of `reps`, in
// GB/s counting 3 * 8 bytes per element as STREAM does.
// cpu_gbps, when given, receives the same bytes over process CPU time per
// thread (best rep): what the triad reaches while it actually runs, on a
// machine shared with other work.
double stream_triad_gbps(NodePools& pools, size_t bytes_per_array, int reps = 5, double* cpu_gbps = nullptr);

ExpertBenchResult run_expert_bench(const ExpertBenchConfig& cfg, NodePools& pools, double stream_gbps, double stream_gbps_cpu = 0);

// oneDNN's own fp32 GEMM (dnnl_sgemm, its OpenMP threads) on an m x k x n
// problem: GFLOP/s, best of reps. The 512-token rows are compared against it.
double dnnl_sgemm_gflops(int64_t m, int64_t n, int64_t k, int reps = 3);

}  // namespace hmoe::numa
