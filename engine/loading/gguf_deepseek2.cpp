// deepseek2 GGUF metadata and naming (engine/gguf_deepseek2.h). The keys and
// tensor names are llama.cpp's (its converter's DeepseekV2Model and
// gguf-py's constants): what the file means, read by hmoe's own code.
#include "engine/loading/gguf_deepseek2.h"

#include <cctype>
#include <cmath>
#include <cstring>

#include "configs/error.h"
#include "engine/loading/gguf_model.h"
#include "io/dtype.h"
#include "io/gguf.h"
#include "numa/kernels.h"
#include "numa/quant_gguf.h"

namespace hmoe {

namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kBf16 = 30;

// Hugging Face -> GGUF within a block (llama.cpp's deepseek2 tensor names).
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
    {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
    {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
    {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
    {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
    {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
};

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A 2-D view [rows, cols] of a GGUF tensor's data (plain or ggml blocks).
cpu::Mat view2d(const io::GgufFile& f, const io::GgufTensor& t, int64_t rows, int64_t cols) {
  const std::string what = f.path() + ": tensor '" + std::string(t.name) + "'";
  cpu::Mat m;
  if (t.type == kF32 || t.type == kF16 || t.type == kBf16) {
    m.dtype = t.type == kF32 ? DType::f32 : t.type == kF16 ? DType::f16 : DType::bf16;
    m.data = t.data;
    m.rows = rows;
    m.cols = cols;
  } else if (cpu::ggml_type_supported(t.type)) {
    m = cpu::ext_view(static_cast<cpu::ExtType>(t.type), t.data, rows, cols, what);
  } else {
    const io::GgmlTypeInfo* ti = io::ggml_type_info(t.type);
    fail(ErrorKind::unsupported, what + " has type " + (ti ? std::string(ti->name) : "id " + std::to_string(t.type)) +
                                     ", which hmoe does not compute on");
  }
  cpu::check_mat(m, what);
  return m;
}

}  // namespace

bool gguf_deepseek2_tensor_for(const std::string& hf, std::string& g, int64_t& expert) { return gguf_tensor_for(hf, kLayerNames, g, expert); }

// The largest finite F16 value (65504) with room for rounding to it.
constexpr float kF16Max = 65519.0f;

bool gguf_deepseek2_kv_b(const io::GgufFile& f, int64_t layer, int64_t rows, int64_t cols, std::vector<uint8_t>& out, DType& dtype,
                         std::vector<std::string>& used) {
  const std::string blk = "blk." + std::to_string(layer) + ".";
  const io::GgufTensor* kb = f.find_tensor(blk + "attn_k_b.weight");
  const io::GgufTensor* vb = f.find_tensor(blk + "attn_v_b.weight");
  if (!kb && !vb) return false;
  if (!kb || !vb)
    fail(ErrorKind::bad_model, f.path() + ": tensor '" + blk + (kb ? "attn_v_b" : "attn_k_b") + ".weight' is missing (its pair " + blk +
                                   (kb ? "attn_k_b" : "attn_v_b") + ".weight is there, and no attn_kv_b)");
  // attn_k_b: ne = [nope, kv_lora, heads]; attn_v_b: ne = [kv_lora, v, heads] (2-D files flatten the last two).
  auto dims3 = [&](const io::GgufTensor& t, uint64_t& a, uint64_t& b, uint64_t& c) {
    if (t.shape.size() == 3) a = t.shape[0], b = t.shape[1], c = t.shape[2];
    else fail(ErrorKind::bad_model, f.path() + ": tensor '" + std::string(t.name) + "' has shape " + shape_str(t.shape) + ", expected 3 dimensions");
  };
  uint64_t nope, r1, h1, r2, v, h2;
  dims3(*kb, nope, r1, h1);
  dims3(*vb, r2, v, h2);
  const uint64_t r = static_cast<uint64_t>(cols);
  if (r1 != r || r2 != r || h1 != h2 || h1 * (nope + v) != static_cast<uint64_t>(rows))
    fail(ErrorKind::bad_model, f.path() + ": tensors '" + blk + "attn_k_b.weight' " + shape_str(kb->shape) + " and '" + blk + "attn_v_b.weight' " +
                                   shape_str(vb->shape) + " do not make kv_b [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                   "] (expected [nope, kv_lora, heads] and [kv_lora, v, heads])");
  const int64_t heads = static_cast<int64_t>(h1), np = static_cast<int64_t>(nope), vd = static_cast<int64_t>(v), ew = np + vd;
  const cpu::Mat k = view2d(f, *kb, heads * cols, np), vm = view2d(f, *vb, heads * vd, cols);
  const bool half = k.quant == cpu::Quant::none && vm.quant == cpu::Quant::none && k.dtype == vm.dtype &&
                    (k.dtype == DType::f16 || k.dtype == DType::bf16);
  dtype = half ? k.dtype : DType::f32;
  out.assign(static_cast<size_t>(rows * cols) * dtype_size(dtype), 0);
  if (half) {  // exact copies of the 16-bit elements
    auto* o = reinterpret_cast<uint16_t*>(out.data());
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < cols; ++j) {  // k_b row (h, j) holds W_UK[h][:, j]
        const auto* in = reinterpret_cast<const uint16_t*>(k.row(h * cols + j));
        for (int64_t i = 0; i < np; ++i) o[(h * ew + i) * cols + j] = in[i];
      }
      for (int64_t i = 0; i < vd; ++i) std::memcpy(o + (h * ew + np + i) * cols, vm.row(h * vd + i), static_cast<size_t>(cols) * 2);
    }
  } else {
    // Block types: dequantized to fp32, then held as F16 (half the memory;
    // rounding of 2^-12 relative, far below a block type's own step) unless
    // a value lies beyond F16's range.
    auto* o = reinterpret_cast<float*>(out.data());
    std::vector<float> row(static_cast<size_t>(std::max(np, cols)));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < cols; ++j) {
        cpu::row_to_f32(k, h * cols + j, row.data());
        for (int64_t i = 0; i < np; ++i) o[(h * ew + i) * cols + j] = row[static_cast<size_t>(i)];
      }
      for (int64_t i = 0; i < vd; ++i) cpu::row_to_f32(vm, h * vd + i, o + (h * ew + np + i) * cols);
    }
    const int64_t n = rows * cols;
    bool fits = k.quant != cpu::Quant::none || vm.quant != cpu::Quant::none;  // F32 stays exact
    for (int64_t i = 0; i < n && fits; ++i) fits = std::fabs(o[i]) <= kF16Max;
    if (fits) {
      std::vector<uint8_t> h16(static_cast<size_t>(n) * 2);
      auto* d = reinterpret_cast<uint16_t*>(h16.data());
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(o[i]);
      out = std::move(h16);
      dtype = DType::f16;
    }
  }
  used = {blk + "attn_k_b.weight", blk + "attn_v_b.weight"};
  return true;
}

