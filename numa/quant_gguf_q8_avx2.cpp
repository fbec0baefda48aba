// AVX2 kernels of the integer GGUF path (numa/quant_gguf_q8.h), for CPUs
// without AVX-512 VNNI. Per 32 codes vpmaddubsw (u8 x s8 -> s16), then
// vpmaddwd with the sub-block scales (K types) or with ones (32-blocks) into
// int32 lanes.
//  - K types (Q4_K, Q5_K, Q6_K) keep the numerics contract of the AVX-512
//    kernels (quant_gguf_q8_tiles.cpp: per super-block the exact integer
//    sum, then fixed fp32 fmas), so their bits equal those kernels' and the
//    scalar model's at every token count. Below 4 tokens row1_k (one row,
//    one token, its blocks in memory order); from 4 tokens panel_k: the
//    codes transposed so that the 16-bit products of a whole super-block add
//    up before one scale multiply (about half the multiplies), weights held
//    in registers while 8-token groups of pre-transposed activations pass.
//  - Q4_0, Q5_0: one row by 8/4/2/1 tokens, per-lane fp32 sums, blocked
//    for L1/L2; the zero point comes off per block from the activation's
//    block sums.
//  - Q8_0: quant_gguf_q8_avx2_q80.cpp (the contract's numerics, as the K types).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <cstring>
#include <vector>

#include "configs/error.h"
#include "io/tensor/gguf_block_util.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/quant_gguf_q8_avx2_util.h"

namespace hmoe::cpu::detail {

namespace {

using namespace avx2;

// K types, per row r and token t (the contract of numa/quant_gguf_q8_tiles.cpp,
// so the bits equal the AVX-512 kernels' and q8_tiles_model's): per
// super-block the exact integer I of the sub-block-scaled products (Q6_K:
// codes - 32) and M of the mins times the activation sums, then
// acc = fma(I, d * dx, acc) and acc = fma(-M, dmin * dx, acc) (row1_k,
// panel_k). A K-type super-block's scalars, decoded once per row and block:
struct KBlk {
  float d, dmin;
  __m128i mn16;  // Q4_K/Q5_K: the 8 mins as int16
  __m256i sc16;  // Q6_K: the 16 scales as int16
  uint64_t sc;   // Q4_K/Q5_K: the 8 scales, a byte each
};
template <ExtType T>
HMOE_V256 inline KBlk k_blk(const uint8_t* b) {
  KBlk k{};
  if constexpr (T == ExtType::q6_k) {
    k.d = half_at(b + 208);
    k.sc16 = _mm256_cvtepi8_epi16(ld16(b + 192));
  } else {
    k.d = half_at(b);
    k.dmin = half_at(b + 2);
    uint64_t mn;
    gguf_scales_mins_k4(b + 4, k.sc, mn);
    k.mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn)));
  }
  return k;
}
// 16 where bit `bit` of byte l of qh is set (Q5_K's fifth bit), by one
// 16-bit shift that moves bit `bit` of both bytes to bit 4 (the other bits
// that cross between the bytes never land on bit 4) and a mask.
HMOE_V256 inline __m256i hbit(__m256i qh, int bit) {
  const __m256i t = bit < 4 ? _mm256_slli_epi16(qh, 4 - bit) : _mm256_srli_epi16(qh, bit - 4);
  return _mm256_and_si256(t, _mm256_set1_epi8(16));
}

// Where Q4_K/Q5_K sub-block sb sits in the activation (see Q8Acts::pos).
constexpr int kSlot[8] = {0, 2, 1, 3, 4, 6, 5, 7};

// The 32 codes of K-type sub-block v (0..7) of the super-block at b, in the
// order the activation row stores them (Q4_K/Q5_K: low nibbles of chunk v/2
// for even v, high for odd, Q5_K's fifth bit from qh; Q6_K: elements 32v..32v+31
// with the two high bits from qh).
template <ExtType T>
HMOE_V256 inline __m256i k_codes(const uint8_t* b, int v, __m256i m4) {
  if constexpr (T == ExtType::q6_k) {
    const int h = v / 4, k = v % 4;
    const __m256i q = ld32(b + 64 * h + 32 * (k & 1)), qh = ld32(b + 128 + 32 * h);
    const __m256i lo = k < 2 ? _mm256_and_si256(q, m4) : _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3)), 4);
    return _mm256_or_si256(lo, hi);
  } else {
    const __m256i q = ld32(b + (T == ExtType::q4_k ? 16 : 48) + 32 * (v / 2));
    __m256i c = v % 2 ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
    if constexpr (T == ExtType::q5_k) c = _mm256_or_si256(c, hbit(ld32(b + 16), v));
    return c;
  }
}

