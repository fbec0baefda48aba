// Qwen3-Next (and the Qwen3.5-MoE text models that follow it): a hybrid of
// Gated DeltaNet linear attention (engine/layers/gated_deltanet.h) and gated
// full attention (every full_attention_interval-th layer, or as layer_types
// says), each followed by a MoE of many small experts (softmax top-k) plus
// a shared expert scaled by sigmoid(shared_expert_gate . x), or a dense
// SwiGLU on mlp_only_layers. RMSNorm weights are zero-centred. Only the
// full-attention layers have K/V; each linear-attention layer keeps a
// recurrent state per sequence in the KV cache's seq_state, which can be
// checkpointed at any token (state_align): prefix caching restores it from
// snapshots taken at block boundaries (engine/kv/kv_cache.h).
// The mtp.* weights (multi-token prediction head: one more gated-attention
// block with a MoE) are described as graph.mtp and run only when speculative
// decoding is on; otherwise they are skipped (unused_prefixes).
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
  if (has("mtp.fc.weight")) {
    MtpDesc m;
    m.fc = "mtp.fc.weight";
    m.norm_embedding = "mtp.pre_fc_norm_embedding.weight";
    m.norm_hidden = "mtp.pre_fc_norm_hidden.weight";
    m.final_norm = "mtp.norm.weight";
    BlockDesc& b = m.block;
    b.layer = c.num_hidden_layers;
    b.input_norm = "mtp.layers.0.input_layernorm.weight";
    b.post_norm = "mtp.layers.0.post_attention_layernorm.weight";
    b.attention = AttentionKind::gated_gqa;
    b.attention_prefix = "mtp.layers.0.self_attn.";
    if (c.num_experts > 0)
      b.ffn = {true, "mtp.layers.0.mlp.", c.moe_intermediate_size, RouterKind::softmax_topk, h.shared_expert_intermediate_size, false, true};
    else b.ffn = {false, "mtp.layers.0.mlp.", c.intermediate_size};
    g.mtp = m;
  }
  g.kv = KvLayout{kv_layers, c.num_key_value_heads, c.head_dim};
  g.kv.seq_state_bytes = states * h.state_bytes_per_layer();
  g.kv.state_align = states > 0 ? kDeltaNetChunk : 0;
  return g;
}

}  // namespace hmoe
