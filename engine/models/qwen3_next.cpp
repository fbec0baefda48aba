// Qwen3-Next (and the Qwen3.5-MoE text models that follow it): a hybrid of
// Gated DeltaNet linear attention (engine/layers/gated_deltanet.h) and gated
// full attention (every full_attention_interval-th layer, or as layer_types
// says), each followed by a MoE of many small experts (softmax top-k) plus
// a shared expert scaled by sigmoid(shared_expert_gate . x), or a dense
// SwiGLU on mlp_only_layers. RMSNorm weights are zero-centred. Only the
// full-attention layers have K/V; each linear-attention layer keeps a
// recurrent state per sequence in the KV cache's seq_state, so prefix
// caching is off for this family (a shared KV prefix cannot restore it).
// The mtp.* weights (multi-token prediction head) are not used yet.
#include "configs/error.h"
#include "engine/models/model_graph.h"

namespace hmoe {

ModelGraph qwen3_next_graph(const ModelConfig& c, const HasTensor& has) {
  const HybridConfig& h = c.hybrid;
  if (static_cast<int64_t>(h.full_attention.size()) != c.num_hidden_layers)
    fail(ErrorKind::internal, "qwen3_next: layer kinds do not cover num_hidden_layers");
  ModelGraph g = hf_decoder_graph(c, has);
  g.zero_centred_norms = true;
  g.unused_prefixes = {"mtp."};
  int64_t kv_layers = 0, states = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool full = h.full_attention[static_cast<size_t>(l)];
    BlockDesc b = hf_decoder_block(l, full ? AttentionKind::gated_gqa : AttentionKind::gated_deltanet);
    if (full) b.kv_layer = kv_layers++;
    else {
      b.attention_prefix = "model.layers." + std::to_string(l) + ".linear_attn.";
      b.state_index = states++;
    }
    if (c.is_moe_layer(l))
      b.ffn = {true, hf_mlp_prefix(l), c.moe_intermediate_size, RouterKind::softmax_topk, h.shared_expert_intermediate_size, false, true};
    else b.ffn = {false, hf_mlp_prefix(l), c.intermediate_size};
    g.blocks.push_back(b);
  }
  g.kv = KvLayout{kv_layers, c.num_key_value_heads, c.head_dim};
  g.kv.seq_state_bytes = states * h.state_bytes_per_layer();
  return g;
}

}  // namespace hmoe
