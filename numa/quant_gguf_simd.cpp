// SIMD kernels for the Quant::ext formats (numa/quant_gguf.h).
//
// AVX-512 (v2): per block and row the sub-block scales and mins are decoded
// once (v1 redid it for every 32 weights); then each run of 32 weights is
// dequantized straight into two zmm registers (nibble shift/mask, high bits
// by byte masks, vpmovzxbd + vcvtdq2ps, one FMA with scale and min) and
// multiplied into up to 4 tokens' accumulators, so one pass over the weights
// serves 4 tokens; four rows are walked together (four weight streams in
// flight for GEMV, each token's activations loaded once for the four rows).
// AVX2 (v2): the same per-block scale decoding and in-register dequantize,
// four 8-wide vectors per 32 weights, one row at a time (v1 dequantized
// each block into an L1 buffer with the scalar reference).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "configs/error.h"
#include "io/tensor/gguf_block_util.h"
#include "numa/quant_gguf.h"
#include "numa/quant_gguf_amx.h"

#define HMOE_Q512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define HMOE_Q256 __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail {

namespace {

HMOE_Q512 inline __m512 u8x16(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
HMOE_Q512 inline __m512 i8x16(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
HMOE_Q512 inline __m128i ld16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

constexpr bool is_block(ExtType t) { return static_cast<uint32_t>(t) < 1000; }
template <ExtType T> constexpr int kElems = T == ExtType::q4_k || T == ExtType::q5_k || T == ExtType::q6_k ? 256 : 32;
template <ExtType T> constexpr int kBytes = T == ExtType::q4_0 ? 18 : T == ExtType::q4_1 ? 20 : T == ExtType::q5_0 ? 22 : T == ExtType::q5_1 ? 24
                                          : T == ExtType::q8_0 ? 34 : T == ExtType::q4_k ? 144 : T == ExtType::q5_k ? 176 : 210;

HMOE_Q512 inline float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Per block: w = q * d[i] + m[i] for the i-th run of 16 weights (q unsigned
// for every type but Q8_0), computed once per block and row.
struct BlockScales {
  float d[16], m[16];
};

template <ExtType T>
HMOE_Q512 inline void prep(const uint8_t* blk, BlockScales& s) {
  if constexpr (T == ExtType::q8_0) {
    s.d[0] = s.d[1] = h2f(blk);
  } else if constexpr (T == ExtType::q4_0 || T == ExtType::q5_0) {
    s.d[0] = s.d[1] = h2f(blk);
    s.m[0] = s.m[1] = (T == ExtType::q4_0 ? -8.0f : -16.0f) * s.d[0];
  } else if constexpr (T == ExtType::q4_1 || T == ExtType::q5_1) {
    s.d[0] = s.d[1] = h2f(blk);
    s.m[0] = s.m[1] = h2f(blk + 2);
  } else if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
    const float d = h2f(blk), dmin = h2f(blk + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      detail::gguf_scale_min_k4(j, blk + 4, sc, mn);
      s.d[2 * j] = s.d[2 * j + 1] = d * static_cast<float>(sc);
      s.m[2 * j] = s.m[2 * j + 1] = -dmin * static_cast<float>(mn);
    }
  } else {  // q6_k
    const float d = h2f(blk + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int j = 0; j < 16; ++j) {
      s.d[j] = d * static_cast<float>(sc[j]);
      s.m[j] = -32.0f * s.d[j];
    }
  }
}

// Weights [32c, 32c+32) of block blk (c < kElems/32) into a (first 16) and b.
template <ExtType T>
HMOE_Q512 inline void block_chunk(const uint8_t* blk, int c, const BlockScales& s, __m512& a, __m512& b) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m512 d0 = _mm512_set1_ps(s.d[2 * c]), d1 = _mm512_set1_ps(s.d[2 * c + 1]);
  if constexpr (T == ExtType::q8_0) {
    a = _mm512_mul_ps(d0, i8x16(ld16(blk + 2)));
    b = _mm512_mul_ps(d1, i8x16(ld16(blk + 18)));
    return;
  }
  __m128i q0, q1;
  if constexpr (T == ExtType::q4_0 || T == ExtType::q4_1) {
    const __m128i q = ld16(blk + (T == ExtType::q4_0 ? 2 : 4));
    q0 = _mm_and_si128(q, m4);
    q1 = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
  } else if constexpr (T == ExtType::q5_0 || T == ExtType::q5_1) {
    constexpr int off = T == ExtType::q5_0 ? 2 : 4;
    uint32_t qh;
    std::memcpy(&qh, blk + off, 4);
    const __m128i q = ld16(blk + off + 4);
    const __m128i sixteen = _mm_set1_epi8(16);
    q0 = _mm_or_si128(_mm_and_si128(q, m4), _mm_maskz_mov_epi8(static_cast<__mmask16>(qh & 0xFFFF), sixteen));
    q1 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_maskz_mov_epi8(static_cast<__mmask16>(qh >> 16), sixteen));
  } else if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
    const uint8_t* q = blk + (T == ExtType::q4_k ? 16 : 48) + 32 * (c >> 1);
    q0 = ld16(q), q1 = ld16(q + 16);
    if (c & 1) q0 = _mm_srli_epi16(q0, 4), q1 = _mm_srli_epi16(q1, 4);
    q0 = _mm_and_si128(q0, m4);
    q1 = _mm_and_si128(q1, m4);
    if constexpr (T == ExtType::q5_k) {
      const __m128i bit = _mm_set1_epi8(static_cast<char>(1 << c)), sixteen = _mm_set1_epi8(16);
      q0 = _mm_or_si128(q0, _mm_maskz_mov_epi8(_mm_test_epi8_mask(ld16(blk + 16), bit), sixteen));
      q1 = _mm_or_si128(q1, _mm_maskz_mov_epi8(_mm_test_epi8_mask(ld16(blk + 32), bit), sixteen));
    }
  } else {  // q6_k: sub-chunk c = 4h + qq
    const int h = c >> 2, qq = c & 3;
    const uint8_t* ql = blk + h * 64 + (qq & 1) * 32;
    const uint8_t* qh = blk + 128 + h * 32;
    q0 = ld16(ql), q1 = ld16(ql + 16);
    if (qq >= 2) q0 = _mm_srli_epi16(q0, 4), q1 = _mm_srli_epi16(q1, 4);
    const __m128i m2 = _mm_set1_epi8(3), sh = _mm_cvtsi32_si128(2 * qq);
    const __m128i h0 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(ld16(qh), sh), m2), 4);
    const __m128i h1 = _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(ld16(qh + 16), sh), m2), 4);
    q0 = _mm_or_si128(_mm_and_si128(q0, m4), h0);
    q1 = _mm_or_si128(_mm_and_si128(q1, m4), h1);
  }
  a = _mm512_fmadd_ps(u8x16(q0), d0, _mm512_set1_ps(s.m[2 * c]));
  b = _mm512_fmadd_ps(u8x16(q1), d1, _mm512_set1_ps(s.m[2 * c + 1]));
}

