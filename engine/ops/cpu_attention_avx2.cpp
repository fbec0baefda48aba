// attend_tiles_avx2: the attention inner loop (cpu_attention_kernel.inc) on
// 16-lane vectors made of two ymm registers; up to 4 query heads share each
// key and value load (16 registers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/ops/cpu_attention_kernel.h"

namespace hmoe::ops::detail {

namespace {

struct Isa {
  struct V {
    __m256 lo, hi;
  };
  static constexpr int kHeads = 4;
  static constexpr int kAcc = 4;
  static constexpr int kVAcc = 4;
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static V sub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static V loadf(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void storef(float* p, V v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static __m256 i8x8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
  // bf16 widens by interleaving zero words below the values (two in-lane unpacks of one load): the lanes come out
  // as [0-3, 8-11] and [4-7, 12-15] (the kernel unswizzles scores and outputs). On Zen 3 (bench_simd_pipes)
  // vpmovzxwd issues at 0.79 a cycle and holds back the fp32 pipes (3 multiplies + 1: 1.84 a cycle); the unpacks
  // run beside them (2.64).
  static constexpr bool kBf16Swizzled = true;
  static V swizzle(V v) { return {_mm256_permute2f128_ps(v.lo, v.hi, 0x20), _mm256_permute2f128_ps(v.lo, v.hi, 0x31)}; }
  static V bf16x16(const uint8_t* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), z = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x))};
  }
  template <KvDtype D>
  static V load(const uint8_t* p) {
    if constexpr (D == KvDtype::f32) return loadf(reinterpret_cast<const float*>(p));
    else if constexpr (D == KvDtype::bf16) return bf16x16(p);
    else return {i8x8(p), i8x8(p + 8)};
  }
  static V keep_first(V v, int64_t T, float fill) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i t = _mm256_set1_epi32(static_cast<int>(T));
    const __m256 klo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(t, idx));
    const __m256 khi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(t, _mm256_add_epi32(idx, _mm256_set1_epi32(8))));
    const __m256 f = _mm256_set1_ps(fill);
    return {_mm256_blendv_ps(f, v.lo, klo), _mm256_blendv_ps(f, v.hi, khi)};
  }
  static float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
  }
  static float reduce_max(V v) { return hmax(_mm256_max_ps(v.lo, v.hi)); }
  static float reduce_add(V v) {
    const __m256 s = _mm256_add_ps(v.lo, v.hi);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
  }
  // exp(x) for x <= 0 (and -inf), as the AVX-512 one; 2^n built in the
  // exponent field (x clamped to -87, so n >= -126 stays normal).
  static __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 y = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    y = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), y);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
  static V exp_neg(V x) { return {exp8(x.lo), exp8(x.hi)}; }
  static float exp1(float x) { return _mm256_cvtss_f32(exp8(_mm256_set1_ps(x))); }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

}  // namespace

namespace {
#include "engine/ops/cpu_attention_kernel.inc"
}  // namespace

void attend_tiles_avx2(const AttnTiles& a) { attend(a); }

}  // namespace hmoe::ops::detail
#pragma GCC pop_options
