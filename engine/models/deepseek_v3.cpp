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
  ModelGraph g;
  g.embed = "model.embed_tokens.weight";
  g.final_norm = "model.norm.weight";
  g.lm_head = c.tie_word_embeddings && !has("lm_head.weight") ? g.embed : "lm_head.weight";
  g.kv = mla_kv_layout(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    BlockDesc b;
    b.layer = l;
    b.input_norm = p + "input_layernorm.weight";
    b.post_norm = p + "post_attention_layernorm.weight";
    b.attention = AttentionKind::mla;
    b.attention_prefix = p + "self_attn.";
    const int64_t shared = c.moe_intermediate_size * c.mla.n_shared_experts;
    if (c.is_moe_layer(l)) b.ffn = {true, p + "mlp.", c.moe_intermediate_size, RouterKind::deepseek_grouped, shared, true};
    else b.ffn = {false, p + "mlp.", c.intermediate_size, RouterKind::softmax_topk, 0, true};
    g.blocks.push_back(b);
  }
  return g;
}

}  // namespace hmoe
