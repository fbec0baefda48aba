// The CPU side of the layer kinds: fp32 activations on the host, weights as
// checkpoint views (engine/layers/weights.h), run on node 0's pool (the
// routed experts on the NUMA expert engine, engine/layers/routed_experts.h).
// This file: the interfaces, the step's scratch, and the Qwen3 kinds (GQA
// attention with q/k norm and rotary embeddings, softmax top-k MoE, dense
// SwiGLU); mla_attention.h and deepseek_moe.h add DeepSeek's.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/layers/routed_experts.h"
#include "engine/layers/weights.h"
#include "engine/loading/model_config.h"
#include "engine/ops/cpu_ops.h"
#include "numa/expert_engine.h"

namespace hmoe {

// Scratch buffers reused across steps (sized for the largest batch seen).
struct Workspace {
  std::vector<float> hidden, normed, block_out;
  std::vector<float> q, k, v, attn;
  std::vector<float> router;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_w;
  void resize(int64_t n, const ModelConfig& c);
};

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // x: normed hidden [n, hidden]; out: [n, hidden] (overwritten).
  virtual void forward(const float* x, int64_t n, const ops::TokenSlot* slots, KvCache& kv, float* out, Workspace& ws) = 0;
};

class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  // x: normed hidden [n, hidden]; out: [n, hidden] (overwritten).
  virtual void forward(const float* x, int64_t n, float* out, Workspace& ws) = 0;
  virtual bool is_moe() const = 0;
};

std::unique_ptr<AttentionBlock> make_gqa_attention(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix,
                                                   numa::ThreadPool& pool);
std::unique_ptr<FfnBlock> make_moe_block(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix, numa::NodePools& pools,
                                         ExpertHomeOptions& opt);
std::unique_ptr<FfnBlock> make_dense_mlp(WeightBinder& bind, int64_t hidden, int64_t intermediate, const std::string& prefix,
                                         numa::ThreadPool& pool);

}  // namespace hmoe
