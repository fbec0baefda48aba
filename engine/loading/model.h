// Model: a checkpoint loaded on its placement plan. load() reads config.json
// (or a GGUF file), takes the architecture's graph (engine/models/), asks
// the placement plan where each part lives (engine/placement/placement.h) and
// instantiates the graph once, on the runtime the plan names: the GPU step
// executor (engine/runtime/gpu_runtime.h; routed experts of non-resident
// layers in host memory) or the CPU one (engine/runtime/cpu_runtime.h). Only
// what the plan places on the CPU is built there: an all-GPU run keeps no
// host copy of its weights.
//
// Contract: load() validates the checkpoint fully (every tensor present with
// the right shape and a supported dtype, nothing unexpected) before any
// compute. forward() runs one step for a flat batch of tokens from any
// number of sequences (prefill chunks and decode tokens mixed); it throws
// Error(invalid_argument) for token ids outside the vocabulary and leaves
// the cache unchanged in that case. One forward() at a time per Model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "engine/kv/kv_cache.h"
#include "engine/loading/model_config.h"
#include "engine/runtime/batch.h"
#include "io/safetensors.h"
#include "numa/node_pools.h"

namespace hmoe {

class WeightSource;   // engine/layers/weights.h
class WeightBinder;
class GpuRuntime;     // engine/runtime/gpu_runtime.h
class CpuRuntime;     // engine/runtime/cpu_runtime.h
class EngramModules;  // engine/layers/engram.h
class RoutingTraceWriter;  // engine/layers/routing_trace.h

// What Model::load measured; the load summary line on stderr prints it.
struct LoadReport {
  double seconds = 0;
  uint64_t rss_before = 0, rss_after = 0;  // host resident set (VmRSS) when load() began and ended
  uint64_t peak_rss_before = 0, peak_rss_after = 0;  // host peak resident set (VmHWM) then
  uint64_t gpu_weight_bytes = 0;           // weights uploaded to the GPU
  uint64_t host_weight_bytes = 0;          // weights the host keeps (views or --dtype copies)
  std::string weight_dtype;                // the weight_dtype setting it loaded with
  // Where the host experts live for the GPU's DMA (engine/layers/host_residence.h):
  // the choice with its reason, and what the copy residence took.
  std::string host_residence = "off";      // copy, map or off
  std::string host_residence_why;
  uint64_t residence_copied_bytes = 0, residence_registered_bytes = 0, residence_dropped_bytes = 0;
  double residence_copy_s = 0, residence_register_s = 0;
};

class Model {
 public:
  // Opens and validates MODEL (a Hugging Face directory, quantized or not, or a .gguf file).
  static std::unique_ptr<Model> load(const std::string& dir, const Settings& settings);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  KvLayout kv_layout() const { return kv_layout_; }
  numa::ThreadPool& pool() { return *pool_; }
  numa::NodePools& node_pools() { return *pools_; }  // every NUMA node's pool (the expert engine's)
  int64_t weight_bytes() const;
  // Bytes of weights the host holds for this model (views of the checkpoint
  // or --dtype copies; not what went to the GPU).
  uint64_t host_weight_bytes() const;
  const LoadReport& load_report() const { return report_; }

  // Runs one step. logits receives [batch.logit_rows.size(), vocab_size].
  // With --routing-trace the step's host-expert routing is appended to the file.
  void forward(const Batch& batch, KvCache& kv, std::vector<float>& logits);

  // Speculative decoding with the checkpoint's multi-token-prediction head
  // (setting speculative_tokens; CPU runtime; the head's K/V is one more
  // layer of kv_layout()). speculative_tokens(): tokens drafted per step (0:
  // off, and then the two calls below throw Error(internal)). hidden(): the
  // final normed hidden state of every row of the last forward(), [rows, H].
  // forward_mtp(): the head over `batch` (row i: the token after its
  // position; hidden + i*H: the hidden state of its position), with the
  // checks of forward(); see CpuRuntime::forward_mtp.
  int64_t speculative_tokens() const { return spec_tokens_; }
  const std::vector<float>& hidden() const;
  void forward_mtp(const Batch& batch, const float* hidden, KvCache& kv, std::vector<float>& logits, std::vector<float>& hidden_out);
  // The KV blocks the automatic fit reserved in the GPU budget
  // (--gpu-resident-moe-layers auto that had to choose; 0: none reserved):
  // the server allocates these (engine/placement/placement.h, server_kv_blocks).
  int64_t fit_kv_blocks() const { return fit_kv_blocks_; }
  // The GPU runtime when the placement chose the GPU, else nullptr.
  GpuRuntime* gpu() { return gpu_.get(); }
  const GpuRuntime* gpu() const { return gpu_.get(); }
  // The n-gram memory modules of qwen3_moe_engram models (nullptr otherwise).
  EngramModules* engram() { return engram_.get(); }

 private:
  Model() = default;
  void check_batch(const Batch& b, KvCache& kv) const;  // forward()'s input checks
  std::string dir_;
  LoadReport report_;
  ModelConfig config_;
  KvLayout kv_layout_;
  int64_t spec_tokens_ = 0;
  std::unique_ptr<io::TensorStore> store_;  // null for a GGUF file
  std::unique_ptr<WeightSource> source_;    // GGUF or quantized HF checkpoint; null for plain safetensors
  std::unique_ptr<WeightBinder> binder_;    // owns the --dtype copies the layers view
  std::unique_ptr<numa::NodePools> pools_;  // one worker pool per NUMA node
  numa::ThreadPool* pool_ = nullptr;
  std::unique_ptr<EngramModules> engram_;   // before the runtimes: they keep a pointer to it
  std::unique_ptr<RoutingTraceWriter> trace_;  // setting routing_trace (null: off); before the runtimes too
  std::unique_ptr<CpuRuntime> cpu_;         // one of cpu_, gpu_
  std::unique_ptr<GpuRuntime> gpu_;
  int64_t fit_kv_blocks_ = 0;
};

}  // namespace hmoe
