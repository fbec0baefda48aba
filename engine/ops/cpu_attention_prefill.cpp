// CPU attention for prompt chunks (ops::attention_prefill, engine/ops/cpu_ops.h).
//
// Why: ops::attention is built for decode (one query token reads the whole
// context once); on a 4096-token prompt it runs each token as its own
// matrix-vector product, so every key and value is read and widened once per
// token and pair of heads, and the CPU's FMA units wait on loads. A prompt
// chunk is a matrix product: the G query heads of a kv head and 16
// consecutive query tokens (128 rows for Qwen3-30B-A3B) share every key and
// value. Here, per run of consecutive positions of one sequence:
//  - the run's context keys and values of each kv head are decoded once to
//    fp32 (any KvDtype, through kv_decode_row): keys transposed per block of
//    64 positions ([block][hd][64]), values as rows;
//  - one work item is (kv head, 16 query tokens): S = Q K^T per key block by
//    an 8-row x 32-position register tile, the causal mask on the diagonal
//    blocks, the online softmax per row, O += P V by a 4-row x 64-value
//    register tile; keys past the block's last position are never visited.
// Batch invariance (tests/server: a token's logits are the same bits alone
// and inside any batch): every (token, head) is computed with exactly the
// arithmetic of the decode kernel (cpu_attention_kernel.inc, AVX-512) when
// that runs the token's context as one chunk (contexts below two chunks of
// kMinChunk, or a batch with enough rows for every thread): the same score
// chains over d (score_chains), the online softmax per key tile of 16
// (running max, sum, correction, exp from cpu_attention_exp512.h), the same
// fma order over positions, the same normalisation; only which values share
// a register differs. tests/engine/test_attention_prefill.cpp checks the
// bits. Where that cannot hold (q8_0 keys, which the decode kernel sums per
// group of 32 before scaling; key tiles narrower than 16 from blocks of 8 or
// fewer tokens; no AVX-512; hd other than 64/128/256) every token takes
// ops::attention, as do tokens outside runs of at least kMinRun (decode
// tokens, short chunks), compacted, in the same call.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops/cpu_attention_exp512.h"
#include "engine/ops/cpu_ops.h"

#define HMOE_P512 __attribute__((target("avx512f,avx512dq,fma")))

