// CPU grouped-query attention over the paged KV cache (ops::attention,
// declared in engine/ops/cpu_ops.h).
//
// Why this shape: a decode step reads every cached key and value of the
// sequence once per layer, so decode time grows with context unless that
// read runs at memory speed on all threads. The first version took one job
// per (token, query head), so the K/V of a GQA group was read once per query
// head, in scalar code, and at batch 1 only `heads` jobs existed. Here:
//  - one work item is (token, kv head, chunk of positions): the group's query
//    heads share every K/V load;
//  - long contexts are split into chunks (at least kMinChunk positions, as
//    many as the threads need); each chunk keeps its own running max, sum
//    and unnormalised output (online softmax), and a second pass merges the
//    chunks of each (token, head) by their log-sum-exp (flash-decoding);
//  - per page tile of up to 16 positions the dot products, the exp and the
//    V accumulation are AVX-512 (scalar loops where the CPU lacks it or the
//    head dimension is not a multiple of 16); for head dims 64 and 128 two
//    query heads are done at once with q and the outputs in registers, so
//    each K/V load serves both.
// Results equal attention_reference up to float summation order.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops/cpu_ops.h"

#define HMOE_A512 __attribute__((target("avx512f,avx512dq,fma")))

namespace hmoe::ops {

namespace {

constexpr int64_t kMinChunk = 128;  // positions: below this a split costs more than it gains
constexpr int kTile = 16;

struct Item {
  int64_t t, g, j0, j1;
};

// Per item: m[G] (running max), l[G] (running sum), o[G][hd] (unnormalised output).
inline int64_t part_floats(int64_t G, int64_t hd) { return G * (2 + hd); }

bool use_avx512(int64_t hd) {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return ok && hd % 16 == 0 && cpu::best_isa() == cpu::Isa::avx512;
}

// exp(x) for x <= 0 (and -inf): 2^n * e^y, y = x - n ln2 in [-ln2/2, ln2/2],
// e^y by its degree-6 Taylor polynomial (relative error < 2e-7).
HMOE_A512 inline __m512 exp_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 y = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  const __m512 yy = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), y);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, yy, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, yy, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, yy, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, yy, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, yy, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, yy, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Scores and V accumulation for two query heads at once (HP = 2, or 1 for
// an odd last head), with hd = 16 * NV held in registers: every K and V
// load serves both heads.
template <int NV, int HP>
HMOE_A512 inline void heads_fixed(const float* q, int64_t hd, const float* const* krow, const float* const* vrow, int64_t T, float scale,
                                  float* m, float* l, float* o) {
  const __mmask16 live = static_cast<__mmask16>((1u << T) - 1);
  alignas(64) float sc[HP][kTile];
  {
    __m512 qr[HP][NV];
    for (int h = 0; h < HP; ++h)
      for (int i = 0; i < NV; ++i) qr[h][i] = _mm512_loadu_ps(q + h * hd + 16 * i);
    for (int64_t p = 0; p < T; ++p) {
      __m512 acc[HP];
      for (int h = 0; h < HP; ++h) acc[h] = _mm512_mul_ps(qr[h][0], _mm512_loadu_ps(krow[p]));
      for (int i = 1; i < NV; ++i) {
        const __m512 k = _mm512_loadu_ps(krow[p] + 16 * i);
        for (int h = 0; h < HP; ++h) acc[h] = _mm512_fmadd_ps(qr[h][i], k, acc[h]);
      }
      for (int h = 0; h < HP; ++h) sc[h][p] = _mm512_reduce_add_ps(acc[h]);
    }
  }
  __m512 pv[HP], corr[HP];
  for (int h = 0; h < HP; ++h) {
    const __m512 sv = _mm512_mul_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, sc[h]), _mm512_set1_ps(scale));
    const float mnew = std::max(m[h], _mm512_reduce_max_ps(sv));
    corr[h] = _mm512_set1_ps(std::exp(m[h] - mnew));
    pv[h] = _mm512_maskz_mov_ps(live, exp_neg(_mm512_sub_ps(sv, _mm512_set1_ps(mnew))));
    l[h] = l[h] * std::exp(m[h] - mnew) + _mm512_reduce_add_ps(pv[h]);
    m[h] = mnew;
    _mm512_store_ps(sc[h], pv[h]);
  }
  __m512 acc[HP][NV];
  for (int h = 0; h < HP; ++h)
    for (int i = 0; i < NV; ++i) acc[h][i] = _mm512_mul_ps(_mm512_loadu_ps(o + h * hd + 16 * i), corr[h]);
  for (int64_t p = 0; p < T; ++p) {
    __m512 pb[HP];
    for (int h = 0; h < HP; ++h) pb[h] = _mm512_set1_ps(sc[h][p]);
    for (int i = 0; i < NV; ++i) {
      const __m512 v = _mm512_loadu_ps(vrow[p] + 16 * i);
      for (int h = 0; h < HP; ++h) acc[h][i] = _mm512_fmadd_ps(pb[h], v, acc[h][i]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + h * hd + 16 * i, acc[h][i]);
}

template <int NV>
HMOE_A512 void chunk_fixed(const float* q, int64_t G, int64_t hd, const float* const* krow, const float* const* vrow, int64_t T, float scale,
                           float* m, float* l, float* o) {
  int64_t h = 0;
  for (; h + 2 <= G; h += 2) heads_fixed<NV, 2>(q + h * hd, hd, krow, vrow, T, scale, m + h, l + h, o + h * hd);
  if (h < G) heads_fixed<NV, 1>(q + h * hd, hd, krow, vrow, T, scale, m + h, l + h, o + h * hd);
}

HMOE_A512 void chunk_avx512(const float* q, int64_t G, int64_t hd, const float* const* krow, const float* const* vrow, int64_t T,
                            float scale, float* m, float* l, float* o, float* s) {
  if (hd == 128) return chunk_fixed<8>(q, G, hd, krow, vrow, T, scale, m, l, o);
  if (hd == 64) return chunk_fixed<4>(q, G, hd, krow, vrow, T, scale, m, l, o);
  const int64_t nv = hd / 16;
  for (int64_t h = 0; h < G; ++h) {
    const float* qh = q + h * hd;
    for (int64_t p = 0; p < T; ++p) {
      __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
      int64_t i = 0;
      for (; i + 1 < nv; i += 2) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), _mm512_loadu_ps(krow[p] + 16 * i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i + 16), _mm512_loadu_ps(krow[p] + 16 * i + 16), acc1);
      }
      if (i < nv) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), _mm512_loadu_ps(krow[p] + 16 * i), acc0);
      s[h * kTile + p] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) * scale;
    }
  }
  const __mmask16 live = static_cast<__mmask16>((1u << T) - 1);
  for (int64_t h = 0; h < G; ++h) {
    const __m512 sv = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), live, s + h * kTile);
    const float mnew = std::max(m[h], _mm512_reduce_max_ps(sv));
    const float corr = std::exp(m[h] - mnew);
    const __m512 pv = _mm512_maskz_mov_ps(live, exp_neg(_mm512_sub_ps(sv, _mm512_set1_ps(mnew))));
    l[h] = l[h] * corr + _mm512_reduce_add_ps(pv);
    m[h] = mnew;
    alignas(64) float pr[kTile];
    _mm512_store_ps(pr, pv);
    float* oh = o + h * hd;
    const __m512 c = _mm512_set1_ps(corr);
    for (int64_t i = 0; i < nv; ++i) {
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(oh + 16 * i), c);
      for (int64_t p = 0; p < T; ++p) acc = _mm512_fmadd_ps(_mm512_set1_ps(pr[p]), _mm512_loadu_ps(vrow[p] + 16 * i), acc);
      _mm512_storeu_ps(oh + 16 * i, acc);
    }
  }
}

