// AVX-512 VNNI kernels of the integer GGUF path (numa/quant_gguf_q8.h).
//
// v1: an R-row by NT-token tile walks the row one block (K types: 256
// columns; 32-blocks: a pair, 64 columns) at a time. Each row's block is
// unpacked once into four (K) or one (32-blocks) 64-byte code vectors and
// then multiplied into every token of the tile, so the weights are read
// once per token block; four rows keep four weight streams in flight at
// batch 1. Per row and block: K types decode their sub-block scales with a
// few integer ops and spread them over s16 lanes with vpermw.
// v2 (K types, more than 4 tokens: prompt chunks): a group of 4 rows is
// unpacked once per call into L1 scratch and every token tile reads it, so
// the unpack (about a third of v1's instructions at 4 tokens per tile) is
// paid once per row instead of once per 4 tokens; same bits as v1.
// v3: Q4_K, Q5_K, Q6_K and Q8_0 take the numerics of
// quant_gguf_q8_tiles.cpp (exact integer sums per block, one fp32 step per
// block and row): v1 adds each row's integer lanes up per block (four rows
// at once) and serves calls of fewer than kTileMinTokens* tokens (decode);
// the row-interleaved tile kernels serve the rest with the same bits (v2's
// per-call unpack is gone). Q4_0/Q5_0 keep v1 with per-lane fp32 sums.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "configs/error.h"
#include "io/tensor/gguf_block_util.h"
#include "io/tensor/quant_blocks_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

namespace hmoe::cpu::detail {

bool q8_has_vnni() {
  static const bool v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  }();
  return v;
}

namespace {

// From this many tokens on, Q4_K/Q5_K/Q6_K (Q8_0) products take the tile
// kernels (bench_gguf_cpu --kernels: they win from 4-8 (Q8_0: 4) tokens; below,
// their per-call repack costs more than v1's unpack).
constexpr int64_t kTileMinTokensK = 6, kTileMinTokensQ8 = 4;

// Prefetch distance: the same place in the next tile's rows (R rows on)
// while a tile spans at most kPrefetchTile bytes, so that several KB are in
// flight per stream; longer rows (over kPrefetchTile / R bytes each) are
// streams of their own and prefetch kPrefetchMax bytes ahead within the row.
// (The tile rule used to stop at 4 KiB, so a 4-row tile of lm_head rows,
// 6.7-8.7 KiB in Q6_K / Q8_0, prefetched into its own rows: on a Zen 5 core
// the one-token lm_head product read 14-18 GB/s against 31-32 with the
// next tile's rows, bench/README.md.)
constexpr int64_t kPrefetchMax = 4096, kPrefetchTile = 16384;
inline int64_t prefetch_ahead(int64_t row_bytes, int R) { return row_bytes * R <= kPrefetchTile ? row_bytes * R : kPrefetchMax; }

HMOE_V512 inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

template <ExtType T> constexpr int kBlockBytes = T == ExtType::q4_k ? 144 : T == ExtType::q5_k ? 176 : T == ExtType::q6_k ? 210
                                                 : T == ExtType::q8_0 ? 34 : T == ExtType::q4_0 ? 18 : 22;
template <ExtType T> constexpr bool kIsK = T == ExtType::q4_k || T == ExtType::q5_k || T == ExtType::q6_k;

// s16 lane j of code vector v takes scale index idx[v][j].
struct ScaleIdx {
  __m512i k4[4], k6[4], bits5[4], shift6[2];
};
HMOE_V512 ScaleIdx make_idx() {
  ScaleIdx s;
  alignas(64) int16_t a[32];
  alignas(64) uint8_t b[64];
  const int pa[4] = {0, 1, 4, 5}, pb[4] = {2, 3, 6, 7};
  for (int v = 0; v < 4; ++v) {
    for (int j = 0; j < 32; ++j) a[j] = static_cast<int16_t>(j < 16 ? pa[v] : pb[v]);
    s.k4[v] = _mm512_load_si512(a);
    for (int j = 0; j < 32; ++j) a[j] = static_cast<int16_t>(4 * v + j / 8);
    s.k6[v] = _mm512_load_si512(a);
    for (int j = 0; j < 64; ++j) b[j] = static_cast<uint8_t>(1u << (j < 32 ? pa[v] : pb[v]));
    s.bits5[v] = _mm512_load_si512(b);
  }
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 32; ++j) a[j] = static_cast<int16_t>(j < 16 ? 4 * h : 4 * h + 2);
    s.shift6[h] = _mm512_load_si512(a);
  }
  return s;
}

