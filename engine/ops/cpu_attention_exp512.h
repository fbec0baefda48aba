// e^x on 16 fp32 lanes for x <= 0 (-inf gives 0), shared by the AVX-512
// decode kernel (cpu_attention_avx512.cpp) and the prompt kernel
// (cpu_attention_prefill.cpp), whose results must agree bit for bit:
// 2^n e^y, y = x - n ln2 in [-ln2/2, ln2/2], e^y by its degree-6 Taylor
// polynomial (relative error < 2e-7). Include only from files compiled for
// (or functions targeting) AVX-512F.
#pragma once
#include <immintrin.h>

namespace hmoe::ops::detail {

__attribute__((target("avx512f,fma"))) inline __m512 attn_exp_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 y = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  y = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), y);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace hmoe::ops::detail
