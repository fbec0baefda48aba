// AVX2 int8 kernel of the 16-entry codebook types on the file's blocks
// (IQ4_NL, IQ4_XS, MXFP4): "avx2 v2" for them, for CPUs without AVX-512
// (v1 in quant_gguf_lowbit_avx2.cpp decodes every group through the scalar
// reference, ~0.02 of the read bandwidth on a Zen 3 core).
//
// A run of 32 weights is 16 bytes of nibbles (low nibbles weights 0..15,
// high nibbles 16..31): the bytes and the bytes >> 4 in the two lanes,
// masked, looked up with one vpshufb in the codebook (int8: IQ4 -127..113,
// MXFP4's e2m1 doubled -12..12) give the 32 codes in column order. The
// product is |code| (u8) times the activation with the code's sign
// (vpsignb; vpmaddubsw pairs <= 2 * 127 * 127 < 2^15), widened by vpmaddwd:
//  - IQ4_NL, MXFP4 (a scale per 32-weight block): with ones, one int32 sum
//    per block, times the block's scale and the activation scale in fp32;
//  - IQ4_XS (6-bit scales ls - 32 per 32 weights of a 256-weight block,
//    decoded for the group at once, high bits by pdep): with the integer
//    scale (vpshufb of the words), one int32 sum per block, times d and dx.
// Exact integer sums per scale block, as the scalar reference's codes and
// scales (lowbit_block_codes); equal to it up to the order of the fp32 sums.
// R tokens share a row's decoded codes (tiles of 4, 2, 1 tokens).
#include <immintrin.h>

#include <cstdint>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/detail/lowbit_avx2_layout.h"

#define HMOE_AN __attribute__((target("avx2,fma,f16c,bmi2")))

namespace hmoe::cpu::detail {

namespace {
using lowbit_avx2::hsum8;

using lowbit_bytes::half;
using lowbit_bytes::prefetch;
using lowbit_bytes::u16;

constexpr uint32_t kIq4nl = 20, kIq4xs = 23, kMxfp4 = 39;

// Bytes of one 256-weight group, and of one 32-weight block (the 32-types).
template <uint32_t T> constexpr int kGroupBytes = T == kIq4nl ? 8 * 18 : T == kMxfp4 ? 8 * 17 : 136;
template <uint32_t T> constexpr int kBlockBytes = T == kIq4nl ? 18 : 17;

struct Book {
  alignas(32) int8_t v[32];  // the codebook in both lanes
};
template <uint32_t T>
constexpr Book make_book() {
  Book b{};
  for (int i = 0; i < 32; ++i) b.v[i] = T == kMxfp4 ? mxfp4_value2(static_cast<uint32_t>(i % 16)) : kIq4nlValues[i % 16];
  return b;
}
template <uint32_t T> constexpr Book kBook = make_book<T>();

// The 32 codes of the nibbles at q.
template <uint32_t T>
HMOE_AN inline __m256i codes32(const uint8_t* q) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(15));
  return _mm256_shuffle_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(kBook<T>.v)), n);
}

// 16 int16 pair sums of codes c times activations x.
HMOE_AN inline __m256i dot16(__m256i c, __m256i x) { return _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c)); }

// Row at a times NT tokens: x the activations of token 0 (token t at x + t * cols), dx their scales (token t at dx + t * ng).
template <uint32_t T, int NT>
HMOE_AN void tile(const uint8_t* a, int64_t rb, const int8_t* x, int64_t cols, const float* dx, int64_t ng, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t ahead = rb * ((2048 + rb - 1) / rb) > 4096 ? 4096 : rb * ((2048 + rb - 1) / rb);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < ng; ++g, a += GB) {
    prefetch(a, ahead, GB);
    if constexpr (T == kIq4xs) {
      // the 8 scales ls - 32 as words in both lanes: low bits from the nibbles of scales_l, high bits spread by pdep
      const __m128i m4 = _mm_set1_epi8(15), l = _mm_cvtsi32_si128(static_cast<int>(lowbit_bytes::u32(a + 4)));
      const __m128i hi = _mm_cvtsi64_si128(static_cast<long long>(_pdep_u64(u16(a + 2), 0x0303030303030303ull)));
      const __m128i ls = _mm_sub_epi8(_mm_or_si128(_mm_unpacklo_epi8(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4)), _mm_slli_epi16(hi, 4)),
                                      _mm_set1_epi8(32));
      const __m256i sw = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(ls));
      __m256i sum[NT];
      for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i c = codes32<T>(a + 8 + 16 * j), s = _mm256_shuffle_epi8(sw, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * j)));
        for (int t = 0; t < NT; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * cols + 256 * g + 32 * j));
          sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(dot16(c, xv), s));
        }
      }
      const float d = half(a);
      for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
    } else {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const uint8_t* b = a + kBlockBytes<T> * j;
        const float d = T == kMxfp4 ? e8m0_half(b[0]) : half(b);
        const __m256i c = codes32<T>(b + (T == kMxfp4 ? 1 : 2));
        for (int t = 0; t < NT; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * cols + 256 * g + 32 * j));
          const __m256i p = _mm256_madd_epi16(dot16(c, xv), ones);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

template <uint32_t T>
HMOE_AN void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = w.cols / 256, rb = static_cast<int64_t>(w.row_bytes()), cols = xa.cols;
  const int8_t* x = xa.q.data() + t0 * cols;
  const float* dx = xa.d.data() + t0 * ng;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = w.row(r);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(a, rb, x + t * cols, cols, dx + t * ng, ng, y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(a, rb, x + t * cols, cols, dx + t * ng, ng, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<T, 1>(a, rb, x + t * cols, cols, dx + t * ng, ng, y + t * ldy + r, ldy);
  }
}

}  // namespace

bool lowbit_rows_q8_avx2_nibble(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  }();
  if (!isa) return false;
  switch (w.ext) {
    case kIq4nl: rows<kIq4nl>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq4xs: rows<kIq4xs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kMxfp4: rows<kMxfp4>(xa, t0, n, w, r0, r1, y, ldy); return true;
    default: return false;
  }
}

}  // namespace hmoe::cpu::detail
