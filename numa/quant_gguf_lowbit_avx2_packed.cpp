// IQ2_XXS, IQ2_XS and IQ2_S repacked at load for the AVX2 int8 kernel
// ("avx2 v3"): the file's 7-bit sign indices (with their parity sign) and
// packed grid indices cost the AVX2 v2 kernel (quant_gguf_lowbit_avx2_grid.cpp)
// two table loads per 8 weights and the index arithmetic to reach them; here
// the signs are bit planes and the indices sit in the kernel's lane order.
//
// Group (the lane layout of numa/detail/lowbit_avx2_layout.h):
//   [0, I)      grid indices: IQ2_XXS u8, IQ2_XS / IQ2_S u16; entry 4 j + Q
//               = chunk(j, Q)'s (I = 32 / 64 bytes)
//   [I, I + 32) signs: bit j of byte p = the sign of byte p of vector j
//   then        odd-scale nibbles: IQ2_XXS u32 (nibble h = 32-weight block
//               h), IQ2_XS / IQ2_S u64 (nibble h = 16-weight block h)
//   then        the fp16 d
// 70 bytes per 256 weights for IQ2_XXS (the file's 66, +6%), 106 for IQ2_XS
// (74, +43%) and IQ2_S (82, +29%).
//
// Kernel: per vector the 4 grid rows by table loads (vmovq / vpinsrq), the
// sign of vector j as bit 7 of the planes shifted by 7 - j choosing between
// the permuted activations and their negation (vpblendvb), vpmaddubsw of the
// grid magnitudes with them, pairs of vectors added in 16 bits and
// multiplied by the blocks' odd scales (vpmaddwd), one int32 sum per group.
// The same integer sums as the scalar reference per scale block; fp32 sums
// in another order.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_avx2_layout.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_AP __attribute__((target("avx2,fma,f16c,bmi2")))

namespace hmoe::cpu::detail {

namespace {

using namespace lowbit_avx2;
using lowbit_bytes::half;
using lowbit_bytes::prefetch;
using lowbit_bytes::u16;
using lowbit_bytes::u32;
using lowbit_bytes::u64;

template <uint32_t T> constexpr int kIdxBytes = T == kIq2xxs ? 32 : 64;
template <uint32_t T> constexpr int kScaleBytes = kBlocks16<T> ? 8 : 4;
template <uint32_t T> constexpr int kGroupBytes = kIdxBytes<T> + 32 + kScaleBytes<T> + 2;
template <uint32_t T> constexpr int kFileBytes = T == kIq2xxs ? 66 : T == kIq2xs ? 74 : 82;
template <uint32_t T> constexpr int chunk(int j, int q) { return lowbit_avx2::chunk(kBlocks16<T>, j, q); }

// Index, sign byte of chunk c and the scale nibbles of a file group.
template <uint32_t T>
void file_chunk(const uint8_t* b, int c, uint32_t& idx, uint8_t& sign) {
  if constexpr (T == kIq2xxs) {
    idx = b[2 + 8 * (c / 4) + c % 4];
    sign = iq_sign_byte(u32(b + 6 + 8 * (c / 4)) >> (7 * (c % 4)));
  } else if constexpr (T == kIq2xs) {
    const uint32_t q = u16(b + 2 + 2 * c);
    idx = q & 511;
    sign = iq_sign_byte(q >> 9);
  } else {
    idx = b[2 + c] | (((b[66 + c / 4] >> (2 * (c % 4))) & 3u) << 8);
    sign = b[34 + c];
  }
}

template <uint32_t T>
void pack_group(const uint8_t* b, uint8_t* dst) {
  uint8_t* sg = dst + kIdxBytes<T>;
  std::memset(sg, 0, 32);
  for (int j = 0; j < 8; ++j)
    for (int q = 0; q < 4; ++q) {
      uint32_t idx;
      uint8_t sign;
      file_chunk<T>(b, chunk<T>(j, q), idx, sign);
      if constexpr (T == kIq2xxs) dst[4 * j + q] = static_cast<uint8_t>(idx);
      else {
        const uint16_t v = static_cast<uint16_t>(idx);
        std::memcpy(dst + 2 * (4 * j + q), &v, 2);
      }
      for (int k = 0; k < 8; ++k) sg[8 * q + k] = static_cast<uint8_t>(sg[8 * q + k] | (((sign >> k) & 1u) << j));
    }
  uint8_t* sc = sg + 32;
  if constexpr (T == kIq2xxs) {
    uint32_t v = 0;
    for (int h = 0; h < 8; ++h) v |= (u32(b + 6 + 8 * h) >> 28) << (4 * h);
    std::memcpy(sc, &v, 4);
  } else {
    std::memcpy(sc, b + (T == kIq2xs ? 66 : 74), 8);
  }
  std::memcpy(sc + kScaleBytes<T>, b, 2);
}

template <uint32_t T>
void pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  const int64_t ng = w.cols / 256;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.row(r);
    for (int64_t g = 0; g < ng; ++g, src += kFileBytes<T>, dst += kGroupBytes<T>) pack_group<T>(src, dst);
  }
}

