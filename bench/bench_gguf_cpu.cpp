// The CPU paths on GGUF formats (issue 26), old against new, on Qwen3-30B-A3B
// shapes (hidden 2048, moe_intermediate 768, 128 experts of which 8 per
// token; attention 32 query / 4 kv heads of dim 128):
//
// 1. Routed experts through numa::ExpertEngine (the real decode/prefill
//    path), per weight format (Q4_K_M's mix: gate/up Q4_K, down Q6_K; and
//    each of Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q5_0 alone): "exact" is the fp32
//    dequantize path (setting cpu_gguf_int8=0), "int8" the 8-bit-activation
//    integer kernels (numa/quant_gguf_q8.h).
//    - batch 1: weight GB/s (the stored bytes of the 8 experts a token
//      touches, per step) against a read bandwidth measured here with the
//      same threads; experts are cycled over 64 so the working set is past
//      the L3.
//    - batch 64 / 512 (prefill): integer (or fp32) GOP/s, 2 * 3 * H * I per
//      (token, expert) pair.
// 2. Attention (ops::attention) for one decode token at context 512 and 4096,
//    and a 64-token prefill chunk at 4096, per KV dtype: ms per layer and
//    GB/s of K/V read against the read bandwidth measured here (each call
//    reads another layer's K/V, >= 256 MiB in all, so they come from memory).
// 3. One decode step of a whole layer at context 512 and 4096 (the ratio
//    is what "decode stays flat with context" is about).
//
// 3. --prefill-only: the prefill paths, VNNI against AMX-BF16 and the decode
//    attention kernel against attention_prefill (bench_prefill below).
//
// 4. --kernels: the 8-bit GGUF kernels alone (cpu::gemm_rows_q8 on
//    pre-quantized activations, 32-row items across the pool) for Q4_K, Q5_K,
//    Q6_K, Q8_0 on the model's product shapes, the per-row kernels against
//    the row-interleaved tile kernels (same bits; gemm_rows_q8 picks by token
//    count): GOP/s and the fraction of the vpdpbusd peak measured here with
//    the same threads. Without AVX-512 VNNI: the AVX2 kernels alone (GOP/s,
//    and GB/s against the read bandwidth).
// 5. --lm-head: the one-token lm_head product [151936 x 2048] in Q4_K, Q6_K
//    and Q8_0 from memory, GB/s against the read bandwidth (decode's largest
//    read on small-expert models).
//
// Usage: bench_gguf_cpu [--threads T] [--quick] [--formats all|q4km|NAME] [--batch N (only this batch)] [--no-attention | --attention-only | --prefill-only | --kernels | --lm-head]
//                       [--kv-layers N (attention and layer step: cycle N layers' K/V; default: >= 256 MiB of them; 1: always hot)]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/ops/cpu_ops.h"
#include "engine/placement/prefill_cost.h"
#include "numa/expert_engine.h"
#include "numa/quant_gguf.h"
#include "numa/quant_gguf_amx.h"
#include "numa/quant_gguf_q8.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;
using cpu::ExtType;
using clk = std::chrono::steady_clock;

