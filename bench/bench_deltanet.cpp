// bench_deltanet: Qwen3-Next-80B-A3B's Gated DeltaNet layer on the CPU
// (hidden 2048, 16 key / 32 value heads of 128, conv kernel 4; random bf16
// weights), and its gated delta rule kernel alone (engine/ops/delta_rule.h).
//  - kernel, prefill: one sequence of T tokens, all 32 heads on the pool,
//    chunked (64-token chunks) against the one-step recurrence;
//  - kernel, decode: one token for each of B sequences (32 heads each): the
//    recurrence reads and writes each head's 64 KiB state once per token;
//  - layer: prefill of T tokens (one sequence) and decode of B sequences
//    (projections, conv, kernel, gated norm, out_proj).
// Figures: tokens/s; GFLOP/s of the kernel's nominal arithmetic (chunked:
// 6 dk dv + 2 C (dk + dv) flops per token and head, recurrent: 8 dk dv);
// GB/s of the bytes a step must move (decode: the states read and written,
// plus the layer's weights once per step), against the STREAM triad of all
// pool threads and the FLOP/s numa::mlp_forward reaches on a bf16 expert.
// Usage: bench_deltanet [--quick]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "configs/error.h"
#include "engine/layers/gated_deltanet.h"
#include "engine/ops/delta_rule.h"
#include "engine/placement/prefill_cost.h"
#include "io/dtype.h"
#include "numa/expert_bench.h"
#include "numa/node_pools.h"

using namespace hmoe;

