// AVX2 kernels of the low-bit ggml types (numa/quant_gguf_lowbit.h), for
// CPUs without AVX-512 VNNI. v1: the codes of a 256-weight group come from
// the scalar reference (lowbit_block_codes); the integer product takes
// |code| (vpsignb) times the activations with the code's sign (vpmaddubsw,
// no saturation: 127 * 127 * 2 < 2^15), widened to int32 (vpmaddwd) per run
// of 16; the exact path converts the codes to fp32 and uses FMAs.
#include <immintrin.h>

#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/detail/lowbit_avx2_layout.h"

#define HMOE_L256 __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail {

namespace {
using lowbit_avx2::hsum8;

struct Codes {
  alignas(32) int8_t c[256];
  float s[16], o[16];
};

// A 256-weight group (one block, or 8 of the 32-types) of row p.
void group_codes(ExtType t, const uint8_t* p, Codes& g) {
  const ExtTypeInfo* ti = lowbit_type_info(static_cast<uint32_t>(t));
  const int per = 256 / ti->block_elems;
  for (int i = 0; i < per; ++i) lowbit_block_codes(t, p + i * ti->block_bytes, g.c + i * ti->block_elems, g.s + i * ti->block_elems / 16, g.o + i * ti->block_elems / 16);
}

int64_t group_bytes(ExtType t) {
  const ExtTypeInfo* ti = lowbit_type_info(static_cast<uint32_t>(t));
  return static_cast<int64_t>(ti->block_bytes) * (256 / ti->block_elems);
}

HMOE_L256 float q8_group_dot(const Codes& g, const int8_t* xq, const int16_t* bsum) {
  const __m256i ones = _mm256_set1_epi16(1);
  float f = 0;
  for (int h = 0; h < 8; ++h) {  // 32 weights = runs 2h, 2h+1
    const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.c + 32 * h));
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * h));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c)), ones);
    alignas(32) int32_t l[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), p);
    f += g.s[2 * h] * static_cast<float>(l[0] + l[1] + l[2] + l[3]) + g.s[2 * h + 1] * static_cast<float>(l[4] + l[5] + l[6] + l[7]);
  }
  for (int j = 0; j < 16; ++j) f += g.o[j] * static_cast<float>(bsum[j]);
  return f;
}

}  // namespace

HMOE_L256 void lowbit_rows_q8_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const ExtType type = static_cast<ExtType>(w.ext);
  const int64_t groups = w.cols / 256, gb = group_bytes(type);
  Codes g;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t t = 0; t < n; ++t) y[t * ldy + r] = 0.0f;
    for (int64_t gi = 0; gi < groups; ++gi) {
      group_codes(type, row + gi * gb, g);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t tr = t0 + t, blk = tr * groups + gi;
        y[t * ldy + r] += xa.d[static_cast<size_t>(blk)] * q8_group_dot(g, xa.q.data() + tr * xa.cols + gi * 256, xa.bsum.data() + blk * 16);
      }
    }
  }
}

HMOE_L256 void lowbit_rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const ExtType type = static_cast<ExtType>(w.ext);
  const ExtTypeInfo* ti = lowbit_type_info(w.ext);
  const int64_t nb = w.cols / ti->block_elems;
  alignas(32) float blk[256];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t t = 0; t < n; ++t) y[t * ldy + r] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      lowbit_dequant_block(type, row + b * ti->block_bytes, blk);
      for (int64_t t = 0; t < n; ++t) {
        const float* xt = x + t * ldx + b * ti->block_elems;
        __m256 acc = _mm256_setzero_ps();
        for (int k = 0; k < ti->block_elems; k += 8) acc = _mm256_fmadd_ps(_mm256_load_ps(blk + k), _mm256_loadu_ps(xt + k), acc);
        y[t * ldy + r] += hsum8(acc);
      }
    }
  }
}

}  // namespace hmoe::cpu::detail
