// The CUDA implementations of the layer kinds (engine/layers/*_gpu.cpp),
// made from the checkpoint through a GpuUploader. Each checks that the
// config fits its kernels (Error(unsupported) naming what does not).
#pragma once
#include <memory>
#include <string>

#include "engine/layers/gpu_layer.h"
#include "engine/layers/gpu_upload.h"
#include "engine/layers/kinds.h"
#include "engine/layers/mla_attention.h"
#include "engine/layers/routed_experts.h"
#include "engine/loading/model_config.h"

namespace hmoe {

// GQA attention with per-head q/k RMSNorm and rotary embeddings (Qwen3).
// Steps with query tiles (GpuStepInfo::ntiles) attend on tensor cores for head_dim 64, 128 and 256
// (gpu::attention_tiles_takes); head_dim: multiples of 32 up to 256.
std::unique_ptr<GpuAttention> make_gqa_attention_gpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& prefix);
// Multi-head latent attention (DeepSeek-V3); split: the inputs of the big
// products are a bf16 hi + lo pair (setting gpu_mla_split_inputs).
std::unique_ptr<GpuAttention> make_mla_attention_gpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& prefix, MlaMode mode,
                                                     bool split);

// Dense SwiGLU MLP; split_down: the down product's input is split.
std::unique_ptr<GpuFfn> make_dense_mlp_gpu(GpuUploader& up, const ModelConfig& c, const std::string& prefix, int64_t inter, bool split_down);

// A MoE layer: router (softmax top-k, or DeepSeek's grouped sigmoid with
// its correction bias, in fp32), an optional shared expert of
// shared_inter, and the routed experts in their home. shared_gate
// (Qwen3-Next): the shared expert is `shared_expert.`, scaled per token by
// sigmoid(shared_expert_gate . x); else `shared_experts.`, unscaled.
// fp32_router: a softmax top-k router and the shared-expert gate in fp32 on
// the fp32 normed input (Qwen3-Next under gpu_hybrid_precise: a bf16 input
// flips near-tied expert choices of the fp32 model); else bf16.
std::unique_ptr<GpuFfn> make_moe_gpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& prefix, RouterKind router,
                                     int64_t shared_inter, RoutedExperts::Home home, numa::NodePools& pools, ExpertHomeOptions& opt,
                                     bool shared_gate = false, bool fp32_router = false);

}  // namespace hmoe