namespace {

constexpr int64_t H = 2048, I = 768, K = 8;

// The fastest of repeated runs of f (after one warm-up run), repeated until
// min_seconds have passed and at least min_reps ran: seconds.
template <class F>
double best_seconds(F&& f, double min_seconds, int min_reps) {
  f();
  double best = 1e30, total = 0;
  for (int r = 0; total < min_seconds || r < min_reps; ++r) {
    const auto t0 = clk::now();
    f();
    const double sec = std::chrono::duration<double>(clk::now() - t0).count();
    best = std::min(best, sec);
    total += sec;
  }
  return best;
}

std::vector<float> randn(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct ExpertSet {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<numa::ExpertWeights> w;
  double expert_bytes = 0;
};

// E experts; each matrix quantized once and copied (distinct memory per expert).
ExpertSet make_experts(ExtType tu, ExtType td, int64_t E) {
  ExpertSet s;
  const auto g = randn(static_cast<size_t>(I * H), 1, 0.05f), u = randn(static_cast<size_t>(I * H), 2, 0.05f),
             d = randn(static_cast<size_t>(H * I), 3, 0.05f);
  const auto qg = qtools::quant_rows(tu, g.data(), I, H), qu = qtools::quant_rows(tu, u.data(), I, H), qd = qtools::quant_rows(td, d.data(), H, I);
  s.bytes.reserve(static_cast<size_t>(3 * E));
  for (int64_t e = 0; e < E; ++e) {
    s.bytes.push_back(qg);
    const void* pg = s.bytes.back().data();
    s.bytes.push_back(qu);
    const void* pu = s.bytes.back().data();
    s.bytes.push_back(qd);
    const void* pd = s.bytes.back().data();
    s.w.push_back({cpu::ext_view(tu, pg, I, H, "gate"), cpu::ext_view(tu, pu, I, H, "up"), cpu::ext_view(td, pd, H, I, "down")});
  }
  s.expert_bytes = static_cast<double>(s.w[0].gate.bytes() + s.w[0].up.bytes() + s.w[0].down.bytes());
  return s;
}

// Seconds per forward of n tokens, each routed to K distinct experts; the
// routing moves on every step so consecutive steps touch other experts.
double time_forward(numa::ExpertEngine& eng, int64_t n, int64_t E, double min_seconds) {
  const auto x = randn(static_cast<size_t>(n * H), 7, 1.0f);
  std::vector<float> out(static_cast<size_t>(n * H));
  std::vector<int32_t> ids(static_cast<size_t>(n * K));
  std::vector<float> wts(ids.size(), 1.0f / K);
  std::mt19937 rng(11);
  int64_t step = 0;
  auto route = [&] {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j)
        ids[static_cast<size_t>(t * K + j)] = static_cast<int32_t>(n == 1 ? (step * K + j) % E : (static_cast<int64_t>(rng() % (E / K)) * K + j) % E);
    ++step;
  };
  route();
  eng.forward(x.data(), n, ids.data(), wts.data(), K, out.data());  // warm-up
  double total = 0;
  int reps = 0;
  while (total < min_seconds || reps < 3) {
    route();
    auto t0 = clk::now();
    eng.forward(x.data(), n, ids.data(), wts.data(), K, out.data());
    total += std::chrono::duration<double>(clk::now() - t0).count();
    ++reps;
  }
  return total / reps;
}

// A cache of `layers` layers of maxctx positions in dtype d, K and V random
// (N(0,1) values taken at random offsets of one pool, so filling hundreds of
// MiB costs no more than the stores).
std::unique_ptr<KvCache> filled_cache(KvDtype d, int64_t layers, int64_t kvh, int64_t hd, int64_t maxctx, uint32_t seed) {
  KvLayout l{layers, kvh, hd};
  l.dtype = d;
  auto kv = std::make_unique<KvCache>(l, maxctx / 16 + 4, 16);
  const int seq = kv->add_sequence();
  kv->reserve(seq, maxctx);
  const size_t w = static_cast<size_t>(kvh * hd);
  const auto pool = randn(w * 64, seed, 1.0f);
  std::mt19937 g(seed + 1);
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int64_t p = 0; p < maxctx; ++p) {
      const float* k = pool.data() + g() % (pool.size() - w);
      const float* v = pool.data() + g() % (pool.size() - w);
      kv->store(layer, seq, p, k, v);
    }
  return kv;
}

constexpr KvDtype kKvDtypes[] = {KvDtype::f32, KvDtype::bf16, KvDtype::q8_0};

// Layers so that one pass over them at 4096 positions reads >= 256 MiB: each
// call takes the next layer, so the K/V come from memory, as in a model's
// decode step (48 layers of them), not from the cache of the previous call.
int64_t g_kv_layers = 0;  // --kv-layers: 0 = cold_layers(); 1 = the same layer every call (K/V hot in the caches)
int64_t cold_layers(KvDtype d, int64_t kvh, int64_t hd, int64_t maxctx) {
  if (g_kv_layers > 0) return g_kv_layers;
  const int64_t per_layer = maxctx * kv_block_bytes(KvLayout{1, kvh, hd, -1, -1, 0, d}, 16) / 16;
  return std::max<int64_t>(2, ((int64_t{256} << 20) + per_layer - 1) / per_layer);
}

