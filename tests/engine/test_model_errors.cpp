// Bad model directories and bad token ids: each is an Error that names the
// file and the problem; nothing crashes.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "io/safetensors_writer.h"
#include "tests/test_util.h"

using namespace hmoe;
using nlohmann::json;

namespace {

json small_config() {
  return json{{"model_type", "qwen3_moe"}, {"vocab_size", 64}, {"hidden_size", 16}, {"intermediate_size", 24},
              {"moe_intermediate_size", 8}, {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"num_key_value_heads", 1},
              {"head_dim", 8}, {"num_experts", 4}, {"num_experts_per_tok", 2}, {"norm_topk_prob", true},
              {"mlp_only_layers", {1}}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"max_position_embeddings", 128},
              {"eos_token_id", 1}};
}

io::TensorToWrite bf16(const std::string& name, std::vector<int64_t> shape, std::mt19937& rng) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  io::TensorToWrite t{name, DType::bf16, shape, std::vector<uint8_t>(static_cast<size_t>(n) * 2)};
  std::normal_distribution<float> nd(0.0f, 0.3f);
  for (int64_t i = 0; i < n; ++i) reinterpret_cast<uint16_t*>(t.bytes.data())[i] = f32_to_bf16(nd(rng) + (shape.size() == 1 ? 1.0f : 0.0f));
  return t;
}

std::vector<io::TensorToWrite> small_tensors(const json& c) {
  std::mt19937 rng(7);
  const int64_t V = c["vocab_size"], H = c["hidden_size"], nh = c["num_attention_heads"], kvh = c["num_key_value_heads"], hd = c["head_dim"],
                E = c["num_experts"], I = c["moe_intermediate_size"], D = c["intermediate_size"];
  std::vector<io::TensorToWrite> t;
  t.push_back(bf16("model.embed_tokens.weight", {V, H}, rng));
  t.push_back(bf16("model.norm.weight", {H}, rng));
  t.push_back(bf16("lm_head.weight", {V, H}, rng));
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back(bf16(p + "input_layernorm.weight", {H}, rng));
    t.push_back(bf16(p + "post_attention_layernorm.weight", {H}, rng));
    t.push_back(bf16(p + "self_attn.q_proj.weight", {nh * hd, H}, rng));
    t.push_back(bf16(p + "self_attn.k_proj.weight", {kvh * hd, H}, rng));
    t.push_back(bf16(p + "self_attn.v_proj.weight", {kvh * hd, H}, rng));
    t.push_back(bf16(p + "self_attn.o_proj.weight", {H, nh * hd}, rng));
    t.push_back(bf16(p + "self_attn.q_norm.weight", {hd}, rng));
    t.push_back(bf16(p + "self_attn.k_norm.weight", {hd}, rng));
    if (l == 0) {
      t.push_back(bf16(p + "mlp.gate.weight", {E, H}, rng));
      for (int e = 0; e < E; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        t.push_back(bf16(ep + "gate_proj.weight", {I, H}, rng));
        t.push_back(bf16(ep + "up_proj.weight", {I, H}, rng));
        t.push_back(bf16(ep + "down_proj.weight", {H, I}, rng));
      }
    } else {
      t.push_back(bf16(p + "mlp.gate_proj.weight", {D, H}, rng));
      t.push_back(bf16(p + "mlp.up_proj.weight", {D, H}, rng));
      t.push_back(bf16(p + "mlp.down_proj.weight", {H, D}, rng));
    }
  }
  return t;
}

void write_model(const std::string& dir, const json& config, const std::vector<io::TensorToWrite>& tensors) {
  test::write_file(dir + "/config.json", config.dump());
  io::write_safetensors(dir + "/model.safetensors", tensors);
}

std::unique_ptr<Model> load(const std::string& dir) {
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.threads = 2;
  return Model::load(dir, s);
}