// Element formats (FP8, int8 groups): weights [32c, 32c+32) of row p.
template <ExtType T>
HMOE_Q512 inline void elem_chunk(const Mat& w, const uint8_t* p, int64_t r, int64_t c, __m512& a, __m512& b) {
  if constexpr (T == ExtType::fp8_e4m3) {
    // e4m3 bits placed in an f16's exponent/mantissa give value * 2^-8.
    const float s = w.scales[r * w.groups() + (c * 32) / w.group] * 256.0f;
    const __m256i v0 = _mm256_cvtepu8_epi16(ld16(p + c * 32)), v1 = _mm256_cvtepu8_epi16(ld16(p + c * 32 + 16));
    const __m256i mag = _mm256_set1_epi16(0x7F), sgn = _mm256_set1_epi16(0x80);
    const __m256i h0 = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v0, mag), 7), _mm256_slli_epi16(_mm256_and_si256(v0, sgn), 8));
    const __m256i h1 = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v1, mag), 7), _mm256_slli_epi16(_mm256_and_si256(v1, sgn), 8));
    a = _mm512_mul_ps(_mm512_cvtph_ps(h0), _mm512_set1_ps(s));
    b = _mm512_mul_ps(_mm512_cvtph_ps(h1), _mm512_set1_ps(s));
  } else {  // int8_group
    const int64_t g = r * w.groups() + (c * 32) / w.group;
    const float s = w.scales[g], z = w.zeros ? w.zeros[g] : 128.0f;
    const __m512 vs = _mm512_set1_ps(s), vm = _mm512_set1_ps(-z * s);
    a = _mm512_fmadd_ps(u8x16(ld16(p + c * 32)), vs, vm);
    b = _mm512_fmadd_ps(u8x16(ld16(p + c * 32 + 16)), vs, vm);
  }
}