void bench_attention(numa::ThreadPool& pool, double min_seconds, double bw) {
  const int64_t heads = 32, kvh = 4, hd = 128, maxctx = 4096;
  std::printf("\n## attention (32 q heads / 4 kv heads, dim 128, head-major KV), ms per layer (min over repetitions), %d threads\n\n", pool.size());
  std::printf("Each call reads the next of N layers' K/V (by default N x 4096 positions >= 256 MiB, so the bytes come from memory; --kv-layers 1: hot).\n\n");
  std::printf("| KV dtype | layers | rows | context | KV MB read | ms | KV GB/s | / read bw |\n|---|---|---|---|---|---|---|---|\n");
  struct Case {
    int64_t n, ctx;
  };
  for (KvDtype d : kKvDtypes) {
    const int64_t layers = cold_layers(d, kvh, hd, maxctx);
    auto kvp = filled_cache(d, layers, kvh, hd, maxctx, 0);
    KvCache& kv = *kvp;
    const int seq = 0;
    double decode_ms[2] = {0, 0};
    for (Case c : {Case{1, 512}, Case{1, 4096}, Case{64, 4096}}) {
      std::vector<ops::TokenSlot> slots;
      for (int64_t t = 0; t < c.n; ++t) slots.push_back({seq, c.ctx - c.n + t});
      const auto q = randn(static_cast<size_t>(c.n * heads * hd), 5, 1.0f);
      std::vector<float> out(q.size());
      int64_t layer = 0;
      auto run = [&] {
        ops::attention(q.data(), c.n, heads, kvh, hd, slots.data(), kv, layer, 0.088f, out.data(), &pool);
        layer = (layer + 1) % layers;
      };
      run();
      double total = 0, best = 1e30;
      int reps = 0;
      while (total < min_seconds || reps < 3 * layers) {
        auto t0 = clk::now();
        run();
        const double sec = std::chrono::duration<double>(clk::now() - t0).count();
        total += sec;
        best = std::min(best, sec);
        ++reps;
      }
      const double ms = best * 1e3;
      const double kv_mb = static_cast<double>(c.ctx * kv_block_bytes(KvLayout{1, kvh, hd, -1, -1, 0, d}, 16) / 16) / 1e6;  // K and V, once
      if (c.n == 1) decode_ms[c.ctx == 4096] = ms;
      std::printf("| %s | %ld | %ld | %ld | %.1f | %.3f | %.1f | %.2f |\n", kv_dtype_name(d), layers, c.n, c.ctx, kv_mb, ms, kv_mb / ms,
                  kv_mb / ms * 1e9 / bw);
    }
    std::printf("\n%s: decode attention 4096 vs 512: %.2fx the time (8x the bytes)\n\n", kv_dtype_name(d), decode_ms[1] / decode_ms[0]);
  }
}

