// GpuStack: the whole decoder step on the GPU for one placement. Embedding,
// attention (paged KV cache in bf16 on the GPU), routers, dense MLPs,
// resident MoE layers' experts and lm_head run on the GPU; the experts of
// non-resident MoE layers stay in host memory and run on the CPU
// (numa::ExpertEngine), reached through pinned buffers: normed hidden states
// and routing go down, expert sums come back, the step goes on.
//
// Contract: the constructor uploads every GPU weight (as bf16) and keeps
// views of the CPU experts (they must outlive the stack). forward() has the
// meaning of Model::forward; one call at a time. The KvCache only lends its
// block tables: keys and values live on the GPU, allocated on first use for
// the cache's number of blocks. In a build without CUDA the constructor
// throws Error(unsupported).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/gpu_step.h"
#include "engine/gpu_expert_stream.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "io/safetensors.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "numa/node_pools.h"

namespace hmoe {

class WeightSource;

// Host view of a checkpoint tensor with the given shape (throws when absent).
using WeightLookup = std::function<cpu::Mat(const std::string& name, const std::vector<int64_t>& shape)>;

class GpuStack : public GpuStep {
 public:
  // resident[l]: layer l's routed experts on the GPU (ignored for dense
  // layers); the others run on an ExpertEngine over `pools`. keep_quantized:
  // resident experts of quantized checkpoints stay in their format
  // (engine/gpu_experts.h).
  GpuStack(const ModelConfig& c, const std::vector<bool>& resident, const WeightLookup& get, numa::NodePools& pools,
           const numa::EngineOptions& experts_opt = {}, bool keep_quantized = true);
  ~GpuStack();
  GpuStack(const GpuStack&) = delete;
  GpuStack& operator=(const GpuStack&) = delete;

  void forward(const Batch& b, KvCache& kv, std::vector<float>& logits) override;

  // Decode-sized steps (<= 64 tokens) replay their GPU segments (the device
  // work between two CPU hand-offs; the whole step when every MoE layer is
  // resident) as CUDA graphs while their shape and buffers stay the same.
  // Off in a stack built directly; make_gpu_stack applies --cuda-graphs.
  void set_cuda_graphs(bool on) override;
  // Decode steps of >= 2 sequences with CPU hand-offs run as two
  // micro-batches (the last `second_rows` sequences, 0: half, form the
  // second) so that one's CPU experts overlap the other's GPU work. Each
  // micro-batch reads its own experts, so experts both use are read twice.
  // Off in a stack built directly; make_gpu_stack applies --gpu-cpu-overlap.
  // Prefill steps (> 64 tokens) run attention in 64-token query tiles on
  // tensor cores (gpu::attention_tiles); off: one block per token and head.
  void set_tiled_attention(bool on);
  void set_cpu_overlap(bool on, int64_t second_rows = 0);
  size_t graph_captures() const;  // CUDA graphs captured so far
  // Forward passes of >= o.min_batch tokens compute the non-resident MoE
  // layers on the GPU, experts streamed through a ring of device slots
  // (engine/gpu_expert_stream.h); min_batch 0 turns it off. Off in a stack
  // built directly; make_gpu_stack applies --gpu-prefill-min-batch-size and
  // --gpu-prefetch-window. Not with CUDA graphs in the same pass.
  void enable_expert_streaming(const ExpertStreamOptions& o);
  const ExpertStream* expert_stream() const;  // null when off
  ExpertStream* expert_stream();
  // qwen3_moe_engram: uploads the Engram modules' weights and runs each
  // module before its layer (engine/engram_gpu.h); `host` (the model's
  // EngramModules: hashing, PLE table, recorded ids) must outlive the stack.
  // With CUDA graphs on, decode steps replay the layers between modules as
  // graphs; each module (host wait for its rows, upload, kernels) runs
  // between them. A module before layer 0 turns graphs off.
  void attach_engram(EngramModules& host, const WeightLookup& get);
  const GpuStepTimes& times() const override;
  void reset_times() override;
  uint64_t weight_bytes() const override;  // bytes of weights on the GPU

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Model::load's entry point: resolves --device and the placement from the
// settings, checks that the plan fits the GPU before allocating anything,
// prints one line each saying so on stderr (unless progress is "none"), and
// builds the stack (GpuMlaStack for deepseek_v3); returns nullptr for the
// CPU path. Weights come from `store` (plain safetensors) or, when it is
// null, from `source` (GGUF and quantized checkpoints): attention, norms,
// routers and the head go to the GPU dequantized to bf16 (engine/
// gpu_upload.h); resident routed experts stay in their format where the GPU
// kernels take it (engine/gpu_experts.h, setting gpu_quantized_experts); the
// CPU experts keep their format, and long prompts do not stream experts. An
// architecture without a GPU graph runs on the CPU under --device auto and
// is an error under --device cuda. `engram`: the model's Engram modules
// (qwen3_moe_engram; null otherwise).
std::unique_ptr<GpuStep> make_gpu_stack(const ModelConfig& c, const io::TensorStore* store, WeightSource* source, const Settings& s,
                                        numa::NodePools& pools, EngramModules* engram = nullptr);

}  // namespace hmoe
