// qwen3next GGUF metadata and tensor names (see gguf_qwen3next.h).
#include "engine/loading/gguf_qwen3next.h"

#include <algorithm>
#include <set>

#include "configs/error.h"
#include "engine/loading/gguf_model.h"
#include "io/gguf.h"

namespace hmoe {

namespace {

// Hugging Face -> GGUF within a block (llama.cpp's qwen3next tensor names).
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"linear_attn.in_proj_qkvz.weight", "attn_qkv.weight"},
    {"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
    {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
    {"linear_attn.dt_bias", "ssm_dt.bias"},
    {"linear_attn.A_log", "ssm_a"},
    {"linear_attn.norm.weight", "ssm_norm.weight"},
    {"linear_attn.out_proj.weight", "ssm_out.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

// The qwen3next.* keys llama.cpp's converter writes; any other one is refused.
const std::set<std::string> kKnownKeys = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "rope.dimension_count", "expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length",
    "expert_weights_norm", "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
    "full_attention_interval", "nextn_predict_layers"};

bool ends_with(const std::string& s, const std::string& t) { return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0; }

}  // namespace

nlohmann::json gguf_qwen3next_config_json(const io::GgufFile& f) {
  const std::string a = "qwen3next.";
  std::string known;
  for (const auto& k : kKnownKeys) known += (known.empty() ? "" : ", ") + k;
  for (const io::GgufKv& kv : f.metadata()) {
    const std::string key(kv.key);
    if (key.compare(0, a.size(), a) == 0 && !kKnownKeys.count(key.substr(a.size())))
      fail(ErrorKind::bad_model, f.path() + ": unknown metadata key '" + key + "' (this reader of qwen3next files knows " + known + ")");
  }
  auto has = [&](const char* k) { return f.find(a + k) != nullptr; };
  auto u = [&](const char* k) { return f.get(a + k).as_u64(a + k); };
  auto num = [&](const char* k) { return f.get(a + k).as_f64(a + k); };
  nlohmann::json j;
  j["model_type"] = "qwen3_next";
  const io::GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->shape.size() != 2) fail(ErrorKind::bad_model, f.path() + ": tensor 'token_embd.weight' is missing or not 2-D");
  j["vocab_size"] = emb->shape[1];
  j["hidden_size"] = u("embedding_length");
  const uint64_t blocks = u("block_count"), nextn = has("nextn_predict_layers") ? u("nextn_predict_layers") : 0;
  if (nextn >= blocks) fail(ErrorKind::bad_model, f.path() + ": " + a + "nextn_predict_layers (" + std::to_string(nextn) + ") leaves no layers of " + a + "block_count (" + std::to_string(blocks) + ")");
  const uint64_t L = blocks - nextn;
  j["num_hidden_layers"] = L;
  j["num_attention_heads"] = u("attention.head_count");
  j["num_key_value_heads"] = u("attention.head_count_kv");
  const uint64_t hd = u("attention.key_length");
  if (has("attention.value_length") && u("attention.value_length") != hd)
    fail(ErrorKind::unsupported, f.path() + ": " + a + "attention.value_length differs from key_length");
  j["head_dim"] = hd;
  j["num_experts"] = u("expert_count");
  j["num_experts_per_tok"] = u("expert_used_count");
  j["moe_intermediate_size"] = u("expert_feed_forward_length");
  j["shared_expert_intermediate_size"] = u("expert_shared_feed_forward_length");
  if (has("feed_forward_length")) j["intermediate_size"] = u("feed_forward_length");
  // llama.cpp's qwen3next graph renormalises the top-k weights unless told otherwise.
  j["norm_topk_prob"] = has("expert_weights_norm") ? f.get(a + "expert_weights_norm").as_u64(a + "expert_weights_norm") != 0 : true;
  j["rms_norm_eps"] = num("attention.layer_norm_rms_epsilon");
  if (has("rope.freq_base")) j["rope_theta"] = num("rope.freq_base");
  if (has("context_length")) j["max_position_embeddings"] = u("context_length");
  j["linear_conv_kernel_dim"] = u("ssm.conv_kernel");
  j["linear_key_head_dim"] = u("ssm.state_size");
  j["linear_num_key_heads"] = u("ssm.group_count");
  const uint64_t nv = u("ssm.time_step_rank"), inner = u("ssm.inner_size");
  if (nv == 0 || inner % nv != 0)
    fail(ErrorKind::bad_model, f.path() + ": " + a + "ssm.inner_size (" + std::to_string(inner) + ") is not a multiple of " + a + "ssm.time_step_rank (" + std::to_string(nv) + ")");
  j["linear_num_value_heads"] = nv;
  j["linear_value_head_dim"] = inner / nv;
  const uint64_t interval = u("full_attention_interval");
  if (interval == 0) fail(ErrorKind::bad_model, f.path() + ": " + a + "full_attention_interval is 0");
  j["full_attention_interval"] = interval;
  const uint64_t rot = has("rope.dimension_count") ? u("rope.dimension_count") : hd / 4;
  j["partial_rotary_factor"] = static_cast<double>(rot) / static_cast<double>(hd);
  // Blocks without a router are dense MLP blocks.
  nlohmann::json dense = nlohmann::json::array();
  for (uint64_t l = 0; l < L; ++l)
    if (!f.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight")) dense.push_back(l);
  j["mlp_only_layers"] = dense;
  j["decoder_sparse_step"] = 1;
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (const io::GgufValue* v = f.find("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = v->as_u64("tokenizer.ggml.eos_token_id");
  if (const io::GgufValue* v = f.find("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = v->as_u64("tokenizer.ggml.bos_token_id");
  return j;
}

bool gguf_qwen3next_tensor_for(const std::string& hf, std::string& g, int64_t& expert) { return gguf_tensor_for(hf, kLayerNames, g, expert); }

Qwen3NextStored gguf_qwen3next_stored(const std::string& hf) {
  if (hf == "model.norm.weight" || hf == "mtp.norm.weight" || hf == "mtp.pre_fc_norm_embedding.weight" || hf == "mtp.pre_fc_norm_hidden.weight" ||
      ends_with(hf, ".input_layernorm.weight") || ends_with(hf, ".post_attention_layernorm.weight") ||
      ends_with(hf, ".self_attn.q_norm.weight") || ends_with(hf, ".self_attn.k_norm.weight"))
    return Qwen3NextStored::plus_one;
  if (ends_with(hf, ".linear_attn.A_log")) return Qwen3NextStored::neg_exp;
  if (ends_with(hf, ".linear_attn.in_proj_qkvz.weight")) return Qwen3NextStored::split_qkvz;
  return Qwen3NextStored::as_is;
}

void gguf_qwen3next_qkvz_row(int64_t row, int64_t nk, int64_t dk, int64_t nv, int64_t dv, int64_t& src, bool& gate) {
  const int64_t r = nv / nk, group = 2 * dk + 2 * r * dv, gk = row / group, j = row % group, K = nk * dk;
  gate = false;
  if (j < dk) src = gk * dk + j;
  else if (j < 2 * dk) src = K + gk * dk + (j - dk);
  else if (j < 2 * dk + r * dv) src = 2 * K + gk * r * dv + (j - 2 * dk);
  else {
    gate = true;
    src = gk * r * dv + (j - 2 * dk - r * dv);
  }
}

}  // namespace hmoe
