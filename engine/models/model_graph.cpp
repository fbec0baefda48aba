// The decoder layout the architectures share, and the dispatch by architecture.
#include "engine/models/model_graph.h"

#include "configs/error.h"

namespace hmoe {

ModelGraph hf_decoder_graph(const ModelConfig& c, const HasTensor& has) {
  ModelGraph g;
  g.embed = "model.embed_tokens.weight";
  g.final_norm = "model.norm.weight";
  g.lm_head = c.tie_word_embeddings && !has("lm_head.weight") ? g.embed : "lm_head.weight";
  return g;
}

BlockDesc hf_decoder_block(int64_t layer, AttentionKind attention) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  BlockDesc b;
  b.layer = layer;
  b.input_norm = p + "input_layernorm.weight";
  b.post_norm = p + "post_attention_layernorm.weight";
  b.attention = attention;
  b.attention_prefix = p + "self_attn.";
  return b;
}

std::string hf_mlp_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

ModelGraph model_graph(const ModelConfig& c, const HasTensor& has) {
  switch (c.arch) {
    case Arch::qwen3_moe:
    case Arch::qwen3_moe_engram: return qwen3_moe_graph(c, has);
    case Arch::deepseek_v3: return deepseek_v3_graph(c, has);
    case Arch::qwen3_next: return qwen3_next_graph(c, has);
  }
  fail(ErrorKind::unsupported, "model_type '" + c.model_type + "' is recognised but its graph is not implemented yet");
}

}  // namespace hmoe