namespace hmoe::ops {

namespace {

using detail::attn_exp_neg;

constexpr int64_t kMinRun = 16;  // tokens: shorter runs stay on the decode kernel
constexpr int64_t kQ = 16;       // query tokens per item
constexpr int64_t kKB = 64;      // key positions per block
constexpr int64_t kTile = 16;    // positions per online-softmax step (the decode kernel's key tile)
constexpr int64_t kTiles = kKB / kTile;

struct Run {
  int64_t t0, len;  // batch tokens [t0, t0 + len): one sequence, positions p0.. consecutive
  int seq;
  int64_t p0;
};

bool simd_ok(int64_t hd, const KvCache& kv) {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return ok && cpu::best_isa() == cpu::Isa::avx512 && (hd == 64 || hd == 128 || hd == 256) && kv.dtype() != KvDtype::q8_0 && kv.geometry().tile == kTile;
}

// The context of one run, decoded: per kv head, keys [blocks][hd][kKB] and
// values [blocks * kKB][hd] (positions past ctx are zeros).
struct Context {
  int64_t ctx = 0, blocks = 0, hd = 0;
  std::vector<float> kt, v;  // [kv_heads][...]
  float* kt_head(int64_t g) { return kt.data() + g * blocks * hd * kKB; }
  float* v_head(int64_t g) { return v.data() + g * blocks * kKB * hd; }
};

void decode_context(const Run& run, int64_t kv_heads, int64_t hd, KvCache& kv, int64_t layer, Context& c, numa::ThreadPool* pool) {
  c.ctx = run.p0 + run.len;
  c.blocks = (c.ctx + kKB - 1) / kKB;
  c.hd = hd;
  const size_t per = static_cast<size_t>(c.blocks * kKB * hd);
  c.kt.resize(per * static_cast<size_t>(kv_heads));
  c.v.resize(per * static_cast<size_t>(kv_heads));
  const int64_t kw = kv.layout().k_floats(), vw = kv.layout().v_floats();
  auto body = [&](int64_t b, int64_t e, int) {
    std::vector<float> krow(static_cast<size_t>(kw)), vrow(static_cast<size_t>(vw));
    for (int64_t it = b; it < e; ++it) {
      const int64_t g = it / c.blocks, blk = it % c.blocks;
      float* kt = c.kt_head(g) + blk * hd * kKB;
      float* vv = c.v_head(g) + blk * kKB * hd;
      for (int64_t p = 0; p < kKB; ++p) {
        const int64_t pos = blk * kKB + p;
        if (pos >= c.ctx) {
          for (int64_t d = 0; d < hd; ++d) kt[d * kKB + p] = 0.0f;
          std::fill(vv + p * hd, vv + (p + 1) * hd, 0.0f);
          continue;
        }
        // One token's keys and values of every head, back in fp32 (the
        // cache's head-major layout, engine/kv/kv_storage.h); this head's slice.
        kv.load(layer, run.seq, pos, krow.data(), vrow.data());
        for (int64_t d = 0; d < hd; ++d) kt[d * kKB + p] = krow[static_cast<size_t>(g * hd + d)];
        std::copy(vrow.begin() + g * hd, vrow.begin() + (g + 1) * hd, vv + p * hd);
      }
    }
  };
  const int64_t items = kv_heads * c.blocks;
  if (pool && items > 1) pool->parallel_for(items, body);
  else body(0, items, 0);
}

// Accumulators the decode kernel (cpu_attention_kernel.inc, AVX-512: 8
// score accumulators per pass) splits a head's score sum over: its passes
// take 8 heads at a time, then 4, 2 and 1, and a pass of HG heads sums every
// score in 8 / HG interleaved chains over d, added in order at the end.
int64_t score_chains(int64_t h, int64_t G) {
  int64_t h0 = G / 8 * 8;
  if (h < h0) return 1;
  for (int64_t hg : {4, 2, 1}) {
    if (h0 + hg <= G) {
      if (h < h0 + hg) return 8 / hg;
      h0 += hg;
    }
  }
  return 8;
}

// S[i][0..kKB) = Q[i] . K[j0 + .] for RR rows (qs: [RR][hd], kt: the key
// block [hd][kKB]), each score summed in NS chains over d as the decode
// kernel sums it (the same fma order per lane, so the same bits).
template <int NS, int RR>
HMOE_P512 inline void scores(const float* qs, int64_t hd, const float* kt, float* s) {
  for (int jv = 0; jv < kKB / 32; ++jv) {
    __m512 acc[RR][2][NS];
    for (auto& a : acc)
      for (auto& b : a)
        for (auto& c : b) c = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d += NS)
      for (int u = 0; u < NS; ++u) {
        const __m512 k0 = _mm512_loadu_ps(kt + (d + u) * kKB + jv * 32), k1 = _mm512_loadu_ps(kt + (d + u) * kKB + jv * 32 + 16);
        for (int i = 0; i < RR; ++i) {
          const __m512 q = _mm512_set1_ps(qs[i * hd + d + u]);
          acc[i][0][u] = _mm512_fmadd_ps(q, k0, acc[i][0][u]);
          acc[i][1][u] = _mm512_fmadd_ps(q, k1, acc[i][1][u]);
        }
      }
    for (int i = 0; i < RR; ++i)
      for (int c = 0; c < 2; ++c) {
        __m512 v = acc[i][c][0];
        for (int u = 1; u < NS; ++u) v = _mm512_add_ps(v, acc[i][c][u]);
        _mm512_storeu_ps(s + i * kKB + jv * 32 + c * 16, v);
      }
  }
}

// 8 rows of one head (NS chains each).
HMOE_P512 inline void scores8(int64_t ns, const float* qs, int64_t hd, const float* kt, float* s) {
  switch (ns) {
    case 1: return scores<1, 8>(qs, hd, kt, s);
    case 2:
      for (int i = 0; i < 8; i += 4) scores<2, 4>(qs + i * hd, hd, kt, s + i * kKB);
      return;
    case 4:
      for (int i = 0; i < 8; i += 2) scores<4, 2>(qs + i * hd, hd, kt, s + i * kKB);
      return;
    default:
      for (int i = 0; i < 8; ++i) scores<8, 1>(qs + i * hd, hd, kt, s + i * kKB);
  }
}

// o[r] = o[r] * corr[r][t] + sum_p P[r][p] V[p] for rows r..r+3, tile t of
// kTile positions at a time (NV = hd / 16), 64 values of hd at a time: each
// V vector is loaded once into a register for four rows (16 accumulators,
// 4 loads + 4 broadcasts per 16 FMAs). The per-tile rescale and the fma
// order over positions are the decode kernel's.
template <int NV>
HMOE_P512 inline void pv4(const float* p, const float* v, int64_t np, const float* corr, float* o) {
  constexpr int64_t hd = NV * 16;
  for (int h = 0; h < NV / 4; ++h) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 4; ++c) acc[i][c] = _mm512_loadu_ps(o + i * hd + h * 64 + c * 16);
    const float* vh = v + h * 64;
    for (int64_t t0 = 0; t0 < np; t0 += kTile) {
      for (int i = 0; i < 4; ++i) {
        const __m512 ci = _mm512_set1_ps(corr[i * kTiles + t0 / kTile]);
        for (int c = 0; c < 4; ++c) acc[i][c] = _mm512_mul_ps(acc[i][c], ci);
      }
      const int64_t t1 = std::min(np, t0 + kTile);
      for (int64_t j = t0; j < t1; ++j) {
        __m512 vv[4];
        for (int c = 0; c < 4; ++c) vv[c] = _mm512_loadu_ps(vh + j * hd + c * 16);
        for (int i = 0; i < 4; ++i) {
          const __m512 pi = _mm512_set1_ps(p[i * kKB + j]);
          for (int c = 0; c < 4; ++c) acc[i][c] = _mm512_fmadd_ps(pi, vv[c], acc[i][c]);
        }
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + i * hd + h * 64 + c * 16, acc[i][c]);
  }
}