// acc[i][j] += w_i . x_j over one run of 32 weights (a: first 16, b: last 16):
// each token's x is loaded once for all R rows.
template <int R, int NT>
HMOE_Q512 inline void fma_tokens(const float* x, int64_t ldx, int64_t t0, int64_t k, const __m512 (&a)[R], const __m512 (&b)[R],
                                 __m512 (&acc)[R][NT]) {
  for (int j = 0; j < NT; ++j) {
    const float* xt = x + (t0 + j) * ldx + k;
    const __m512 xa = _mm512_loadu_ps(xt), xb = _mm512_loadu_ps(xt + 16);
    for (int i = 0; i < R; ++i) {
      acc[i][j] = _mm512_fmadd_ps(a[i], xa, acc[i][j]);
      acc[i][j] = _mm512_fmadd_ps(b[i], xb, acc[i][j]);
    }
  }
}

// y[t0+j, r+i] for i < R rows, j < NT tokens.
template <ExtType T, int R, int NT>
HMOE_Q512 void tile512(const float* x, int64_t ldx, int64_t t0, const Mat& w, int64_t r, float* y, int64_t ldy) {
  __m512 acc[R][NT];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = w.row(r + i);
  __m512 a[R], b[R];
  if constexpr (is_block(T)) {
    constexpr int BE = kElems<T>, BB = kBytes<T>;
    const int64_t nb = w.cols / BE;
    for (int64_t bi = 0; bi < nb; ++bi) {
      BlockScales sc[R];
      for (int i = 0; i < R; ++i) prep<T>(rows[i] + bi * BB, sc[i]);
      for (int c = 0; c < BE / 32; ++c) {
        for (int i = 0; i < R; ++i) block_chunk<T>(rows[i] + bi * BB, c, sc[i], a[i], b[i]);
        fma_tokens<R, NT>(x, ldx, t0, bi * BE + c * 32, a, b, acc);
      }
    }
  } else {
    const int64_t chunks = w.cols / 32;
    for (int64_t c = 0; c < chunks; ++c) {
      for (int i = 0; i < R; ++i) elem_chunk<T>(w, rows[i], r + i, c, a[i], b[i]);
      fma_tokens<R, NT>(x, ldx, t0, c * 32, a, b, acc);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) y[(t0 + j) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <ExtType T>
HMOE_Q512 void rows512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile512<T, 4, 4>(x, ldx, t, w, r, y, ldy);
    for (; t < n; ++t) tile512<T, 4, 1>(x, ldx, t, w, r, y, ldy);
  }
  for (; r < r1; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile512<T, 1, 4>(x, ldx, t, w, r, y, ldy);
    for (; t < n; ++t) tile512<T, 1, 1>(x, ldx, t, w, r, y, ldy);
  }
}

// ---- bf16 tiles for the AMX path (numa/quant_gguf_amx.h) ------------------
// Each run of 32 weights is dequantized as for the fp32 kernels above and
// rounded to bf16 (round to nearest even) into its A-tile row.
#define HMOE_B512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")))

template <ExtType T>
HMOE_B512 void tiles512(const Mat& w, int64_t r0, int64_t nr, uint16_t* out) {
  for (int64_t i = 0; i < nr; ++i) {
    const uint8_t* row = w.row(r0 + i);
    __m512 a, b;
    if constexpr (is_block(T)) {
      constexpr int BE = kElems<T>, BB = kBytes<T>;
      const int64_t nb = w.cols / BE;
      for (int64_t bi = 0; bi < nb; ++bi) {
        BlockScales sc;
        prep<T>(row + bi * BB, sc);
        for (int c = 0; c < BE / 32; ++c) {
          block_chunk<T>(row + bi * BB, c, sc, a, b);
          const int64_t kk = bi * (BE / 32) + c;
          _mm512_storeu_si512(out + (kk * 32 + i) * 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
        }
      }
    } else {
      for (int64_t kk = 0; kk < w.cols / 32; ++kk) {
        elem_chunk<T>(w, row, r0 + i, kk, a, b);
        _mm512_storeu_si512(out + (kk * 32 + i) * 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
      }
    }
  }
}

// ---- AVX2 (v2): the same structure as AVX-512, 8-wide --------------------
HMOE_Q256 inline __m128i ld16b(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
HMOE_Q256 inline __m256 u8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
HMOE_Q256 inline __m256 i8x8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// 16 bits of `bits` -> 16 bytes of 16 where the bit is set.
HMOE_Q256 inline __m128i bits16(uint32_t bits) {
  const __m128i b = _mm_shuffle_epi8(_mm_set1_epi16(static_cast<short>(bits & 0xFFFF)), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m128i sel = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(b, sel), sel), _mm_set1_epi8(16));
}

template <ExtType T>
HMOE_Q256 inline void prep256(const uint8_t* blk, BlockScales& s) {
  if constexpr (T == ExtType::q8_0) {
    s.d[0] = s.d[1] = detail::gguf_half(blk);
  } else if constexpr (T == ExtType::q4_0 || T == ExtType::q5_0) {
    s.d[0] = s.d[1] = detail::gguf_half(blk);
    s.m[0] = s.m[1] = (T == ExtType::q4_0 ? -8.0f : -16.0f) * s.d[0];
  } else if constexpr (T == ExtType::q4_1 || T == ExtType::q5_1) {
    s.d[0] = s.d[1] = detail::gguf_half(blk);
    s.m[0] = s.m[1] = detail::gguf_half(blk + 2);
  } else if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
    const float d = detail::gguf_half(blk), dmin = detail::gguf_half(blk + 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      detail::gguf_scale_min_k4(j, blk + 4, sc, mn);
      s.d[2 * j] = s.d[2 * j + 1] = d * static_cast<float>(sc);
      s.m[2 * j] = s.m[2 * j + 1] = -dmin * static_cast<float>(mn);
    }
  } else {
    const float d = detail::gguf_half(blk + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int j = 0; j < 16; ++j) {
      s.d[j] = d * static_cast<float>(sc[j]);
      s.m[j] = -32.0f * s.d[j];
    }
  }
}

// Weights [32c, 32c+32) of block blk into w[0..3] (8 each).
template <ExtType T>
HMOE_Q256 inline void block_chunk256(const uint8_t* blk, int c, const BlockScales& s, __m256 (&w)[4]) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m256 d0 = _mm256_set1_ps(s.d[2 * c]), d1 = _mm256_set1_ps(s.d[2 * c + 1]);
  if constexpr (T == ExtType::q8_0) {
    const __m128i a = ld16b(blk + 2), b = ld16b(blk + 18);
    w[0] = _mm256_mul_ps(d0, i8x8(a));
    w[1] = _mm256_mul_ps(d0, i8x8(_mm_srli_si128(a, 8)));
    w[2] = _mm256_mul_ps(d1, i8x8(b));
    w[3] = _mm256_mul_ps(d1, i8x8(_mm_srli_si128(b, 8)));
    return;
  }
  __m128i q0, q1;
  if constexpr (T == ExtType::q4_0 || T == ExtType::q4_1) {
    const __m128i q = ld16b(blk + (T == ExtType::q4_0 ? 2 : 4));
    q0 = _mm_and_si128(q, m4);
    q1 = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
  } else if constexpr (T == ExtType::q5_0 || T == ExtType::q5_1) {
    constexpr int off = T == ExtType::q5_0 ? 2 : 4;
    uint32_t qh;
    std::memcpy(&qh, blk + off, 4);
    const __m128i q = ld16b(blk + off + 4);
    q0 = _mm_or_si128(_mm_and_si128(q, m4), bits16(qh));
    q1 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), m4), bits16(qh >> 16));
  } else if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
    const uint8_t* q = blk + (T == ExtType::q4_k ? 16 : 48) + 32 * (c >> 1);
    q0 = ld16b(q), q1 = ld16b(q + 16);
    if (c & 1) q0 = _mm_srli_epi16(q0, 4), q1 = _mm_srli_epi16(q1, 4);
    q0 = _mm_and_si128(q0, m4);
    q1 = _mm_and_si128(q1, m4);
    if constexpr (T == ExtType::q5_k) {
      const __m128i bit = _mm_set1_epi8(static_cast<char>(1 << c)), sixteen = _mm_set1_epi8(16);
      q0 = _mm_or_si128(q0, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(ld16b(blk + 16), bit), bit), sixteen));
      q1 = _mm_or_si128(q1, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(ld16b(blk + 32), bit), bit), sixteen));
    }
  } else {  // q6_k
    const int h = c >> 2, qq = c & 3;
    const uint8_t* ql = blk + h * 64 + (qq & 1) * 32;
    const uint8_t* qh = blk + 128 + h * 32;
    q0 = ld16b(ql), q1 = ld16b(ql + 16);
    if (qq >= 2) q0 = _mm_srli_epi16(q0, 4), q1 = _mm_srli_epi16(q1, 4);
    const __m128i m2 = _mm_set1_epi8(3), sh = _mm_cvtsi32_si128(2 * qq);
    q0 = _mm_or_si128(_mm_and_si128(q0, m4), _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(ld16b(qh), sh), m2), 4));
    q1 = _mm_or_si128(_mm_and_si128(q1, m4), _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(ld16b(qh + 16), sh), m2), 4));
  }
  const __m256 m0 = _mm256_set1_ps(s.m[2 * c]), m1 = _mm256_set1_ps(s.m[2 * c + 1]);
  w[0] = _mm256_fmadd_ps(u8x8(q0), d0, m0);
  w[1] = _mm256_fmadd_ps(u8x8(_mm_srli_si128(q0, 8)), d0, m0);
  w[2] = _mm256_fmadd_ps(u8x8(q1), d1, m1);
  w[3] = _mm256_fmadd_ps(u8x8(_mm_srli_si128(q1, 8)), d1, m1);
}