// The odd scales (2 s + 1) as bytes for the set shuffles (kLayout.ctl32 / ctl16).
template <uint32_t T>
HMOE_AP inline __m256i odd_scales(const uint8_t* sc) {
  __m256i v;
  if constexpr (kBlocks16<T>) {
    const __m256i s = _mm256_set1_epi64x(static_cast<long long>(u64(sc)));
    const __m256i m = _mm256_set1_epi8(15);
    v = _mm256_unpacklo_epi8(_mm256_and_si256(s, m), _mm256_and_si256(_mm256_srli_epi16(s, 4), m));
  } else {  // lane 0 bytes 0, 4, 8, 12 = blocks 0, 1, 4, 5; lane 1 blocks 2, 3, 6, 7
    v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u32(sc))), _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28)),
                         _mm256_set1_epi32(15));
  }
  return _mm256_or_si256(_mm256_add_epi8(v, v), _mm256_set1_epi8(1));
}

template <uint32_t T>
HMOE_AP inline __m256i scale_set(__m256i odd, int k) {
  if constexpr (kBlocks16<T>) return _mm256_shuffle_epi8(odd, _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.ctl16[k])));
  else return _mm256_shuffle_epi8(odd, _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.ctl32[k / 2])));
}

// Grid rows of 4 chunks: IQ2_XXS 4 byte indices in q (low 32 bits), else 4 u16.
template <uint32_t T>
HMOE_AP inline __m256i grid_vec(uint64_t q) {
  if constexpr (T == kIq2xxs) {
    const uint32_t v = static_cast<uint32_t>(q);
    return _mm256_set_epi64x(static_cast<long long>(kIq2xxsGrid[v >> 24]), static_cast<long long>(kIq2xxsGrid[(v >> 16) & 255]),
                             static_cast<long long>(kIq2xxsGrid[(v >> 8) & 255]), static_cast<long long>(kIq2xxsGrid[v & 255]));
  } else {
    const uint64_t* grid = T == kIq2xs ? kIq2xsGrid : kIq2sGrid;
    return _mm256_set_epi64x(static_cast<long long>(grid[q >> 48]), static_cast<long long>(grid[(q >> 32) & 0xFFFF]),
                             static_cast<long long>(grid[(q >> 16) & 0xFFFF]), static_cast<long long>(grid[q & 0xFFFF]));
  }
}

