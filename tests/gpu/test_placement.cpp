// Placement parsing and planning: CPU-only, always run.
#include <doctest/doctest.h>

#include <cstdlib>

#include "configs/error.h"
#include "engine/placement/placement.h"

using namespace hmoe;

namespace {

std::string error_of(const std::string& v, int64_t layers = 16) {
  try {
    parse_layer_spec("HMOE_GPU_RESIDENT_MOE_LAYERS", v, layers);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    return e.what();
  }
  return "";
}

ModelConfig qwen3_30b_like() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.moe_intermediate_size = 768;
  c.num_hidden_layers = 48;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.max_position_embeddings = 4096;
  return c;
}

}  // namespace

TEST_CASE("layer specs: ranges, lists, keywords") {
  auto s = parse_layer_spec("X", "0-3,10,12-15", 16);
  CHECK(s.mode == LayerSpec::Mode::list);
  CHECK(s.layers == std::vector<int64_t>{0, 1, 2, 3, 10, 12, 13, 14, 15});
  CHECK(parse_layer_spec("X", " 5 , 1-2 ", 16).layers == std::vector<int64_t>{1, 2, 5});
  CHECK(parse_layer_spec("X", "7-7", 8).layers == std::vector<int64_t>{7});
  CHECK(parse_layer_spec("X", "all", 4).mode == LayerSpec::Mode::all);
  CHECK(parse_layer_spec("X", "NONE", 4).mode == LayerSpec::Mode::none);
  CHECK(parse_layer_spec("X", "auto", 4).mode == LayerSpec::Mode::automatic);
}

TEST_CASE("layer specs: bad values name the variable and the value") {
  std::string e = error_of("3-1");
  CHECK(e.find("HMOE_GPU_RESIDENT_MOE_LAYERS") != std::string::npos);
  CHECK(e.find("'3-1'") != std::string::npos);
  CHECK(e.find("backwards") != std::string::npos);
  e = error_of("a");
  CHECK(e.find("'a'") != std::string::npos);
  CHECK(error_of("0-3,2").find("listed twice") != std::string::npos);
  CHECK(error_of("1,1").find("listed twice") != std::string::npos);
  e = error_of("0-16", 16);
  CHECK(e.find("beyond") != std::string::npos);
  CHECK(e.find("16 layers") != std::string::npos);
  CHECK(error_of("99").find("beyond") != std::string::npos);
  CHECK(error_of("1,,2").find("empty") != std::string::npos);
  CHECK(error_of("1,").find("empty") != std::string::npos);
  CHECK(!error_of("-1").empty());
  CHECK(!error_of("1-").empty());
  CHECK(!error_of("1-2-3").empty());
  CHECK(!error_of("1.5").empty());
  CHECK(!error_of("99999999999999999999").empty());
}

TEST_CASE("LVLLM_GPU_RESIDENT_MOE_LAYERS is read as an alias, with a notice; HMOE_ wins") {
  ::unsetenv("HMOE_GPU_RESIDENT_MOE_LAYERS");
  ::setenv("LVLLM_GPU_RESIDENT_MOE_LAYERS", "0-3", 1);
  std::vector<std::string> args;
  Settings s = Settings::load(args);
  CHECK(s.gpu_resident_moe_layers == "0-3");
  CHECK(s.origin("gpu_resident_moe_layers") == "environment variable LVLLM_GPU_RESIDENT_MOE_LAYERS");
  REQUIRE(s.notices.size() == 1);
  CHECK(s.notices[0].find("LVLLM_GPU_RESIDENT_MOE_LAYERS") != std::string::npos);
  // The error names the alias the user wrote.
  ::setenv("LVLLM_GPU_RESIDENT_MOE_LAYERS", "3-1", 1);
  s = Settings::load(args);
  try {
    make_plan(qwen3_30b_like(), s, GpuTarget{"test GPU", 141ull << 30, 4.8e12, true});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("LVLLM_GPU_RESIDENT_MOE_LAYERS='3-1'") != std::string::npos);
  }
  ::setenv("HMOE_GPU_RESIDENT_MOE_LAYERS", "none", 1);
  s = Settings::load(args);
  CHECK(s.gpu_resident_moe_layers == "none");
  CHECK(s.notices.empty());
  std::vector<std::string> flag = {"--gpu-resident-moe-layers", "1-2"};
  s = Settings::load(flag);
  CHECK(s.gpu_resident_moe_layers == "1-2");
  CHECK(s.origin("gpu_resident_moe_layers") == "--gpu-resident-moe-layers");
  ::unsetenv("HMOE_GPU_RESIDENT_MOE_LAYERS");
  ::unsetenv("LVLLM_GPU_RESIDENT_MOE_LAYERS");
}

TEST_CASE("plans: all/none/list/auto on a Qwen3-30B-A3B-shaped model") {
  const ModelConfig c = qwen3_30b_like();
  Settings s = Settings::defaults();
  s.max_model_len = 4096;
  const GpuTarget h200{"H200", 141ull << 30, 4.8e12, true}, card24{"24 GiB card", 24ull << 30, 1e12, true};
  const uint64_t layer = expert_layer_bytes(c);
  CHECK(layer == 128ull * 3 * 768 * 2048 * 2);

  s.gpu_resident_moe_layers = "all";
  Plan p = make_plan(c, s, h200);
  CHECK(p.resident_moe_layers() == 48);
  CHECK(p.gpu_expert_bytes == 48 * layer);
  CHECK(p.cpu_expert_bytes == 0);
  CHECK(p.cpu_bytes_per_token == 0);
  CHECK(p.kv_tokens > 4096);

  s.gpu_resident_moe_layers = "none";
  p = make_plan(c, s, card24);
  CHECK(p.resident_moe_layers() == 0);
  CHECK(p.cpu_bytes_per_token == 48ull * 8 * 3 * 768 * 2048 * 2);

  s.gpu_resident_moe_layers = "0-3,10";
  p = make_plan(c, s, card24);
  CHECK(p.resident_moe_layers() == 5);
  CHECK(p.layers[10].resident);
  CHECK(!p.layers[11].resident);

  s.gpu_resident_moe_layers = "auto";
  p = make_plan(c, s, card24);
  CHECK(p.resident_moe_layers() > 0);
  CHECK(p.resident_moe_layers() < 48);
  CHECK(p.gpu_fixed_bytes + p.gpu_workspace_bytes + p.gpu_expert_bytes + p.kv_bytes <= p.gpu_budget);
  // Auto leaves less than one more layer free beyond the KV reserve.
  CHECK(p.kv_bytes < p.kv_bytes_per_token * 4096 + layer);
  CHECK(p.decode_seconds(1e12, 1e11) > 0);
}

TEST_CASE("plans that do not fit say how much is missing") {
  const ModelConfig c = qwen3_30b_like();
  Settings s = Settings::defaults();
  s.max_model_len = 4096;
  s.gpu_resident_moe_layers = "all";
  try {
    make_plan(c, s, GpuTarget{"24 GiB card", 24ull << 30, 1e12, true});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::out_of_memory);
    const std::string m = e.what();
    CHECK(m.find("missing") != std::string::npos);
    CHECK(m.find("GiB") != std::string::npos);
    CHECK(m.find("fewer resident") != std::string::npos);
  }
  s.gpu_resident_moe_layers = "auto";
  s.gpu_memory_utilization = 0.05;
  CHECK_THROWS_AS(make_plan(c, s, GpuTarget{"small", 8ull << 30, 1e12, true}), Error);
  s.gpu_memory_utilization = 1.5;
  CHECK_THROWS_AS(make_plan(c, s, GpuTarget{"small", 8ull << 30, 1e12, true}), Error);
  // A dense layer cannot be listed as resident.
  ModelConfig d = c;
  d.mlp_only_layers = {0};
  s.gpu_memory_utilization = 0.9;
  s.gpu_resident_moe_layers = "0-1";
  CHECK_THROWS_AS(make_plan(d, s, GpuTarget{"H200", 141ull << 30, 4.8e12, true}), Error);
}

TEST_CASE("--device: bad values are errors; cpu is always possible") {
  Settings s = Settings::defaults();
  std::string why;
  s.device = "cpu";
  CHECK(!resolve_device(s, why));
  s.device = "tpu";
  CHECK_THROWS_AS(resolve_device(s, why), Error);
  s.device = "auto";
  CHECK_NOTHROW(resolve_device(s, why));
  CHECK(!why.empty());
}