// One decode step of a whole Qwen3-30B-A3B-shaped layer on the CPU at
// context 512 and 4096: q/k/v/o projections (Q4_K, through cpu::gemm),
// attention over the KV cache in each dtype, top-8 routed experts (Q4_K_M
// mix). Times are the min over repetitions (the dev box is shared).
void bench_layer(numa::NodePools& pools, double min_seconds) {
  numa::ThreadPool& pool = pools.pool(0);
  const int64_t heads = 32, kvh = 4, hd = 128, maxctx = 4096, E = 64;
  const int64_t NQ = heads * hd, NK = kvh * hd;
  std::vector<std::vector<uint8_t>> wb;
  std::vector<cpu::Mat> proj;
  const int64_t shapes[4][2] = {{NQ, H}, {NK, H}, {NK, H}, {H, NQ}};
  for (int m = 0; m < 4; ++m) {
    const auto f = randn(static_cast<size_t>(shapes[m][0] * shapes[m][1]), 20 + static_cast<uint32_t>(m), 0.02f);
    wb.push_back(qtools::quant_rows(ExtType::q4_k, f.data(), shapes[m][0], shapes[m][1]));
    proj.push_back(cpu::ext_view(ExtType::q4_k, wb.back().data(), shapes[m][0], shapes[m][1], "proj"));
  }
  ExpertSet set = make_experts(ExtType::q4_k, ExtType::q6_k, E);
  numa::EngineOptions eo;
  eo.print_memory = false;
  numa::ExpertEngine eng(set.w, pools, eo);
  const auto x = randn(static_cast<size_t>(H), 9, 1.0f);
  std::vector<float> q(static_cast<size_t>(NQ)), kk(static_cast<size_t>(NK)), vv(static_cast<size_t>(NK)), att(static_cast<size_t>(NQ)),
      o(static_cast<size_t>(H)), out(static_cast<size_t>(H));
  std::vector<int32_t> ids(K);
  std::vector<float> wts(K, 1.0f / K);
  int64_t step = 0;
  std::printf("\n## one decode step of a layer (q/k/v/o Q4_K, attention over the KV cache, top-8 Q4_K_M experts of 64 cycled), %d threads, "
              "min over repetitions\n\n", pool.size());
  std::printf("| KV dtype | KV bytes/token/layer | context | KV MB read | ms/layer | of which attention ms |\n|---|---|---|---|---|---|\n");
  // The six (dtype, context) cases run round-robin, one step each, so that
  // the other jobs on a shared machine slow all of them alike; each case's
  // figure is its fastest step.
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<int64_t> cache_layers;
  for (KvDtype d : kKvDtypes) {
    cache_layers.push_back(cold_layers(d, kvh, hd, maxctx));
    caches.push_back(filled_cache(d, cache_layers.back(), kvh, hd, maxctx, 100));
  }
  const int64_t ctxs[2] = {512, 4096};
  double best[3][2], best_attn[3][2];
  for (auto& r : best) r[0] = r[1] = 1e30;
  for (auto& r : best_attn) r[0] = r[1] = 1e30;
  auto one = [&](size_t di, int ci, bool timed) {
    ops::TokenSlot slot{0, ctxs[ci] - 1};
    for (int64_t j = 0; j < K; ++j) ids[static_cast<size_t>(j)] = static_cast<int32_t>((step * K + j) % E);
    ++step;
    auto t0 = clk::now();
    cpu::gemm(x.data(), 1, proj[0], q.data(), &pool);
    cpu::gemm(x.data(), 1, proj[1], kk.data(), &pool);
    cpu::gemm(x.data(), 1, proj[2], vv.data(), &pool);
    auto t1 = clk::now();
    ops::attention(q.data(), 1, heads, kvh, hd, &slot, *caches[di], step % cache_layers[di], 0.088f, att.data(), &pool);
    auto t2 = clk::now();
    cpu::gemm(att.data(), 1, proj[3], o.data(), &pool);
    std::fill(out.begin(), out.end(), 0.0f);
    eng.forward(o.data(), 1, ids.data(), wts.data(), K, out.data());
    auto t3 = clk::now();
    if (timed) {
      best[di][ci] = std::min(best[di][ci], std::chrono::duration<double>(t3 - t0).count());
      best_attn[di][ci] = std::min(best_attn[di][ci], std::chrono::duration<double>(t2 - t1).count());
    }
  };
  for (size_t di = 0; di < 3; ++di) one(di, 0, false), one(di, 1, false);
  const auto start = clk::now();
  int rounds = 0;
  while (std::chrono::duration<double>(clk::now() - start).count() < 6 * min_seconds || rounds < 10) {
    for (size_t di = 0; di < 3; ++di)
      for (int ci = 0; ci < 2; ++ci) one(di, ci, true);
    ++rounds;
  }
  double ratio[3];
  for (size_t di = 0; di < 3; ++di) {
    const int64_t tok_bytes = kv_block_bytes(KvLayout{1, kvh, hd, -1, -1, 0, kKvDtypes[di]}, 16) / 16;
    for (int ci = 0; ci < 2; ++ci)
      std::printf("| %s | %ld | %ld | %.2f | %.3f | %.3f |\n", kv_dtype_name(kKvDtypes[di]), tok_bytes, ctxs[ci],
                  static_cast<double>(ctxs[ci] * tok_bytes) / 1e6, best[di][ci] * 1e3, best_attn[di][ci] * 1e3);
    ratio[di] = best[di][1] / best[di][0];
  }
  std::printf("\n(%d rounds of the six cases)\n", rounds);
  std::printf("\n| KV dtype | decode step 4096 / 512 (goal <= 1.15x) | KV bytes per token per layer | host memory, 48 layers x 32768 tokens | saved vs fp32 |\n"
              "|---|---|---|---|---|\n");
  const int64_t f32_bytes = kv_block_bytes(KvLayout{1, kvh, hd, -1, -1, 0, KvDtype::f32}, 16) / 16;
  for (size_t di = 0; di < 3; ++di) {
    const int64_t b = kv_block_bytes(KvLayout{1, kvh, hd, -1, -1, 0, kKvDtypes[di]}, 16) / 16;
    const double gib = static_cast<double>(b) * 48 * 32768 / double(int64_t{1} << 30);
    const double saved = static_cast<double>(f32_bytes - b) * 48 * 32768 / double(int64_t{1} << 30);
    std::printf("| %s | %.2fx | %ld | %.2f GiB | %.2f GiB (%.0f%%) |\n", kv_dtype_name(kKvDtypes[di]), ratio[di], b, gib, saved,
                100.0 * static_cast<double>(f32_bytes - b) / static_cast<double>(f32_bytes));
  }
}

