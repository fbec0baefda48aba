// AVX2 micro-kernels: the AVX-512 design (kernels_avx512.cpp) on 8 lanes and
// 16 registers, so 2 rows by up to 4 tokens per block.
#include <immintrin.h>

#include <algorithm>

#include "numa/detail/kernels_impl.h"

#define HMOE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail {

namespace {

template <Fmt F>
HMOE_AVX2 inline __m256 wload(const uint8_t* p, int64_t k) {
  if constexpr (F == Fmt::bf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * 2));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else if constexpr (F == Fmt::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * 2)));
  } else if constexpr (F == Fmt::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + k);
  } else if constexpr (F == Fmt::q8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k))));
  } else {
    __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + (k >> 5) * 16 + (k & 8)));
    if (k & 16) v = _mm_srli_epi16(v, 4);
    v = _mm_and_si128(v, _mm_set1_epi8(0x0F));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
  }
}

HMOE_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <Fmt F, int R, int T>
HMOE_AVX2 void block(const float* x, int64_t ldx, const Mat& w, int64_t r, int64_t t0, float* y, int64_t ldy) {
  const int64_t K = w.cols, K8 = K / 8 * 8;
  const int64_t step = F == Fmt::q4 ? w.group : (K8 > 0 ? K8 : 8);
  const uint8_t* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = w.row(r + i);
  __m256 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
  const float* xt[T];
  for (int j = 0; j < T; ++j) xt[j] = x + (t0 + j) * ldx;
  for (int64_t g0 = 0; g0 < K8; g0 += step) {
    __m256 sv[R], bv[R];
    if constexpr (F == Fmt::q4) {
      const int64_t G = w.groups(), g = g0 / w.group;
      for (int i = 0; i < R; ++i) {
        const float s = w.scales[(r + i) * G + g], z = w.zeros ? w.zeros[(r + i) * G + g] : 8.0f;
        sv[i] = _mm256_set1_ps(s);
        bv[i] = _mm256_set1_ps(-z * s);
      }
    }
    const int64_t gend = std::min(K8, g0 + step);
    for (int64_t k = g0; k < gend; k += 8) {
      __m256 wv[R];
      for (int i = 0; i < R; ++i) {
        wv[i] = wload<F>(wr[i], k);
        if constexpr (F == Fmt::q4) wv[i] = _mm256_fmadd_ps(wv[i], sv[i], bv[i]);
      }
      for (int j = 0; j < T; ++j) {
        const __m256 xv = _mm256_loadu_ps(xt[j] + k);
        for (int i = 0; i < R; ++i) acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) {
      float s = hsum(acc[i][j]);
      if constexpr (F == Fmt::q8) {
        for (int64_t k = K8; k < K; ++k) s += static_cast<float>(reinterpret_cast<const int8_t*>(wr[i])[k]) * xt[j][k];
        s *= w.scales[r + i];
      } else {
        for (int64_t k = K8; k < K; ++k) s += weight_at(w, r + i, k) * xt[j][k];
      }
      y[(t0 + j) * ldy + r + i] = s;
    }
}

template <Fmt F, int R>
HMOE_AVX2 void rows_tokens(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) block<F, R, 4>(x, ldx, w, r, t, y, ldy);
  switch (n - t) {
    case 3: block<F, R, 3>(x, ldx, w, r, t, y, ldy); break;
    case 2: block<F, R, 2>(x, ldx, w, r, t, y, ldy); break;
    case 1: block<F, R, 1>(x, ldx, w, r, t, y, ldy); break;
    default: break;
  }
}

// 16 tokens at a time, as in kernels_avx512.cpp: their activations stay in L2.
template <Fmt F>
HMOE_AVX2 void rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int64_t kTokens = 16;
  for (int64_t t0 = 0; t0 < n; t0 += kTokens) {
    const int64_t nt = std::min(kTokens, n - t0);
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) rows_tokens<F, 2>(x + t0 * ldx, ldx, nt, w, r, y + t0 * ldy, ldy);
    for (; r < r1; ++r) rows_tokens<F, 1>(x + t0 * ldx, ldx, nt, w, r, y + t0 * ldy, ldy);
  }
}

}  // namespace

void rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (fmt_of(w)) {
    case Fmt::bf16: rows<Fmt::bf16>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::f16: rows<Fmt::f16>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::f32: rows<Fmt::f32>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::q8: rows<Fmt::q8>(x, ldx, n, w, r0, r1, y, ldy); break;
    case Fmt::q4: rows<Fmt::q4>(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

}  // namespace hmoe::cpu::detail
