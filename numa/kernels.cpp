// Dot-product GEMM for y = x W^T. One pass over each weight row serves all n
// tokens (the row block stays in L1/L2 while the tokens stream), so decode
// (n = 1) is bound by weight bandwidth and prefill reuses each row n times.
#include "numa/kernels.h"

#include <immintrin.h>

// gcc 12 warns inside its own _mm512_reduce_add_ps; nothing of ours.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <vector>

namespace hmoe::cpu {

namespace {

Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return Isa::avx2;
  return Isa::scalar;
}
Isa g_isa = detect();

inline float load1(DType t, const uint8_t* p, int64_t k) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
    case DType::f16: return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
    default: return reinterpret_cast<const float*>(p)[k];
  }
}

void rows_scalar(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    to_f32(w.dtype, w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * ldx;
      float s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += xt[k] * row[static_cast<size_t>(k)];
      y[t * ldy + r] = s;
    }
  }
}

// ---- AVX-512 -------------------------------------------------------------
__attribute__((target("avx512f,avx512bw"))) inline __m512 load16_512(DType t, const uint8_t* p) {
  if (t == DType::bf16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  if (t == DType::f16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

__attribute__((target("avx512f,avx512bw"))) void rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w,
                                                               int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t K = w.cols, K16 = K / 16 * 16;
  const size_t es = dtype_size(w.dtype);
  // 4 rows at a time against up to 4 tokens: 16 accumulators.
  constexpr int R = 4, T = 4;
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    const uint8_t* wr[R];
    for (int i = 0; i < R; ++i) wr[i] = w.row(r + i);
    for (int64_t t0 = 0; t0 < n; t0 += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, n - t0));
      __m512 acc[R][T];
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
      for (int64_t k = 0; k < K16; k += 16) {
        __m512 wv[R];
        for (int i = 0; i < R; ++i) wv[i] = load16_512(w.dtype, wr[i] + k * es);
        for (int j = 0; j < nt; ++j) {
          __m512 xv = _mm512_loadu_ps(x + (t0 + j) * ldx + k);
          for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
      }
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < nt; ++j) {
          float s = _mm512_reduce_add_ps(acc[i][j]);
          for (int64_t k = K16; k < K; ++k) s += load1(w.dtype, wr[i], k) * x[(t0 + j) * ldx + k];
          y[(t0 + j) * ldy + r + i] = s;
        }
    }
  }
  for (; r < r1; ++r) {
    const uint8_t* wr = w.row(r);
    for (int64_t t = 0; t < n; ++t) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = 0; k < K16; k += 16) acc = _mm512_fmadd_ps(load16_512(w.dtype, wr + k * es), _mm512_loadu_ps(x + t * ldx + k), acc);
      float s = _mm512_reduce_add_ps(acc);
      for (int64_t k = K16; k < K; ++k) s += load1(w.dtype, wr, k) * x[t * ldx + k];
      y[t * ldy + r] = s;
    }
  }
}

// ---- AVX2 ----------------------------------------------------------------
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8_256(DType t, const uint8_t* p) {
  if (t == DType::bf16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  if (t == DType::f16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

__attribute__((target("avx2,fma,f16c"))) inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma,f16c"))) void rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w,
                                                          int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t K = w.cols, K8 = K / 8 * 8;
  const size_t es = dtype_size(w.dtype);
  constexpr int R = 2, T = 4;
  int64_t r = r0;
  for (; r + R <= r1; r += R) {
    const uint8_t* wr[R] = {w.row(r), w.row(r + 1)};
    for (int64_t t0 = 0; t0 < n; t0 += T) {
      const int nt = static_cast<int>(std::min<int64_t>(T, n - t0));
      __m256 acc[R][T];
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) acc[i][j] = _mm256_setzero_ps();
      for (int64_t k = 0; k < K8; k += 8) {
        __m256 w0 = load8_256(w.dtype, wr[0] + k * es), w1 = load8_256(w.dtype, wr[1] + k * es);
        for (int j = 0; j < nt; ++j) {
          __m256 xv = _mm256_loadu_ps(x + (t0 + j) * ldx + k);
          acc[0][j] = _mm256_fmadd_ps(w0, xv, acc[0][j]);
          acc[1][j] = _mm256_fmadd_ps(w1, xv, acc[1][j]);
        }
      }
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < nt; ++j) {
          float s = hsum256(acc[i][j]);
          for (int64_t k = K8; k < K; ++k) s += load1(w.dtype, wr[i], k) * x[(t0 + j) * ldx + k];
          y[(t0 + j) * ldy + r + i] = s;
        }
    }
  }
  for (; r < r1; ++r) {
    const uint8_t* wr = w.row(r);
    for (int64_t t = 0; t < n; ++t) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t k = 0; k < K8; k += 8) acc = _mm256_fmadd_ps(load8_256(w.dtype, wr + k * es), _mm256_loadu_ps(x + t * ldx + k), acc);
      float s = hsum256(acc);
      for (int64_t k = K8; k < K; ++k) s += load1(w.dtype, wr, k) * x[t * ldx + k];
      y[t * ldy + r] = s;
    }
  }
}

}  // namespace

Isa best_isa() { return g_isa; }
const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512" : isa == Isa::avx2 ? "avx2" : "scalar"; }
Isa set_isa_for_testing(Isa isa) {
  Isa old = g_isa;
  g_isa = std::min(isa, detect());
  return old;
}

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t k = 0; k < n; ++k) dst[k] = load1(t, p, k);
}

void gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (g_isa) {
    case Isa::avx512: rows_avx512(x, ldx, n, w, r0, r1, y, ldy); break;
    case Isa::avx2: rows_avx2(x, ldx, n, w, r0, r1, y, ldy); break;
    default: rows_scalar(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

void gemm(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool) {
  // Row blocks of 16 keep the 4-row micro-kernel busy and give enough chunks.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (w.rows + kBlock - 1) / kBlock;
  auto body = [&](int64_t b0, int64_t b1, int) {
    gemm_rows(x, w.cols, n, w, b0 * kBlock, std::min(w.rows, b1 * kBlock), y, w.rows);
  };
  if (pool && w.rows * w.cols * n >= 32768) pool->parallel_for(blocks, body);
  else body(0, blocks, 0);
}

void gemm_reference(const float* x, int64_t n, const Mat& w, float* y) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(x[t * w.cols + k]) * load1(w.dtype, w.row(r), k);
      y[t * w.rows + r] = static_cast<float>(s);
    }
}

}  // namespace hmoe::cpu