void chunk_scalar(const float* q, int64_t G, int64_t hd, const float* const* krow, const float* const* vrow, int64_t T, float scale,
                  float* m, float* l, float* o, float* s) {
  for (int64_t h = 0; h < G; ++h) {
    const float* qh = q + h * hd;
    float mx = m[h];
    for (int64_t p = 0; p < T; ++p) {
      float acc = 0;
      for (int64_t i = 0; i < hd; ++i) acc += qh[i] * krow[p][i];
      s[h * kTile + p] = acc * scale;
      mx = std::max(mx, acc * scale);
    }
    const float corr = std::exp(m[h] - mx);
    float* oh = o + h * hd;
    float sum = 0;
    for (int64_t i = 0; i < hd; ++i) oh[i] *= corr;
    for (int64_t p = 0; p < T; ++p) {
      const float pr = std::exp(s[h * kTile + p] - mx);
      sum += pr;
      for (int64_t i = 0; i < hd; ++i) oh[i] += pr * vrow[p][i];
    }
    l[h] = l[h] * corr + sum;
    m[h] = mx;
  }
}

// One item: positions [j0, j1) of token t's sequence against its kv head g.
void run_item(const Item& it, const float* q, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
              int64_t layer, float scale, float* part) {
  const int64_t G = heads / kv_heads;
  float* m = part;
  float* l = part + G;
  float* o = part + 2 * G;
  std::fill(m, m + G, -INFINITY);
  std::fill(l, l + G, 0.0f);
  std::fill(o, o + G * hd, 0.0f);
  const float* qg = q + (it.t * heads + it.g * G) * hd;
  const int seq = slots[it.t].seq;
  const bool simd = use_avx512(hd);
  thread_local std::vector<float> s;
  if (s.size() < static_cast<size_t>(G * kTile)) s.resize(static_cast<size_t>(G * kTile));
  const float* krow[kTile];
  const float* vrow[kTile];
  const int64_t bs = kv.block_size();
  const int64_t kw = kv.layout().k_floats(), vw = kv.layout().v_floats();
  // a tile stays within one page, where rows are contiguous
  auto tile_end = [&](int64_t j) { return std::min({it.j1, (j / bs + 1) * bs, j + kTile}); };
  // The next tile's K/V rows are prefetched while this one computes: rows of
  // one kv head are hd floats every kw, a stride the hardware does not follow.
  auto prefetch = [&](int64_t j) {
    if (j >= it.j1) return;
    const int64_t T = tile_end(j) - j;
    const char* k0 = reinterpret_cast<const char*>(kv.k(layer, seq, j) + it.g * hd);
    const char* v0 = reinterpret_cast<const char*>(kv.v(layer, seq, j) + it.g * hd);
    for (int64_t p = 0; p < T; ++p)
      for (int64_t b = 0; b < hd * 4; b += 64) {
        __builtin_prefetch(k0 + p * kw * 4 + b);
        __builtin_prefetch(v0 + p * vw * 4 + b);
      }
  };
  prefetch(it.j0);
  for (int64_t j = it.j0; j < it.j1;) {
    const int64_t end = tile_end(j);
    const int64_t T = end - j;
    const float* k0 = kv.k(layer, seq, j) + it.g * hd;
    const float* v0 = kv.v(layer, seq, j) + it.g * hd;
    for (int64_t p = 0; p < T; ++p) {
      krow[p] = k0 + p * kw;
      vrow[p] = v0 + p * vw;
    }
    prefetch(end);
    if (simd) chunk_avx512(qg, G, hd, krow, vrow, T, scale, m, l, o, s.data());
    else chunk_scalar(qg, G, hd, krow, vrow, T, scale, m, l, o, s.data());
    j = end;
  }
}

}  // namespace