// One row's super-block unpacked: codes, per-lane s16 scales, and the
// scalars that scale its integer sums.
struct KBlock {
  __m512i c[4], s[4];
  __m128i mn;  // Q4_K/Q5_K: the 8 mins as s16
  __m256i sc;  // Q6_K: the 16 scales as s16
  float d, dmin;
};

template <ExtType T>
HMOE_V512 inline void unpack_k(const uint8_t* b, const ScaleIdx& ix, KBlock& k) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
    k.d = half_at(b);
    k.dmin = half_at(b + 2);
    uint64_t sc, mn;
    gguf_scales_mins_k4(b + 4, sc, mn);
    const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
    k.mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn)));
    for (int v = 0; v < 4; ++v) k.s[v] = _mm512_permutexvar_epi16(ix.k4[v], sc16);
    const uint8_t* qs = b + (T == ExtType::q4_k ? 16 : 48);
    const __m512i l0 = _mm512_loadu_si512(qs), l1 = _mm512_loadu_si512(qs + 64);
    k.c[0] = _mm512_and_si512(l0, m4);
    k.c[1] = _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4);
    k.c[2] = _mm512_and_si512(l1, m4);
    k.c[3] = _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4);
    if constexpr (T == ExtType::q5_k) {
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)));
      const __m512i sixteen = _mm512_set1_epi8(16);
      for (int v = 0; v < 4; ++v) k.c[v] = _mm512_mask_add_epi8(k.c[v], _mm512_test_epi8_mask(qh, ix.bits5[v]), k.c[v], sixteen);
    }
  } else {  // q6_k
    k.d = half_at(b + 208);
    k.sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m512i sc16 = _mm512_castsi256_si512(k.sc);
    for (int v = 0; v < 4; ++v) k.s[v] = _mm512_permutexvar_epi16(ix.k6[v], sc16);
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
      const __m512i hlo = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, ix.shift6[0]), m3), 4);
      const __m512i hhi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, ix.shift6[1]), m3), 4);
      k.c[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), hlo);
      k.c[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), hhi);
    }
  }
}

// This super-block's integer sums for one token (xq: its 256 codes, bs: its
// 16 block sums): a holds sum_s sc_s * ia_s split over its lanes (Q6_K: the
// offset 32 taken off), ms (Q4_K/Q5_K) the mins' sum over its 4 lanes.
template <ExtType T>
HMOE_V512 inline __m512i dot_k(const KBlock& k, const int8_t* xq, const int16_t* bs, __m128i& ms) {
  __m512i a = _mm512_setzero_si512();
  for (int v = 0; v < 4; ++v) a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(k.c[v], _mm512_loadu_si512(xq + 64 * v)), k.s[v]);
  if constexpr (T == ExtType::q6_k) {
    const __m256i corr = _mm256_madd_epi16(k.sc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)));
    return _mm512_sub_epi32(a, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
  } else {
    ms = _mm_madd_epi16(k.mn, _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs)));
    return a;
  }
}

// Lane sums of a0..a3: [sum a0, sum a1, sum a2, sum a3] (exact, integers).
HMOE_V512 inline __m128i hsum4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
  const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
  const __m256i u = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

// Per-row kernel (v1 layout, the numerics of quant_gguf_q8_tiles.cpp): R
// rows (4, or 1) by NT tokens; each row's super-block is unpacked once and
// multiplied into every token; the integer sums are added up across lanes
// (four rows at once) before the one fp32 step per block.
template <ExtType T, int R, int NT>
HMOE_V512 void tile_k(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy, const ScaleIdx& ix) {
  static_assert(R == 4 || R == 1);
  constexpr int BB = kBlockBytes<T>;
  constexpr bool mins = T != ExtType::q6_k;
  const int64_t nb = w.cols / 256;
  const int64_t ahead = prefetch_ahead(nb * BB, R);
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = static_cast<const uint8_t*>(w.data) + (r + i) * nb * BB;
  const int8_t* xq[NT];
  const float* xd[NT];
  const int16_t* xb[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = xa.q.data() + (tx + j) * xa.cols;
    xd[j] = xa.d.data() + (tx + j) * nb;
    xb[j] = xa.bsum.data() + (tx + j) * nb * 16;
  }
  if constexpr (R == 4) {
    __m128 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = _mm_setzero_ps();
    for (int64_t bi = 0; bi < nb; ++bi) {
      __m512i a[4][NT];
      __m128i ms[4][NT];
      float d[4], dm[4];
      for (int i = 0; i < 4; ++i) {
        const uint8_t* b = rows[i] + bi * BB;
        const char* pf = reinterpret_cast<const char*>(b + ahead);
#pragma GCC unroll 4
        for (int l = 0; l < (BB + 63) / 64 + 1; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
        KBlock k;
        unpack_k<T>(b, ix, k);
        d[i] = k.d;
        dm[i] = k.dmin;
        for (int j = 0; j < NT; ++j) a[i][j] = dot_k<T>(k, xq[j] + bi * 256, xb[j] + bi * 16, ms[i][j]);
      }
      const __m128 d4 = _mm_setr_ps(d[0], d[1], d[2], d[3]), dm4 = _mm_setr_ps(dm[0], dm[1], dm[2], dm[3]);
      for (int j = 0; j < NT; ++j) {
        const __m128 dx = _mm_set1_ps(xd[j][bi]);
        acc[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(hsum4(a[0][j], a[1][j], a[2][j], a[3][j])), _mm_mul_ps(d4, dx), acc[j]);
        if constexpr (mins) {
          const __m128i m = _mm_hadd_epi32(_mm_hadd_epi32(ms[0][j], ms[1][j]), _mm_hadd_epi32(ms[2][j], ms[3][j]));
          acc[j] = _mm_fnmadd_ps(_mm_cvtepi32_ps(m), _mm_mul_ps(dm4, dx), acc[j]);
        }
      }
    }
    for (int j = 0; j < NT; ++j) _mm_storeu_ps(y + j * ldy + r, acc[j]);
  } else {
    float acc[NT] = {};
    for (int64_t bi = 0; bi < nb; ++bi) {
      KBlock k;
      unpack_k<T>(rows[0] + bi * BB, ix, k);
      for (int j = 0; j < NT; ++j) {
        __m128i ms;
        const int32_t ib = _mm512_reduce_add_epi32(dot_k<T>(k, xq[j] + bi * 256, xb[j] + bi * 16, ms));
        const float dx = xd[j][bi];
        acc[j] = std::fma(static_cast<float>(ib), k.d * dx, acc[j]);
        if constexpr (mins) {
          const __m128i h = _mm_hadd_epi32(ms, ms);
          acc[j] = std::fma(-static_cast<float>(_mm_cvtsi128_si32(_mm_hadd_epi32(h, h))), k.dmin * dx, acc[j]);
        }
      }
    }
    for (int j = 0; j < NT; ++j) y[j * ldy + r] = acc[j];
  }
}

// 32-blocks: the code vector of block pair p of a row (see the file comment
// of quant_gguf_q8.cpp for the byte order).
template <ExtType T>
HMOE_V512 inline __m512i unpack_pair(const uint8_t* pa) {
  constexpr int BB = kBlockBytes<T>;
  const uint8_t* pb = pa + BB;
  if constexpr (T == ExtType::q8_0) {
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2))),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2)), 1);
    return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    constexpr int off = T == ExtType::q4_0 ? 2 : 6;
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + off))),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + off)), 1);
    __m512i c = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), _mm512_set1_epi8(0x0F));
    if constexpr (T == ExtType::q5_0) {
      uint32_t qa, qb;
      std::memcpy(&qa, pa + 2, 4);
      std::memcpy(&qb, pb + 2, 4);
      const uint64_t m = (qa & 0xFFFFull) | (static_cast<uint64_t>(qb & 0xFFFFu) << 16) | (static_cast<uint64_t>(qa >> 16) << 32) |
                         (static_cast<uint64_t>(qb >> 16) << 48);
      c = _mm512_mask_add_epi8(c, m, c, _mm512_set1_epi8(16));
    }
    return c;
  }
}

template <ExtType T, int R, int NT>
HMOE_V512 void tile_b(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy) {
  constexpr int BB = kBlockBytes<T>;
  constexpr __mmask16 bmask = T == ExtType::q8_0 ? 0xFF00 : 0xF0F0;
  const int64_t np = w.cols / 64;
  const int64_t ahead = prefetch_ahead(np * 2 * BB, R);
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = static_cast<const uint8_t*>(w.data) + (r + i) * np * 2 * BB;
  const int8_t* xq[NT];
  const int32_t* xi[NT];
  const float* xv[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = xa.q.data() + (tx + j) * xa.cols;
    xi[j] = xa.init.data() + (tx + j) * np * 16;
    xv[j] = xa.dv.data() + (tx + j) * np * 16;
  }
  __m512 acc[R][NT];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    for (int i = 0; i < R; ++i) {
      const uint8_t* pa = rows[i] + 2 * p * BB;
      _mm_prefetch(reinterpret_cast<const char*>(pa + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(pa + ahead + 64), _MM_HINT_T0);
      const __m512 dw = _mm512_mask_blend_ps(bmask, _mm512_set1_ps(half_at(pa)), _mm512_set1_ps(half_at(pa + BB)));
      const __m512i c = unpack_pair<T>(pa);
      for (int j = 0; j < NT; ++j) {
        const __m512i a = _mm512_dpbusd_epi32(_mm512_loadu_si512(xi[j] + 16 * p), c, _mm512_loadu_si512(xq[j] + 64 * p));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(dw, _mm512_loadu_ps(xv[j] + 16 * p)), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) y[j * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

// Q8_0 per-row kernel with the numerics of quant_gguf_q8_tiles.cpp: per
// block pair and row one vpdpbusd (lanes 0-7 block 2p, 8-15 block 2p+1,
// seeded with -128 * sum(q)), the lanes added up per block (four rows at
// once), then one fp32 step per block.
template <int R, int NT>
HMOE_V512 void tile_q8(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy) {
  static_assert(R == 4 || R == 1);
  constexpr int BB = 34;
  const int64_t np = w.cols / 64, nblk = w.cols / 32;
  const int64_t ahead = prefetch_ahead(np * 2 * BB, R);
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = static_cast<const uint8_t*>(w.data) + (r + i) * np * 2 * BB;
  const int8_t* xq[NT];
  const int32_t* xi[NT];
  const float* xd[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = xa.q.data() + (tx + j) * xa.cols;
    xi[j] = xa.init.data() + (tx + j) * np * 16;
    xd[j] = xa.d.data() + (tx + j) * nblk;
  }
  if constexpr (R == 4) {
    __m128 acc[NT];
    for (int j = 0; j < NT; ++j) acc[j] = _mm_setzero_ps();
    for (int64_t p = 0; p < np; ++p) {
      __m512i a[4][NT];
      uint64_t ha = 0, hb = 0;  // the 4 rows' f16 scales, built in registers (no store-to-load forwarding)
      for (int i = 0; i < 4; ++i) {
        const uint8_t* pa = rows[i] + 2 * p * BB;
        _mm_prefetch(reinterpret_cast<const char*>(pa + ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(pa + ahead + 64), _MM_HINT_T0);
        uint16_t h0, h1;
        std::memcpy(&h0, pa, 2);
        std::memcpy(&h1, pa + BB, 2);
        ha |= static_cast<uint64_t>(h0) << (16 * i);
        hb |= static_cast<uint64_t>(h1) << (16 * i);
        const __m512i c = unpack_pair<ExtType::q8_0>(pa);
        for (int j = 0; j < NT; ++j) a[i][j] = _mm512_dpbusd_epi32(_mm512_loadu_si512(xi[j] + 16 * p), c, _mm512_loadu_si512(xq[j] + 64 * p));
      }
      const __m128 da = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(ha))), db = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(hb)));
      for (int j = 0; j < NT; ++j) {
        const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0][j], a[1][j]), _mm512_unpackhi_epi32(a[0][j], a[1][j]));
        const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2][j], a[3][j]), _mm512_unpackhi_epi32(a[2][j], a[3][j]));
        const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
        const __m256i lo = _mm512_castsi512_si256(t), hi = _mm512_extracti64x4_epi64(t, 1);  // lanes 0-7: block 2p; 8-15: block 2p+1
        const __m128i ia = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
        const __m128i ib = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
        acc[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(ia), _mm_mul_ps(da, _mm_set1_ps(xd[j][2 * p])), acc[j]);
        acc[j] = _mm_fmadd_ps(_mm_cvtepi32_ps(ib), _mm_mul_ps(db, _mm_set1_ps(xd[j][2 * p + 1])), acc[j]);
      }
    }
    for (int j = 0; j < NT; ++j) _mm_storeu_ps(y + j * ldy + r, acc[j]);
  } else {
    float acc[NT] = {};
    for (int64_t p = 0; p < np; ++p) {
      const uint8_t* pa = rows[0] + 2 * p * BB;
      const float da = half_at(pa), db = half_at(pa + BB);
      const __m512i c = unpack_pair<ExtType::q8_0>(pa);
      for (int j = 0; j < NT; ++j) {
        const __m512i a = _mm512_dpbusd_epi32(_mm512_loadu_si512(xi[j] + 16 * p), c, _mm512_loadu_si512(xq[j] + 64 * p));
        const int32_t ia = _mm512_mask_reduce_add_epi32(0x00FF, a), ib = _mm512_mask_reduce_add_epi32(0xFF00, a);
        acc[j] = std::fma(static_cast<float>(ia), da * xd[j][2 * p], acc[j]);
        acc[j] = std::fma(static_cast<float>(ib), db * xd[j][2 * p + 1], acc[j]);
      }
    }
    for (int j = 0; j < NT; ++j) y[j * ldy + r] = acc[j];
  }
}

