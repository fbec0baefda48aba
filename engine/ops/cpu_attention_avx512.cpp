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

#include "engine/ops/cpu_attention_exp512.h"
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
  // exp(x) for x <= 0 (and -inf), shared with the prompt kernel (cpu_attention_exp512.h).
  static V exp_neg(V x) { return attn_exp_neg(x); }
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
