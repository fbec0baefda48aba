// The CPU blocks of Qwen3-Next besides its linear attention
// (engine/layers/gated_deltanet.h), as transformers' Qwen3Next* modules
// compute them:
//  - gated full attention: q_proj yields per head the query and an output
//    gate ([query | gate], head_dim each); q and k get a zero-centred RMSNorm
//    per head; rotary embeddings on the first head_dim * partial_rotary_factor
//    dimensions (rotate-half within them); causal GQA over the paged KV cache
//    at the block's KV layer; the heads' output times sigmoid(gate), o_proj;
//  - MoE with a gated shared expert: softmax top-k routed experts (on the
//    NUMA expert engine) plus sigmoid(shared_expert_gate . x) times a SwiGLU
//    shared expert;
//  - zero-centred RMSNorm weights: the model scales by (1 + w), bound here
//    as fp32 (1 + w) so that the plain RMSNorm applies them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/layers/cpu_layers.h"

namespace hmoe {

// gemm: the input treatment of their dense products (cpu_layers.h); routers stay exact.
std::unique_ptr<AttentionBlock> make_gated_attention(WeightBinder& bind, const ModelConfig& c, int64_t kv_layer, const std::string& prefix,
                                                     numa::ThreadPool& pool, const cpu::GemmOptions& gemm = {});
std::unique_ptr<FfnBlock> make_shared_gated_moe(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix,
                                                int64_t shared_inter, numa::NodePools& pools, ExpertHomeOptions& opt,
                                                const cpu::GemmOptions& gemm = {});

// Owns the fp32 (1 + w) copies of zero-centred norm weights.
class NormStore {
 public:
  // The weight `name` [n]: as stored, or as fp32 (1 + w) when zero_centred;
  // round_bf16: (1 + w) rounded to bf16, as the GPU's bf16 mode stores it
  // (emulation, GemmOptions::hybrid_precise off).
  cpu::Mat bind(WeightBinder& b, const std::string& name, int64_t n, bool zero_centred, bool round_bf16 = false);

 private:
  std::vector<std::unique_ptr<std::vector<float>>> owned_;
};

}  // namespace hmoe
