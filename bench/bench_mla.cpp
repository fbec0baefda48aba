// bench_mla: one DeepSeek-V3-shaped multi-head latent attention layer
// (hidden 7168, 128 heads, q_lora 1536, kv_lora 512, nope/rope/v 128/64/128,
// random bf16 weights) on the CPU, decode and a prefill chunk, through both
// ways of attending over the latent cache:
//  - latent (kv_b absorbed): per step it streams the layer's weights once and
//    reads kv_lora + rope = 576 floats per cached token;
//  - expanded: it also applies kv_b to every cached latent each step
//    (context x 512 x 32768 multiply-adds), which is what the absorbed path
//    exists to avoid at decode.
// Figures: seconds per step, the bytes the step must move (weights + cache)
// and that as GB/s against the machine's STREAM triad (all pool threads),
// and the KV bytes per token of the latent layout against expanded K/V.
// Usage: bench_mla [--quick]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/layers/mla_attention.h"
#include "io/dtype.h"
#include "numa/expert_bench.h"
#include "numa/node_pools.h"

using namespace hmoe;

namespace {

double wall() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Bf16Mat {
  std::vector<uint16_t> data;
  cpu::Mat view;
  Bf16Mat(int64_t rows, int64_t cols, uint64_t seed, float scale) : data(static_cast<size_t>(rows * cols)) {
    uint64_t s = seed;
    for (auto& v : data) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      v = f32_to_bf16((static_cast<float>((s >> 40) % 2001) - 1000.0f) * 1e-3f * scale);
    }
    view = cpu::Mat{DType::bf16, data.data(), rows, cols};
  }
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  nlohmann::json j = {{"model_type", "deepseek_v3"}, {"num_hidden_layers", 1}, {"first_k_dense_replace", 1}, {"max_position_embeddings", 163840},
                      {"rope_scaling",
                       {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}};
  const ModelConfig c = ModelConfig::from_json(j, "bench");
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  Bf16Mat q_a(m.q_lora_rank, H, 1, 0.05f), q_a_norm(1, m.q_lora_rank, 2, 1.0f), q_b(nh * m.qk_head_dim(), m.q_lora_rank, 3, 0.05f),
      kv_a(m.kv_lora_rank + m.qk_rope_head_dim, H, 4, 0.05f), kv_a_norm(1, m.kv_lora_rank, 5, 1.0f),
      kv_b(nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, 6, 0.05f), o_proj(H, nh * m.v_head_dim, 7, 0.05f);
  MlaWeights w;
  w.q_a = q_a.view;
  w.q_a_norm = q_a_norm.view;
  w.q_b = q_b.view;
  w.kv_a = kv_a.view;
  w.kv_a_norm = kv_a_norm.view;
  w.kv_b = kv_b.view;
  w.o_proj = o_proj.view;
  const double weight_bytes = static_cast<double>(q_a.view.bytes() + q_b.view.bytes() + kv_a.view.bytes() + kv_b.view.bytes() + o_proj.view.bytes());

  numa::PoolOptions po;
  po.quiet = true;
  numa::NodePools pools(po);
  const double triad = numa::stream_triad_gbps(pools, size_t{256} << 20);
  numa::ThreadPool& pool = pools.pool(0);
  std::printf("bench_mla: DeepSeek-V3 MLA layer, bf16 weights %.1f MB, %d threads, STREAM triad %.1f GB/s\n", weight_bytes / 1e6,
              pools.threads(), triad);
  const double latent_kv = static_cast<double>(m.kv_token_floats()) * 4;
  const double expanded_kv = static_cast<double>(nh * (m.qk_head_dim() + m.v_head_dim)) * 4;
  std::printf("KV bytes per token and layer (fp32): latent %.0f, expanded K/V %.0f (%.0fx); 61 layers: %.1f KB vs %.1f MB per token\n",
              latent_kv, expanded_kv, expanded_kv / latent_kv, 61 * latent_kv / 1e3, 61 * expanded_kv / 1e6);

  const std::vector<int64_t> contexts = quick ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 1024, 2048};
  const std::vector<int64_t> chunks = {1, 32};
  std::vector<float> x(static_cast<size_t>(32 * H));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  std::printf("%-9s %7s %6s %12s %12s %10s %8s\n", "mode", "context", "tokens", "ms/step", "MB moved", "GB/s", "of triad");
  for (int64_t ctx : contexts)
    for (int64_t n : chunks)
      for (MlaMode mode : {MlaMode::latent, MlaMode::expanded}) {
        auto block = make_mla_attention(w, c, 0, pool, mode);
        KvCache kv(mla_kv_layout(c), (ctx + 15) / 16 + 1, 16);
        const int seq = kv.add_sequence();
        kv.reserve(seq, ctx);
        // Earlier tokens: random normed latents and rope keys, written directly.
        for (int64_t p = 0; p < ctx - n; ++p) {
          float* row = kv.k(0, seq, p);
          for (int64_t i = 0; i < m.kv_token_floats(); ++i) row[i] = static_cast<float>(((p * 131 + i * 7) % 200) - 100) * 0.01f;
        }
        std::vector<ops::TokenSlot> slots;
        for (int64_t t = 0; t < n; ++t) slots.push_back({seq, ctx - n + t});
        std::vector<float> out(static_cast<size_t>(n * H));
        Workspace ws;
        block->forward(x.data(), n, slots.data(), kv, out.data(), ws);  // warm-up
        int steps = 0;
        const double t0 = wall();
        double t1 = t0;
        while (steps < 2 || t1 - t0 < (quick ? 0.3 : 1.0)) {
          block->forward(x.data(), n, slots.data(), kv, out.data(), ws);
          ++steps;
          t1 = wall();
        }
        const double sec = (t1 - t0) / steps;
        const double bytes = weight_bytes + static_cast<double>(ctx) * latent_kv;
        std::printf("%-9s %7lld %6lld %12.2f %12.1f %10.2f %7.0f%%\n", mode == MlaMode::latent ? "latent" : "expanded",
                    static_cast<long long>(ctx), static_cast<long long>(n), sec * 1e3, bytes / 1e6, bytes / sec / 1e9,
                    100.0 * bytes / sec / 1e9 / triad);
      }
  std::printf("(MB moved: the layer's weights once plus the latent cache read; expanded also computes kv_b over the whole context)\n");
  return 0;
}
