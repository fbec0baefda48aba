// DeepSeek-V3 / Kimi-K2: multi-head latent attention over a latent KV cache
// (engine/layers/mla_attention.h); the first first_k_dense_replace layers
// dense SwiGLU, the others MoE with DeepSeek's group-limited sigmoid router
// (engine/layers/deepseek_moe.h) and n_shared_experts shared experts. Its
// products may take split bf16 inputs on the GPU (FfnDesc::precise): the
// routing rides on near-ties that one bf16 rounding flips.
#include "engine/layers/mla_attention.h"
#include "engine/models/model_graph.h"

namespace hmoe {

ModelGraph deepseek_v3_graph(const ModelConfig& c, const HasTensor& has) {
  ModelGraph g = hf_decoder_graph(c, has);
  g.kv = mla_kv_layout(c);
  const int64_t shared = c.moe_intermediate_size * c.mla.n_shared_experts;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    BlockDesc b = hf_decoder_block(l, AttentionKind::mla);
    if (c.is_moe_layer(l)) b.ffn = {true, hf_mlp_prefix(l), c.moe_intermediate_size, RouterKind::deepseek_grouped, shared, true};
    else b.ffn = {false, hf_mlp_prefix(l), c.intermediate_size, RouterKind::softmax_topk, 0, true};
    g.blocks.push_back(b);
  }
  return g;
}

}  // namespace hmoe
