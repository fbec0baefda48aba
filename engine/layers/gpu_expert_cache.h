// GpuExpertCache: split decode and the GPU expert cache for the MoE layers
// whose routed experts live in host memory (issues 26 "Hybrid" and 27).
//
// In a decode-sized step (<= 64 tokens) a host layer hands its routing to
// the host anyway (engine/runtime/gpu_runtime.h). There, instead of running
// every routed (token, expert) pair on the CPU, split():
//  1. looks up the step's routed experts in a pool of device slots (one
//     expert each: gate/up and down matrices as the file's GGUF blocks);
//     cached experts run on the GPU and cost no copy;
//  2. of the experts not cached, copies as many as balance the CPU's
//     share (split_stream_count, expert_cache_policy.h: host read and
//     pinned PCIe bandwidths, probed at load and then followed as decode
//     measures them: the CPU share's wall time per byte of its experts
//     (observe_cpu) and the copies' GPU-event time per byte, each a moving
//     average) from pinned host memory (the node memory of the copy
//     residence, engine/layers/host_residence.h, read piece by piece; or the
//     file map pinned in place, residence map) into free or least
//     recently used slots, as one batched copy on a copy stream;
//  3. enqueues the GPU share (gpu::gguf_moe_experts on the slot pool, ids =
//     slots) on the step stream once the copies arrived; its output goes to
//     a scratch row block that add_gpu_share() adds onto the CPU's sums.
// The caller then runs the pairs left to the CPU (cpu_ids / cpu_weights)
// while the copies and the GPU share run, copies the CPU sums into the
// step's d rows and calls add_gpu_share(). No host synchronisation beyond
// the routing the host already waits for.
//
// Which layers: those whose every expert matrix is a GGUF type the native
// kernels take (Q4_K/Q5_K/Q6_K/Q8_0 and the low-bit Q2_K/Q3_K/IQ1-IQ4/MXFP4,
// gpu::gguf_native_supported; slots sized from each type's row bytes); layers of
// other formats (and shapes those kernels do not take) stay on the CPU.
// Slots are pooled per (gate/up type, down type), the budget shared by the
// classes in proportion to their host bytes.
//
// Which misses are copied (and so cached) is the policy's choice
// (ExpertCacheSet::split, setting gpu_expert_cache_policy: freq_recency by
// default, lru, lfu); with freq_recency a miss whose use count does not beat
// the victim's stays on the CPU even when the split would copy it.
//
// Budget (setting gpu_expert_cache, bytes of VRAM for cached/streamed
// experts of host layers): "auto" is a modest size that keeps the placement
// honest (the experts live on the host): an eighth of the host layers'
// expert bytes, at least four top-k sets of slots per class and at most a
// quarter of the device's free memory; 0 turns split decode and the cache
// off (every routed expert of a host layer on the CPU).
//
// Contract: the host experts must outlive the cache; one step at a time on
// the step stream given at construction; split() returns with the GPU
// share enqueued; add_gpu_share() enqueues on the step stream.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/layers/expert_cache_policy.h"
#include "engine/loading/model_config.h"
#include "gpu/kernels.h"
#include "gpu/memory.h"
#include "numa/expert_engine.h"

