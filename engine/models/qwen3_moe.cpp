// Qwen3-MoE (and its Engram variant, qwen3_moe_engram): GQA attention with
// per-head q/k RMSNorm and rotary embeddings; routed experts with softmax
// top-k on the layers config.json marks sparse, a dense SwiGLU MLP on the
// others; optionally n-gram memory (Engram) modules before some layers.
#include "engine/models/model_graph.h"

namespace hmoe {

ModelGraph qwen3_moe_graph(const ModelConfig& c, const HasTensor& has) {
  ModelGraph g = hf_decoder_graph(c, has);
  g.engram = c.arch == Arch::qwen3_moe_engram;
  g.kv = KvLayout{c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    BlockDesc b = hf_decoder_block(l, AttentionKind::gqa);
    if (c.is_moe_layer(l)) b.ffn = {true, hf_mlp_prefix(l), c.moe_intermediate_size, RouterKind::softmax_topk, 0, false};
    else b.ffn = {false, hf_mlp_prefix(l), c.intermediate_size};
    g.blocks.push_back(b);
  }
  return g;
}

}  // namespace hmoe