namespace {

double wall() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Seconds per call of fn, at least 2 calls and `budget` seconds.
template <class Fn>
double time_it(Fn&& fn, double budget) {
  fn();
  int n = 0;
  const double t0 = wall();
  double t1 = t0;
  while (n < 2 || t1 - t0 < budget) {
    fn();
    ++n;
    t1 = wall();
  }
  return (t1 - t0) / n;
}

std::vector<float> noise(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = (static_cast<float>((s >> 40) % 2001) - 1000.0f) * 1e-3f * scale;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const double budget = quick ? 0.2 : 1.0;
  const ModelConfig c = ModelConfig::from_json(nlohmann::json{{"model_type", "qwen3_next"}}, "bench");  // Qwen3-Next-80B-A3B defaults
  const HybridConfig& h = c.hybrid;
  const int64_t nv = h.linear_num_value_heads, nk = h.linear_num_key_heads, dk = h.linear_key_head_dim, dv = h.linear_value_head_dim;
  const int64_t C = 64;
  numa::PoolOptions po;
  po.quiet = true;
  numa::NodePools pools(po);
  numa::ThreadPool& pool = pools.pool(0);
  const double triad = numa::stream_triad_gbps(pools, size_t{256} << 20);
  const double expert_flops = measure_cpu_expert_flops(c, &pool, 256);
  std::printf("bench_deltanet: Qwen3-Next-80B-A3B Gated DeltaNet (%lld key / %lld value heads, dk %lld, dv %lld), %d threads, %s kernels;\n"
              "machine: STREAM triad %.1f GB/s, numa::mlp_forward on a bf16 expert %.1f GFLOP/s\n",
              static_cast<long long>(nk), static_cast<long long>(nv), static_cast<long long>(dk), static_cast<long long>(dv), pools.threads(),
              ops::delta_rule_isa(), triad, expert_flops / 1e9);

  // --- The kernel alone. Inputs: token-major [T][heads * d], g < 0, beta in (0, 1).
  std::printf("\nkernel (all %lld heads on the pool)\n%-22s %8s %12s %10s %10s %9s\n", static_cast<long long>(nv), "what", "tokens", "tokens/s",
              "GFLOP/s", "GB/s", "of triad");
  const std::vector<int64_t> lengths = quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 4096};
  for (int64_t T : lengths) {
    auto q = noise(static_cast<size_t>(T * nv * dk), 1, 0.01f), k = noise(q.size(), 2, 0.09f), v = noise(static_cast<size_t>(T * nv * dv), 3, 1.0f);
    auto g = noise(static_cast<size_t>(T * nv), 4, 0.1f), beta = noise(g.size(), 5, 0.4f);
    for (auto& x : g) x = -0.05f - std::abs(x);
    for (auto& x : beta) x = 0.5f + x;
    std::vector<float> out(static_cast<size_t>(T * nv * dv)), S(static_cast<size_t>(nv * dk * dv));
    for (int chunked = 1; chunked >= 0; --chunked) {
      const double sec = time_it([&] {
        std::fill(S.begin(), S.end(), 0.0f);
        pool.parallel_for(nv, [&](int64_t b, int64_t e, int) {
          for (int64_t hd = b; hd < e; ++hd) {
            ops::DeltaRuleArgs a;
            a.q = q.data() + hd * dk;
            a.k = k.data() + hd * dk;
            a.ld_qk = nv * dk;
            a.v = v.data() + hd * dv;
            a.ld_v = nv * dv;
            a.g = g.data() + hd;
            a.beta = beta.data() + hd;
            a.ld_gb = nv;
            a.out = out.data() + hd * dv;
            a.ld_o = nv * dv;
            a.tokens = T;
            a.dk = dk;
            a.dv = dv;
            if (chunked) ops::delta_rule_chunked(a, S.data() + hd * dk * dv, C);
            else ops::delta_rule_recurrent(a, S.data() + hd * dk * dv);
          }
        }, 1, 1);
      }, budget);
      const double flops = static_cast<double>(T * nv) * (chunked ? 6.0 * dk * dv + 2.0 * C * (dk + dv) : 8.0 * dk * dv);
      const double bytes = static_cast<double>(T * nv) * (2 * dk + 2 * dv + 2) * 4;  // q, k, v, g, beta in; out
      std::printf("%-22s %8lld %12.0f %10.1f %10.2f %8.1f%%\n", chunked ? "prefill, chunked" : "prefill, recurrent", static_cast<long long>(T),
                  static_cast<double>(T) / sec, flops / sec / 1e9, bytes / sec / 1e9, 100 * bytes / sec / 1e9 / triad);
    }
  }
  for (int64_t B : quick ? std::vector<int64_t>{16} : std::vector<int64_t>{1, 16, 64}) {
    auto q = noise(static_cast<size_t>(B * nv * dk), 6, 0.01f), k = noise(q.size(), 7, 0.09f), v = noise(static_cast<size_t>(B * nv * dv), 8, 1.0f);
    auto g = noise(static_cast<size_t>(B * nv), 9, 0.1f), beta = noise(g.size(), 10, 0.4f);
    for (auto& x : g) x = -0.05f - std::abs(x);
    for (auto& x : beta) x = 0.5f + x;
    std::vector<float> out(static_cast<size_t>(B * nv * dv)), S(static_cast<size_t>(B * nv * dk * dv), 0.01f);
    const double sec = time_it([&] {
      pool.parallel_for(B * nv, [&](int64_t b, int64_t e, int) {
        for (int64_t it = b; it < e; ++it) {
          ops::DeltaRuleArgs a;
          a.q = q.data() + it * dk;
          a.k = k.data() + it * dk;
          a.ld_qk = dk;
          a.v = v.data() + it * dv;
          a.ld_v = dv;
          a.g = g.data() + it;
          a.beta = beta.data() + it;
          a.out = out.data() + it * dv;
          a.ld_o = dv;
          a.tokens = 1;
          a.dk = dk;
          a.dv = dv;
          ops::delta_rule_recurrent(a, S.data() + it * dk * dv);
        }
      }, 1);
    }, budget);
    const double bytes = static_cast<double>(B * nv * dk * dv) * 4 * 2;  // each state read and written
    std::printf("%-22s %8lld %12.0f %10.1f %10.2f %8.1f%%\n", ("decode, " + std::to_string(B) + " seqs").c_str(), static_cast<long long>(B),
                static_cast<double>(B) / sec, static_cast<double>(B * nv) * 8.0 * dk * dv / sec / 1e9, bytes / sec / 1e9,
                100 * bytes / sec / 1e9 / triad);
  }