// Row r of a 32-block matrix times NT activation rows (as tile_k: the
// block's codes loaded once, fixed per-token order, batch invariant).
template <ExtType T, int NT>
HMOE_V256 void tile_b(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy) {
  static_assert(T == ExtType::q4_0 || T == ExtType::q5_0, "Q8_0: quant_gguf_q8_avx2_q80.cpp");
  constexpr int BB = T == ExtType::q4_0 ? 18 : 22;
  const int64_t nblk = w.cols / 32, np = w.cols / 64;
  const uint8_t* row = w.row(r);
  // token j's codes at xq + j * cols, its block scales at dx + j * nblk (strides
  // in registers: no pointer arrays to reload)
  const int64_t cols = xa.cols;
  const int8_t* xq = xa.q.data() + tx * cols;
  const float* dx = xa.d.data() + tx * nblk;
  __m256 acc[NT];
  float zacc[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) zacc[j] = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const uint8_t* b = row + blk * BB;
    const float dw = half_at(b);
    const int64_t p = blk / 2, half = blk % 2;
    constexpr int off = T == ExtType::q4_0 ? 2 : 6;
    const __m128i v = ld16(b + off);
    __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
    if constexpr (T == ExtType::q5_0) {
      uint32_t qh;
      std::memcpy(&qh, b + 2, 4);
      // byte l gets bit l of qh: spread the 32 bits over 32 bytes
      const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                                _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
      c = _mm256_or_si256(c, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel), _mm256_set1_epi8(16)));
    }
    const __m256 bdw = _mm256_set1_ps(dw);
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const __m256 scale = _mm256_mul_ps(bdw, _mm256_broadcast_ss(dx + j * nblk + blk));  // dw * dx, as the scalar product
      // activation order per pair: a.lo, b.lo, a.hi, b.hi
      const int8_t* xp = xq + j * cols + 64 * p;
      const __m256i prod = _mm256_maddubs_epi16(c, _mm256_set_m128i(ld16(xp + 32 + 16 * half), ld16(xp + 16 * half)));
      // -zero * sum(x) of this block: the seed of its first lane in the pair's init
      const int32_t seed = xa.init[static_cast<size_t>(((tx + j) * np + p) * 16 + 4 * half)];
      zacc[j] += dw * dx[j * nblk + blk] * static_cast<float>(seed);
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones)), scale, acc[j]);
    }
  }
  for (int j = 0; j < NT; ++j) y[j * ldy] = hsum(acc[j]) + zacc[j];
}

// Where sub-block g of super-block bi starts in an activation row.
template <ExtType T>
constexpr int64_t k_slot_off(int64_t bi, int g) {
  return bi * 256 + 32 * (T == ExtType::q6_k ? g : kSlot[g]);
}

