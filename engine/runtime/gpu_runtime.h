// GpuRuntime: the one GPU step executor, for every architecture. It
// instantiates a ModelGraph (engine/models/) with the CUDA implementations
// of its layer kinds on the placement given (which MoE layers keep their
// routed experts on the GPU; the others stay in host memory, run by the
// NUMA expert engine) and runs steps:
//  - embedding, blocks, final norm and lm_head on the GPU, over the paged
//    KV cache's GPU storage (the KvCache lends its block tables);
//  - GPU segments between host hand-offs: a block whose routed experts are
//    in host memory ends its segment with its router; the normed hidden
//    states and the routing go down, the CPU experts run, the sums come back
//    (a shared expert runs on the GPU meanwhile); Engram modules cut
//    segments too (the host waits for their table rows);
//  - decode-sized steps (<= 64 tokens) replay each segment as a CUDA graph
//    while the shape and buffers hold (set_cuda_graphs);
//  - decode steps of >= 2 sequences with hand-offs may run as two
//    micro-batches so that one's CPU experts overlap the other's GPU work
//    (set_cpu_overlap);
//  - passes of >= the prefill minimum stream the host experts to the GPU
//    instead (enable_expert_streaming, engine/layers/expert_stream.h);
//  - prefill steps attend in query tiles on tensor cores (set_tiled_attention);
//  - decode-sized hand-offs split their routed experts between the CPU and
//    the GPU: cached experts and a balanced share of the others, copied
//    over PCIe, run on the GPU while the CPU computes the rest
//    (enable_expert_cache, engine/layers/gpu_expert_cache.h).
//
// Contract: the constructor uploads every GPU weight (releasing the host
// pages of what it uploaded) and keeps views of the host experts (the
// checkpoint must outlive the runtime). forward() has the meaning of
// Model::forward; one call at a time. In a build without CUDA the
// constructor throws Error(unsupported).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "configs/settings.h"
#include "engine/kv/kv_cache.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/gpu_expert_cache.h"
#include "engine/layers/mla_attention.h"
#include "engine/layers/routed_experts.h"
#include "engine/layers/weights.h"
#include "engine/loading/model_config.h"
#include "engine/models/model_graph.h"
#include "engine/runtime/batch.h"
#include "numa/node_pools.h"

namespace hmoe {

class EngramModules;

// Where decode time goes, summed over steps since the last reset.
struct GpuStepTimes {
  double total_s = 0;        // wall time of forward()
  double cpu_experts_s = 0;  // CPU expert work (wall)
  double transfer_s = 0;     // host<->device copies of the hand-offs (GPU events)
  int64_t steps = 0;
  double gpu_s() const { return total_s - cpu_experts_s - transfer_s; }  // GPU work and launch overhead
};

struct GpuRuntimeOptions {
  std::vector<bool> resident;     // per layer: a MoE layer's routed experts on the GPU
  // Per layer: the GPU that runs it (the placement's; empty: all GPU 0).
  // Checked against the machine before anything is allocated
  // (check_layer_devices, engine/placement/placement.h).
  std::vector<int> devices;
  ExpertHomeOptions experts;
  MlaMode mla_mode = MlaMode::automatic;
  bool split_inputs = true;       // precise layers (FfnDesc::precise, MLA) split their products' inputs
  bool quantized_dense = true;    // GGUF attention / lm_head weights stay in their blocks (setting gpu_quantized_dense)
  bool cuda_graphs = false, cpu_overlap = false, tiled_attention = true;
  int64_t overlap_second_rows = 0;  // rows of the second micro-batch; 0: half
  // Split decode and the GPU expert cache of the host layers (settings
  // gpu_expert_cache, gpu_split_decode; engine/layers/gpu_expert_cache.h).
  GpuExpertCacheOptions expert_cache;
  // Everything from the settings but `resident` and `devices` (the placement's).
  static GpuRuntimeOptions from_settings(const Settings& s);
};

class GpuRuntime {
 public:
  GpuRuntime(const ModelConfig& c, const ModelGraph& g, WeightBinder& bind, numa::NodePools& pools, const GpuRuntimeOptions& o,
             EngramModules* engram = nullptr);
  // A model of c.arch from a lookup (synthetic benchmark models).
  static std::unique_ptr<GpuRuntime> from_lookup(const ModelConfig& c, const WeightLookup& get, numa::NodePools& pools, const GpuRuntimeOptions& o,
                                                 EngramModules* engram = nullptr);
  ~GpuRuntime();
  GpuRuntime(const GpuRuntime&) = delete;
  GpuRuntime& operator=(const GpuRuntime&) = delete;

  void forward(const Batch& b, KvCache& kv, std::vector<float>& logits);

  void set_cuda_graphs(bool on);
  void set_cpu_overlap(bool on, int64_t second_rows = 0);
  void set_tiled_attention(bool on);
  size_t graph_captures() const;  // CUDA graphs captured so far
  // min_batch 0 turns streaming off; off (with a notice) when the slots do not fit.
  void enable_expert_streaming(const ExpertStreamOptions& o);
  const ExpertStream* expert_stream() const;  // null when off
  // Budget 0 turns split decode and the expert cache off (then every routed
  // expert of a host layer runs on the CPU); rebuilt empty otherwise.
  void enable_expert_cache(const GpuExpertCacheOptions& o);
  const GpuExpertCache* expert_cache() const;  // null when off
  GpuExpertCache* expert_cache();
  // Expert 0 of the first MoE layer whose experts stay in host memory (null: none):
  // what expert_stream_options measures the CPU experts on.
  const numa::ExpertWeights* host_expert_sample() const;
  ExpertStream* expert_stream();
  const GpuStepTimes& times() const;
  void reset_times();
  uint64_t weight_bytes() const;        // bytes of weights on the GPU
  uint64_t kv_bytes_per_token() const;  // KV cache bytes per token over all layers (bf16)
  const std::vector<int>& layer_devices() const { return devices_; }  // the GPU of each layer

 private:
  std::vector<int> devices_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe
