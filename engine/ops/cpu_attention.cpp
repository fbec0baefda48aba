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
//  - the cache's dtype (KvDtype: fp32, bf16, q8_0) is read as stored: the
//    hd 64/128 loops widen bf16 to fp32 by a 16-bit shift and int8 by a
//    sign extension times the block's scale, in registers; other head dims
//    (or no AVX-512) decode a tile's rows into an fp32 scratch first.
// Results equal attention_reference (which decodes the stored rows) up to
// float summation order.
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

// 16 values [16 i, 16 i + 16) of a stored row slice, widened to fp32
// (sc: the slice's q8_0 scales, one per 32 values).
template <KvDtype D>
HMOE_A512 inline __m512 load16(const uint8_t* r, const float* sc, int i) {
  if constexpr (D == KvDtype::f32) {
    (void)sc;
    return _mm512_loadu_ps(reinterpret_cast<const float*>(r) + 16 * i);
  } else if constexpr (D == KvDtype::bf16) {
    (void)sc;
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r) + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r) + i);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(sc[i >> 1]));
  }
}

// r[p] = the sum of v[p]'s 16 lanes, for 16 vectors: a transpose-and-add
// tree (about 42 shuffles and adds instead of 16 full reductions).
HMOE_A512 inline __m512 hsum16(const __m512* v) {
  __m512 x[8], y[4];
  for (int k = 0; k < 8; ++k) x[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(x[2 * k]), b = _mm512_castps_pd(x[2 * k + 1]);
    y[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

// Scores and V accumulation for two query heads at once (HP = 2, or 1 for
// an odd last head), with hd = 16 * NV held in registers: every K and V
// load serves both heads. krow/vrow: the tile's row slices in dtype D
// (ksc/vsc: their q8_0 scales).
template <int NV, int HP, KvDtype D>
HMOE_A512 inline void heads_fixed(const float* q, int64_t hd, const uint8_t* const* krow, const float* const* ksc, const uint8_t* const* vrow,
                                  const float* const* vsc, int64_t T, float scale, float* m, float* l, float* o) {
  const __mmask16 live = static_cast<__mmask16>((1u << T) - 1);
  alignas(64) float sc[HP][kTile];
  __m512 dots[HP][kTile];  // per head and position: the lane-wise products, summed by hsum16
  {
    __m512 qr[HP][NV];
    for (int h = 0; h < HP; ++h)
      for (int i = 0; i < NV; ++i) qr[h][i] = _mm512_loadu_ps(q + h * hd + 16 * i);
    for (int64_t p = 0; p < T; ++p) {
      __m512 acc[HP];
      const __m512 k0 = load16<D>(krow[p], ksc[p], 0);
      for (int h = 0; h < HP; ++h) acc[h] = _mm512_mul_ps(qr[h][0], k0);
      for (int i = 1; i < NV; ++i) {
        const __m512 k = load16<D>(krow[p], ksc[p], i);
        for (int h = 0; h < HP; ++h) acc[h] = _mm512_fmadd_ps(qr[h][i], k, acc[h]);
      }
      for (int h = 0; h < HP; ++h) dots[h][p] = acc[h];
    }
    for (int64_t p = T; p < kTile; ++p)
      for (int h = 0; h < HP; ++h) dots[h][p] = _mm512_setzero_ps();
  }
  __m512 pv[HP], corr[HP];
  for (int h = 0; h < HP; ++h) {
    const __m512 sv = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), live, hsum16(dots[h]), _mm512_set1_ps(scale));
    const float mnew = std::max(m[h], _mm512_reduce_max_ps(sv));
    // the correction in the vector exp (no libm call per tile and head; -inf - x clamps to 0)
    corr[h] = exp_neg(_mm512_set1_ps(m[h] - mnew));
    pv[h] = _mm512_maskz_mov_ps(live, exp_neg(_mm512_sub_ps(sv, _mm512_set1_ps(mnew))));
    l[h] = l[h] * _mm512_cvtss_f32(corr[h]) + _mm512_reduce_add_ps(pv[h]);
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
      const __m512 v = load16<D>(vrow[p], vsc[p], i);
      for (int h = 0; h < HP; ++h) acc[h][i] = _mm512_fmadd_ps(pb[h], v, acc[h][i]);
    }
  }
  for (int h = 0; h < HP; ++h)
    for (int i = 0; i < NV; ++i) _mm512_storeu_ps(o + h * hd + 16 * i, acc[h][i]);
}

template <int NV, KvDtype D>
HMOE_A512 void chunk_fixed(const float* q, int64_t G, int64_t hd, const uint8_t* const* krow, const float* const* ksc, const uint8_t* const* vrow,
                           const float* const* vsc, int64_t T, float scale, float* m, float* l, float* o) {
  int64_t h = 0;
  for (; h + 2 <= G; h += 2) heads_fixed<NV, 2, D>(q + h * hd, hd, krow, ksc, vrow, vsc, T, scale, m + h, l + h, o + h * hd);
  if (h < G) heads_fixed<NV, 1, D>(q + h * hd, hd, krow, ksc, vrow, vsc, T, scale, m + h, l + h, o + h * hd);
}

// The tile's rows widened to fp32 once, 16 values at a time (out: T rows of hd).
template <KvDtype D>
HMOE_A512 void widen_tile(const uint8_t* const* rows, const float* const* sc, int64_t T, int64_t hd, float* out) {
  for (int64_t p = 0; p < T; ++p)
    for (int i = 0; i < static_cast<int>(hd / 16); ++i) _mm512_storeu_ps(out + p * hd + 16 * i, load16<D>(rows[p], sc[p], i));
}

template <KvDtype D>
void chunk_fixed_hd(const float* q, int64_t G, int64_t hd, const uint8_t* const* krow, const float* const* ksc, const uint8_t* const* vrow,
                    const float* const* vsc, int64_t T, float scale, float* m, float* l, float* o) {
  if (hd == 128) chunk_fixed<8, D>(q, G, hd, krow, ksc, vrow, vsc, T, scale, m, l, o);
  else chunk_fixed<4, D>(q, G, hd, krow, ksc, vrow, vsc, T, scale, m, l, o);
}

HMOE_A512 void chunk_avx512(const float* q, int64_t G, int64_t hd, const float* const* krow, const float* const* vrow, int64_t T,
                            float scale, float* m, float* l, float* o, float* s) {
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
  const KvDtype dt = kv.dtype();
  const bool simd = use_avx512(hd);
  // hd 64/128 on AVX-512 read the stored dtype in registers. With more
  // than two query heads per kv head every row would be widened once per
  // pair of heads, so the tile is widened once into an L1 scratch and the
  // fp32 loops run on it (still reading the stored bytes from memory).
  // Other head dims: rows decoded into the scratch (fp32: no copy).
  const bool fused = simd && (hd == 64 || hd == 128);
  const bool widen = fused && dt != KvDtype::f32 && G > 2;
  const bool decode = !fused && dt != KvDtype::f32;
  thread_local std::vector<float> s, kdec, vdec;
  if (s.size() < static_cast<size_t>(G * kTile)) s.resize(static_cast<size_t>(G * kTile));
  if ((decode || widen) && kdec.size() < static_cast<size_t>(kTile * hd)) kdec.resize(static_cast<size_t>(kTile * hd)), vdec.resize(static_cast<size_t>(kTile * hd));
  const uint8_t* krow[kTile];
  const uint8_t* vrow[kTile];
  const float* ksc[kTile];
  const float* vsc[kTile];
  const float* kf[kTile];
  const float* vf[kTile];
  const int64_t bs = kv.block_size();
  const int64_t kw = kv.layout().k_floats(), vw = kv.layout().v_floats();
  const int64_t kb = kv_row_bytes(dt, kw), vb = kv_row_bytes(dt, vw);
  // Byte offset of head g's values in a row, and of its q8_0 scales.
  const int64_t esz = dt == KvDtype::f32 ? 4 : dt == KvDtype::bf16 ? 2 : 1;
  const int64_t hoff = it.g * hd * esz, hbytes = hd * esz;
  const int64_t ksoff = kv_q8_scale_offset(kw) + it.g * hd / 32 * 4, vsoff = kv_q8_scale_offset(vw) + it.g * hd / 32 * 4;
  // a tile stays within one page, where rows are contiguous
  auto tile_end = [&](int64_t j) { return std::min({it.j1, (j / bs + 1) * bs, j + kTile}); };
  // The next tile's K/V rows are prefetched while this one computes: rows of
  // one kv head are hd values every row, a stride the hardware does not follow.
  auto prefetch = [&](int64_t j) {
    if (j >= it.j1) return;
    const int64_t T = tile_end(j) - j;
    const uint8_t* k0 = kv.k_row(layer, seq, j) + hoff;
    const uint8_t* v0 = kv.v_row(layer, seq, j) + hoff;
    for (int64_t p = 0; p < T; ++p)
      for (int64_t b = 0; b < hbytes; b += 64) {
        __builtin_prefetch(k0 + p * kb + b);
        __builtin_prefetch(v0 + p * vb + b);
      }
  };
  // Two tiles ahead: one tile's compute is shorter than a strided miss.
  prefetch(it.j0);
  prefetch(tile_end(it.j0));
  for (int64_t j = it.j0; j < it.j1;) {
    const int64_t end = tile_end(j);
    const int64_t T = end - j;
    const uint8_t* k0 = kv.k_row(layer, seq, j);
    const uint8_t* v0 = kv.v_row(layer, seq, j);
    for (int64_t p = 0; p < T; ++p) {
      krow[p] = k0 + p * kb + hoff;
      vrow[p] = v0 + p * vb + hoff;
      ksc[p] = dt == KvDtype::q8_0 ? reinterpret_cast<const float*>(k0 + p * kb + ksoff) : nullptr;
      vsc[p] = dt == KvDtype::q8_0 ? reinterpret_cast<const float*>(v0 + p * vb + vsoff) : nullptr;
      if (decode) {
        kv_decode_row(dt, k0 + p * kb, kw, it.g * hd, hd, kdec.data() + p * hd);
        kv_decode_row(dt, v0 + p * vb, vw, it.g * hd, hd, vdec.data() + p * hd);
        kf[p] = kdec.data() + p * hd;
        vf[p] = vdec.data() + p * hd;
      } else {
        kf[p] = reinterpret_cast<const float*>(krow[p]);
        vf[p] = reinterpret_cast<const float*>(vrow[p]);
      }
    }
    if (end < it.j1) prefetch(tile_end(end));
    if (widen) {
      if (dt == KvDtype::bf16) {
        widen_tile<KvDtype::bf16>(krow, ksc, T, hd, kdec.data());
        widen_tile<KvDtype::bf16>(vrow, vsc, T, hd, vdec.data());
      } else {
        widen_tile<KvDtype::q8_0>(krow, ksc, T, hd, kdec.data());
        widen_tile<KvDtype::q8_0>(vrow, vsc, T, hd, vdec.data());
      }
      const uint8_t* kw8[kTile];
      const uint8_t* vw8[kTile];
      for (int64_t p = 0; p < T; ++p) {
        kw8[p] = reinterpret_cast<const uint8_t*>(kdec.data() + p * hd);
        vw8[p] = reinterpret_cast<const uint8_t*>(vdec.data() + p * hd);
      }
      chunk_fixed_hd<KvDtype::f32>(qg, G, hd, kw8, ksc, vw8, vsc, T, scale, m, l, o);
    } else if (fused) {
      switch (dt) {
        case KvDtype::f32: chunk_fixed_hd<KvDtype::f32>(qg, G, hd, krow, ksc, vrow, vsc, T, scale, m, l, o); break;
        case KvDtype::bf16: chunk_fixed_hd<KvDtype::bf16>(qg, G, hd, krow, ksc, vrow, vsc, T, scale, m, l, o); break;
        case KvDtype::q8_0: chunk_fixed_hd<KvDtype::q8_0>(qg, G, hd, krow, ksc, vrow, vsc, T, scale, m, l, o); break;
      }
    } else if (simd) {
      chunk_avx512(qg, G, hd, kf, vf, T, scale, m, l, o, s.data());
    } else {
      chunk_scalar(qg, G, hd, kf, vf, T, scale, m, l, o, s.data());
    }
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
  const int64_t kw = kv.layout().k_floats(), vw = kv.layout().v_floats();
  std::vector<double> scores;
  std::vector<float> kd, vd;  // the stored rows of head g, decoded to fp32
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      const float* qv = q + (t * heads + h) * hd;
      const int seq = slots[t].seq;
      const int64_t len = slots[t].pos + 1;
      scores.assign(static_cast<size_t>(len), 0.0);
      kd.resize(static_cast<size_t>(len * hd));
      vd.resize(static_cast<size_t>(len * hd));
      for (int64_t j = 0; j < len; ++j) {
        kv_decode_row(kv.dtype(), kv.k_row(layer, seq, j), kw, g * hd, hd, kd.data() + j * hd);
        kv_decode_row(kv.dtype(), kv.v_row(layer, seq, j), vw, g * hd, hd, vd.data() + j * hd);
      }
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* kj = kd.data() + j * hd;
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
        for (int64_t j = 0; j < len; ++j) acc += scores[static_cast<size_t>(j)] * vd[static_cast<size_t>(j * hd + i)];
        o[i] = static_cast<float>(acc / sum);
      }
    }
}

}  // namespace hmoe::ops