// K types, one row by one token (decode, small batches, row tails): the
// row's super-blocks in order (so the hardware prefetchers see one stream),
// the contract's horizontal sums 8 super-blocks at a time, then its fp32
// steps in block order.
template <ExtType T>
HMOE_V256 float row1_k(const Q8Acts& xa, int64_t t, const Mat& w, int64_t r) {
  constexpr int BB = T == ExtType::q4_k ? 144 : T == ExtType::q5_k ? 176 : 210;
  const int64_t nb = w.cols / 256;
  const int8_t* xq = xa.q.data() + t * xa.cols;
  const uint8_t* row = w.row(r);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  float acc = 0.0f;
  for (int64_t bg = 0; bg < nb; bg += 8) {
    const int ng = static_cast<int>(std::min<int64_t>(8, nb - bg));
    alignas(32) __m256i A[8];
    __m128i Ms[8];
    float sd[8], sm[8];
    for (int g = 0; g < 8; ++g) {
      if (g >= ng) {
        A[g] = _mm256_setzero_si256(), Ms[g] = _mm_setzero_si128();
        continue;
      }
      const int64_t bi = bg + g;
      const uint8_t* b = row + bi * BB;
      const KBlk kb = k_blk<T>(b);
      const int16_t* bs = xa.bsum.data() + (t * nb + bi) * 16;
      const float dx = xa.d[static_cast<size_t>(t * nb + bi)];
      // the sub-block scales as int16 in both 128-bit lanes, each picked
      // into a whole vector by one byte shuffle (Q6_K: scale 2v in the low
      // lane, 2v + 1 in the high one)
      __m256i s16[2];
      if constexpr (T == ExtType::q6_k) {
        s16[0] = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(kb.sc16));
        s16[1] = _mm256_broadcastsi128_si256(_mm256_extracti128_si256(kb.sc16, 1));
      } else {
        s16[0] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(kb.sc))));
      }
      __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        __m256i sv;
        if constexpr (T == ExtType::q6_k) {
          const char l = static_cast<char>(4 * (v % 4)), h = static_cast<char>(4 * (v % 4) + 2);
          sv = _mm256_shuffle_epi8(s16[v / 4], _mm256_setr_epi8(l, l + 1, l, l + 1, l, l + 1, l, l + 1, l, l + 1, l, l + 1, l, l + 1, l, l + 1, h, h + 1, h,
                                                                 h + 1, h, h + 1, h, h + 1, h, h + 1, h, h + 1, h, h + 1, h, h + 1));
        } else {
          sv = _mm256_shuffle_epi8(s16[0], _mm256_set1_epi16(static_cast<int16_t>((2 * v) | ((2 * v + 1) << 8))));
        }
        a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(k_codes<T>(b, v, m4), ld32(xq + k_slot_off<T>(bi, v))), sv));
      }
      if constexpr (T == ExtType::q6_k) {
        A[g] = _mm256_sub_epi32(a, _mm256_slli_epi32(_mm256_madd_epi16(kb.sc16, ld32(bs)), 5));
        Ms[g] = _mm_setzero_si128();
      } else {
        A[g] = a;
        Ms[g] = _mm_madd_epi16(kb.mn16, ld16(bs));
      }
      sd[g] = kb.d * dx;
      sm[g] = kb.dmin * dx;
    }
    alignas(32) float fi[8], fm[8];
    _mm256_store_ps(fi, _mm256_cvtepi32_ps(hsum8_i32(A)));
    if constexpr (T != ExtType::q6_k)
      _mm256_store_ps(fm, _mm256_cvtepi32_ps(_mm256_set_m128i(hsum4_i32(Ms[4], Ms[5], Ms[6], Ms[7]), hsum4_i32(Ms[0], Ms[1], Ms[2], Ms[3]))));
    for (int g = 0; g < ng; ++g) {
      acc = fma1(fi[g], sd[g], acc);
      if constexpr (T != ExtType::q6_k) acc = fma1(-fm[g], sm[g], acc);
    }
  }
  return acc;
}

// K types from 4 tokens on, weights stationary, in fewer multiplies: per
// row and super-block the 8 sub-blocks' codes (32 each) are transposed by
// dwords into 8 vectors V_m whose dword g is dword m of sub-block g, so that
// every vpmaddubsw result has the same sub-block in the same 16-bit lanes
// (lanes 2g, 2g + 1 <- sub-block g). Their 16-bit sums can then be added
// before one vpmaddwd with the sub-block scales: Q4_K 8 products and 1 scale
// multiply per 256 codes (|code x act| pair sums <= 2 * 15 * 127, 8 of them
// fit int16), Q5_K 2 (codes <= 31: 4 fit), Q6_K 4 (codes <= 63: 2 fit),
// against 8 + 8 in tile_k. The activations of a token block are transposed
// the same way once (pack_acts) for all the rows that multiply them, padded
// to 8 tokens; the contract's horizontal sums and fp32 steps run on 8
// tokens' lanes together.
constexpr int64_t kPanelRows = 8, kPanelTokens = 32;

