// ModelConfig: the architecture hyper-parameters read from a Hugging Face
// config.json, with the published defaults of each model_type for absent
// fields. The model graph is composed from this struct alone.
//
// Contract: from_dir/from_json validate everything the graph relies on
// (positive sizes, divisibility, ranges) and throw hmoe::Error(bad_model)
// naming config.json and the field; unknown model_type is unsupported.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hmoe {

enum class Arch { qwen3_moe, qwen3_moe_engram, deepseek_v3, qwen3_next };

// The `engram` block of a qwen3_moe_engram config.json: n-gram memory (PLE)
// modules inserted before the layers in layer_ids (see engine/layers/engram.h).
struct EngramConfig {
  std::vector<int64_t> layer_ids;  // empty: no modules
  int64_t max_ngram_size = 3;
  int64_t n_embed_per_ngram = 0;
  int64_t n_head_per_ngram = 0;
  int64_t kernel_size = 4;
  int64_t pad_id = 0;
  std::vector<int64_t> engram_vocab_size;
  double norm_eps = 1.1920928955078125e-07;
  double conv_norm_eps = 1e-5;
};

// The DeepSeek-V3 / Kimi-K2 fields of a deepseek_v3 config.json (defaults:
// transformers' DeepseekV3Config). Multi-head latent attention, group-limited
// sigmoid routing with shared experts, and yarn rope scaling.
struct MlaConfig {
  int64_t q_lora_rank = 1536;  // 0: a plain q_proj (DeepSeek-V2-Lite style)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  bool rope_interleave = true;  // rope on (even, odd) pairs, as the published weights expect
  int64_t n_shared_experts = 1;
  int64_t n_group = 8;
  int64_t topk_group = 4;
  double routed_scaling_factor = 2.5;
  int64_t first_k_dense_replace = 3;
  int64_t moe_layer_freq = 1;
  // rope_scaling: type "yarn" or none (empty).
  std::string rope_scaling_type;
  double yarn_factor = 1.0;
  int64_t yarn_original_max_position_embeddings = 4096;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  double yarn_mscale = 0.0, yarn_mscale_all_dim = 0.0;  // 0: absent
  double yarn_attention_factor = 0.0;                   // 0: absent (derived from mscale)
  bool yarn_truncate = true;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Floats the KV cache keeps per token and layer: the latent and the rope key.
  int64_t kv_token_floats() const { return kv_lora_rank + qk_rope_head_dim; }
};

// The Qwen3-Next fields of a qwen3_next config.json (defaults:
// transformers' Qwen3NextConfig): which layers are Gated DeltaNet (linear
// attention) and which gated full attention, the DeltaNet's shapes, partial
// rotary embeddings, the sigmoid-gated shared expert and the MTP head.
struct HybridConfig {
  std::vector<bool> full_attention;  // per layer: true = full_attention, false = linear_attention
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  double partial_rotary_factor = 0.25;
  int64_t shared_expert_intermediate_size = 512;
  int64_t mtp_layers = 1;  // num_nextn_predict_layers (the mtp.* weights, when the checkpoint has them)

  int64_t key_dim() const { return linear_key_head_dim * linear_num_key_heads; }
  int64_t value_dim() const { return linear_value_head_dim * linear_num_value_heads; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Per sequence and linear-attention layer, the bytes of its recurrent
  // state (engine/layers/gated_deltanet.h): a 64-byte header (tokens
  // consumed), the conv window ((K - 1) x conv_dim) and the delta-rule state
  // (value heads x key_head_dim x value_head_dim), fp32, 64-byte aligned.
  int64_t state_bytes_per_layer() const {
    const int64_t floats = (linear_conv_kernel_dim - 1) * conv_dim() + linear_num_value_heads * linear_key_head_dim * linear_value_head_dim;
    return 64 + (floats * 4 + 63) / 64 * 64;
  }
};

struct ModelConfig {
  Arch arch = Arch::qwen3_moe;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each routed expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 32768;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::vector<int64_t> eos_token_ids;  // config.json, then generation_config.json
  int64_t bos_token_id = -1;
  std::string torch_dtype = "bfloat16";
  // Stored bytes per routed-expert weight when the checkpoint says (GGUF:
  // its *_exps tensors, e.g. 1.0625 for Q8_0); 0: from torch_dtype.
  double expert_bytes_per_weight = 0;
  // Device bytes per routed-expert weight when resident experts stay
  // quantized on the GPU (engine/layers/gpu_experts.h); 0: bf16 (2).
  double gpu_expert_bytes_per_weight = 0;
  EngramConfig engram;  // qwen3_moe_engram only
  MlaConfig mla;        // deepseek_v3 only (num_experts holds n_routed_experts)
  HybridConfig hybrid;  // qwen3_next only

  // True when layer `l` has a routed-experts block (else a dense MLP).
  bool is_moe_layer(int64_t l) const;

  static ModelConfig from_dir(const std::string& dir);
  // `where` names the source in messages (usually the config.json path).
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace hmoe