// One item: query tokens [q0, q0 + nq) of the run (nq <= kQ) against kv head
// g. Rows are head-major (row h * nqp + i: head g G + h, token q0 + i; nqp =
// nq rounded up to 8, padding rows repeat the last token and are dropped),
// so every 8-row score tile belongs to one head.
template <int NV>
HMOE_P512 void run_item(const Run& run, int64_t q0, int64_t nq, int64_t g, const float* q, int64_t heads, int64_t G, float scale, Context& c,
                        float* out) {
  constexpr int64_t hd = NV * 16;
  const int64_t nqp = (nq + 7) / 8 * 8, Rp = G * nqp;
  thread_local std::vector<float> qs, s, o, m, l, corr;
  thread_local std::vector<int64_t> rowpos, chains;
  qs.resize(static_cast<size_t>(Rp * hd));
  s.resize(static_cast<size_t>(Rp * kKB));
  o.assign(static_cast<size_t>(Rp * hd), 0.0f);
  m.assign(static_cast<size_t>(Rp), -INFINITY);
  l.assign(static_cast<size_t>(Rp), 0.0f);
  corr.resize(static_cast<size_t>(Rp * kTiles));
  rowpos.resize(static_cast<size_t>(Rp));
  chains.resize(static_cast<size_t>(G));
  for (int64_t h = 0; h < G; ++h) chains[static_cast<size_t>(h)] = score_chains(h, G);
  for (int64_t r = 0; r < Rp; ++r) {
    const int64_t h = r / nqp, tq = std::min(r % nqp, nq - 1);
    rowpos[static_cast<size_t>(r)] = run.p0 + q0 + tq;
    const float* src = q + ((run.t0 + q0 + tq) * heads + g * G + h) * hd;
    for (int64_t d = 0; d < hd; ++d) qs[static_cast<size_t>(r * hd + d)] = src[d] * scale;
  }
  const int64_t last = run.p0 + q0 + nq - 1, first = run.p0 + q0;
  const float* kt = c.kt_head(g);
  const float* vh = c.v_head(g);
  for (int64_t blk = 0; blk * kKB <= last; ++blk) {
    const int64_t j0 = blk * kKB;
    const int64_t np = std::min(kKB, last + 1 - j0), ntile = (np + kTile - 1) / kTile;
    for (int64_t r = 0; r < Rp; r += 8) scores8(chains[static_cast<size_t>(r / nqp)], qs.data() + r * hd, hd, kt + blk * hd * kKB, s.data() + r * kKB);
    const bool diag = j0 + kKB - 1 > first;
    // Online softmax per key tile of 16, as the decode kernel runs it.
    for (int64_t r = 0; r < Rp; ++r) {
      float* sr = s.data() + r * kKB;
      float& mr = m[static_cast<size_t>(r)];
      float& lr = l[static_cast<size_t>(r)];
      for (int64_t t = 0; t < ntile; ++t) {
        __mmask16 live = 0xFFFF;
        if (diag) {
          const int64_t lim = rowpos[static_cast<size_t>(r)] - (j0 + t * kTile);  // lanes 0..lim are visible
          live = lim < 0 ? 0 : lim >= 15 ? 0xFFFF : static_cast<__mmask16>((1u << (lim + 1)) - 1);
        }
        const __m512 sv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, sr + t * kTile);
        const float mnew = std::max(mr, _mm512_reduce_max_ps(sv));
        const __m512 pv = _mm512_maskz_mov_ps(live, attn_exp_neg(_mm512_sub_ps(sv, _mm512_set1_ps(mnew))));
        const float cr = mnew == mr ? 1.0f : _mm512_cvtss_f32(attn_exp_neg(_mm512_set1_ps(mr - mnew)));
        lr = lr * cr + _mm512_reduce_add_ps(pv);
        mr = mnew;
        corr[static_cast<size_t>(r * kTiles + t)] = cr;
        _mm512_storeu_ps(sr + t * kTile, pv);
      }
    }
    for (int64_t r = 0; r < Rp; r += 4)
      pv4<NV>(s.data() + r * kKB, vh + j0 * hd, np, corr.data() + r * kTiles, o.data() + r * hd);
  }
  // Normalised as the decode kernel's one-chunk merge does (1 / l in double).
  for (int64_t h = 0; h < G; ++h)
    for (int64_t tq = 0; tq < nq; ++tq) {
      const int64_t r = h * nqp + tq;
      float* dst = out + ((run.t0 + q0 + tq) * heads + g * G + h) * hd;
      const float inv = static_cast<float>(1.0 / static_cast<double>(l[static_cast<size_t>(r)]));
      for (int64_t d = 0; d < hd; ++d) dst[d] = o[static_cast<size_t>(r * hd + d)] * inv;
    }
}

