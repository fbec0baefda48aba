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

enum class Arch { qwen3_moe, qwen3_moe_engram, deepseek_v3 };

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

  // True when layer `l` has a routed-experts block (else a dense MLP).
  bool is_moe_layer(int64_t l) const;

  static ModelConfig from_dir(const std::string& dir);
  // `where` names the source in messages (usually the config.json path).
  static ModelConfig from_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace hmoe