template <ExtType T, int R, int NT>
HMOE_V512 inline void tile(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy, const ScaleIdx& ix) {
  if constexpr (kIsK<T>) tile_k<T, R, NT>(xa, tx, w, r, y, ldy, ix);
  else if constexpr (T == ExtType::q8_0) tile_q8<R, NT>(xa, tx, w, r, y, ldy);
  else tile_b<T, R, NT>(xa, tx, w, r, y, ldy);
}

template <ExtType T>
HMOE_V512 void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  static const ScaleIdx ix = make_idx();  // built once (thread-safe static)
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4, 4>(xa, t0 + t, w, r, y + t * ldy, ldy, ix);
    for (; t + 2 <= n; t += 2) tile<T, 4, 2>(xa, t0 + t, w, r, y + t * ldy, ldy, ix);
    for (; t < n; ++t) tile<T, 4, 1>(xa, t0 + t, w, r, y + t * ldy, ldy, ix);
  }
  for (; r < r1; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 1, 4>(xa, t0 + t, w, r, y + t * ldy, ldy, ix);
    for (; t < n; ++t) tile<T, 1, 1>(xa, t0 + t, w, r, y + t * ldy, ldy, ix);
  }
}

}  // namespace

HMOE_V512 bool q8_quantize_block_avx512(Q8Acts& a, int64_t t, int64_t b, const float* xb) {
  const int nv = static_cast<int>(a.block / 16);  // 16 or 2 vectors
  __m512 v[16];
  __m512 mx = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int i = 0; i < nv; ++i) {
    v[i] = _mm512_loadu_ps(xb + 16 * i);
    bad |= _mm512_fpclass_ps_mask(v[i], 0x99);  // NaN or inf: the scalar path says what to do
    mx = _mm512_max_ps(mx, _mm512_abs_ps(v[i]));
  }
  if (bad) return false;
  const float amax = _mm512_reduce_max_ps(mx);
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
  a.d[static_cast<size_t>(t * (a.cols / a.block) + b)] = amax / 127.0f;
  int8_t* qt = a.q.data() + t * a.cols;
  const bool k = a.block == 256;
  int16_t* bs = k ? a.bsum.data() + (t * (a.cols / 256) + b) * 16 : nullptr;
  const int run = a.type == ExtType::q6_k || lowbit_type(static_cast<uint32_t>(a.type)) ? 1 : 2;  // vectors of 16 per block sum
  if (k) std::fill(bs, bs + 16, int16_t{0});
  for (int i = 0; i < nv; ++i) {
    // round to nearest even (the MXCSR default), as std::nearbyint in the scalar path
    const __m512i qi = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[i], _mm512_set1_ps(id))), _mm512_set1_epi32(127)),
                                        _mm512_set1_epi32(-127));
    const int64_t k0 = b * a.block + 16 * i;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + a.pos(k0)), _mm512_cvtepi32_epi8(qi));
    if (k) bs[i / run] = static_cast<int16_t>(bs[i / run] + _mm512_reduce_add_epi32(qi));
  }
  return true;
}

void q8_rows_avx512(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const auto t = static_cast<ExtType>(w.ext);
  if (q8_tiles_serve(t) && n >= (t == ExtType::q8_0 ? kTileMinTokensQ8 : kTileMinTokensK)) return q8_tiles_avx512(xa, t0, n, w, r0, r1, y, ldy);
  q8_rows_avx512_rowwise(xa, t0, n, w, r0, r1, y, ldy);
}

void q8_rows_avx512_rowwise(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_k: return rows<ExtType::q4_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_k: return rows<ExtType::q5_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q6_k: return rows<ExtType::q6_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q8_0: return rows<ExtType::q8_0>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q4_0: return rows<ExtType::q4_0>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_0: return rows<ExtType::q5_0>(xa, t0, n, w, r0, r1, y, ldy);
    default: break;
  }
  fail(ErrorKind::internal, "q8_rows_avx512: type " + std::to_string(w.ext) + " has no integer kernel");
}

}  // namespace hmoe::cpu::detail
