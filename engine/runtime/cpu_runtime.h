// CpuRuntime: the CPU step executor. Instantiates a ModelGraph
// (engine/models/) with the CPU implementations of its layer kinds
// (engine/layers/cpu_layers.h: fp32 activations, weights as checkpoint
// views, routed experts on the NUMA expert engine) and runs steps: embedding,
// blocks (Engram modules before the blocks that have one), final norm and
// lm_head, over the paged KV cache in host memory.
//
// Contract: forward() has the meaning of Model::forward (inputs already
// checked); one call at a time. The checkpoint must outlive the runtime.
#pragma once
#include <memory>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/layers/cpu_layers.h"
#include "engine/layers/hybrid_blocks.h"
#include "engine/layers/mla_attention.h"
#include "engine/models/model_graph.h"
#include "engine/runtime/batch.h"
#include "numa/node_pools.h"

namespace hmoe {

class EngramModules;
class ExpertDeferral;

struct CpuRuntimeOptions {
  ExpertHomeOptions experts;
  MlaMode mla_mode = MlaMode::automatic;
  cpu::GemmOptions gemm;  // the dense products' input treatment (numa/kernels.h)
  int64_t defer_experts = 0;  // setting defer_experts (engine/layers/expert_deferral.h); 0: off
  static CpuRuntimeOptions from_settings(const Settings& s);
};

class CpuRuntime {
 public:
  CpuRuntime(const ModelConfig& c, const ModelGraph& g, WeightBinder& bind, numa::NodePools& pools, const CpuRuntimeOptions& o,
             EngramModules* engram = nullptr);
  ~CpuRuntime();
  void forward(const Batch& b, KvCache& kv, std::vector<float>& logits);

 private:
  struct Block {
    cpu::Mat input_norm, post_norm;
    std::unique_ptr<AttentionBlock> attn;
    std::unique_ptr<FfnBlock> ffn;
  };
  const ModelConfig& c_;
  numa::ThreadPool& pool_;  // node 0's: attention, dense layers, lm_head
  EngramModules* engram_;
  Workspace ws_;
  cpu::GemmOptions gemm_;
  NormStore norms_;  // zero-centred norm weights as fp32 (1 + w)
  cpu::Mat embed_, final_norm_, lm_head_;
  std::vector<Block> blocks_;
  std::unique_ptr<ExpertDeferral> deferral_;  // null: off
  std::vector<bool> may_defer_;               // per block: the next block is MoE too
};

}  // namespace hmoe