HMOE_AP inline float hsum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Row at a times NT tokens; xp: per token and group 256 permuted activations then their negation.
template <uint32_t T, int NT>
HMOE_AP void tile(const uint8_t* a, int64_t rb, const int8_t* xp, const float* dx, int64_t ng, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>, IB = kIdxBytes<T>;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t ahead = rb * ((2048 + rb - 1) / rb) > 4096 ? 4096 : rb * ((2048 + rb - 1) / rb);
  for (int64_t g = 0; g < ng; ++g, a += GB) {
    prefetch(a, ahead, GB);
    const __m256i planes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + IB));
    const __m256i odd = odd_scales<T>(a + IB + 32);
    uint64_t q[8];
    if constexpr (T == kIq2xxs) {
      for (int i = 0; i < 4; ++i) {
        const uint64_t v = u64(a + 8 * i);
        q[2 * i] = v;
        q[2 * i + 1] = v >> 32;
      }
    } else {
      for (int i = 0; i < 8; ++i) q[i] = u64(a + 8 * i);
    }
    // the indices stay in registers (the compiler would reload each byte)
    asm("" : "+r"(q[0]), "+r"(q[1]), "+r"(q[2]), "+r"(q[3]));
    asm("" : "+r"(q[4]), "+r"(q[5]), "+r"(q[6]), "+r"(q[7]));
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i g0 = grid_vec<T>(q[2 * k]), g1 = grid_vec<T>(q[2 * k + 1]);
      const __m256i m0 = _mm256_slli_epi16(planes, 7 - 2 * k), m1 = _mm256_slli_epi16(planes, 6 - 2 * k);
      const __m256i sc = scale_set<T>(odd, k);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const int8_t* x = xp + (t * ng + g) * 512 + 64 * k;
        const __m256i x0 = _mm256_blendv_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(x)), _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 256)), m0);
        const __m256i x1 =
            _mm256_blendv_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + 32)), _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 288)), m1);
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(g0, x0), _mm256_maddubs_epi16(g1, x1));
        sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, sc));
      }
    }
    const float d = half(a + IB + 32 + kScaleBytes<T>) * kDScale<T>;
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

template <uint32_t T>
HMOE_AP void rows(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = cols / 256, rb = ng * kGroupBytes<T>;
  thread_local std::vector<int8_t> buf;
  thread_local std::vector<float> dx;
  buf.resize(static_cast<size_t>(n * ng * 512) + 32);
  dx.resize(static_cast<size_t>(n * ng));
  int8_t* xp = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 31) & ~uintptr_t{31});
  const uint8_t* perm = kLayout.xperm[kBlocks16<T> ? 1 : 0];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < ng; ++g) {
      const int8_t* x = xa.q.data() + (t0 + t) * xa.cols + 256 * g;
      int8_t* o = xp + (t * ng + g) * 512;
      for (int p = 0; p < 256; p += 8) std::memcpy(o + p, x + perm[p], 8);  // chunks of 8 columns
      for (int p = 0; p < 256; p += 32)  // |x| <= 127
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 256 + p),
                           _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_load_si256(reinterpret_cast<const __m256i*>(o + p))));
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)];
    }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = packed + r * rb;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(a, rb, xp + t * ng * 512, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(a, rb, xp + t * ng * 512, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<T, 1>(a, rb, xp + t * ng * 512, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
  }
}

}  // namespace

bool lowbit_avx2_pack_applies(uint32_t ext, int64_t cols) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
  }();
  return isa && (ext == kIq2xxs || ext == kIq2xs || ext == kIq2s) && cols > 0 && cols % 256 == 0;
}

size_t lowbit_avx2_row_bytes(uint32_t ext, int64_t cols) {
  const int gb = ext == kIq2xxs ? kGroupBytes<kIq2xxs> : kGroupBytes<kIq2xs>;
  return static_cast<size_t>(cols / 256) * static_cast<size_t>(gb);
}

void lowbit_avx2_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  switch (w.ext) {
    case kIq2xxs: pack<kIq2xxs>(w, r0, r1, dst); break;
    case kIq2xs: pack<kIq2xs>(w, r0, r1, dst); break;
    default: pack<kIq2s>(w, r0, r1, dst); break;
  }
}

void lowbit_rows_q8_avx2_packed(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                                int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  switch (static_cast<uint32_t>(xa.type)) {
    case kIq2xxs: rows<kIq2xxs>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    case kIq2xs: rows<kIq2xs>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    default: rows<kIq2s>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
  }
}

}  // namespace hmoe::cpu::detail