nlohmann::json gguf_deepseek2_config_json(const io::GgufFile& f) {
  const std::string a = "deepseek2.";
  auto has = [&](const char* k) { return f.find(a + k) != nullptr; };
  auto u = [&](const char* k) { return f.get(a + k).as_u64(a + k); };
  auto num = [&](const char* k) { return f.get(a + k).as_f64(a + k); };
  auto bad = [&](const char* k, const std::string& why) { fail(ErrorKind::bad_model, f.path() + ": " + a + k + " " + why); };
  auto unsupported = [&](const char* k, const std::string& why) { fail(ErrorKind::unsupported, f.path() + ": " + a + k + " " + why); };
  nlohmann::json j;
  j["model_type"] = "deepseek_v3";
  const io::GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->shape.size() != 2) fail(ErrorKind::bad_model, f.path() + ": tensor 'token_embd.weight' is missing or not 2-D");
  j["vocab_size"] = emb->shape[1];
  if (has("vocab_size") && u("vocab_size") != emb->shape[1])
    bad("vocab_size", "(" + std::to_string(u("vocab_size")) + ") differs from token_embd.weight's rows (" + std::to_string(emb->shape[1]) + ")");
  j["hidden_size"] = u("embedding_length");
  j["num_hidden_layers"] = u("block_count");
  const uint64_t heads = u("attention.head_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = heads;
  // MLA is written as MQA (1 KV head) by current converters, with the head count by older ones.
  if (has("attention.head_count_kv") && u("attention.head_count_kv") != 1 && u("attention.head_count_kv") != heads)
    bad("attention.head_count_kv", "is " + std::to_string(u("attention.head_count_kv")) + "; latent attention needs 1 or the head count (" +
                                       std::to_string(heads) + ")");
  const uint64_t dense = has("leading_dense_block_count") ? u("leading_dense_block_count") : 0;
  j["first_k_dense_replace"] = dense;
  if (dense > 0 || has("feed_forward_length")) j["intermediate_size"] = u("feed_forward_length");
  j["moe_intermediate_size"] = u("expert_feed_forward_length");
  j["n_routed_experts"] = u("expert_count");
  j["num_experts_per_tok"] = u("expert_used_count");
  j["n_shared_experts"] = has("expert_shared_count") ? u("expert_shared_count") : 0;
  j["n_group"] = has("expert_group_count") ? u("expert_group_count") : 1;
  j["topk_group"] = has("expert_group_used_count") ? u("expert_group_used_count") : 1;
  // llama.cpp: no weights scale means 1, no weights norm means off.
  j["routed_scaling_factor"] = has("expert_weights_scale") ? num("expert_weights_scale") : 1.0;
  j["norm_topk_prob"] = has("expert_weights_norm") && f.get(a + "expert_weights_norm").as_u64(a + "expert_weights_norm") != 0;
  if (!has("expert_gating_func"))
    unsupported("expert_gating_func", "is absent: llama.cpp then routes with softmax (DeepSeek-V2), which hmoe's DeepSeek model does not (sigmoid only)");
  if (const uint64_t g = u("expert_gating_func"); g != 2)
    unsupported("expert_gating_func", "is " + std::to_string(g) + " (" + (g == 1 ? "softmax" : g == 4 ? "sqrt-softplus" : "unknown") +
                                          "); hmoe's DeepSeek model routes with sigmoid (2) only");
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  if (has("nextn_predict_layers") && u("nextn_predict_layers") != 0)
    unsupported("nextn_predict_layers", "is " + std::to_string(u("nextn_predict_layers")) + ": multi-token prediction layers are not supported");

  // Latent attention dimensions.
  const uint64_t kv_lora = u("attention.kv_lora_rank"), rope = u("rope.dimension_count");
  j["kv_lora_rank"] = kv_lora;
  j["qk_rope_head_dim"] = rope;
  if (has("attention.q_lora_rank") && u("attention.q_lora_rank") > 0) j["q_lora_rank"] = u("attention.q_lora_rank");
  else j["q_lora_rank"] = nullptr;
  uint64_t qk, v;
  if (has("attention.key_length_mla")) {  // current converters: key/value_length are the MQA view's
    qk = u("attention.key_length_mla");
    v = u("attention.value_length_mla");
    if (has("attention.key_length") && u("attention.key_length") != kv_lora + rope)
      bad("attention.key_length", "is " + std::to_string(u("attention.key_length")) + ", expected kv_lora_rank + rope dimensions (" +
                                      std::to_string(kv_lora + rope) + ") beside key_length_mla");
    if (has("attention.value_length") && u("attention.value_length") != kv_lora)
      bad("attention.value_length", "is " + std::to_string(u("attention.value_length")) + ", expected kv_lora_rank (" + std::to_string(kv_lora) +
                                        ") beside value_length_mla");
  } else {
    qk = u("attention.key_length");
    v = u("attention.value_length");
  }
  if (qk <= rope) bad(has("attention.key_length_mla") ? "attention.key_length_mla" : "attention.key_length",
                      "(" + std::to_string(qk) + ") must exceed rope.dimension_count (" + std::to_string(rope) + ")");
  j["qk_nope_head_dim"] = qk - rope;
  j["v_head_dim"] = v;

  j["rms_norm_eps"] = num("attention.layer_norm_rms_epsilon");
  if (has("rope.freq_base")) j["rope_theta"] = num("rope.freq_base");
  if (has("context_length")) j["max_position_embeddings"] = u("context_length");
  if (has("rope.scaling.type")) {
    const std::string type(f.get(a + "rope.scaling.type").as_string(a + "rope.scaling.type"));
    if (type == "yarn") {
      nlohmann::json rs;
      rs["type"] = "yarn";
      rs["factor"] = num("rope.scaling.factor");
      rs["original_max_position_embeddings"] = u("rope.scaling.original_context_length");
      if (has("rope.scaling.yarn_beta_fast")) rs["beta_fast"] = num("rope.scaling.yarn_beta_fast");
      if (has("rope.scaling.yarn_beta_slow")) rs["beta_slow"] = num("rope.scaling.yarn_beta_slow");
      if (has("rope.scaling.yarn_attn_factor")) rs["attention_factor"] = num("rope.scaling.yarn_attn_factor");
      if (has("rope.scaling.yarn_ext_factor") && num("rope.scaling.yarn_ext_factor") != 1.0)
        unsupported("rope.scaling.yarn_ext_factor", "is " + std::to_string(num("rope.scaling.yarn_ext_factor")) + " (only 1 is supported)");
      // The converter stores 0.1 * mscale_all_dim; DeepSeek's configs have mscale == mscale_all_dim.
      const double mscale = has("rope.scaling.yarn_log_multiplier") ? num("rope.scaling.yarn_log_multiplier") / 0.1 : 0.0;
      rs["mscale"] = mscale;
      rs["mscale_all_dim"] = mscale;
      j["rope_scaling"] = rs;
    } else if (type != "none") {
      unsupported("rope.scaling.type", "is '" + type + "'; DeepSeek-V3 models use yarn (or none)");
    }
  }
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (const io::GgufValue* x = f.find("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = x->as_u64("tokenizer.ggml.eos_token_id");
  if (const io::GgufValue* x = f.find("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = x->as_u64("tokenizer.ggml.bos_token_id");
  // noaux_tc needs each MoE layer's score-correction bias.
  const uint64_t layers = u("block_count");
  for (uint64_t l = dense; l < layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".exp_probs_b.bias";
    if (!f.find_tensor(b))
      fail(ErrorKind::unsupported, f.path() + ": tensor '" + b + "' (the routing's score-correction bias) is missing; hmoe routes DeepSeek "
                                              "models with it (noaux_tc)");
  }
  return j;
}

}  // namespace hmoe
