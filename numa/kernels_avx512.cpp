// AVX-512 micro-kernels: an R-row by T-token block of dot products, one pass
// over the R weight rows serving all T tokens (so decode is bound by weight
// bandwidth and prefill reuses each loaded weight vector T times). Weights
// are widened to fp32 in registers: bf16 by a shift, f16 by vcvtph2ps, int8
// by vpmovsxbd + vcvtdq2ps (row scale applied once at the end, rows
// prefetched ahead in software), int4 by vpmovzxbd + vpermps from a
// per-row, per-group table of the 16 dequantized values (see block_q4t).
// gcc 12 warns inside its own intrinsics headers (_mm512_reduce_add_ps,
// _mm512_undefined_*); nothing of ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>

#include "numa/detail/kernels_impl.h"

#define HMOE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define HMOE_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace hmoe::cpu::detail {

namespace {

// Software prefetch distance (bytes ahead in each weight row) for the
// quantized kernels.
constexpr int64_t kPrefetch = 1024;

template <Fmt F>
HMOE_AVX512 inline __m512 wload(const uint8_t* p, int64_t k) {
  if constexpr (F == Fmt::bf16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + k * 2));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (F == Fmt::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + k * 2)));
  } else if constexpr (F == Fmt::f32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + k);
  } else if constexpr (F == Fmt::q8) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k))));
  } else {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (k >> 5) * 16));
    if (k & 16) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
  }
}

// y[t0+j, r+i] for i < R, j < T.
template <Fmt F, int R, int T>
HMOE_AVX512 void block(const float* x, int64_t ldx, const Mat& w, int64_t r, int64_t t0, float* y, int64_t ldy) {
  const int64_t K = w.cols, K16 = K / 16 * 16;
  const int64_t step = F == Fmt::q4 ? w.group : (K16 > 0 ? K16 : 16);
  const uint8_t* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = w.row(r + i);
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  const float* xt[T];
  for (int j = 0; j < T; ++j) xt[j] = x + (t0 + j) * ldx;
  for (int64_t g0 = 0; g0 < K16; g0 += step) {
    __m512 sv[R], bv[R];
    if constexpr (F == Fmt::q4) {
      const int64_t G = w.groups(), g = g0 / w.group;
      for (int i = 0; i < R; ++i) {
        const float s = w.scales[(r + i) * G + g], z = w.zeros ? w.zeros[(r + i) * G + g] : 8.0f;
        sv[i] = _mm512_set1_ps(s);
        bv[i] = _mm512_set1_ps(-z * s);
      }
    }
    const int64_t gend = std::min(K16, g0 + step);
    for (int64_t k = g0; k < gend; k += 16) {
      if constexpr (F == Fmt::q8)
        if ((k & 63) == 0)
          for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k + kPrefetch), _MM_HINT_T0);
      __m512 wv[R];
      for (int i = 0; i < R; ++i) {
        wv[i] = wload<F>(wr[i], k);
        if constexpr (F == Fmt::q4) wv[i] = _mm512_fmadd_ps(wv[i], sv[i], bv[i]);
      }
      for (int j = 0; j < T; ++j) {
        const __m512 xv = _mm512_loadu_ps(xt[j] + k);
        for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      if constexpr (F == Fmt::q8) {
        for (int64_t k = K16; k < K; ++k) s += static_cast<float>(reinterpret_cast<const int8_t*>(wr[i])[k]) * xt[j][k];
        s *= w.scales[r + i];
      } else {
        for (int64_t k = K16; k < K; ++k) s += weight_at(w, r + i, k) * xt[j][k];
      }
      y[(t0 + j) * ldy + r + i] = s;
    }
}

// int4 group-wise through a per-group lookup table: for each row and group
// the 16 possible weights (q - zero) * scale are computed once into a zmm
// register, and vpermps (which reads only the low 4 bits of each dword
// index) turns 16 zero-extended nibble bytes into those fp32 weights without
// a mask or an int->float conversion: one 16-byte load gives 32 weights
// (vpmovzxbd, vpermps; vpsrld 4, vpermps). The weights are exactly the
// scalar reference's (q - zero) * scale, any token count uses the same
// kernel, and the group scale is applied once per group (in the table).
// Weights are prefetched kPrefetch bytes ahead in every row.

template <int R, int T>
HMOE_AVX512 void block_q4t(const float* x, int64_t ldx, const Mat& w, int64_t r, int64_t t0, float* y, int64_t ldy) {
  const int64_t G = w.groups(), gs = w.group;
  const uint8_t* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = w.row(r + i);
  const float* xt[T];
  for (int j = 0; j < T; ++j) xt[j] = x + (t0 + j) * ldx;
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  // One token: two accumulator sets (low and high halves) break the FMA chains.
  constexpr int A = T == 1 ? 2 : 1;
  __m512 acc[A][R][T];
  for (int a = 0; a < A; ++a)
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < T; ++j) acc[a][i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512 tbl[R];
    for (int i = 0; i < R; ++i) {
      const float s = w.scales[(r + i) * G + g], z = w.zeros ? w.zeros[(r + i) * G + g] : 8.0f;
      tbl[i] = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(z)), _mm512_set1_ps(s));
    }
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
      if ((k & 127) == 0)
        for (int i = 0; i < R; ++i) _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k / 2 + kPrefetch), _MM_HINT_T0);
      __m512 wl[R], wh[R];
      for (int i = 0; i < R; ++i) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[i] + k / 2)));
        wl[i] = _mm512_permutexvar_ps(v, tbl[i]);
        wh[i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl[i]);
      }
      for (int j = 0; j < T; ++j) {
        const __m512 x0 = _mm512_loadu_ps(xt[j] + k), x1 = _mm512_loadu_ps(xt[j] + k + 16);
        for (int i = 0; i < R; ++i) {
          acc[0][i][j] = _mm512_fmadd_ps(wl[i], x0, acc[0][i][j]);
          acc[A - 1][i][j] = _mm512_fmadd_ps(wh[i], x1, acc[A - 1][i][j]);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) {
      __m512 s = acc[0][i][j];
      if constexpr (A == 2) s = _mm512_add_ps(s, acc[1][i][j]);
      y[(t0 + j) * ldy + r + i] = _mm512_reduce_add_ps(s);
    }
}

