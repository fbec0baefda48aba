// When a forward pass should stream non-resident experts to the GPU instead
// of running them on the CPU: a per-MoE-layer cost model and the two
// settings that control the streaming (HMOE_GPU_PREFILL_MIN_BATCH_SIZE,
// HMOE_GPU_PREFETCH_WINDOW).
//
// Model, per non-resident MoE layer and n tokens (F = 6*H*I FLOP per token and
// routed expert, k experts per token; W = 3*E*H*I weights; B_cpu = W times
// the bytes per weight the CPU reads (as stored: 2 for bf16, about 0.6 for
// GGUF Q4_K), B_pcie = W times the bytes per weight that cross PCIe (the
// GPU format of quantized experts, else bf16)):
//   CPU:      max(covered(n) * B_cpu / cpu_bandwidth, n*k*F / cpu_expert_flops)
//   streamed: max(B_pcie / pcie_bandwidth,            n*k*F / gpu_expert_flops) + o
// covered(n) = 1 - (1 - k/E)^n is the expected fraction of experts a batch
// routes to (uniform routing); o is a fixed per-layer cost of the streamed
// path (launches, the host sync of the group sizes; assumed, see below); the streamed path copies all E experts (the
// window fills before the router is known). The copy and the GPU work
// overlap (the scheduler's point), hence max, not a sum. The break-even is
// the smallest n where streamed < CPU.
//
// Contract: pure functions except measure_cpu_expert_flops (CPU work only).
// Parsers throw Error(invalid_argument) naming the flag or variable and the value.
#pragma once
#include <cstdint>

#include "configs/settings.h"
#include "engine/loading/model_config.h"
#include "numa/expert_engine.h"
#include "numa/node_pools.h"
#include "numa/thread_pool.h"

namespace hmoe {

struct PrefillCost {
  double cpu_expert_flops = 0;  // FLOP/s of the CPU experts at prefill sizes (measured)
  double cpu_bandwidth = 0;     // host memory read bytes/s
  double pcie_bandwidth = 0;    // pinned host -> device bytes/s
  double gpu_expert_flops = 0;  // FLOP/s of the GPU expert products
  double cpu_bytes_per_weight = 2.0;     // expert bytes per weight the CPU reads (as stored)
  double stream_bytes_per_weight = 2.0;  // expert bytes per weight a streamed layer copies
};

// Bytes per weight of c's routed experts as stored (c.expert_bytes_per_weight
// when the loader set it, else 2) and as streamed (the GPU format's,
// c.gpu_expert_bytes_per_weight, when `quantized`, else bf16's 2).
double expert_cpu_bytes_per_weight(const ModelConfig& c);
double expert_stream_bytes_per_weight(const ModelConfig& c, bool quantized);
// Bytes one streamed layer copies over PCIe (all E experts).
double stream_layer_bytes(const ModelConfig& c, const PrefillCost& m);

double cpu_expert_seconds(const ModelConfig& c, const PrefillCost& m, int64_t n);
double streamed_expert_seconds(const ModelConfig& c, const PrefillCost& m, int64_t n);
// Smallest n in [1, 2^20] where the streamed layer is faster; 0 when none is.
int64_t prefill_break_even(const ModelConfig& c, const PrefillCost& m);

// GPU expert FLOP/s the model assumes (per-expert cuBLAS bf16 products on an
// H100/H200-class card, well below the dense peak); it only matters once a
// layer's products outlast its copy, far above any break-even.
constexpr double kAssumedGpuExpertFlops = 200e12;
// Fixed cost per streamed layer (kernel and cuBLAS launches, one host sync):
// assumed; it keeps tiny models, whose copies take microseconds, on the CPU
// for short passes.
constexpr double kStreamLayerOverheadSeconds = 100e-6;

// "auto" never resolves below this many tokens: shorter passes are decode
// and chunk steps, which the hand-off path (CUDA graphs, CPU/GPU overlap) serves.
constexpr int64_t kAutoMinBatchFloor = 128;

// Host memory read bytes/s: `pool` (null: one thread) summing 512 MiB it wrote itself, best of 3 after a warm-up.
double measure_host_read_bandwidth(numa::ThreadPool* pool);

// FLOP/s of numa::mlp_forward over one random bf16 expert of c's shape for
// `tokens` tokens on `pool` (null: the calling thread), best of 3.
double measure_cpu_expert_flops(const ModelConfig& c, numa::ThreadPool* pool, int64_t tokens = 256);
// FLOP/s of the expert engine (the kernels prefill really uses: GGUF 8-bit,
// int8/int4 groups, bf16) on one expert of the model, `sample`, with
// `tokens` tokens all routed to it, on `pools`, best of 3.
double measure_cpu_expert_flops(const numa::ExpertWeights& sample, numa::NodePools& pools, const numa::EngineOptions& eo, int64_t tokens = 256);

// gpu_prefill_min_batch_size: -1 for "auto", else a count >= 0 (0: never).
int64_t parse_prefill_min_batch(const Settings& s);
// gpu_prefetch_window: 1..8.
int parse_prefetch_window(const Settings& s);

}  // namespace hmoe