namespace hmoe {

struct GpuExpertCacheOptions {
  int64_t budget_bytes = -1;  // -1: auto (see above); 0: off
  CachePolicy policy = CachePolicy::freq_recency;  // setting gpu_expert_cache_policy
  SplitCost cost;             // bandwidths (measured by make_gpu_expert_cache when 0) and the share override
  int64_t max_tokens = 64;    // decode-sized steps only
  bool quiet = false;
  // Register the host experts their owner did not register in place
  // (residence map; copy's node memory registers itself at load); false
  // (residence off): read them as pageable memory.
  bool pin_in_place = false;
};

// Parses gpu_expert_cache ("auto", "0", bytes with optional KiB/MiB/GiB/KB/MB/GB)
// and gpu_split_decode ("auto", "0" or a fraction in (0, 1]); Error naming
// the flag on a bad value. Split "0" keeps the cache (cached experts still
// run on the GPU) but never copies a missed expert.
int64_t parse_gpu_expert_cache(const std::string& v);
double parse_gpu_split_decode(const std::string& v);

struct GpuExpertCacheStats {
  ExpertCacheCounters c;
  int64_t slots = 0, slots_used = 0;
  uint64_t device_bytes = 0;
  int64_t layers = 0;          // host layers the cache serves
  int64_t steps = 0;           // layer steps split
  double copy_s = 0;           // copy-stream time of the batched copies (GPU events)
  double pcie_bandwidth = 0, host_bandwidth = 0;  // used by the split now (probes at load, then the moving averages)
  double achieved_bandwidth() const { return copy_s > 0 ? static_cast<double>(c.bytes) / copy_s : 0; }
  double gpu_share() const {
    const int64_t p = c.gpu_pairs + c.cpu_pairs;
    return p > 0 ? static_cast<double>(c.gpu_pairs) / static_cast<double>(p) : 0;
  }
};

class GpuExpertCache {
 public:
  struct Layer {
    int64_t layer;
    const std::vector<numa::ExpertWeights>* experts;
    const std::vector<std::vector<numa::ExpertWeights>>* pieces = nullptr;  // StreamLayerSource::pieces (copy residence)
    bool registered = false;                                                // StreamLayerSource::registered
  };
  GpuExpertCache(const ModelConfig& c, std::vector<Layer> layers, const GpuExpertCacheOptions& o, gpu::Stream& step);
  ~GpuExpertCache();
  GpuExpertCache(const GpuExpertCache&) = delete;
  GpuExpertCache& operator=(const GpuExpertCache&) = delete;

  bool covers(int64_t layer) const;  // a host layer the cache serves
  int64_t max_tokens() const;
  // Layer `layer`'s routing for n rows (host copies ids/w [n, k]): enqueues
  // the copies and the GPU share (x: the rows' normed input, bf16 on the
  // device). Returns the GPU pairs; the CPU's pairs are then in
  // cpu_ids()/cpu_weights() as [n, cpu_k()] (weight 0 pads; cpu_k() 0: none).
  int64_t split(int64_t layer, const gpu::bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* w);
  const int32_t* cpu_ids() const;
  const float* cpu_weights() const;
  int64_t cpu_k() const;
  // The host's wall time for the CPU pairs of the last split(): folds
  // bytes / seconds into the host bandwidth the split uses (auto split).
  void observe_cpu(double seconds);
  // d[0..n) += the GPU share of the last split() (nothing when it had none).
  void add_gpu_share(float* d, gpu::Stream& s);
  // Before a step's first split(), with the step stream idle (a step that
  // threw leaves nothing behind); after it, once the step stream was
  // synchronized, end_step() folds the copy times into stats.
  void begin_step();
  void end_step();
  const GpuExpertCacheStats& stats() const;
  void reset_stats();
  std::string describe() const;  // one line: layers, slots, bytes, split rule

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The cache for a step's host layers, or null when the budget is 0, no
// host layer has native GGUF experts, or the minimum slots do not fit (a
// notice on stderr unless quiet).
std::unique_ptr<GpuExpertCache> make_gpu_expert_cache(const ModelConfig& c, std::vector<GpuExpertCache::Layer> layers, GpuExpertCacheOptions o,
                                                      gpu::Stream& step, numa::ThreadPool* pool);

// Lines for `hmoe plan`: the budget, the slots it buys per class, the
// split share of a layer's misses over PCIe from the bandwidths given, and
// the expected decode read time of the host layers per token (CPU alone vs
// split), for `host_layers` layers of `expert_bytes` bytes per expert.
std::string expert_cache_plan_report(const ModelConfig& c, const std::string& cache_setting, const std::string& split_setting,
                                     const std::string& policy_setting, double host_bandwidth,
                                     double pcie_bandwidth, int64_t host_layers, uint64_t expert_bytes);

}  // namespace hmoe