void run_prefill(const Run& run, const float* q, int64_t heads, int64_t kv_heads, int64_t hd, KvCache& kv, int64_t layer, float scale, float* out,
                 numa::ThreadPool* pool) {
  thread_local Context tl_ctx;  // the workers use the caller's through this reference
  Context& c = tl_ctx;
  decode_context(run, kv_heads, hd, kv, layer, c, pool);
  const int64_t G = heads / kv_heads, qb = (run.len + kQ - 1) / kQ;
  // Items in decreasing cost (later query blocks see more keys) so the last ones are short.
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t blk = qb - 1 - it / kv_heads, g = it % kv_heads;
      const int64_t q0 = blk * kQ, nq = std::min(kQ, run.len - q0);
      if (hd == 256) run_item<16>(run, q0, nq, g, q, heads, G, scale, c, out);
      else if (hd == 128) run_item<8>(run, q0, nq, g, q, heads, G, scale, c, out);
      else run_item<4>(run, q0, nq, g, q, heads, G, scale, c, out);
    }
  };
  const int64_t items = qb * kv_heads;
  if (pool && items > 1) pool->parallel_for(items, body, 1, 1);
  else body(0, items, 0);
}

}  // namespace

void attention_prefill(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
                       int64_t layer, float scale, float* out, numa::ThreadPool* pool) {
  std::vector<Run> runs;
  std::vector<int64_t> rest;  // tokens for ops::attention
  if (simd_ok(hd, kv) && heads % kv_heads == 0) {
    for (int64_t t = 0; t < n;) {
      int64_t e = t + 1;
      while (e < n && slots[e].seq == slots[t].seq && slots[e].pos == slots[e - 1].pos + 1) ++e;
      if (e - t >= kMinRun) runs.push_back({t, e - t, slots[t].seq, slots[t].pos});
      else
        for (int64_t i = t; i < e; ++i) rest.push_back(i);
      t = e;
    }
  }
  if (runs.empty()) return attention(q, n, heads, kv_heads, hd, slots, kv, layer, scale, out, pool);
  for (const Run& r : runs) run_prefill(r, q, heads, kv_heads, hd, kv, layer, scale, out, pool);
  if (rest.empty()) return;
  const int64_t row = heads * hd, nr = static_cast<int64_t>(rest.size());
  std::vector<float> qc(static_cast<size_t>(nr * row)), oc(qc.size());
  std::vector<TokenSlot> sc(static_cast<size_t>(nr));
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t t = rest[static_cast<size_t>(i)];
    std::copy(q + t * row, q + (t + 1) * row, qc.begin() + i * row);
    sc[static_cast<size_t>(i)] = slots[t];
  }
  attention(qc.data(), nr, heads, kv_heads, hd, sc.data(), kv, layer, scale, oc.data(), pool);
  for (int64_t i = 0; i < nr; ++i) std::copy(oc.begin() + i * row, oc.begin() + (i + 1) * row, out + rest[static_cast<size_t>(i)] * row);
}

}  // namespace hmoe::ops