template <ExtType T>
HMOE_Q256 inline void elem_chunk256(const Mat& w, const uint8_t* p, int64_t r, int64_t c, __m256 (&v)[4]) {
  if constexpr (T == ExtType::fp8_e4m3) {
    const __m256 s = _mm256_set1_ps(w.scales[r * w.groups() + (c * 32) / w.group] * 256.0f);
    const __m128i mag = _mm_set1_epi16(0x7F), sgn = _mm_set1_epi16(0x80);
    for (int i = 0; i < 4; ++i) {
      const __m128i u = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c * 32 + 8 * i)));
      const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(u, mag), 7), _mm_slli_epi16(_mm_and_si128(u, sgn), 8));
      v[i] = _mm256_mul_ps(_mm256_cvtph_ps(h), s);
    }
  } else {
    const int64_t g = r * w.groups() + (c * 32) / w.group;
    const float sc = w.scales[g], z = w.zeros ? w.zeros[g] : 128.0f;
    const __m256 vs = _mm256_set1_ps(sc), vm = _mm256_set1_ps(-z * sc);
    for (int i = 0; i < 4; ++i)
      v[i] = _mm256_fmadd_ps(u8x8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c * 32 + 8 * i))), vs, vm);
  }
}

HMOE_Q256 inline float hsum256(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

template <int NT>
HMOE_Q256 inline void fma256(const float* x, int64_t ldx, int64_t t0, int64_t k, const __m256 (&v)[4], __m256 (&acc)[NT][2]) {
  for (int j = 0; j < NT; ++j) {
    const float* xt = x + (t0 + j) * ldx + k;
    acc[j][0] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xt), acc[j][0]);
    acc[j][1] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xt + 8), acc[j][1]);
    acc[j][0] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xt + 16), acc[j][0]);
    acc[j][1] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xt + 24), acc[j][1]);
  }
}

