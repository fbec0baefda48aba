#include "engine/loading/model_config.h"

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

// DeepSeek-V3 / Kimi-K2: re-reads the shared fields with DeepseekV3Config's
// defaults, then the MLA, routing and yarn fields, and validates them.
void read_deepseek_v3(const Reader& r, ModelConfig& c) {
  const nlohmann::json& j = r.j;
  MlaConfig& m = c.mla;
  c.vocab_size = r.integer("vocab_size", 129280);
  c.hidden_size = r.integer("hidden_size", 7168);
  c.intermediate_size = r.integer("intermediate_size", 18432);
  c.moe_intermediate_size = r.integer("moe_intermediate_size", 2048);
  c.num_hidden_layers = r.integer("num_hidden_layers", 61);
  c.num_attention_heads = r.integer("num_attention_heads", 128);
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  c.num_experts = r.integer("n_routed_experts", 256);
  c.num_experts_per_tok = r.integer("num_experts_per_tok", 8);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  c.max_position_embeddings = r.integer("max_position_embeddings", 4096);
  if (!r.has("bos_token_id")) c.bos_token_id = 0;
  if (!r.has("eos_token_id")) c.eos_token_ids = {1};
  // A null q_lora_rank means a plain q_proj.
  m.q_lora_rank = j.contains("q_lora_rank") && j["q_lora_rank"].is_null() ? 0 : r.integer("q_lora_rank", 1536, 0);
  m.kv_lora_rank = r.integer("kv_lora_rank", 512);
  m.qk_nope_head_dim = r.integer("qk_nope_head_dim", 128);
  m.qk_rope_head_dim = r.integer("qk_rope_head_dim", 64);
  m.v_head_dim = r.integer("v_head_dim", 128);
  m.rope_interleave = r.boolean("rope_interleave", true);
  m.n_shared_experts = r.integer("n_shared_experts", 1, 0);
  m.n_group = r.integer("n_group", 8);
  m.topk_group = r.integer("topk_group", 4);
  m.routed_scaling_factor = r.number("routed_scaling_factor", 2.5);
  m.first_k_dense_replace = r.integer("first_k_dense_replace", 3, 0);
  m.moe_layer_freq = r.integer("moe_layer_freq", 1);
  c.head_dim = m.qk_rope_head_dim;  // as DeepseekV3Config sets it: the rotary dimension

  if (m.qk_rope_head_dim % 2 != 0) r.bad("qk_rope_head_dim", "must be even for rotary embeddings");
  if (c.num_key_value_heads != c.num_attention_heads)
    r.bad("num_key_value_heads", "must equal num_attention_heads for multi-head latent attention");
  if (c.num_experts % m.n_group != 0)
    r.bad("n_group", "(" + std::to_string(m.n_group) + ") must divide n_routed_experts (" + std::to_string(c.num_experts) + ")");
  if (m.topk_group > m.n_group)
    r.bad("topk_group", "(" + std::to_string(m.topk_group) + ") exceeds n_group (" + std::to_string(m.n_group) + ")");
  if (c.num_experts_per_tok > m.topk_group * (c.num_experts / m.n_group))
    r.bad("num_experts_per_tok", "(" + std::to_string(c.num_experts_per_tok) + ") exceeds the experts of topk_group groups (" +
                                     std::to_string(m.topk_group * (c.num_experts / m.n_group)) + ")");
  if (!(m.routed_scaling_factor > 0 && m.routed_scaling_factor < 1e6)) r.bad("routed_scaling_factor", "must be positive");
  if (m.first_k_dense_replace > c.num_hidden_layers) r.bad("first_k_dense_replace", "exceeds num_hidden_layers");
  const std::string scoring = r.string("scoring_func", "sigmoid"), method = r.string("topk_method", "noaux_tc");
  if (scoring != "sigmoid") fail(ErrorKind::unsupported, r.where + ": scoring_func '" + scoring + "' is not supported (only sigmoid)");
  if (method != "noaux_tc") fail(ErrorKind::unsupported, r.where + ": topk_method '" + method + "' is not supported (only noaux_tc)");

  // rope_scaling (transformers 4) or rope_parameters (transformers 5).
  const char* rs_field = r.has("rope_scaling") ? "rope_scaling" : r.has("rope_parameters") ? "rope_parameters" : nullptr;
  if (!rs_field) return;
  if (!j[rs_field].is_object()) r.bad(rs_field, "must be an object, got " + j[rs_field].dump());
  const std::string rw = r.where + " (" + rs_field + ")";
  Reader s{j[rs_field], rw};
  const std::string type = s.string("rope_type", s.string("type", "default"));
  if (type == "default") return;
  if (type != "yarn") fail(ErrorKind::unsupported, rw + ": rope type '" + type + "' is not supported for deepseek_v3 (only yarn)");
  m.rope_scaling_type = type;
  m.yarn_original_max_position_embeddings = s.integer("original_max_position_embeddings", c.max_position_embeddings);
  m.yarn_factor = s.has("factor") ? s.number("factor", 1.0)
                                  : static_cast<double>(c.max_position_embeddings) / static_cast<double>(m.yarn_original_max_position_embeddings);
  m.yarn_beta_fast = s.number("beta_fast", 32.0);
  m.yarn_beta_slow = s.number("beta_slow", 1.0);
  if (m.yarn_beta_fast == 0) m.yarn_beta_fast = 32.0;  // transformers: `or 32`
  if (m.yarn_beta_slow == 0) m.yarn_beta_slow = 1.0;
  m.yarn_mscale = s.number("mscale", 0.0);
  m.yarn_mscale_all_dim = s.number("mscale_all_dim", 0.0);
  m.yarn_attention_factor = s.number("attention_factor", 0.0);
  m.yarn_truncate = s.boolean("truncate", true);
  if (!(m.yarn_factor > 0 && m.yarn_factor < 1e6)) s.bad("factor", "must be positive");
  if (!(m.yarn_beta_fast > 0) || !(m.yarn_beta_slow > 0)) s.bad("beta_fast", "and beta_slow must be positive");
  if (m.yarn_attention_factor < 0) s.bad("attention_factor", "must be positive");
}