// A token block packed for panel_k (tp = tn rounded up to 8; the padding
// tokens are zeros): super-block bi of token j at x[(bi * tp + j) * 8 + m]
// (m < 8), its activation scale at dx[bi * tp + j], its 16 block sums at
// bs[(bi * tp + j) * 16].
struct Packed {
  __m256i* x;
  float* dx;
  int16_t* bs;
  int64_t tp;
};
template <ExtType T>
HMOE_V256 void pack_acts(const Q8Acts& xa, int64_t tx, int64_t tn, int64_t nb, const Packed& pk) {
  for (int64_t j = 0; j < pk.tp; ++j)
    for (int64_t bi = 0; bi < nb; ++bi) {
      const int64_t at = bi * pk.tp + j;
      if (j >= tn) {
        for (int m = 0; m < 8; ++m) _mm256_store_si256(pk.x + at * 8 + m, _mm256_setzero_si256());
        pk.dx[at] = 0.0f;
        std::memset(pk.bs + at * 16, 0, 32);
        continue;
      }
      const int8_t* xq = xa.q.data() + (tx + j) * xa.cols;
      __m256i v[8];
      for (int g = 0; g < 8; ++g) v[g] = ld32(xq + k_slot_off<T>(bi, g));
      transpose_dwords(v);
      for (int m = 0; m < 8; ++m) _mm256_store_si256(pk.x + at * 8 + m, v[m]);
      pk.dx[at] = xa.d[static_cast<size_t>((tx + j) * nb + bi)];
      std::memcpy(pk.bs + at * 16, xa.bsum.data() + ((tx + j) * nb + bi) * 16, 32);
    }
}

template <ExtType T>
HMOE_V256 void panel_k(const Packed& pk, int64_t tn, const Mat& w, int64_t rb, int64_t re, float* y, int64_t ldy) {
  constexpr int BB = T == ExtType::q4_k ? 144 : T == ExtType::q5_k ? 176 : 210;
  const int64_t nb = w.cols / 256, tp = pk.tp;
  alignas(32) float acc[kPanelRows][kPanelTokens] = {};
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const int64_t rs = static_cast<int64_t>(w.row_bytes());
  const auto* base = static_cast<const uint8_t*>(w.data);
  // Super-block by super-block, the panel's rows inner: a super-block's packed activations (256 bytes a token,
  // 8 KiB for 32) stay in L1 while the rows pass; the next super-block's weights (a row apart each, which the
  // hardware prefetchers do not follow) are prefetched a super-block ahead.
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t r = rb; r < re; ++r) {
      const int64_t nr = bi + 1 < nb ? r : r + (re - rb);
      if (nr >= w.rows) break;
      const uint8_t* nx = base + nr * rs + (bi + 1 < nb ? (bi + 1) * BB : 0);
      for (int l = 0; l < BB; l += 64) _mm_prefetch(reinterpret_cast<const char*>(nx + l), _MM_HINT_T0);
    }
    for (int64_t r = rb; r < re; ++r) {
      const uint8_t* b = base + r * rs + bi * BB;
      const KBlk kb = k_blk<T>(b);
      __m256i sa, sb = _mm256_setzero_si256();
      if constexpr (T == ExtType::q6_k) {
        const auto* scp = reinterpret_cast<const int8_t*>(b + 192);
        alignas(32) int16_t ta[16], tb[16];
        for (int k = 0; k < 16; ++k) ta[k] = scp[2 * (k / 2)], tb[k] = scp[2 * (k / 2) + 1];
        sa = _mm256_load_si256(reinterpret_cast<const __m256i*>(ta));
        sb = _mm256_load_si256(reinterpret_cast<const __m256i*>(tb));
      } else {
        const __m128i s8 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(kb.sc)));
        sa = _mm256_set_m128i(_mm_unpackhi_epi16(s8, s8), _mm_unpacklo_epi16(s8, s8));
      }
      __m256i c[8];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) c[g] = k_codes<T>(b, g, m4);
      transpose_dwords(c);
      const __m256 d = _mm256_set1_ps(kb.d), dmin = _mm256_set1_ps(kb.dmin);
      for (int64_t jg = 0; jg < tp; jg += 8) {
        alignas(32) __m256i A[8];
        for (int j = 0; j < 8; ++j) {
          const __m256i* xp = pk.x + (bi * tp + jg + j) * 8;
#define p(m) _mm256_maddubs_epi16(c[m], _mm256_load_si256(xp + (m)))
          if constexpr (T == ExtType::q4_k) {
            A[j] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p(0), p(1)), _mm256_add_epi16(p(2), p(3))),
                                                      _mm256_add_epi16(_mm256_add_epi16(p(4), p(5)), _mm256_add_epi16(p(6), p(7)))),
                                     sa);
          } else if constexpr (T == ExtType::q5_k) {
            const __m256i s0 = _mm256_add_epi16(_mm256_add_epi16(p(0), p(1)), _mm256_add_epi16(p(2), p(3)));
            const __m256i s1 = _mm256_add_epi16(_mm256_add_epi16(p(4), p(5)), _mm256_add_epi16(p(6), p(7)));
            A[j] = _mm256_add_epi32(_mm256_madd_epi16(s0, sa), _mm256_madd_epi16(s1, sa));
          } else {  // Q6_K: V_0..V_3 hold the first 16 of each 32 (scales sa), V_4..V_7 the second (sb); codes - 32 by the sums
            const __m256i q = _mm256_add_epi32(
                _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p(0), p(1)), sa), _mm256_madd_epi16(_mm256_add_epi16(p(2), p(3)), sa)),
                _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(p(4), p(5)), sb), _mm256_madd_epi16(_mm256_add_epi16(p(6), p(7)), sb)));
            A[j] = _mm256_sub_epi32(q, _mm256_slli_epi32(_mm256_madd_epi16(kb.sc16, ld32(pk.bs + (bi * tp + jg + j) * 16)), 5));
          }
#undef p
        }
        const __m256 dx = _mm256_load_ps(pk.dx + bi * tp + jg);
        float* ar = acc[r - rb] + jg;
        __m256 s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8_i32(A)), _mm256_mul_ps(d, dx), _mm256_load_ps(ar));
        if constexpr (T != ExtType::q6_k) {
          const int16_t* bs = pk.bs + (bi * tp + jg) * 16;
          auto ms = [&](int j) { return _mm_madd_epi16(kb.mn16, ld16(bs + 16 * j)); };
          const __m256i M = _mm256_set_m128i(hsum4_i32(ms(4), ms(5), ms(6), ms(7)), hsum4_i32(ms(0), ms(1), ms(2), ms(3)));
          s = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(dmin, dx), s);
        }
        _mm256_store_ps(ar, s);
      }
    }
  }
  for (int64_t r = rb; r < re; ++r)
    for (int64_t j = 0; j < tn; ++j) y[j * ldy + r] = acc[r - rb][j];
}

// K types: panel_k from 4 tokens and 4 rows on (the packing is paid once
// per 32 tokens for all the rows of the call; at 4-7 tokens the padded
// 8-token panel still beats row1_k: 4 tokens, one thread, Q4_K / Q5_K /
// Q6_K 48 / 21-41 / 46 -> 71 / 44-64 / 45-59 GOP/s), row1_k below.
template <ExtType T>
HMOE_V256 void rows_k(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (n >= 4 && r1 - r0 >= 4) {
    const int64_t nb = w.cols / 256;
    const auto need = static_cast<size_t>(kPanelTokens * nb);
    const PanelScratch sc = panel_scratch(need * 8, need, need * 16);
    for (int64_t tb = 0; tb < n; tb += kPanelTokens) {
      const int64_t tn = std::min(kPanelTokens, n - tb);
      const Packed pk{sc.x, sc.dx, sc.bs, (tn + 7) / 8 * 8};
      if (!sc.holds(PanelKey{xa.stamp, t0 + tb, tn, static_cast<int>(T)})) pack_acts<T>(xa, t0 + tb, tn, nb, pk);
      for (int64_t rb = r0; rb < r1; rb += kPanelRows) panel_k<T>(pk, tn, w, rb, std::min(rb + kPanelRows, r1), y + tb * ldy, ldy);
    }
    return;
  }
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < n; ++t) y[t * ldy + r] = row1_k<T>(xa, t0 + t, w, r);
}