template <ExtType T, int NT>
HMOE_Q256 void tile256(const float* x, int64_t ldx, int64_t t0, const Mat& w, int64_t r, float* y, int64_t ldy) {
  __m256 acc[NT][2];
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  const uint8_t* row = w.row(r);
  if constexpr (is_block(T)) {
    constexpr int BE = kElems<T>, BB = kBytes<T>;
    const int64_t nb = w.cols / BE;
    for (int64_t bi = 0; bi < nb; ++bi) {
      BlockScales sc;
      prep256<T>(row + bi * BB, sc);
      for (int c = 0; c < BE / 32; ++c) {
        __m256 v[4];
        block_chunk256<T>(row + bi * BB, c, sc, v);
        fma256<NT>(x, ldx, t0, bi * BE + c * 32, v, acc);
      }
    }
  } else {
    for (int64_t c = 0; c < w.cols / 32; ++c) {
      __m256 v[4];
      elem_chunk256<T>(w, row, r, c, v);
      fma256<NT>(x, ldx, t0, c * 32, v, acc);
    }
  }
  for (int j = 0; j < NT; ++j) y[(t0 + j) * ldy + r] = hsum256(_mm256_add_ps(acc[j][0], acc[j][1]));
}

template <ExtType T>
HMOE_Q256 void rows256(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  for (int64_t r = r0; r < r1; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile256<T, 4>(x, ldx, t, w, r, y, ldy);
    for (; t < n; ++t) tile256<T, 1>(x, ldx, t, w, r, y, ldy);
  }
}

}  // namespace

