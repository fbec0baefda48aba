// make_plan for Qwen3-Next-80B-A3B shapes (engine/placement/placement.h):
// the KV cache per token covers the full-attention layers only (every
// fourth), each running sequence's linear-attention states are counted in
// the GPU workspace, and the layers' GPU bytes follow their kind (gated
// attention with its doubled q_proj, or Gated DeltaNet). CPU-only.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "engine/placement/placement.h"

using namespace hmoe;

TEST_CASE("make_plan: Qwen3-Next-80B-A3B shapes (K/V of 12 of 48 layers, DeltaNet states per sequence)") {
  const nlohmann::json j = {{"model_type", "qwen3_next"}, {"vocab_size", 151936}, {"hidden_size", 2048}, {"intermediate_size", 5120},
                            {"moe_intermediate_size", 512}, {"shared_expert_intermediate_size", 512}, {"num_hidden_layers", 48},
                            {"num_attention_heads", 16}, {"num_key_value_heads", 2}, {"head_dim", 256}, {"num_experts", 512},
                            {"num_experts_per_tok", 10}, {"full_attention_interval", 4}, {"linear_num_key_heads", 16},
                            {"linear_num_value_heads", 32}, {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128},
                            {"linear_conv_kernel_dim", 4}, {"partial_rotary_factor", 0.25}, {"max_position_embeddings", 262144}};
  const ModelConfig c = ModelConfig::from_json(j, "test config.json");
  REQUIRE(c.arch == Arch::qwen3_next);
  const GpuTarget gpu{"H200", 150ull * 1000 * 1000 * 1000, 0, true};
  std::vector<std::string> one = {"--max-model-len", "32768", "--max-num-seqs", "1"}, nine = {"--max-model-len", "32768", "--max-num-seqs", "9"};
  const Plan p1 = make_plan(c, Settings::load(one), gpu), p9 = make_plan(c, Settings::load(nine), gpu);
  CHECK(p1.kv_bytes_per_token == 12u * 2 * 2 * 256 * 2);
  // Per sequence: 36 layers x (conv window 3 x 8192 + state 32 x 128 x 128) fp32.
  const uint64_t per_seq = 36ull * (3 * 8192 + 32 * 128 * 128) * 4;
  const uint64_t seq_logits = 151936ull * 4;  // the workspace's logits rows per sequence
  CHECK(p9.gpu_workspace_bytes - p1.gpu_workspace_bytes == 8 * (per_seq + seq_logits));
  // Weights: 12 gated attention layers (q_proj twice as wide), 36 DeltaNet layers, 48 routers and shared experts with their gate.
  const uint64_t H = 2048, full = ((2 * 16 + 2 * 2) * 256 * H + H * 16 * 256 + 2 * H) * 2 + 4 * 256 * 4;
  const uint64_t linear = ((2 * 2048 + 2 * 4096 + 64) * H + H * 4096) * 2 + (8192 * 4 + 3 * 32 + 128) * 4 + 2 * H * 2;
  const uint64_t moe = 512 * H * 2 + (3 * 512 + 1) * H * 2;
  const uint64_t embed = 2 * 151936ull * H * 2 + H * 2;
  CHECK(p1.gpu_fixed_bytes == embed + 12 * full + 36 * linear + 48 * moe);
}
