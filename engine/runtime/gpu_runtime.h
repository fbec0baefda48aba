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
//  - decode-sized steps may hand off through mapped host memory instead of
//    copies (set_zero_copy_handoff; engine/runtime/zero_copy_handoff.h):
//    the whole step is one graph enqueued up front, the host and the GPU
//    signal each other through flags;
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
#include <functional>
#include <memory>
#include <vector>

#include "configs/settings.h"
#include "engine/kv/kv_cache.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/gpu_expert_cache.h"
#include "engine/layers/mla_attention.h"
#include "engine/layers/routed_experts.h"
#include "engine/layers/weights.h"
#include "gpu/deltanet.h"
#include "gpu/quant.h"
#include "engine/loading/model_config.h"
#include "engine/models/model_graph.h"
#include "engine/runtime/batch.h"
#include "numa/node_pools.h"

namespace hmoe {

struct RoutingTrace;
class RoutingReplay;


class EngramModules;

// Where decode time goes, summed over steps since the last reset.
struct GpuStepTimes {
  double total_s = 0;        // wall time of forward()
  double cpu_experts_s = 0;  // CPU expert work (wall)
  // The hand-offs: copy hand-off, the host<->device copies (GPU events
  // around them); zero-copy hand-off, the GPU's hand-off kernels plus the
  // flags' crossings (ZeroCopyHandoff::step_seconds).
  double transfer_s = 0;
  int64_t steps = 0;
  int64_t zero_copy_steps = 0;  // of steps, those that handed off through mapped host memory
  uint64_t cold_bytes = 0;   // host experts the CPU ran: distinct experts per layer step x their bytes (the decode bound's DRAM term)
  // GPU work and what is left: launches, event waits and host bookkeeping (copy hand-off), the GPU's spin reads (zero-copy).
  double gpu_s() const { return total_s - cpu_experts_s - transfer_s; }
};

// Device time per part of the steps run with part profiling on
// (GpuRuntime::set_part_profile), summed over those steps: embedding; per
// layer its attention part (input norm to o_proj) and feed-forward part
// (post-attention norm to the expert sums); the tail (last residual add,
// final norm, lm_head). Events between the parts, plain launches.
struct GpuPartTimes {
  double embed_ms = 0, tail_ms = 0;
  std::vector<double> attn_ms, ffn_ms;
  int64_t steps = 0;
};

// Experts of one MoE layer that `tokens` tokens touch, expected when each
// token picks k of e uniformly: e * (1 - (1 - k/e)^tokens); exactly k at one
// token, at most e.
double expected_experts_touched(int64_t e, int64_t k, int64_t tokens);

struct GpuRuntimeOptions {
  std::vector<bool> resident;     // per layer: a MoE layer's routed experts on the GPU
  // Per layer: the GPU that runs it (the placement's; empty: all GPU 0).
  // Checked against the machine before anything is allocated
  // (check_layer_devices, engine/placement/placement.h).
  std::vector<int> devices;
  ExpertHomeOptions experts;
  MlaMode mla_mode = MlaMode::automatic;
  bool split_inputs = true;       // precise layers (FfnDesc::precise, MLA) split their products' inputs
  // Setting gpu_hybrid_precise (Qwen3-Next): zero-centred norms, router and
  // shared-expert gate in fp32, linear/gated-attention projection inputs split.
  bool hybrid_precise = true;
  // Setting gpu_hybrid_precise_act: under hybrid_precise, bf16 experts' activation
  // as hi + lo in decode-sized passes (ExpertHomeOptions::split_act).
  bool hybrid_precise_act = true;
  bool quantized_dense = true;    // GGUF attention / lm_head weights stay in their blocks (setting gpu_quantized_dense)
  bool cuda_graphs = false, cpu_overlap = false, tiled_attention = true;
  bool programmatic_launch = true;  // setting gpu_programmatic_launch (gpu::Stream::set_programmatic_launch)
  bool decode_fusion = false;       // setting gpu_decode_fusion (GpuStepInfo::fused)
  // Setting gpu_gguf_decode_kernel (gpu::set_gguf_decode_kernel, process-wide;
  // applied when the runtime is built).
  gpu::GgufDecodeKernel gguf_decode_kernel = gpu::GgufDecodeKernel::direct;
  // Setting gpu_gguf_prefill_kernel (gpu::set_gguf_prefill_kernel, process-wide;
  // applied when the runtime is built).
  gpu::GgufPrefillKernel gguf_prefill_kernel = gpu::GgufPrefillKernel::pipelined;
  // Setting gpu_deltanet_kernel (gpu::set_deltanet_kernel, process-wide; applied when the runtime is built).
  gpu::DeltaNetKernel deltanet_kernel = gpu::DeltaNetKernel::v1;
  // Setting gpu_attention_tiles_kernel (gpu::set_attention_tiles_kernel, process-wide; applied when the runtime is built).
  int attention_tiles_kernel = 3;
  int64_t overlap_second_rows = 0;  // rows of the second micro-batch; 0: half
  // Settings gpu_handoff (zero-copy: true) and gpu_handoff_timeout (seconds).
  bool zero_copy_handoff = false;
  double handoff_timeout_s = 10;
  // Setting defer_experts: hand-off layers followed by another hand-off layer
  // defer their N lowest-weight experts per token to a worker thread that
  // runs while the GPU runs the next layer (engine/layers/expert_deferral.h;
  // one-micro-batch steps only); 0: off.
  int64_t defer_experts = 0;
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
  // The hand-off of decode-sized steps (setting gpu_handoff): through
  // mapped host memory (true) or copies (false); the host's time-out in
  // seconds for a zero-copy hand-off.
  void set_zero_copy_handoff(bool on, double timeout_s = 10);
  // Tests: called on the host before each hand-off's CPU experts with the
  // layer. It may throw (a failing CPU expert step: forward() rethrows after
  // the GPU is released); returning false withholds the layer's release in a
  // zero-copy step (the GPU then waits, and the host's wait for the next
  // hand-off times out). Null: none.
  void set_handoff_test_hook(std::function<bool(int64_t layer)> hook);
  size_t graph_captures() const;  // CUDA graphs captured so far
  // The CUDA graphs the last graph-replayed step ran (its segments and
  // micro-batches; 0 when none) and their kernel nodes' names: what one
  // decode step launches (benchmarks).
  size_t last_step_graphs() const;
  std::vector<std::string> last_step_kernels() const;
  // Bytes of GPU weights a decode step of `tokens` sequences reads: every
  // dense weight once (embedding: the tokens' rows), and per resident MoE
  // layer the experts the step touches, expected under uniform routing
  // (E * (1 - (1 - K/E)^tokens); exactly K at one token).
  double decode_weight_bytes(int64_t tokens) const;
  // Part profiling (benchmarks): while on, steps without hand-offs, Engram
  // modules or streamed experts launch plainly (no graphs) with an event
  // between every two parts and add their times to part_times(); turning it
  // on clears them.
  void set_part_profile(bool on);
  const GpuPartTimes& part_times() const;
  // min_batch 0 turns streaming off; off (with a notice) when the slots do not fit.
  void enable_expert_streaming(const ExpertStreamOptions& o);
  const ExpertStream* expert_stream() const;  // null when off
  // Budget 0 turns split decode and the expert cache off (then every routed
  // expert of a host layer runs on the CPU); rebuilt empty otherwise.
  void enable_expert_cache(const GpuExpertCacheOptions& o);
  // Benchmarks: the host layers' routed ids from this trace instead of the
  // router (RoutingReplay, engine/layers/routing_trace.h; null: off).
  // Error(invalid_argument) when its layers, experts or top-k are not the model's.
  void set_routing_replay(const RoutingTrace* t);
  // What the copy residence of the host experts took (ExpertHomeOptions::residence; zeros otherwise).
  const HostResidenceStats& host_residence_stats() const;
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
  // Bytes of KvCache seq_state per sequence the runtime keeps on the host
  // (linear-attention layers: the tokens consumed; their states are on the GPU); 0: none.
  int64_t seq_state_bytes() const;
  const std::vector<int>& layer_devices() const { return devices_; }  // the GPU of each layer

 private:
  std::vector<int> devices_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe
