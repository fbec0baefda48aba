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
//    an 8-row x 32-position register tile (16 accumulators, one K load per
//    8 FMAs), the causal mask on the diagonal blocks, the online softmax per
//    row, O += P V by a 4-row x 64-value register tile; keys past the block's last
//    position are never visited;
//  - the scale is folded into Q; fp32 throughout, so results equal
//    attention_reference up to summation order.
// Tokens outside runs of at least kMinRun (decode tokens, short chunks) go to
// ops::attention, compacted, in the same call.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops/cpu_ops.h"

#define HMOE_P512 __attribute__((target("avx512f,avx512dq,fma")))

namespace hmoe::ops {

namespace {

constexpr int64_t kMinRun = 16;  // tokens: shorter runs stay on the decode kernel
constexpr int64_t kQ = 16;       // query tokens per item
constexpr int64_t kKB = 64;      // key positions per block

struct Run {
  int64_t t0, len;  // batch tokens [t0, t0 + len): one sequence, positions p0.. consecutive
  int seq;
  int64_t p0;
};

bool simd_ok(int64_t hd) {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return ok && cpu::best_isa() == cpu::Isa::avx512 && (hd == 64 || hd == 128);
}

// e^x for x <= 0 (-inf gives 0): 2^n e^r with |r| <= ln2 / 2, e^r by a
// degree-6 polynomial (relative error about 2e-7).
HMOE_P512 inline __m512 exp_le0(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, n);
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

// S[r][0..kKB) = Q[r] . K[j0 + .] for rows r0..r0+8 (qs: [R][hd], kt: the key block [hd][kKB]).
HMOE_P512 inline void scores8(const float* qs, int64_t hd, const float* kt, float* s) {
  for (int jv = 0; jv < kKB / 32; ++jv) {
    __m512 acc[8][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; ++d) {
      const __m512 k0 = _mm512_loadu_ps(kt + d * kKB + jv * 32), k1 = _mm512_loadu_ps(kt + d * kKB + jv * 32 + 16);
      for (int i = 0; i < 8; ++i) {
        const __m512 q = _mm512_set1_ps(qs[i * hd + d]);
        acc[i][0] = _mm512_fmadd_ps(q, k0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(q, k1, acc[i][1]);
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_storeu_ps(s + i * kKB + jv * 32, acc[i][0]);
      _mm512_storeu_ps(s + i * kKB + jv * 32 + 16, acc[i][1]);
    }
  }
}

// o[r] = o[r] * corr[r] + sum_p P[r][p] V[p] for rows r0..r0+3 (NV = hd / 16),
// 64 values of hd at a time: each V vector is loaded once into a register
// for four rows (16 accumulators, 4 loads + 4 broadcasts per 16 FMAs).
template <int NV>
HMOE_P512 inline void pv4(const float* p, const float* v, int64_t np, const float* corr, float* o) {
  constexpr int64_t hd = NV * 16;
  for (int h = 0; h < NV / 4; ++h) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 4; ++c) acc[i][c] = _mm512_mul_ps(_mm512_loadu_ps(o + i * hd + h * 64 + c * 16), _mm512_set1_ps(corr[i]));
    const float* vh = v + h * 64;
    for (int64_t j = 0; j < np; ++j) {
      __m512 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = _mm512_loadu_ps(vh + j * hd + c * 16);
      for (int i = 0; i < 4; ++i) {
        const __m512 pi = _mm512_set1_ps(p[i * kKB + j]);
        for (int c = 0; c < 4; ++c) acc[i][c] = _mm512_fmadd_ps(pi, vv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + i * hd + h * 64 + c * 16, acc[i][c]);
  }
}

// One item: query tokens [q0, q0 + nq) of the run (nq <= kQ) against kv head g.
template <int NV>
HMOE_P512 void run_item(const Run& run, int64_t q0, int64_t nq, int64_t g, const float* q, int64_t heads, int64_t G, float scale, Context& c,
                        float* out) {
  constexpr int64_t hd = NV * 16;
  const int64_t R = nq * G, Rp = (R + 7) / 8 * 8;
  thread_local std::vector<float> qs, s, o, m, l, corr;
  thread_local std::vector<int64_t> rowpos;
  qs.assign(static_cast<size_t>(Rp * hd), 0.0f);
  s.resize(static_cast<size_t>(Rp * kKB));
  o.assign(static_cast<size_t>(Rp * hd), 0.0f);
  m.assign(static_cast<size_t>(Rp), -INFINITY);
  l.assign(static_cast<size_t>(Rp), 0.0f);
  corr.resize(static_cast<size_t>(Rp));
  rowpos.resize(static_cast<size_t>(Rp));
  for (int64_t r = 0; r < Rp; ++r) {
    const int64_t tq = std::min(r / G, nq - 1);  // padding rows repeat the last token's position (their output is dropped)
    rowpos[static_cast<size_t>(r)] = run.p0 + q0 + tq;
    if (r >= R) continue;
    const float* src = q + ((run.t0 + q0 + tq) * heads + g * G + r % G) * hd;
    for (int64_t d = 0; d < hd; ++d) qs[static_cast<size_t>(r * hd + d)] = src[d] * scale;
  }
  const int64_t last = run.p0 + q0 + nq - 1, first = run.p0 + q0;
  const float* kt = c.kt_head(g);
  const float* vh = c.v_head(g);
  for (int64_t blk = 0; blk * kKB <= last; ++blk) {
    const int64_t j0 = blk * kKB;
    const int64_t np = std::min(kKB, last + 1 - j0);
    for (int64_t r = 0; r < Rp; r += 8) scores8(qs.data() + r * hd, hd, kt + blk * hd * kKB, s.data() + r * kKB);
    const bool diag = j0 + kKB - 1 > first;
    for (int64_t r = 0; r < Rp; ++r) {
      float* sr = s.data() + r * kKB;
      __m512 sv[kKB / 16];
      __mmask16 lives[kKB / 16];
      __m512 mx = _mm512_set1_ps(-INFINITY);
      for (int v = 0; v < kKB / 16; ++v) {
        __mmask16 live = 0xFFFF;
        if (diag) {
          const int64_t lim = rowpos[static_cast<size_t>(r)] - (j0 + v * 16);  // lanes 0..lim are visible
          live = lim < 0 ? 0 : lim >= 15 ? 0xFFFF : static_cast<__mmask16>((1u << (lim + 1)) - 1);
        }
        lives[v] = live;
        sv[v] = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, sr + v * 16);
        mx = _mm512_max_ps(mx, sv[v]);
      }
      const float mold = m[static_cast<size_t>(r)];
      const float mnew = std::max(mold, _mm512_reduce_max_ps(mx));
      const float cr = mold == -INFINITY ? 0.0f : _mm512_cvtss_f32(exp_le0(_mm512_set1_ps(mold - mnew)));
      __m512 sum = _mm512_setzero_ps();
      for (int v = 0; v < kKB / 16; ++v) {
        const __m512 pv = _mm512_maskz_mov_ps(lives[v], exp_le0(_mm512_sub_ps(sv[v], _mm512_set1_ps(mnew))));
        sum = _mm512_add_ps(sum, pv);
        _mm512_storeu_ps(sr + v * 16, pv);
      }
      l[static_cast<size_t>(r)] = l[static_cast<size_t>(r)] * cr + _mm512_reduce_add_ps(sum);
      m[static_cast<size_t>(r)] = mnew;
      corr[static_cast<size_t>(r)] = cr;
    }
    for (int64_t r = 0; r < Rp; r += 4) pv4<NV>(s.data() + r * kKB, vh + j0 * hd, np, corr.data() + r, o.data() + r * hd);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t tq = r / G;
    float* dst = out + ((run.t0 + q0 + tq) * heads + g * G + r % G) * hd;
    const float inv = 1.0f / l[static_cast<size_t>(r)];
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
      if (hd == 128) run_item<8>(run, q0, nq, g, q, heads, G, scale, c, out);
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
  if (simd_ok(hd) && heads % kv_heads == 0) {
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
