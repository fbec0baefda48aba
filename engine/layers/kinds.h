// The layer kinds a model graph (engine/models/) is composed of; each has a
// CPU and a CUDA implementation (engine/layers/*.cpp, *_gpu.cpp).
#pragma once
#include <cstdint>
#include <string>

namespace hmoe {

// gated_gqa: Qwen3-Next's full attention (q_proj also yields a sigmoid
// output gate, zero-centred q/k norm, partial rotary); gated_deltanet: its
// linear attention (engine/layers/gated_deltanet.h), which keeps a recurrent
// state per sequence instead of K/V.
enum class AttentionKind { gqa, mla, gated_gqa, gated_deltanet };
// Tokens per chunk of gated_deltanet's chunked kernel; its pieces end at
// multiples of this, which is the KvLayout::state_align of models with it.
inline constexpr int64_t kDeltaNetChunk = 64;
enum class RouterKind { softmax_topk, deepseek_grouped };

// A feed-forward layer: a dense SwiGLU MLP of `inter`, or a MoE layer
// (router, routed experts of moe_intermediate_size, optional shared expert
// of shared_inter, scaled per token by sigmoid(shared_expert_gate . x) when
// shared_gate). precise: the GPU may split the inputs of its products
// into a bf16 hi + lo pair (setting gpu_mla_split_inputs).
struct FfnDesc {
  bool moe = false;
  std::string prefix;
  int64_t inter = 0;
  RouterKind router = RouterKind::softmax_topk;
  int64_t shared_inter = 0;
  bool precise = false;
  bool shared_gate = false;
};

}  // namespace hmoe
