// The layer kinds a model graph (engine/models/) is composed of; each has a
// CPU and a CUDA implementation (engine/layers/*.cpp, *_gpu.cpp).
#pragma once
#include <cstdint>
#include <string>

namespace hmoe {

enum class AttentionKind { gqa, mla };
enum class RouterKind { softmax_topk, deepseek_grouped };

// A feed-forward layer: a dense SwiGLU MLP of `inter`, or a MoE layer
// (router, routed experts of moe_intermediate_size, optional shared expert
// of shared_inter). precise: the GPU may split the inputs of its products
// into a bf16 hi + lo pair (setting gpu_mla_split_inputs).
struct FfnDesc {
  bool moe = false;
  std::string prefix;
  int64_t inter = 0;
  RouterKind router = RouterKind::softmax_topk;
  int64_t shared_inter = 0;
  bool precise = false;
};

}  // namespace hmoe