void attention(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
               int64_t layer, float scale, float* out, numa::ThreadPool* pool) {
  const int64_t G = heads / kv_heads;
  const int threads = pool ? pool->size() : 1;
  // Chunks per (token, kv head): enough items for every thread (4 each),
  // never below kMinChunk positions.
  const int64_t base = n * kv_heads;
  const int64_t want = std::max<int64_t>(1, (4 * threads + base - 1) / base);
  // Reused between calls; the workers see the caller's through references.
  thread_local std::vector<Item> tl_items;
  thread_local std::vector<int64_t> tl_first;
  thread_local std::vector<float> tl_parts;
  std::vector<Item>& items = tl_items;
  std::vector<int64_t>& first = tl_first;  // per (token, kv head): its first item
  std::vector<float>& parts = tl_parts;
  items.clear();
  first.assign(static_cast<size_t>(base) + 1, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t len = slots[t].pos + 1;
    const int64_t splits = std::clamp<int64_t>(len / kMinChunk, 1, want);
    const int64_t step = (len + splits - 1) / splits;
    for (int64_t g = 0; g < kv_heads; ++g) {
      first[static_cast<size_t>(t * kv_heads + g)] = static_cast<int64_t>(items.size());
      for (int64_t j = 0; j < len; j += step) items.push_back({t, g, j, std::min(len, j + step)});
    }
  }
  first[static_cast<size_t>(base)] = static_cast<int64_t>(items.size());
  const int64_t pf = part_floats(G, hd);
  if (parts.size() < items.size() * static_cast<size_t>(pf)) parts.resize(items.size() * static_cast<size_t>(pf));
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      run_item(items[static_cast<size_t>(i)], q, heads, kv_heads, hd, slots, kv, layer, scale, parts.data() + i * pf);
  };
  const int64_t ni = static_cast<int64_t>(items.size());
  if (pool && ni > 1) pool->parallel_for(ni, body, 1, 1);
  else body(0, ni, 0);
  // Merge each (token, kv head)'s chunks by their log-sum-exp.
  auto merge = [&](int64_t b, int64_t e, int) {
    for (int64_t tg = b; tg < e; ++tg) {
      const int64_t i0 = first[static_cast<size_t>(tg)], i1 = first[static_cast<size_t>(tg) + 1];
      const int64_t t = tg / kv_heads, g = tg % kv_heads;
      for (int64_t h = 0; h < G; ++h) {
        float M = -INFINITY;
        for (int64_t i = i0; i < i1; ++i) M = std::max(M, parts[static_cast<size_t>(i * pf + h)]);
        float* dst = out + (t * heads + g * G + h) * hd;
        std::fill(dst, dst + hd, 0.0f);
        double L = 0;
        for (int64_t i = i0; i < i1; ++i) {
          const float* p = parts.data() + i * pf;
          const float w = std::exp(p[h] - M);
          L += static_cast<double>(w) * p[G + h];
          const float* o = p + 2 * G + h * hd;
          for (int64_t k = 0; k < hd; ++k) dst[k] += w * o[k];
        }
        const float inv = static_cast<float>(1.0 / L);
        for (int64_t k = 0; k < hd; ++k) dst[k] *= inv;
      }
    }
  };
  if (pool && base > 1 && n * heads * hd >= 4096) pool->parallel_for(base, merge);
  else merge(0, base, 0);
}

void attention_reference(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
                         int64_t layer, float scale, float* out) {
  const int64_t group = heads / kv_heads;
  std::vector<double> scores;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      const float* qv = q + (t * heads + h) * hd;
      const int seq = slots[t].seq;
      const int64_t len = slots[t].pos + 1;
      scores.assign(static_cast<size_t>(len), 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* kj = kv.k(layer, seq, j) + g * hd;
        double s = 0;
        for (int64_t i = 0; i < hd; ++i) s += static_cast<double>(qv[i]) * kj[i];
        scores[static_cast<size_t>(j)] = s * scale;
        mx = std::max(mx, scores[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (auto& s : scores) sum += (s = std::exp(s - mx));
      float* o = out + (t * heads + h) * hd;
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < len; ++j) acc += scores[static_cast<size_t>(j)] * kv.v(layer, seq, j)[g * hd + i];
        o[i] = static_cast<float>(acc / sum);
      }
    }
}

}  // namespace hmoe::ops
