// AVX2 int8 kernel of the low-bit K types on the file's blocks (Q2_K, Q3_K):
// "avx2 v2" for them, for CPUs without AVX-512 (v1 in
// quant_gguf_lowbit_avx2.cpp decodes every group through the scalar
// reference, ~0.02 of the read bandwidth on a Zen 3 core).
//
// A block's qs[32 h .. 32 h + 31] holds weights 128 h + 32 j + l (l < 32) at
// bits 2 j: one vector load per half, a shift and a mask per j give 32
// unsigned codes in column order (Q3_K: bit 4 h + j of hmask[l] as bit 2,
// so the code is u - 4 with u in 0..7). vpmaddubsw (u8 codes x int8
// activations, pairs <= 2 * 7 * 127) then vpmaddwd with the run's integer
// scale (lane 0 run 2 (4 h + j), lane 1 the next run; placed by vpshufb
// from the 16 scales in both lanes) sum into int32 lanes, one integer sum
// per block and token:
//  - Q2_K: y += dx (d sum_16 sc dot - dmin sum_16 m bsum) (the mins against
//    the activations' sums per 16, Q8Acts::bsum);
//  - Q3_K: y += dx d (sum_16 s dot_u - 4 sum_16 s bsum), s = the 6-bit scale - 32.
// Exact integer sums per block, as the scalar reference's codes, scales and
// offsets (lowbit_block_codes); equal to it up to the order of the fp32
// sums. Tiles of 4, 2, 1 tokens share a row's decoded codes.
#include <immintrin.h>

#include <cstdint>

#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/detail/lowbit_avx2_layout.h"

#define HMOE_AK __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail {

namespace {
using lowbit_avx2::hsum8;

using lowbit_bytes::half;
using lowbit_bytes::prefetch;

constexpr uint32_t kQ2k = 10, kQ3k = 11;
template <uint32_t T> constexpr int kBlockBytes = T == kQ2k ? 84 : 110;

// vpshufb controls, run pair k (runs 2k, 2k + 1) from 16 scale bytes in both lanes:
// lo: the scale byte as a word's low byte (unsigned); hi: as its high byte (signed, then >> 8).
struct Ctl {
  alignas(32) uint8_t lo[8][32];
  alignas(32) uint8_t hi[8][32];
};
constexpr Ctl make_ctl() {
  Ctl c{};
  for (int k = 0; k < 8; ++k)
    for (int p = 0; p < 32; ++p) {
      const uint8_t src = static_cast<uint8_t>(2 * k + p / 16);
      c.lo[k][p] = p % 2 ? 0x80 : src;
      c.hi[k][p] = p % 2 ? src : 0x80;
    }
  return c;
}
constexpr Ctl kCtl = make_ctl();

HMOE_AK inline __m256i ctl(const uint8_t (&v)[32]) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(v)); }

// Q3_K's 16 scales - 32 as int8: low nibbles sc[0..7] then their high nibbles, and
// bits 2 (j / 4) of sc[8 + j % 4] as bits 4, 5 (dword k of the broadcast shifted by 2 k).
HMOE_AK inline __m128i q3k_scales(const uint8_t* sc) {
  const __m128i m4 = _mm_set1_epi8(15);
  const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc));
  const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4));
  const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(lowbit_bytes::u32(sc + 8))), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

// Row at a times NT tokens: x the activations of token 0 (token t at x + t * cols), dx their scales and bs their sums
// per 16 (token t at dx + t * ng, bs + 16 t ng).
template <uint32_t T, int NT>
HMOE_AK void tile(const uint8_t* a, int64_t rb, const int8_t* x, int64_t cols, const float* dx, const int16_t* bs, int64_t ng, float* y,
                  int64_t ldy) {
  constexpr int BB = kBlockBytes<T>;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t ahead = rb * ((2048 + rb - 1) / rb) > 4096 ? 4096 : rb * ((2048 + rb - 1) / rb);
  const __m256i three = _mm256_set1_epi8(3);
  for (int64_t g = 0; g < ng; ++g, a += BB) {
    prefetch(a, ahead, BB);
    const uint8_t* qs = a + (T == kQ2k ? 16 : 32);
    __m128i s8;  // the 16 scales as bytes (Q2_K: low nibbles; Q3_K: signed)
    __m256i hm = _mm256_setzero_si256();
    if constexpr (T == kQ2k) {
      s8 = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)), _mm_set1_epi8(15));
    } else {
      s8 = q3k_scales(a + 96);
      hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    }
    const __m256i sb = _mm256_broadcastsi128_si256(s8);
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * h));
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three);
        __m256i sc;
        if constexpr (T == kQ3k) {
          const int b = 4 * h + j;
          const __m256i hb = b >= 2 ? _mm256_srli_epi16(hm, b - 2) : _mm256_slli_epi16(hm, 2 - b);
          u = _mm256_or_si256(u, _mm256_and_si256(hb, _mm256_set1_epi8(4)));
          sc = _mm256_srai_epi16(_mm256_shuffle_epi8(sb, ctl(kCtl.hi[4 * h + j])), 8);
        } else {
          sc = _mm256_shuffle_epi8(sb, ctl(kCtl.lo[4 * h + j]));
        }
        for (int t = 0; t < NT; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * cols + 256 * g + 128 * h + 32 * j));
          sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), sc));
        }
      }
    }
    const float d = half(a + BB - (T == kQ2k ? 4 : 2));
    if constexpr (T == kQ2k) {
      const float dmin = half(a + 82);
      const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)), 4), _mm_set1_epi8(15)));
      for (int t = 0; t < NT; ++t) {
        const __m256i bsv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + (t * ng + g) * 16));
        const float dt = dx[t * ng + g];
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * dt), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(m16, bsv)), _mm256_set1_ps(dmin * dt), acc[t]);
      }
    } else {
      const __m256i s16 = _mm256_cvtepi8_epi16(s8);
      for (int t = 0; t < NT; ++t) {
        const __m256i bsv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + (t * ng + g) * 16));
        const __m256i tot = _mm256_sub_epi32(sum[t], _mm256_slli_epi32(_mm256_madd_epi16(s16, bsv), 2));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

template <uint32_t T>
HMOE_AK void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = w.cols / 256, rb = static_cast<int64_t>(w.row_bytes()), cols = xa.cols;
  const int8_t* x = xa.q.data() + t0 * cols;
  const float* dx = xa.d.data() + t0 * ng;
  const int16_t* bs = xa.bsum.data() + t0 * ng * 16;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = w.row(r);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(a, rb, x + t * cols, cols, dx + t * ng, bs + t * ng * 16, ng, y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(a, rb, x + t * cols, cols, dx + t * ng, bs + t * ng * 16, ng, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<T, 1>(a, rb, x + t * cols, cols, dx + t * ng, bs + t * ng * 16, ng, y + t * ldy + r, ldy);
  }
}

}  // namespace

bool lowbit_rows_q8_avx2_kquant(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  if (!isa) return false;
  switch (w.ext) {
    case kQ2k: rows<kQ2k>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kQ3k: rows<kQ3k>(xa, t0, n, w, r0, r1, y, ldy); return true;
    default: return false;
  }
}

}  // namespace hmoe::cpu::detail