  // --- The whole layer, random bf16 weights.
  std::map<std::string, std::vector<uint16_t>> store;
  WeightBinder bind([&](const std::string& name, const std::vector<int64_t>& shape) {
    if (shape.empty()) fail(ErrorKind::bad_model, "no tensor " + name);
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto& buf = store[name];
    const float scale = name.find("A_log") != std::string::npos ? 1.0f : name.find("norm") != std::string::npos ? 0.0f : 0.02f;
    const auto f = noise(static_cast<size_t>(n), std::hash<std::string>{}(name), scale);
    buf.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = f32_to_bf16(f[static_cast<size_t>(i)] + (scale == 0.0f ? 1.0f : 0.0f));
    return cpu::Mat{DType::bf16, buf.data(), shape[0], n / shape[0]};
  });
  auto layer = make_gated_deltanet(bind, c, 0, "bench.linear_attn.", pool);
  double weight_bytes = 0;
  for (const auto& [name, buf] : store) weight_bytes += static_cast<double>(buf.size()) * 2;
  KvLayout lay{1, c.num_key_value_heads, c.head_dim};
  lay.seq_state_bytes = h.state_bytes_per_layer();
  std::printf("\nlayer (bf16 weights %.1f MB, state %.2f MB per sequence)\n%-22s %8s %12s %10s %9s\n", weight_bytes / 1e6,
              static_cast<double>(lay.seq_state_bytes) / 1e6, "what", "tokens", "tokens/s", "GB/s", "of triad");
  Workspace ws;
  const int64_t H = c.hidden_size;
  for (int64_t T : lengths) {
    const auto x = noise(static_cast<size_t>(T * H), 11, 1.0f);
    std::vector<float> out(static_cast<size_t>(T * H));
    std::vector<ops::TokenSlot> slots;
    KvCache kv(lay, 2, 16);
    int seq = kv.add_sequence();
    for (int64_t t = 0; t < T; ++t) slots.push_back({seq, t});
    const double sec = time_it([&] {
      kv.free_sequence(seq);
      seq = kv.add_sequence();
      layer->forward(x.data(), T, slots.data(), kv, out.data(), ws);
    }, budget);
    const double bytes = weight_bytes + static_cast<double>(lay.seq_state_bytes);
    std::printf("%-22s %8lld %12.0f %10.2f %8.1f%%\n", "prefill, 1 seq", static_cast<long long>(T), static_cast<double>(T) / sec, bytes / sec / 1e9,
                100 * bytes / sec / 1e9 / triad);
  }
  for (int64_t B : quick ? std::vector<int64_t>{16} : std::vector<int64_t>{1, 16, 64}) {
    const auto x = noise(static_cast<size_t>(B * H), 12, 1.0f);
    std::vector<float> out(static_cast<size_t>(B * H));
    KvCache kv(lay, 2, 16);
    std::vector<int> seqs;
    for (int64_t b = 0; b < B; ++b) seqs.push_back(kv.add_sequence());
    int64_t pos = 0;
    const double sec = time_it([&] {
      std::vector<ops::TokenSlot> slots;
      for (int64_t b = 0; b < B; ++b) slots.push_back({seqs[static_cast<size_t>(b)], pos});
      ++pos;
      layer->forward(x.data(), B, slots.data(), kv, out.data(), ws);
    }, budget);
    const double bytes = weight_bytes + static_cast<double>(B) * static_cast<double>(lay.seq_state_bytes) * 2;
    std::printf("%-22s %8lld %12.0f %10.2f %8.1f%%\n", ("decode, " + std::to_string(B) + " seqs").c_str(), static_cast<long long>(B),
                static_cast<double>(B) / sec, bytes / sec / 1e9, 100 * bytes / sec / 1e9 / triad);
  }
  std::printf("(GB/s: kernel prefill the q/k/v/g/beta/out streams; decode the states read and written; layer: weights once per step plus states)\n");
  return 0;
}
