// Qwen3-MoE (and its Engram variant, qwen3_moe_engram): GQA attention with
// per-head q/k RMSNorm and rotary embeddings; routed experts with softmax
// top-k on the layers config.json marks sparse, a dense SwiGLU MLP on the
// others; optionally n-gram memory (Engram) modules before some layers.
#include "configs/error.h"
#include "engine/models/model_graph.h"

namespace hmoe {

ModelGraph qwen3_moe_graph(const ModelConfig& c, const HasTensor& has) {
  ModelGraph g;
  g.embed = "model.embed_tokens.weight";
  g.final_norm = "model.norm.weight";
  g.lm_head = c.tie_word_embeddings && !has("lm_head.weight") ? g.embed : "lm_head.weight";
  g.engram = c.arch == Arch::qwen3_moe_engram;
  g.kv = KvLayout{c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    BlockDesc b;
    b.layer = l;
    b.input_norm = p + "input_layernorm.weight";
    b.post_norm = p + "post_attention_layernorm.weight";
    b.attention = AttentionKind::gqa;
    b.attention_prefix = p + "self_attn.";
    if (c.is_moe_layer(l)) b.ffn = {true, p + "mlp.", c.moe_intermediate_size, RouterKind::softmax_topk, 0, false};
    else b.ffn = {false, p + "mlp.", c.intermediate_size};
    g.blocks.push_back(b);
  }
  return g;
}

ModelGraph model_graph(const ModelConfig& c, const HasTensor& has) {
  switch (c.arch) {
    case Arch::qwen3_moe:
    case Arch::qwen3_moe_engram: return qwen3_moe_graph(c, has);
    case Arch::deepseek_v3: return deepseek_v3_graph(c, has);
  }
  fail(ErrorKind::unsupported, "model_type '" + c.model_type + "' is recognised but its graph is not implemented yet");
}

}  // namespace hmoe
