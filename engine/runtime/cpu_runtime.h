// CpuRuntime: the CPU step executor. Instantiates a ModelGraph
// (engine/models/) with the CPU implementations of its layer kinds
// (engine/layers/cpu_layers.h: fp32 activations, weights as checkpoint
// views, routed experts on the NUMA expert engine) and runs steps: embedding,
// blocks (Engram modules before the blocks that have one), final norm and
// lm_head, over the paged KV cache in host memory. With a graph whose MTP
// head is enabled (ModelGraph::mtp with a KV layer) it also runs that head
// (forward_mtp) and keeps every row's final hidden state for it.
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

  // MTP head (speculative decoding). hidden(): every row's final normed
  // hidden state of the last forward() (kept only when the head is on).
  bool has_mtp() const { return mtp_ != nullptr; }
  const std::vector<float>& hidden() const { return hidden_; }
  // Row i of b: the token after the row's position, hidden_in + i*H the
  // hidden state of the position (main model's, or the head's own when
  // drafting on); writes the head's K/V at the row's slot, logits of
  // b.logit_rows and their normed hidden states (hidden_out, [rows, H]).
  void forward_mtp(const Batch& b, const float* hidden_in, KvCache& kv, std::vector<float>& logits, std::vector<float>& hidden_out);

 private:
  struct Block {
    cpu::Mat input_norm, post_norm;
    std::unique_ptr<AttentionBlock> attn;
    std::unique_ptr<FfnBlock> ffn;
  };
  struct Mtp {
    cpu::Mat fc, norm_embedding, norm_hidden, final_norm;
    Block block;
  };
  Block make_block(const BlockDesc& d, const ModelGraph& g, WeightBinder& bind, numa::NodePools& pools, ExpertHomeOptions& homes,
                   const CpuRuntimeOptions& o);
  // x += attn(norm(x)); x += ffn(norm(x)) over ws_ (n rows).
  void run_block(Block& blk, int64_t n, const ops::TokenSlot* slots, KvCache& kv);
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
  std::unique_ptr<Mtp> mtp_;                  // null: no MTP head
  std::vector<float> hidden_, mtp_in_;
};

}  // namespace hmoe