template <int R>
HMOE_AVX512 void rows_tokens_q4t(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) block_q4t<R, 4>(x, ldx, w, r, t, y, ldy);
  switch (n - t) {
    case 3: block_q4t<R, 3>(x, ldx, w, r, t, y, ldy); break;
    case 2: block_q4t<R, 2>(x, ldx, w, r, t, y, ldy); break;
    case 1: block_q4t<R, 1>(x, ldx, w, r, t, y, ldy); break;
    default: break;
  }
}

HMOE_AVX512 void rows_q4t(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int64_t kTokens = 16;
  for (int64_t t0 = 0; t0 < n; t0 += kTokens) {
    const int64_t nt = std::min(kTokens, n - t0);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_tokens_q4t<4>(x + t0 * ldx, ldx, nt, w, r, y + t0 * ldy, ldy);
    for (; r < r1; ++r) rows_tokens_q4t<1>(x + t0 * ldx, ldx, nt, w, r, y + t0 * ldy, ldy);
  }
}

template <Fmt F, int R>
HMOE_AVX512 void rows_tokens(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) block<F, R, 4>(x, ldx, w, r, t, y, ldy);
  switch (n - t) {
    case 3: block<F, R, 3>(x, ldx, w, r, t, y, ldy); break;
    case 2: block<F, R, 2>(x, ldx, w, r, t, y, ldy); break;
    case 1: block<F, R, 1>(x, ldx, w, r, t, y, ldy); break;
    default: break;
  }
}

// Tokens are taken 16 at a time so that their activations (16 x cols fp32)
// stay in L2 while the row block passes over them; the row block itself
// (16 rows) is re-read from L2 once per 16 tokens.
template <Fmt F>
HMOE_AVX512 void rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int64_t kTokens = 16;
  for (int64_t t0 = 0; t0 < n; t0 += kTokens) {
    const int64_t nt = std::min(kTokens, n - t0);
    const float* xt = x + t0 * ldx;
    float* yt = y + t0 * ldy;
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_tokens<F, 4>(xt, ldx, nt, w, r, yt, ldy);
    for (; r < r1; ++r) rows_tokens<F, 1>(xt, ldx, nt, w, r, yt, ldy);
  }
}

// vdpbf16ps: 32 bf16 products per instruction, pairs summed into fp32 lanes.
template <int R, int T>
HMOE_AVX512_BF16 void block_bf16dot(const uint16_t* x, int64_t ldx, const Mat& w, int64_t r, int64_t t0, float* y, int64_t ldy) {
  const int64_t K = w.cols, K32 = K / 32 * 32;
  const uint16_t* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = reinterpret_cast<const uint16_t*>(w.row(r + i));
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K32; k += 32) {
    __m512bh wv[R];
    for (int i = 0; i < R; ++i) wv[i] = (__m512bh)_mm512_loadu_si512(wr[i] + k);
    for (int j = 0; j < T; ++j) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (t0 + j) * ldx + k);
      for (int i = 0; i < R; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv[i], xv);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      for (int64_t k = K32; k < K; ++k) s += bf16_to_f32(wr[i][k]) * bf16_to_f32(x[(t0 + j) * ldx + k]);
      y[(t0 + j) * ldy + r + i] = s;
    }
}

template <int R>
HMOE_AVX512_BF16 void rows_tokens_bf16dot(const uint16_t* x, int64_t ldx, int64_t n, const Mat& w, int64_t r, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) block_bf16dot<R, 4>(x, ldx, w, r, t, y, ldy);
  switch (n - t) {
    case 3: block_bf16dot<R, 3>(x, ldx, w, r, t, y, ldy); break;
    case 2: block_bf16dot<R, 2>(x, ldx, w, r, t, y, ldy); break;
    case 1: block_bf16dot<R, 1>(x, ldx, w, r, t, y, ldy); break;
    default: break;
  }
}

}  // namespace

void rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (fmt_of(w)) {
    case Fmt::bf16: rows<Fmt::bf16>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::f16: rows<Fmt::f16>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::f32: rows<Fmt::f32>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::q8: rows<Fmt::q8>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::q4: rows_q4t(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

void rows_bf16dot_avx512(const uint16_t* xb, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) rows_tokens_bf16dot<4>(xb, ldx, n, w, r, y, ldy);
  for (; r < r1; ++r) rows_tokens_bf16dot<1>(xb, ldx, n, w, r, y, ldy);
}

}  // namespace hmoe::cpu::detail
