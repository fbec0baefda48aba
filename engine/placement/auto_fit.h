// Automatic fit (`--gpu-resident-moe-layers auto`, `hmoe plan`): chooses the
// resident MoE layers, the GPU expert cache's bytes, the KV blocks and the
// streamed-prefill slots for a GPU budget, a target context and a decode
// batch, from bandwidths (GPU memory, host DRAM, PCIe), and keeps every
// option it considered with its predicted decode bound, so that the choice
// is explained in one table.
//
// Model, for r resident MoE layers of M (all MoE layers are the same size;
// the first r in layer order), at decode batch B and context T per sequence:
//  - GPU memory: weights (make_plan's fixed bytes), r layers of experts,
//    workspace, KV for B x T tokens (kv_blocks_for; server_kv: the
//    server's own rule, default_kv_blocks, whose blocks the server then
//    allocates), streaming slots (window + 1 whole
//    layers in the streamed format, plus the step room the runtime keeps,
//    when r < M and streamed prefill is on; when window + 1 whole layers do
//    not fit, slots of chunks of experts in a quarter of what is left,
//    engine/layers/expert_stream_chunks.h), and the expert cache takes what
//    is left (at most the gpu_expert_cache setting's bytes; none when it is 0) (experts of the M - r host layers, one expert at a time);
//  - per decode step, each MoE layer reads u(B) = E (1 - (1 - k/E)^B)
//    distinct experts; a host layer's expert is a cache hit with
//    probability h (uniform routing: cached experts / host experts; with a
//    routing trace: the freq_recency policy's simulated hit rate);
//  - step time = (GPU weight bytes + r u(B) expert bytes + hits' expert
//    bytes + B T KV bytes) / GPU bandwidth + misses' expert bytes / host
//    bandwidth (the hybrid step runs the GPU segments and the CPU experts
//    one after the other: no overlap assumed); tok/s = B / step time.
// Options that keep streamed prefill (its slots fit, or every layer is
// resident) come first when any does (a long prompt on the CPU experts is
// several times slower); among them the highest tok/s wins, and within 0.5%
// the one with more resident layers (a resident expert costs no PCIe
// copies and no cache bookkeeping).
//
// Contract: pure (no device work); Error(out_of_memory) when not even r = 0
// fits (naming the shortfall, as make_plan does).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "engine/layers/routing_trace.h"
#include "engine/loading/model_config.h"
#include "engine/placement/placement.h"

namespace hmoe {

struct FitInputs {
  double gpu_bandwidth = 1.0e12;  // bytes/s of device memory
  double cpu_bandwidth = 50e9;    // host DRAM read bytes/s the CPU experts reach
  double pcie_bandwidth = 25e9;   // pinned host -> device bytes/s
  int64_t context = 0;            // tokens per sequence the KV cache must hold (0: max_model_len, else the model's)
  int64_t batch = 1;              // decode batch (sequences) for the bound and the KV room
  bool stream_slots = true;       // reserve streamed-prefill slots (off: gpu_prefill_min_batch_size 0)
  int window = 1;                 // gpu_prefetch_window
  bool server_kv = false;         // KV blocks as the server allocates them (default_kv_blocks, placement.h) instead of batch x context
  const RoutingTrace* trace = nullptr;  // hit rates from this trace (its layers must be the model's); null: uniform routing
};

struct FitOption {
  int64_t resident = 0;           // MoE layers with their experts on the GPU (the first r)
  bool fits = false;
  std::string why;                // when it does not fit
  uint64_t expert_bytes = 0;      // resident experts
  uint64_t kv_bytes = 0;
  int64_t kv_blocks = 0;
  int64_t stream_slots = 0;       // 0: streamed prefill off for this option
  int64_t stream_chunk = 0;       // experts per slot when the slots hold chunks of a layer (0: whole layers)
  uint64_t slot_bytes = 0;        // slots plus the step room
  uint64_t cache_bytes = 0;       // expert cache
  int64_t cache_experts = 0;
  double hit_rate = 0;
  double gpu_seconds = 0, cpu_seconds = 0;  // per decode step
  double tok_s = 0;
};

struct FitChoice {
  std::vector<FitOption> options;  // r = 0..M
  size_t best = 0;
  int64_t context = 0, batch = 1;
  uint64_t budget = 0, fixed_bytes = 0, workspace_bytes = 0;
  uint64_t expert_gpu_bytes = 0, expert_cpu_bytes = 0;  // one expert
  std::string hit_model;  // "uniform routing" or "trace FILE (freq_recency)"
  const FitOption& chosen() const { return options[best]; }
};

FitChoice auto_fit(const ModelConfig& c, const Settings& s, const GpuTarget& gpu, const FitInputs& in);

// The layer list of the first r MoE layers ("none", "0-9", "all"), for
// gpu_resident_moe_layers.
std::string first_moe_layers(const ModelConfig& c, int64_t r);

// The table `hmoe plan` prints: one row per option considered (all, or
// every few when there are many, always with the best and its neighbours).
std::string fit_table(const FitChoice& f);

}  // namespace hmoe
