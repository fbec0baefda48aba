#include "engine/model_config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "io/mmap_file.h"

namespace hmoe {

namespace {

struct Reader {
  const nlohmann::json& j;
  const std::string& where;

  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    fail(ErrorKind::bad_model, where + ": field '" + field + "' " + what);
  }
  bool has(const char* f) const { return j.contains(f) && !j[f].is_null(); }
  int64_t integer(const char* f, int64_t def, int64_t min = 1) const {
    if (!has(f)) return def;
    const auto& v = j[f];
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))))
      bad(f, "must be an integer, got " + v.dump());
    int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    if (x < min) bad(f, "must be at least " + std::to_string(min) + ", got " + std::to_string(x));
    if (x > (int64_t{1} << 40)) bad(f, "is absurdly large: " + std::to_string(x));
    return x;
  }
  int64_t required(const char* f, int64_t min = 1) const {
    if (!has(f)) bad(f, "is missing");
    return integer(f, 0, min);
  }
  double number(const char* f, double def) const {
    if (!has(f)) return def;
    if (!j[f].is_number()) bad(f, "must be a number, got " + j[f].dump());
    return j[f].get<double>();
  }
  bool boolean(const char* f, bool def) const {
    if (!has(f)) return def;
    if (!j[f].is_boolean()) bad(f, "must be true or false, got " + j[f].dump());
    return j[f].get<bool>();
  }
  std::string string(const char* f, const std::string& def) const {
    if (!has(f)) return def;
    if (!j[f].is_string()) bad(f, "must be a string, got " + j[f].dump());
    return j[f].get<std::string>();
  }
  std::vector<int64_t> int_list(const char* f) const {
    std::vector<int64_t> out;
    if (!has(f)) return out;
    const auto& v = j[f];
    if (v.is_number_integer()) return {v.get<int64_t>()};
    if (!v.is_array()) bad(f, "must be an integer or a list of integers, got " + v.dump());
    for (const auto& e : v) {
      if (!e.is_number_integer()) bad(f, "must hold integers only, got " + e.dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
};

}  // namespace

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) != mlp_only_layers.end()) return false;
  return num_experts > 0 && (l + 1) % decoder_sparse_step == 0;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(ErrorKind::bad_model, where + ": not a JSON object");
  Reader r{j, where};
  ModelConfig c;
  c.model_type = r.string("model_type", "");
  if (c.model_type.empty()) fail(ErrorKind::bad_model, where + ": field 'model_type' is missing");
  if (c.model_type == "qwen3_moe") c.arch = Arch::qwen3_moe;
  else if (c.model_type == "qwen3_moe_engram") c.arch = Arch::qwen3_moe_engram;
  else if (c.model_type == "deepseek_v3") c.arch = Arch::deepseek_v3;
  else
    fail(ErrorKind::unsupported, where + ": model_type '" + c.model_type + "' is not supported (supported: qwen3_moe)");

  // Defaults are those of transformers' Qwen3MoeConfig.
  c.vocab_size = r.integer("vocab_size", 151936);
  c.hidden_size = r.integer("hidden_size", 2048);
  c.intermediate_size = r.integer("intermediate_size", 6144);
  c.moe_intermediate_size = r.integer("moe_intermediate_size", 768);
  c.num_hidden_layers = r.integer("num_hidden_layers", 24);
  c.num_attention_heads = r.integer("num_attention_heads", 32);
  c.num_key_value_heads = r.integer("num_key_value_heads", 4);
  c.head_dim = r.integer("head_dim", c.hidden_size / c.num_attention_heads);
  c.num_experts = r.integer("num_experts", 128, 0);
  c.num_experts_per_tok = r.integer("num_experts_per_tok", 8);
  c.norm_topk_prob = r.boolean("norm_topk_prob", false);
  c.decoder_sparse_step = r.integer("decoder_sparse_step", 1);
  c.mlp_only_layers = r.int_list("mlp_only_layers");
  c.hidden_act = r.string("hidden_act", "silu");
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.rope_theta = r.number("rope_theta", 10000.0);
  if (r.has("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("rope_theta") &&
      j["rope_parameters"]["rope_theta"].is_number())
    c.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();
  c.max_position_embeddings = r.integer("max_position_embeddings", 32768);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.attention_bias = r.boolean("attention_bias", false);
  c.eos_token_ids = r.int_list("eos_token_id");
  c.bos_token_id = r.has("bos_token_id") ? r.integer("bos_token_id", -1, 0) : -1;
  c.torch_dtype = r.string("torch_dtype", r.string("dtype", "bfloat16"));

  if (c.hidden_act != "silu") r.bad("hidden_act", "'" + c.hidden_act + "' is not supported (only silu)");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) + ") must divide num_attention_heads (" +
                                     std::to_string(c.num_attention_heads) + ")");
  if (c.head_dim % 2 != 0) r.bad("head_dim", "must be even for rotary embeddings");
  if (c.num_experts > 0 && c.num_experts_per_tok > c.num_experts)
    r.bad("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) + ") exceeds num_experts (" + std::to_string(c.num_experts) + ")");
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1)) r.bad("rms_norm_eps", "must be in (0, 1)");
  if (!(c.rope_theta > 1)) r.bad("rope_theta", "must be greater than 1");
  for (auto l : c.mlp_only_layers)
    if (l < 0 || l >= c.num_hidden_layers) r.bad("mlp_only_layers", "names layer " + std::to_string(l) + ", outside 0.." + std::to_string(c.num_hidden_layers - 1));
  for (auto e : c.eos_token_ids)
    if (e < 0 || e >= c.vocab_size) r.bad("eos_token_id", std::to_string(e) + " is outside the vocabulary");
  return c;
}

ModelConfig ModelConfig::from_dir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!io::file_exists(path)) fail(ErrorKind::bad_model, path + ": missing (is '" + dir + "' a Hugging Face model directory?)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::bad_model, path + ": not valid JSON: " + e.what());
  }
  ModelConfig c = from_json(j, path);
  const std::string gen = dir + "/generation_config.json";
  if (io::file_exists(gen)) {
    try {
      auto g = nlohmann::json::parse(io::read_text_file(gen));
      if (g.is_object()) {
        Reader gr{g, gen};
        auto eos = gr.int_list("eos_token_id");
        for (auto e : eos)
          if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), e) == c.eos_token_ids.end() && e >= 0 && e < c.vocab_size)
            c.eos_token_ids.push_back(e);
      }
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::bad_model, gen + ": not valid JSON: " + e.what());
    }
  }
  return c;
}

}  // namespace hmoe