// Qwen3-Next: re-reads the shared fields with Qwen3NextConfig's defaults,
// then the layer kinds (layer_types, or full_attention_interval: every n-th
// layer full attention), the DeltaNet shapes and the rope fields.
void read_qwen3_next(const Reader& r, ModelConfig& c) {
  const nlohmann::json& j = r.j;
  HybridConfig& h = c.hybrid;
  c.hidden_size = r.integer("hidden_size", 2048);
  c.intermediate_size = r.integer("intermediate_size", 5632);
  c.moe_intermediate_size = r.integer("moe_intermediate_size", 512);
  c.num_hidden_layers = r.integer("num_hidden_layers", 48);
  c.num_attention_heads = r.integer("num_attention_heads", 16);
  c.num_key_value_heads = r.integer("num_key_value_heads", 2);
  c.head_dim = r.integer("head_dim", 256);
  c.num_experts = r.integer("num_experts", 512, 0);
  c.num_experts_per_tok = r.integer("num_experts_per_tok", 10);
  c.norm_topk_prob = r.boolean("norm_topk_prob", true);
  h.linear_conv_kernel_dim = r.integer("linear_conv_kernel_dim", 4);
  h.linear_key_head_dim = r.integer("linear_key_head_dim", 128);
  h.linear_value_head_dim = r.integer("linear_value_head_dim", 128);
  h.linear_num_key_heads = r.integer("linear_num_key_heads", 16);
  h.linear_num_value_heads = r.integer("linear_num_value_heads", 32);
  h.shared_expert_intermediate_size = r.integer("shared_expert_intermediate_size", 512, 0);
  h.mtp_layers = r.integer("num_nextn_predict_layers", 1, 0);
  if (h.linear_num_value_heads % h.linear_num_key_heads != 0)
    r.bad("linear_num_value_heads", "(" + std::to_string(h.linear_num_value_heads) + ") must be a multiple of linear_num_key_heads (" +
                                         std::to_string(h.linear_num_key_heads) + ")");
  if (h.linear_conv_kernel_dim > 64) r.bad("linear_conv_kernel_dim", "is too large (at most 64)");

  const int64_t L = c.num_hidden_layers;
  std::vector<bool> from_interval;
  if (r.has("full_attention_interval")) {
    const int64_t n = r.integer("full_attention_interval", 4);
    for (int64_t l = 0; l < L; ++l) from_interval.push_back((l + 1) % n == 0);
  }
  if (r.has("layer_types")) {
    const auto& v = j["layer_types"];
    if (!v.is_array()) r.bad("layer_types", "must be a list of \"linear_attention\" / \"full_attention\", got " + v.dump());
    if (static_cast<int64_t>(v.size()) != L)
      r.bad("layer_types", "has " + std::to_string(v.size()) + " entries but num_hidden_layers is " + std::to_string(L));
    for (size_t l = 0; l < v.size(); ++l) {
      const std::string t = v[l].is_string() ? v[l].get<std::string>() : v[l].dump();
      if (t != "linear_attention" && t != "full_attention")
        r.bad("layer_types", "entry " + std::to_string(l) + " is " + (v[l].is_string() ? "'" + t + "'" : t) +
                                 " (expected linear_attention or full_attention)");
      h.full_attention.push_back(t == "full_attention");
    }
    if (!from_interval.empty() && from_interval != h.full_attention)
      r.bad("layer_types", "disagrees with full_attention_interval (" + j["full_attention_interval"].dump() + ")");
  } else {
    h.full_attention = from_interval;
    if (h.full_attention.empty())
      for (int64_t l = 0; l < L; ++l) h.full_attention.push_back((l + 1) % 4 == 0);  // transformers' default interval
  }

  // Rope: rope_theta and partial_rotary_factor at the top (transformers 4
  // configs, the published checkpoint) or in rope_parameters (transformers 5).
  c.rope_theta = r.number("rope_theta", 10000.0);
  h.partial_rotary_factor = r.number("partial_rotary_factor", 0.25);
  for (const char* f : {"rope_parameters", "rope_scaling"}) {
    if (!r.has(f)) continue;
    if (!j[f].is_object()) r.bad(f, "must be an object, got " + j[f].dump());
    const std::string fw = r.where + " (" + f + ")";
    Reader s{j[f], fw};
    const std::string type = s.string("rope_type", s.string("type", "default"));
    if (type != "default") fail(ErrorKind::unsupported, fw + ": rope type '" + type + "' is not supported for qwen3_next (only default)");
    c.rope_theta = s.number("rope_theta", c.rope_theta);
    h.partial_rotary_factor = s.number("partial_rotary_factor", h.partial_rotary_factor);
  }
  if (!(h.partial_rotary_factor > 0 && h.partial_rotary_factor <= 1)) r.bad("partial_rotary_factor", "must be in (0, 1]");
  const auto rot = static_cast<int64_t>(static_cast<double>(c.head_dim) * h.partial_rotary_factor);
  if (rot < 2 || rot % 2 != 0)
    r.bad("partial_rotary_factor", "gives " + std::to_string(rot) + " rotary dimensions of head_dim " + std::to_string(c.head_dim) + " (must be even, >= 2)");
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t l) const {
  if (arch == Arch::deepseek_v3) return num_experts > 0 && l >= mla.first_k_dense_replace && l % mla.moe_layer_freq == 0;
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
  else if (c.model_type == "deepseek_v3" || c.model_type == "kimi_k2") c.arch = Arch::deepseek_v3;
  else if (c.model_type == "qwen3_next") c.arch = Arch::qwen3_next;
  else
    fail(ErrorKind::unsupported,
         where + ": model_type '" + c.model_type + "' is not supported (supported: qwen3_moe, qwen3_moe_engram, deepseek_v3, kimi_k2, qwen3_next)");

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
  if (c.arch == Arch::deepseek_v3) read_deepseek_v3(r, c);
  if (c.arch == Arch::qwen3_next) read_qwen3_next(r, c);

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
  if (c.arch == Arch::qwen3_moe_engram) {
    if (!r.has("engram") || !j["engram"].is_object()) r.bad("engram", "is missing or not an object (model_type qwen3_moe_engram needs it)");
    const std::string ew = where + " (engram)";
    Reader e{j["engram"], ew};
    EngramConfig& g = c.engram;
    g.layer_ids = e.int_list("layer_ids");
    g.max_ngram_size = e.integer("max_ngram_size", 3, 2);
    g.n_embed_per_ngram = e.required("n_embed_per_ngram");
    g.n_head_per_ngram = e.required("n_head_per_ngram");
    g.kernel_size = e.integer("kernel_size", 4);
    g.pad_id = e.required("pad_id", 0);
    g.engram_vocab_size = e.int_list("engram_vocab_size");
    g.norm_eps = e.number("norm_eps", g.norm_eps);
    g.conv_norm_eps = e.number("conv_norm_eps", g.conv_norm_eps);
    if (g.layer_ids.empty()) e.bad("layer_ids", "must name at least one layer");
    for (size_t i = 0; i < g.layer_ids.size(); ++i) {
      if (g.layer_ids[i] < 0 || g.layer_ids[i] >= c.num_hidden_layers)
        e.bad("layer_ids", "names layer " + std::to_string(g.layer_ids[i]) + ", outside 0.." + std::to_string(c.num_hidden_layers - 1));
      if (std::find(g.layer_ids.begin(), g.layer_ids.begin() + static_cast<std::ptrdiff_t>(i), g.layer_ids[i]) != g.layer_ids.begin() + static_cast<std::ptrdiff_t>(i))
        e.bad("layer_ids", "names layer " + std::to_string(g.layer_ids[i]) + " twice");
    }
    if (g.n_embed_per_ngram % g.n_head_per_ngram != 0) e.bad("n_embed_per_ngram", "must be a multiple of n_head_per_ngram");
    if (g.pad_id >= c.vocab_size) e.bad("pad_id", std::to_string(g.pad_id) + " is outside the vocabulary");
    if (!(g.norm_eps > 0 && g.norm_eps < 1)) e.bad("norm_eps", "must be in (0, 1)");
    if (!(g.conv_norm_eps > 0 && g.conv_norm_eps < 1)) e.bad("conv_norm_eps", "must be in (0, 1)");
  }
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
