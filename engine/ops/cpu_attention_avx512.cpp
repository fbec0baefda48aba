// attend_tiles_avx512: the attention inner loop (cpu_attention_kernel.inc)
// on 16-lane zmm vectors; up to 8 query heads share each key and value load.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,fma")
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/ops/cpu_attention_kernel.h"

namespace hmoe::ops::detail {

namespace {

struct Isa {
  using V = __m512;
  static constexpr int kHeads = 8;  // query heads per pass (8 score accumulators)
  static constexpr int kAcc = 8;    // score accumulators in flight
  static constexpr int kVAcc = 16;  // output accumulators in the value pass
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, V v) { _mm512_storeu_ps(p, v); }
  template <KvDtype D>
  static V load(const uint8_t* p) {
    if constexpr (D == KvDtype::f32) return _mm512_loadu_ps(p);
    else if constexpr (D == KvDtype::bf16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
    else return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // lanes [0, T) of v, the others `fill`
  static V keep_first(V v, int64_t T, float fill) {
    return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << T) - 1), _mm512_set1_ps(fill), v);
  }
  static float reduce_max(V v) { return _mm512_reduce_max_ps(v); }
  static float reduce_add(V v) { return _mm512_reduce_add_ps(v); }
  // exp(x) for x <= 0 (and -inf): 2^n e^y, y = x - n ln2 in [-ln2/2, ln2/2],
  // e^y by its degree-6 Taylor polynomial (relative error < 2e-7).
  static V exp_neg(V x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V y = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    y = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), y);
    V p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
  }
  static float exp1(float x) { return _mm512_cvtss_f32(exp_neg(_mm512_set1_ps(x))); }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

}  // namespace

namespace {
#include "engine/ops/cpu_attention_kernel.inc"
}  // namespace

void attend_tiles_avx512(const AttnTiles& a) { attend(a); }

}  // namespace hmoe::ops::detail
#pragma GCC pop_options
