// SIMD kernels for the Quant::ext formats (numa/quant_gguf.h).
//
// AVX-512 (v2): per block and row the sub-block scales and mins are decoded
// once (v1 redid it for every 32 weights); then each run of 32 weights is
// dequantized straight into two zmm registers (nibble shift/mask, high bits
// by byte masks, vpmovzxbd + vcvtdq2ps, one FMA with scale and min) and
// multiplied into up to 4 tokens' accumulators, so one pass over the weights
// serves 4 tokens. Two rows are walked together to keep two independent
// streams in flight for GEMV.
// AVX2 (v1): each block is dequantized by the scalar reference into an L1
// buffer and FMA'd with 8-wide vectors (correct, slower to dequantize).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "configs/error.h"
#include "numa/quant_gguf.h"

#define HMOE_Q512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))
#define HMOE_Q256 __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail {

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

inline void scale_min(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

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
      scale_min(j, blk + 4, sc, mn);
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

template <int R, int NT>
HMOE_Q512 inline void fma_tokens(const float* x, int64_t ldx, int64_t t0, int64_t k, int i, __m512 a, __m512 b, __m512 (&acc)[R][NT]) {
  for (int j = 0; j < NT; ++j) {
    const float* xt = x + (t0 + j) * ldx + k;
    acc[i][j] = _mm512_fmadd_ps(a, _mm512_loadu_ps(xt), acc[i][j]);
    acc[i][j] = _mm512_fmadd_ps(b, _mm512_loadu_ps(xt + 16), acc[i][j]);
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
  if constexpr (is_block(T)) {
    constexpr int BE = kElems<T>, BB = kBytes<T>;
    const int64_t nb = w.cols / BE;
    for (int64_t bi = 0; bi < nb; ++bi) {
      BlockScales sc[R];
      for (int i = 0; i < R; ++i) prep<T>(rows[i] + bi * BB, sc[i]);
      for (int c = 0; c < BE / 32; ++c)
        for (int i = 0; i < R; ++i) {
          __m512 a, b;
          block_chunk<T>(rows[i] + bi * BB, c, sc[i], a, b);
          fma_tokens<R, NT>(x, ldx, t0, bi * BE + c * 32, i, a, b, acc);
        }
    }
  } else {
    const int64_t chunks = w.cols / 32;
    for (int64_t c = 0; c < chunks; ++c)
      for (int i = 0; i < R; ++i) {
        __m512 a, b;
        elem_chunk<T>(w, rows[i], r + i, c, a, b);
        fma_tokens<R, NT>(x, ldx, t0, c * 32, i, a, b, acc);
      }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NT; ++j) y[(t0 + j) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <ExtType T>
HMOE_Q512 void rows512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile512<T, 2, 4>(x, ldx, t, w, r, y, ldy);
    for (; t < n; ++t) tile512<T, 2, 1>(x, ldx, t, w, r, y, ldy);
  }
  for (; r < r1; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile512<T, 1, 4>(x, ldx, t, w, r, y, ldy);
    for (; t < n; ++t) tile512<T, 1, 1>(x, ldx, t, w, r, y, ldy);
  }
}

// AVX2: dequantize a 256-or-fewer element span to L1, then FMA.
HMOE_Q256 void rows256(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const ExtTypeInfo* ti = ext_type_info(w.ext);
  const bool blocks = w.ext < 1000;
  const int64_t span = blocks ? ti->block_elems : 32;
  alignas(32) float buf[256];
  constexpr int NT = 4;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = w.row(r);
    for (int64_t t0 = 0; t0 < n; t0 += NT) {
      const int nt = static_cast<int>(std::min<int64_t>(NT, n - t0));
      __m256 acc[NT];
      for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
      for (int64_t k0 = 0; k0 < w.cols; k0 += span) {
        if (blocks) dequant_block(static_cast<ExtType>(w.ext), p + (k0 / span) * ti->block_bytes, buf);
        else
          for (int i = 0; i < 32; ++i) buf[i] = ext_weight_at(w, r, k0 + i);
        for (int64_t i = 0; i < span; i += 8) {
          const __m256 wv = _mm256_load_ps(buf + i);
          for (int j = 0; j < nt; ++j) acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (t0 + j) * ldx + k0 + i), acc[j]);
        }
      }
      for (int j = 0; j < nt; ++j) {
        const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc[j]), _mm256_extractf128_ps(acc[j], 1));
        const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        y[(t0 + j) * ldy + r] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
      }
    }
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
  rows256(x, ldx, n, w, r0, r1, y, ldy);
}

}  // namespace hmoe::cpu::detail