// 32-block types, blocked for the caches: 64 tokens of activations (128 KiB
// at 2048 columns) stay in L2 while 16 rows of weights pass over them, and
// each 8-token tile (16 KiB) stays in L1 while those 16 rows multiply it.
template <ExtType T>
HMOE_V256 void rows_b(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int64_t kTokens = 64, kRows = 16;
  for (int64_t tb = 0; tb < n; tb += kTokens) {
    const int64_t tn = std::min(kTokens, n - tb);
    for (int64_t rb = r0; rb < r1; rb += kRows) {
      const int64_t re = std::min(rb + kRows, r1);
      int64_t t = tb;
      for (; t + 8 <= tb + tn; t += 8)
        for (int64_t r = rb; r < re; ++r) tile_b<T, 8>(xa, t0 + t, w, r, y + t * ldy + r, ldy);
      if (t + 4 <= tb + tn) {
        for (int64_t r = rb; r < re; ++r) tile_b<T, 4>(xa, t0 + t, w, r, y + t * ldy + r, ldy);
        t += 4;
      }
      if (t + 2 <= tb + tn) {
        for (int64_t r = rb; r < re; ++r) tile_b<T, 2>(xa, t0 + t, w, r, y + t * ldy + r, ldy);
        t += 2;
      }
      if (t < tb + tn)
        for (int64_t r = rb; r < re; ++r) tile_b<T, 1>(xa, t0 + t, w, r, y + t * ldy + r, ldy);
    }
  }
}

}  // namespace

// Q8Acts::quantize's block b of row t on AVX2, bit for bit the scalar path
// (round to nearest even, the MXCSR default, as std::nearbyint; clamp to
// +-127; codes at Q8Acts::pos; K types' sums per 16 or 32 codes). False
// (nothing written) when the block holds inf or NaN: the scalar path says
// what those give.
HMOE_V256 bool q8_quantize_block_avx2(Q8Acts& a, int64_t t, int64_t b, const float* xb) {
  const int nv = static_cast<int>(a.block / 8);  // 32 or 4 vectors of 8
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), big = _mm256_set1_ps(std::numeric_limits<float>::max());
  __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int i = 0; i < nv; ++i) {
    const __m256 av = _mm256_and_ps(_mm256_loadu_ps(xb + 8 * i), abs_mask);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(av, big, _CMP_NLE_UQ));  // NaN or inf
    mx = _mm256_max_ps(mx, av);
  }
  if (_mm256_movemask_ps(bad)) return false;
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
  a.d[static_cast<size_t>(t * (a.cols / a.block) + b)] = amax / 127.0f;
  int8_t* qt = a.q.data() + t * a.cols;
  const bool k = a.block == 256, halves = a.type == ExtType::q4_0 || a.type == ExtType::q5_0;
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i s16[16];  // K types: the codes of each 16 added lane-wise
  for (int g = 0; g < nv / 4; ++g) {  // 32 codes at a time
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * g + 8 * i), vid)), hi), lo);
    const __m256i c = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), order);
    const int64_t k0 = b * a.block + 32 * g;
    if (halves) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + a.pos(k0)), _mm256_castsi256_si128(c));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + a.pos(k0 + 16)), _mm256_extracti128_si256(c, 1));
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + a.pos(k0)), c);
    }
    if (k) {
      s16[2 * g] = _mm256_add_epi32(q[0], q[1]);
      s16[2 * g + 1] = _mm256_add_epi32(q[2], q[3]);
    }
  }
  if (k) {
    alignas(32) int32_t sums[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums), hsum8_i32(s16));
    _mm256_store_si256(reinterpret_cast<__m256i*>(sums + 8), hsum8_i32(s16 + 8));
    int16_t* bs = a.bsum.data() + (t * (a.cols / 256) + b) * 16;
    if (a.type == ExtType::q6_k || lowbit_type(static_cast<uint32_t>(a.type)))
      for (int i = 0; i < 16; ++i) bs[i] = static_cast<int16_t>(sums[i]);
    else
      for (int i = 0; i < 16; ++i) bs[i] = static_cast<int16_t>(i < 8 ? sums[2 * i] + sums[2 * i + 1] : 0);
  }
  return true;
}

void q8_rows_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_k: return rows_k<ExtType::q4_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_k: return rows_k<ExtType::q5_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q6_k: return rows_k<ExtType::q6_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q8_0: return q8_0_rows_avx2(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q4_0: return rows_b<ExtType::q4_0>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_0: return rows_b<ExtType::q5_0>(xa, t0, n, w, r0, r1, y, ldy);
    default: break;
  }
  fail(ErrorKind::internal, "q8_rows_avx2: type " + std::to_string(w.ext) + " has no integer kernel");
}

}  // namespace hmoe::cpu::detail
