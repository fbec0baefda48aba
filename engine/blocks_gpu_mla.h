// GpuMlaStack: the DeepSeek-V3 / Kimi-K2 decoder step on the GPU for one
// placement. Embedding, multi-head latent attention over a latent KV cache
// in bf16 on the GPU (kv_lora_rank + qk_rope_head_dim values per token and
// layer), DeepSeek's group-limited sigmoid routing, the shared experts, the
// first_k_dense_replace dense layers, resident routed experts and lm_head run
// on the GPU; the routed experts of non-resident MoE layers stay in host
// memory and run on the CPU (numa::ExpertEngine) through pinned buffers,
// while the GPU computes that layer's shared expert - or, for passes with
// many tokens (enable_expert_streaming), are streamed to the GPU.
//
// Attention follows MlaMode (the mla_attention setting) as the CPU path
// does: latent = kv_b absorbed into query and output, attention in the
// latent space; expanded = kv_b applied to the cached latents of every
// sequence of the step, then ordinary attention; expanded_prefill = expanded
// for the tokens of sequences with more than one token in the step (while
// the step's expanded K/V stay under 1 GiB), latent for the others; auto =
// latent, as on the CPU.
//
// Contract: as GpuStack (engine/blocks_gpu.h): the constructor uploads every
// GPU weight as bf16 and keeps views of the CPU experts (they must outlive
// the stack); forward() has the meaning of Model::forward, one call at a
// time; the KvCache lends its block tables, and its storage becomes a
// GpuKvStorage of the latent width with no values (engine/kv_storage_gpu.h),
// so prefix sharing and the pinned host pool work on this path too. CUDA
// graphs are not used on this path (set_cuda_graphs is accepted and
// ignored). Without CUDA the constructor throws Error(unsupported).
//
// Numerics: as GpuStack, bf16 product inputs and fp32 accumulation, but for
// the split inputs (set_split_inputs): the tiny fixture's routing rides on
// near-ties that one bf16 rounding of these four products' inputs flips
// (bench/README.md, "DeepSeek-V3 GPU top-1").
#pragma once
#include <memory>
#include <vector>

#include "engine/blocks_gpu.h"
#include "engine/blocks_mla.h"
#include "engine/gpu_step.h"

namespace hmoe {

class GpuMlaStack : public GpuStep {
 public:
  // resident[l]: MoE layer l's routed experts on the GPU (ignored for dense
  // layers); keep_quantized as GpuStack's.
  GpuMlaStack(const ModelConfig& c, const std::vector<bool>& resident, const WeightLookup& get, numa::NodePools& pools, MlaMode mode,
              const numa::EngineOptions& experts_opt = {}, bool keep_quantized = true);
  ~GpuMlaStack() override;
  GpuMlaStack(const GpuMlaStack&) = delete;
  GpuMlaStack& operator=(const GpuMlaStack&) = delete;

  void forward(const Batch& b, KvCache& kv, std::vector<float>& logits) override;
  void set_cuda_graphs(bool) override {}
  // Setting gpu_mla_split_inputs (default on): the inputs of q_a/kv_a, q_b,
  // o_proj and the dense down projection are a bf16 hi + lo pair (one
  // product over 2n rows, halves added), not one bf16 rounding.
  void set_split_inputs(bool on);
  // Passes of >= o.min_batch tokens run the non-resident MoE layers' routed
  // experts on the GPU, streamed from pinned host memory (ExpertStream, as
  // GpuStack); the shared expert runs on the GPU as always. Off (with a
  // notice) when the slots do not fit the GPU.
  void enable_expert_streaming(const ExpertStreamOptions& o);
  const ExpertStream* expert_stream() const;  // null when off
  const GpuStepTimes& times() const override;
  void reset_times() override;
  uint64_t weight_bytes() const override;
  uint64_t kv_bytes_per_token() const;  // latent cache bytes per token over all layers (bf16)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe
