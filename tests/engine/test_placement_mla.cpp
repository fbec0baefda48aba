// make_plan for DeepSeek-V3 shapes (multi-head latent attention): the KV
// cache per token is the latent and the rope key of every layer in bf16,
// attention bytes are the MLA projections, MoE layers add the shared expert
// and the bias, the first_k_dense_replace layers are dense and always on the
// GPU, and 'auto' fills the GPU with whole 22.5 GB expert layers. CPU-only.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/placement/placement.h"

using namespace hmoe;

namespace {

ModelConfig deepseek_v3() {
  const nlohmann::json j = {{"model_type", "deepseek_v3"}, {"vocab_size", 129280}, {"hidden_size", 7168}, {"intermediate_size", 18432},
                            {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61}, {"num_attention_heads", 128},
                            {"num_key_value_heads", 128}, {"n_routed_experts", 256}, {"num_experts_per_tok", 8}, {"n_shared_experts", 1},
                            {"first_k_dense_replace", 3}, {"max_position_embeddings", 163840},
                            {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                                              {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}};
  return ModelConfig::from_json(j, "test config.json");
}

}  // namespace

TEST_CASE("make_plan: DeepSeek-V3 shapes (latent KV cache, MLA weights, shared experts, dense first layers)") {
  const ModelConfig c = deepseek_v3();
  REQUIRE(c.arch == Arch::deepseek_v3);
  std::vector<std::string> args = {"--max-model-len", "32768"};
  Settings s = Settings::load(args);
  s.mla_attention = "latent";
  const GpuTarget gpu{"H200", 150ull * 1000 * 1000 * 1000, 0, true};
  const Plan p = make_plan(c, s, gpu);
  CHECK(p.kv_bytes_per_token == 61u * (512 + 64) * 2);
  CHECK(p.moe_layers() == 58);
  CHECK(expert_layer_bytes(c) == 256ull * 3 * 2048 * 7168 * 2);  // 22.5 GB
  for (int64_t l = 0; l < 3; ++l) {
    CHECK_FALSE(p.layers[static_cast<size_t>(l)].moe);
    CHECK(p.layers[static_cast<size_t>(l)].resident);
  }
  // q_a 1536x7168 + norm + q_b 24576x1536, kv_a 576x7168 + norm, kv_b 32768x512, W_UK^T 128x512x128, o 7168x16384, 2 norms; bf16.
  const uint64_t attn = (1536ull * 7168 + 1536 + 24576ull * 1536 + 576ull * 7168 + 512 + 32768ull * 512 + 128ull * 512 * 128 + 7168ull * 16384 +
                         2 * 7168) * 2;
  CHECK(mla_attention_bytes(c, true) == attn);
  CHECK(mla_attention_bytes(c, false) == attn - 128ull * 512 * 128 * 2);
  const uint64_t embed = 2ull * 129280 * 7168 * 2 + 7168 * 2, dense = 3ull * 18432 * 7168 * 2;
  const uint64_t moe = 256ull * 7168 * 2 + 3ull * 2048 * 7168 * 2 + 256 * 4;
  CHECK(p.gpu_fixed_bytes == embed + 61 * attn + 3 * dense + 58 * moe);
  // auto: whole expert layers while they fit after the fixed bytes, workspace and a 32768-token cache.
  const uint64_t base = p.gpu_fixed_bytes + p.gpu_workspace_bytes + p.kv_bytes_per_token * 32768;
  const uint64_t budget = static_cast<uint64_t>(static_cast<double>(gpu.total_bytes) * s.gpu_memory_utilization);
  CHECK(p.resident_moe_layers() == static_cast<int64_t>((budget - base) / expert_layer_bytes(c)));
  CHECK(p.resident_moe_layers() >= 3);
  CHECK(p.gpu_expert_bytes == static_cast<uint64_t>(p.resident_moe_layers()) * expert_layer_bytes(c));

  s.gpu_resident_moe_layers = "0-2";
  CHECK_THROWS_AS(make_plan(c, s, gpu), Error);  // layers 0-2 are dense
  s.gpu_resident_moe_layers = "3-60";
  CHECK_THROWS_AS(make_plan(c, s, gpu), Error);  // 58 x 22.5 GB does not fit
}