// Prefill paths (issue 26): the routed experts and a dense projection with
// the 8-bit VNNI kernels against the AMX-BF16 tiles (numa/quant_gguf_amx.h),
// and attention of a 2048-token prompt chunk at context 4096 through the
// decode kernel (ops::attention) against ops::attention_prefill. FLOP/s
// against the tiles' own peak (tdpbf16ps with operands in tile registers,
// all threads) where the CPU has AMX.
void bench_prefill(numa::NodePools& pools, double min_seconds) {
  numa::ThreadPool& pool = pools.pool(0);
  const bool amx = cpu::amx_hardware();
  const double peak = cpu::amx_bf16_peak_flops(&pool);
  std::printf("\n## prefill paths, %d threads; AMX-BF16 %s", pool.size(), amx ? "available" : "not available (AMX columns skipped)");
  if (amx) std::printf(", measured tile peak %.0f GFLOP/s", peak / 1e9);
  std::printf("\n\n| what | format | tokens | tokens / expert | VNNI ms | AMX ms | speed-up | VNNI GFLOP/s | AMX GFLOP/s | AMX / tile peak |\n|---|---|---|---|---|---|---|---|---|---|\n");
  const int64_t old_min = cpu::amx_min_tokens();
  struct Fmt {
    const char* name;
    ExtType up, down;
  };
  const int64_t E = 128;
  for (Fmt f : {Fmt{"Q4_K_M (Q4_K / Q6_K)", ExtType::q4_k, ExtType::q6_k}, Fmt{"Q8_0", ExtType::q8_0, ExtType::q8_0}}) {
    ExpertSet set = make_experts(f.up, f.down, E);
    numa::EngineOptions eo;
    eo.print_memory = false;
    numa::ExpertEngine eng(set.w, pools, eo);
    for (int64_t n : {int64_t{128}, int64_t{512}, int64_t{2048}}) {
      double ms[2] = {NAN, NAN};
      for (int v = 0; v < (amx ? 2 : 1); ++v) {
        cpu::set_amx_min_tokens(v == 0 ? 0 : 8);
        ms[v] = time_forward(eng, n, E, min_seconds) * 1e3;
      }
      const double flop = 2.0 * 3.0 * static_cast<double>(H * I) * static_cast<double>(n * K);
      std::printf("| routed experts (%ld of %ld per token) | %s | %ld | %ld | %.2f | %.2f | %.2fx | %.0f | %.0f | %.2f |\n", K, E, f.name, n, n * K / E, ms[0], ms[1],
                  ms[0] / ms[1], flop / ms[0] / 1e6, flop / ms[1] / 1e6, flop / ms[1] / 1e6 / (peak / 1e9));
    }
  }
  for (ExtType t : {ExtType::q4_k, ExtType::q8_0}) {
    const int64_t rows = 4096, cols = 2048, n = 512;
    const auto f = randn(static_cast<size_t>(rows * cols), 31, 0.02f);
    const auto wb = qtools::quant_rows(t, f.data(), rows, cols);
    const cpu::Mat w = cpu::ext_view(t, wb.data(), rows, cols, "q_proj");
    const auto x = randn(static_cast<size_t>(n * cols), 32, 1.0f);
    std::vector<float> y(static_cast<size_t>(n * rows));
    double ms[2] = {NAN, NAN};
    for (int v = 0; v < (amx ? 2 : 1); ++v) {
      cpu::set_amx_min_tokens(v == 0 ? 0 : 8);
      ms[v] = best_seconds([&] { cpu::gemm(x.data(), n, w, y.data(), &pool); }, min_seconds, 3) * 1e3;
    }
    const double flop = 2.0 * static_cast<double>(rows * cols * n);
    std::printf("| cpu::gemm q_proj [4096 x 2048] | %s | %ld | - | %.2f | %.2f | %.2fx | %.0f | %.0f | %.2f |\n", cpu::ext_type_info(static_cast<uint32_t>(t))->name, n,
                ms[0], ms[1], ms[0] / ms[1], flop / ms[0] / 1e6, flop / ms[1] / 1e6, flop / ms[1] / 1e6 / (peak / 1e9));
  }
  cpu::set_amx_min_tokens(old_min);
  // attention: 32 q / 4 kv heads of 128, bf16 cache, a 2048-token chunk at positions 2048..4095
  const int64_t heads = 32, kvh = 4, hd = 128, ctx = 4096, n = 2048;
  auto kvp = filled_cache(KvDtype::bf16, 1, kvh, hd, ctx, 200);
  std::vector<ops::TokenSlot> slots;
  for (int64_t t = 0; t < n; ++t) slots.push_back({0, ctx - n + t});
  const auto q = randn(static_cast<size_t>(n * heads * hd), 5, 1.0f);
  std::vector<float> out(q.size());
  double ms[2];
  for (int v = 0; v < 2; ++v) {
    auto run = [&] {
      if (v == 0) ops::attention(q.data(), n, heads, kvh, hd, slots.data(), *kvp, 0, 0.088f, out.data(), &pool);
      else ops::attention_prefill(q.data(), n, heads, kvh, hd, slots.data(), *kvp, 0, 0.088f, out.data(), &pool);
    };
    const double best = best_seconds(run, min_seconds, 2);
    ms[v] = best * 1e3;
  }
  // causal: token at position p reads p + 1 keys; QK and PV, 2 FLOP per multiply-add
  double pairs = 0;
  for (int64_t t = 0; t < n; ++t) pairs += static_cast<double>(ctx - n + t + 1);
  const double flop = pairs * static_cast<double>(heads * hd) * 4.0;
  std::printf("\n| attention, 2048-token chunk at context 4096 (32/4 heads of 128, bf16 KV) | decode kernel ms | prefill kernel ms | speed-up | decode GFLOP/s | prefill GFLOP/s |\n"
              "|---|---|---|---|---|---|\n| per layer | %.1f | %.1f | %.2fx | %.0f | %.0f |\n", ms[0], ms[1], ms[0] / ms[1], flop / ms[0] / 1e6, flop / ms[1] / 1e6);
}