void expect_load_error(const std::string& dir, const std::string& needle) {
  try {
    load(dir);
    FAIL("no error (expected '" << needle << "')");
  } catch (const Error& e) {
    CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("a small valid checkpoint (MoE + dense layer) loads and runs") {
  test::TempDir d("model");
  write_model(d.str(), small_config(), small_tensors(small_config()));
  auto m = load(d.str());
  CHECK(m->config().is_moe_layer(0));
  CHECK_FALSE(m->config().is_moe_layer(1));
  KvCache kv(m->kv_layout(), 4, 16);
  int seq = kv.add_sequence();
  kv.reserve(seq, 3);
  Batch b;
  b.add(5, seq, 0, false);
  b.add(17, seq, 1, false);
  b.add(63, seq, 2, true);
  std::vector<float> logits;
  m->forward(b, kv, logits);
  REQUIRE(logits.size() == 64);
  for (float x : logits) CHECK(std::isfinite(x));
}

TEST_CASE("token ids outside the vocabulary are rejected") {
  test::TempDir d("model");
  write_model(d.str(), small_config(), small_tensors(small_config()));
  auto m = load(d.str());
  KvCache kv(m->kv_layout(), 4, 16);
  int seq = kv.add_sequence();
  kv.reserve(seq, 2);
  std::vector<float> logits;
  for (int32_t bad : {64, -1, 1 << 30}) {
    Batch b;
    b.add(bad, seq, 0, true);
    try {
      m->forward(b, kv, logits);
      FAIL("no error for id " << bad);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
      CHECK(std::string(e.what()).find("outside the vocabulary") != std::string::npos);
    }
  }
}

TEST_CASE("bad config.json") {
  test::TempDir d("cfg");
  expect_load_error(d.str(), "config.json: missing");
  test::write_file(d.str() + "/config.json", "{\"model_type\": ");
  expect_load_error(d.str(), "not valid JSON");
  auto c = small_config();
  c["model_type"] = "gpt_unknown";
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "'gpt_unknown' is not supported");
  c = small_config();
  c.erase("model_type");
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "model_type");
  c = small_config();
  c["hidden_size"] = "sixteen";
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "'hidden_size' must be an integer");
  c = small_config();
  c["num_key_value_heads"] = 3;
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "num_key_value_heads");
  c = small_config();
  c["num_experts_per_tok"] = 9;
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "exceeds num_experts");
  c = small_config();
  c["hidden_size"] = -4;
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "at least");
  c = small_config();
  c["mlp_only_layers"] = {7};
  test::write_file(d.str() + "/config.json", c.dump());
  expect_load_error(d.str(), "mlp_only_layers");
}

TEST_CASE("missing, unexpected, misshapen and wrongly typed tensors") {
  const json c = small_config();
  {
    test::TempDir d("t");
    auto t = small_tensors(c);
    t.erase(t.begin() + 5);  // a layer-0 attention weight
    write_model(d.str(), c, t);
    expect_load_error(d.str(), "missing tensor 'model.layers.0.");
  }
  {
    test::TempDir d("t");
    auto t = small_tensors(c);
    std::mt19937 rng(1);
    t.push_back(bf16("model.layers.0.mlp.experts.99.up_proj.weight", {8, 16}, rng));
    write_model(d.str(), c, t);
    expect_load_error(d.str(), "unexpected tensor 'model.layers.0.mlp.experts.99.up_proj.weight'");
  }
  {
    test::TempDir d("t");
    auto t = small_tensors(c);
    std::mt19937 rng(1);
    t[0] = bf16("model.embed_tokens.weight", {64, 15}, rng);
    write_model(d.str(), c, t);
    expect_load_error(d.str(), "has shape [64, 15], expected [64, 16]");
  }
  {
    test::TempDir d("t");
    auto t = small_tensors(c);
    t[1].dtype = DType::i16;
    write_model(d.str(), c, t);
    expect_load_error(d.str(), "dtype I16");
  }
  {
    test::TempDir d("t");
    write_model(d.str(), c, small_tensors(c));
    std::string bytes = test::read_file(d.str() + "/model.safetensors");
    test::write_file(d.str() + "/model.safetensors", bytes.substr(0, bytes.size() / 2));
    expect_load_error(d.str(), "truncated");
  }
  {
    test::TempDir d("t");
    test::write_file(d.str() + "/config.json", c.dump());
    expect_load_error(d.str(), "no model.safetensors.index.json and no .safetensors files");
  }
}