void ext_rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_0: return rows512<ExtType::q4_0>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q4_1: return rows512<ExtType::q4_1>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q5_0: return rows512<ExtType::q5_0>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q5_1: return rows512<ExtType::q5_1>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q8_0: return rows512<ExtType::q8_0>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q4_k: return rows512<ExtType::q4_k>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q5_k: return rows512<ExtType::q5_k>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q6_k: return rows512<ExtType::q6_k>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::fp8_e4m3: return rows512<ExtType::fp8_e4m3>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::int8_group: return rows512<ExtType::int8_group>(x, ldx, n, w, r0, r1, y, ldy);
  }
  fail(ErrorKind::internal, "ext_rows_avx512: unknown type " + std::to_string(w.ext));
}

void ext_rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_0: return rows256<ExtType::q4_0>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q4_1: return rows256<ExtType::q4_1>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q5_0: return rows256<ExtType::q5_0>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q5_1: return rows256<ExtType::q5_1>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q8_0: return rows256<ExtType::q8_0>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q4_k: return rows256<ExtType::q4_k>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q5_k: return rows256<ExtType::q5_k>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::q6_k: return rows256<ExtType::q6_k>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::fp8_e4m3: return rows256<ExtType::fp8_e4m3>(x, ldx, n, w, r0, r1, y, ldy);
    case ExtType::int8_group: return rows256<ExtType::int8_group>(x, ldx, n, w, r0, r1, y, ldy);
  }
  fail(ErrorKind::internal, "ext_rows_avx2: unknown type " + std::to_string(w.ext));
}

void ext_rows_to_bf16_tiles_avx512(const Mat& w, int64_t r0, int64_t nr, uint16_t* out) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_0: return tiles512<ExtType::q4_0>(w, r0, nr, out);
    case ExtType::q4_1: return tiles512<ExtType::q4_1>(w, r0, nr, out);
    case ExtType::q5_0: return tiles512<ExtType::q5_0>(w, r0, nr, out);
    case ExtType::q5_1: return tiles512<ExtType::q5_1>(w, r0, nr, out);
    case ExtType::q8_0: return tiles512<ExtType::q8_0>(w, r0, nr, out);
    case ExtType::q4_k: return tiles512<ExtType::q4_k>(w, r0, nr, out);
    case ExtType::q5_k: return tiles512<ExtType::q5_k>(w, r0, nr, out);
    case ExtType::q6_k: return tiles512<ExtType::q6_k>(w, r0, nr, out);
    case ExtType::fp8_e4m3: return tiles512<ExtType::fp8_e4m3>(w, r0, nr, out);
    case ExtType::int8_group: return tiles512<ExtType::int8_group>(w, r0, nr, out);
  }
  fail(ErrorKind::internal, "ext_rows_to_bf16_tiles_avx512: unknown type " + std::to_string(w.ext));
}

}  // namespace hmoe::cpu::detail