// The AVX2 kernels (CPUs without AVX-512 VNNI): gemm_rows_q8 alone, 32-row
// items across the pool, on a projection's shape and a 65536-row one that
// streams from memory (an lm_head's kind); GOP/s, and GB/s of the stored
// weight bytes against the read bandwidth bw measured in this process.
void bench_kernels_avx2(numa::ThreadPool& pool, double min_seconds, int64_t only_batch, double bw) {
  std::printf("\n## 8-bit GGUF kernels, AVX2 (gemm_rows_q8, activations quantized beforehand), %d threads\n\n", pool.size());
  std::printf("| format | product [rows x cols] | tokens | ms | GOP/s | weight GB/s | / read bw |\n|---|---|---|---|---|---|---|\n");
  for (ExtType t : {ExtType::q4_k, ExtType::q5_k, ExtType::q6_k, ExtType::q8_0})
    for (int64_t rows : {int64_t{4096}, int64_t{65536}}) {
      const int64_t cols = 2048;
      const auto f = randn(static_cast<size_t>(rows * cols), 41, 0.02f);
      const auto wb = qtools::quant_rows(t, f.data(), rows, cols);
      const cpu::Mat w = cpu::ext_view(t, wb.data(), rows, cols, "w");
      for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{8}, int64_t{32}, int64_t{512}}) {
        if (only_batch && n != only_batch) continue;
        if (rows > 4096 && n > 8) continue;  // the streaming shape is about decode (batches of 1, 4 and 8)
        const auto x = randn(static_cast<size_t>(n * cols), 42, 1.0f);
        cpu::Q8Acts xa;
        xa.reset(n, w);
        for (int64_t i = 0; i < n; ++i) xa.quantize(i, x.data() + i * cols);
        std::vector<float> y(static_cast<size_t>(n * rows));
        auto run = [&] {
          pool.parallel_for((rows + 31) / 32, [&](int64_t b, int64_t e, int) {
            cpu::gemm_rows_q8(xa, 0, n, w, b * 32, std::min(rows, e * 32), y.data(), rows);
          });
        };
        const double best = best_seconds(run, min_seconds, 3);
        const double ops = 2.0 * static_cast<double>(rows * cols * n), gbs = static_cast<double>(wb.size()) / best / 1e9;
        std::printf("| %s | [%ld x %ld] | %ld | %.3f | %.1f | %.1f | %.2f |\n", cpu::ext_type_info(static_cast<uint32_t>(t))->name, rows, cols, n, best * 1e3,
                    ops / best / 1e9, gbs, gbs / (bw / 1e9));
      }
    }
}

void bench_kernels(numa::ThreadPool& pool, double min_seconds, int64_t only_batch) {
  const double peak = cpu::detail::q8_vnni_peak_macs(&pool) * 2.0;
  std::printf("\n## 8-bit GGUF kernels (gemm_rows_q8, activations quantized beforehand), %d threads, vpdpbusd peak %.0f GOP/s\n\n", pool.size(), peak / 1e9);
  const bool amx = cpu::detail::q8_amx_mode() == cpu::AmxMode::hardware;
  std::printf("AMX-INT8 tiles: %s\n\n", amx ? "yes (the tiles column runs 16-token blocks on them; the last column is the VNNI tiles alone)" : "no");
  std::printf("| format | product [rows x cols] | tokens | per-row ms | tiles ms | speed-up | per-row GOP/s | tiles GOP/s | tiles / int8 peak | VNNI tiles ms (AMX off) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  for (ExtType t : {ExtType::q4_k, ExtType::q5_k, ExtType::q6_k, ExtType::q8_0})
    for (Shape sh : {Shape{"expert gate [768 x 2048]", 768, 2048}, Shape{"expert down [2048 x 768]", 2048, 768}, Shape{"q_proj [4096 x 2048]", 4096, 2048}}) {
      const int64_t cols = sh.cols, rows = sh.rows;
      if (t != ExtType::q6_k && t != ExtType::q4_k && sh.cols == 768) continue;  // 768 = 3 x 256: the K types only
      const auto f = randn(static_cast<size_t>(rows * cols), 41, 0.02f);
      const auto wb = qtools::quant_rows(t, f.data(), rows, cols);
      const cpu::Mat w = cpu::ext_view(t, wb.data(), rows, cols, "w");
      for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, int64_t{32}, int64_t{512}}) {
        if (only_batch && n != only_batch) continue;
        const auto x = randn(static_cast<size_t>(n * cols), 42, 1.0f);
        cpu::Q8Acts xa;
        xa.reset(n, w);
        for (int64_t i = 0; i < n; ++i) xa.quantize(i, x.data() + i * cols);
        std::vector<float> y(static_cast<size_t>(n * rows));
        double ms[3] = {0, 0, NAN};
        const cpu::AmxMode mode = cpu::amx_mode();
        for (int v = 0; v < (amx && n >= 16 ? 3 : 2); ++v) {
          if (v == 2) cpu::set_amx_mode(cpu::AmxMode::off);
          auto run = [&] {
            pool.parallel_for((rows + 31) / 32, [&](int64_t b, int64_t e, int) {
              for (int64_t i = b; i < e; ++i) {
                const int64_t r0 = i * 32, r1 = std::min(rows, r0 + 32);
                if (v == 0) cpu::detail::q8_rows_avx512_rowwise(xa, 0, n, w, r0, r1, y.data(), rows);
                else cpu::detail::q8_tiles_avx512(xa, 0, n, w, r0, r1, y.data(), rows);
              }
            });
          };
          const double best = best_seconds(run, min_seconds, 3);
          ms[v] = best * 1e3;
        }
        cpu::set_amx_mode(mode);
        const double ops = 2.0 * static_cast<double>(rows * cols * n);
        const std::string vnni = std::isnan(ms[2]) ? "-" : std::to_string(ms[2]);
        std::printf("| %s | %s | %ld | %.3f | %.3f | %.2fx | %.1f | %.1f | %.2f | %s |\n", cpu::ext_type_info(static_cast<uint32_t>(t))->name, sh.name, n, ms[0], ms[1],
                    ms[0] / ms[1], ops / ms[0] / 1e6, ops / ms[1] / 1e6, ops / ms[1] / 1e6 / (peak / 1e9), vnni.c_str());
      }
    }
}

// --lm-head: the one-token lm_head product from memory (a Qwen3 output matrix, [151936 x 2048], 207-331 MB: past
// any cache), gemm_rows_q8 in items of 32 rows over the pool as a decode step runs it, against the read probe. The
// blocks are random bytes with finite fp16 scales (the kernels' work does not depend on the values). This is where a
// CPU decode step of a small-expert model spends most of its time (the Q6_K lm_head of a Q4_K_M file: 255 MB a token).
void bench_lm_head(numa::ThreadPool& pool, double min_seconds, double bw) {
  const int64_t rows = 151936, cols = 2048;
  std::printf("\n## one-token lm_head product from memory [%ld x %ld] (gemm_rows_q8, items of 32 rows), %d threads\n\n", rows, cols, pool.size());
  std::printf("| format | MB | ms | GB/s | / read bw |\n|---|---|---|---|---|\n");
  for (ExtType t : {ExtType::q4_k, ExtType::q6_k, ExtType::q8_0}) {
    const cpu::ExtTypeInfo* ti = cpu::ext_type_info(static_cast<uint32_t>(t));
    const size_t bb = static_cast<size_t>(ti->block_bytes);
    std::vector<uint8_t> wb(static_cast<size_t>(cols / ti->block_elems) * bb * static_cast<size_t>(rows));
    std::mt19937_64 rng(11);
    for (size_t i = 0; i + 8 <= wb.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(wb.data() + i, &v, 8);
    }
    for (size_t b = 0; b < wb.size() / bb; ++b) {  // finite scales: d (and dmin) in [2^-7, 2^-6)
      const uint16_t h = static_cast<uint16_t>(0x2000 + (rng() & 0x3FF));
      uint8_t* blk = wb.data() + b * bb;
      if (t == ExtType::q6_k) std::memcpy(blk + 208, &h, 2);
      else std::memcpy(blk, &h, 2);
      if (t == ExtType::q4_k) std::memcpy(blk + 2, &h, 2);
    }
    const cpu::Mat w = cpu::ext_view(t, wb.data(), rows, cols, "lm_head");
    const auto x = randn(static_cast<size_t>(cols), 43, 1.0f);
    cpu::Q8Acts xa;
    xa.reset(1, w);
    xa.quantize(0, x.data());
    std::vector<float> y(static_cast<size_t>(rows));
    auto run = [&] {
      pool.parallel_for((rows + 31) / 32, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) cpu::gemm_rows_q8(xa, 0, 1, w, i * 32, std::min(rows, i * 32 + 32), y.data(), rows);
      });
    };
    const double sec = best_seconds(run, min_seconds, 5);
    const double gbs = static_cast<double>(wb.size()) / sec / 1e9;
    std::printf("| %s | %.1f | %.2f | %.1f | %.2f |\n", ti->name, wb.size() / 1e6, sec * 1e3, gbs, gbs / (bw / 1e9));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  bool quick = false, all = true, attn = true, experts = true, prefill_only = false, kernels_only = false, lm_head_only = false;
  int64_t only_batch = 0;
  std::string only_fmt;  // one format by name (Q8_0, Q4_K, ...)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--formats" && i + 1 < argc) {
      const std::string f = argv[++i];
      all = f != "q4km";
      only_fmt = f == "all" || f == "q4km" ? "" : f;
    }
    else if (a == "--batch" && i + 1 < argc) only_batch = std::stoll(argv[++i]);
    else if (a == "--no-attention") attn = false;
    else if (a == "--attention-only") experts = false;
    else if (a == "--kv-layers" && i + 1 < argc) g_kv_layers = std::stoll(argv[++i]);
    else if (a == "--prefill-only") prefill_only = true;
    else if (a == "--kernels") kernels_only = true;
    else if (a == "--lm-head") lm_head_only = true;
    else {
      std::fprintf(stderr, "usage: bench_gguf_cpu [--threads T] [--quick] [--formats all|q4km|NAME] [--batch N] [--no-attention | --attention-only | --prefill-only | --kernels | --lm-head] [--kv-layers N]\n");
      return 2;
    }
  }
  numa::PoolOptions po;
  po.threads = threads;
  po.quiet = true;
  numa::NodePools pools(po);
  numa::ThreadPool& pool = pools.pool(0);
  const double bw = measure_host_read_bandwidth(&pool);  // 256 MiB, the same threads
  const double min_s = quick ? 0.2 : 1.0;
  std::printf("# bench_gguf_cpu: %d threads, ISA %s%s, read bandwidth %.2f GB/s (256 MiB, same threads)\n", pool.size(),
              cpu::isa_name(cpu::best_isa()), cpu::detail::q8_has_vnni() ? " +VNNI" : "", bw / 1e9);
  if (prefill_only) {
    bench_prefill(pools, min_s);
    return 0;
  }
  if (lm_head_only) {
    bench_lm_head(pool, min_s, bw);
    return 0;
  }
  if (kernels_only) {
    if (cpu::best_isa() != cpu::Isa::avx512 || !cpu::detail::q8_has_vnni()) {
      bench_kernels_avx2(pool, min_s, only_batch, bw);
      return 0;
    }
    bench_kernels(pool, min_s, only_batch);
    return 0;
  }
  if (experts) std::printf("\n## routed experts (ExpertEngine, hidden %ld, intermediate %ld, top-%ld, 64 experts cycled)\n\n", H, I, K);
  if (experts) std::printf("| format (gate,up / down) | MB/expert | batch | exact ms | int8 ms | speed-up | exact GB/s | int8 GB/s | int8 / read bw | exact GOP/s | int8 GOP/s |\n");
  if (experts) std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  struct Fmt {
    const char* name;
    ExtType up, down;
  };
  std::vector<Fmt> fmts = {{"Q4_K_M (Q4_K / Q6_K)", ExtType::q4_k, ExtType::q6_k}};
  if (all)
    for (Fmt f : {Fmt{"Q4_K", ExtType::q4_k, ExtType::q4_k}, Fmt{"Q5_K", ExtType::q5_k, ExtType::q5_k}, Fmt{"Q6_K", ExtType::q6_k, ExtType::q6_k},
                  Fmt{"Q8_0", ExtType::q8_0, ExtType::q8_0}, Fmt{"Q4_0", ExtType::q4_0, ExtType::q4_0}, Fmt{"Q5_0", ExtType::q5_0, ExtType::q5_0}})
      fmts.push_back(f);
  const int64_t E = 64;
  if (!experts) fmts.clear();
  for (const Fmt& f : fmts) {
    if (!only_fmt.empty() && only_fmt != f.name) continue;
    ExpertSet set = make_experts(f.up, f.down, E);
    numa::EngineOptions on, off;
    on.print_memory = off.print_memory = false;
    off.gguf_int8 = false;
    numa::ExpertEngine eq(set.w, pools, on), ee(set.w, pools, off);
    for (int64_t n : {int64_t{1}, int64_t{64}, int64_t{512}}) {
      if (quick && n == 512 && &f != &fmts[0]) continue;
      if (only_batch && n != only_batch) continue;
      const double se = time_forward(ee, n, E, min_s), sq = time_forward(eq, n, E, min_s);
      // bytes: distinct experts touched per step (all K at batch 1; at most E)
      const double touched = static_cast<double>(std::min<int64_t>(E, n * K));
      const double bytes = touched * set.expert_bytes;
      const double ops = 2.0 * 3.0 * static_cast<double>(H * I) * static_cast<double>(n * K);
      std::printf("| %s | %.2f | %ld | %.3f | %.3f | %.2fx | %.1f | %.1f | %.2f | %.1f | %.1f |\n", f.name, set.expert_bytes / 1e6, n, se * 1e3,
                  sq * 1e3, se / sq, bytes / se / 1e9, bytes / sq / 1e9, bytes / sq / bw, ops / se / 1e9, ops / sq / 1e9);
    }
  }
  if (experts)
    std::printf("\n(GB/s: stored bytes of the distinct experts a step touches / step time; GOP/s: 2 x 3 x H x I per (token, expert)\n"
              " pair, integer multiply-adds for int8, fp32 FMAs for exact.)\n");
  if (attn) {
    bench_attention(pool, min_s, bw);
    bench_layer(pools, min_s);
  }
  return 0;
}
