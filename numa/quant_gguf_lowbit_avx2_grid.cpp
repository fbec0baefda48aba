// AVX2 int8 kernel of the grid IQ types on the file's blocks (IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): "avx2 v2", for CPUs without AVX-512 (the
// v1 kernel of quant_gguf_lowbit_avx2.cpp decodes every group through the
// scalar reference, ~0.01 of the read bandwidth on a Zen 3 core).
//
// Layout (numa/detail/lowbit_avx2_layout.h, as v4 on AVX-512): a group's
// 32 chunks of 8 weights in 8 vectors of 4 qwords, qword Q of every vector
// one scale block. Vectors 2k and 2k + 1 share their blocks lane for lane: their
// vpmaddubsw products (grid magnitudes u8 x activations with the weight's
// sign, vpsignb; |s16| <= 62 * 127 * 2 each, two of them < 2^15) are added
// in 16 bits and multiplied by the blocks' odd scales (2 s + 1) with one
// vpmaddwd into int32 lanes: one integer sum per group and row, times the
// row's d and the activation scale in fp32. The activations are permuted
// into that order once per call. Grid rows and sign patterns (bytes +-1)
// are scalar table loads (L1) put together with vmovq / vpinsrq.
// Exact integer sums per scale block; equal to the scalar reference up to
// the order of the fp32 sums (one int32 -> fp32 conversion per group).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_avx2_layout.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_AG __attribute__((target("avx2,fma,f16c,bmi2")))

namespace hmoe::cpu::detail {

namespace {

using lowbit_bytes::half;
using lowbit_bytes::prefetch;
using lowbit_bytes::u16;
using lowbit_bytes::u32;
using lowbit_bytes::u64;

using namespace lowbit_avx2;

template <uint32_t T> constexpr int kGroupBytes = T == kIq2xxs ? 66 : T == kIq2xs ? 74 : T == kIq3xxs ? 98 : T == kIq3s ? 110 : 82;
template <uint32_t T> constexpr int chunk(int j, int q) { return lowbit_avx2::chunk(kBlocks16<T>, j, q); }

struct Tables {
  uint64_t sign7[128];   // 7-bit sign index -> bytes -1 / +1 (with the parity sign)
  uint64_t sign8[256];   // sign byte -> bytes -1 / +1
  uint64_t iq3xxs[256];  // IQ3_XXS grid row in the low dword (the high one 0)
};

constexpr uint64_t sign_pattern(uint32_t bits) {
  uint64_t v = 0;
  for (int j = 0; j < 8; ++j) v |= static_cast<uint64_t>((bits >> j) & 1 ? 0xFF : 0x01) << (8 * j);
  return v;
}

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 128; ++i) t.sign7[i] = sign_pattern(iq_sign_byte(i));
  for (uint32_t i = 0; i < 256; ++i) t.sign8[i] = sign_pattern(i);
  return t;
}
constexpr Tables kT = make_tables();
const Tables& tables() {
  static const Tables t = [] {
    Tables v = kT;
    for (int e = 0; e < 256; ++e) v.iq3xxs[e] = kIq3xxsGrid[e];
    return v;
  }();
  return t;
}
const Tables& kTab = tables();

// Grid magnitudes and sign bytes of chunk c of the group at b.
template <uint32_t T>
inline void chunk_bytes(const uint8_t* b, int c, uint64_t& g, uint64_t& s) {
  if constexpr (T == kIq2xxs) {
    g = kIq2xxsGrid[b[2 + 8 * (c / 4) + c % 4]];
    s = kTab.sign7[(u32(b + 6 + 8 * (c / 4)) >> (7 * (c % 4))) & 127];
  } else if constexpr (T == kIq2xs) {
    const uint32_t q = u16(b + 2 + 2 * c);
    g = kIq2xsGrid[q & 511];
    s = kTab.sign7[q >> 9];
  } else if constexpr (T == kIq2s) {
    g = kIq2sGrid[b[2 + c] | (((b[66 + c / 4] >> (2 * (c % 4))) & 3) << 8)];
    s = kTab.sign8[b[34 + c]];
  } else if constexpr (T == kIq3xxs) {
    g = kTab.iq3xxs[b[2 + 2 * c]] | static_cast<uint64_t>(kIq3xxsGrid[b[3 + 2 * c]]) << 32;
    s = kTab.sign7[(u32(b + 66 + 4 * (c / 4)) >> (7 * (c % 4))) & 127];
  } else {  // IQ3_S
    const uint32_t h = b[66 + c / 4] >> (2 * (c % 4));
    g = kIq3sGrid[b[2 + 2 * c] | ((h & 1) << 8)] | static_cast<uint64_t>(kIq3sGrid[b[3 + 2 * c] | ((h & 2) << 7)]) << 32;
    s = kTab.sign8[b[74 + c]];
  }
}

// The odd scales (2 s + 1) of the group as bytes for the set shuffles:
// 32-weight blocks: lane 0 bytes 0, 4, 8, 12 = blocks 0, 1, 4, 5, lane 1 blocks 2, 3, 6, 7;
// 16-weight blocks: both lanes bytes 0..15 = blocks 0..15.
template <uint32_t T>
HMOE_AG inline __m256i odd_scales(const uint8_t* b) {
  __m256i v;
  if constexpr (T == kIq2xxs) {
    const __m256i a = _mm256_srli_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 60);
    const __m256i c = _mm256_srli_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 34)), 60);
    v = _mm256_packus_epi32(a, c);  // lane 0 words 0, 2, 4, 6 = blocks 0, 1, 4, 5
  } else if constexpr (T == kIq3xxs) {
    const __m256i a = _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 66)), 28);
    v = _mm256_permutevar8x32_epi32(a, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
  } else if constexpr (T == kIq3s) {
    v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u32(b + 106))), _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28)),
                         _mm256_set1_epi32(15));
  } else {
    const __m256i s = _mm256_set1_epi64x(static_cast<long long>(u64(b + (T == kIq2xs ? 66 : 74))));
    const __m256i m = _mm256_set1_epi8(15);
    v = _mm256_unpacklo_epi8(_mm256_and_si256(s, m), _mm256_and_si256(_mm256_srli_epi16(s, 4), m));
  }
  return _mm256_or_si256(_mm256_add_epi8(v, v), _mm256_set1_epi8(1));
}

// Vector j of the group: grid magnitudes and sign bytes.
template <uint32_t T>
HMOE_AG inline void vec(const uint8_t* b, int j, __m256i& g, __m256i& s) {
  uint64_t g0, g1, g2, g3, s0, s1, s2, s3;
  chunk_bytes<T>(b, chunk<T>(j, 0), g0, s0);
  chunk_bytes<T>(b, chunk<T>(j, 1), g1, s1);
  chunk_bytes<T>(b, chunk<T>(j, 2), g2, s2);
  chunk_bytes<T>(b, chunk<T>(j, 3), g3, s3);
  g = _mm256_set_epi64x(static_cast<long long>(g3), static_cast<long long>(g2), static_cast<long long>(g1), static_cast<long long>(g0));
  s = _mm256_set_epi64x(static_cast<long long>(s3), static_cast<long long>(s2), static_cast<long long>(s1), static_cast<long long>(s0));
}

// Row r times NT tokens; xp: the permuted activations (token t, group g at xp + (t * ng + g) * 256), dx their scales.
template <uint32_t T, int NT>
HMOE_AG void tile(const uint8_t* a, int64_t rb, const int8_t* xp, const float* dx, int64_t ng, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t ahead = rb * ((2048 + rb - 1) / rb) > 4096 ? 4096 : rb * ((2048 + rb - 1) / rb);
  for (int64_t g = 0; g < ng; ++g, a += GB) {
    prefetch(a, ahead, GB);
    const __m256i odd = odd_scales<T>(a);
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m256i g0, s0, g1, s1;
      vec<T>(a, 2 * k, g0, s0);
      vec<T>(a, 2 * k + 1, g1, s1);
      const __m256i sc = scale_set<T>(odd, k);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const int8_t* x = xp + (t * ng + g) * 256 + 64 * k;
        const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x)), x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 32));
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(g0, _mm256_sign_epi8(x0, s0)), _mm256_maddubs_epi16(g1, _mm256_sign_epi8(x1, s1)));
        sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, sc));
      }
    }
    const float d = half(a) * kDScale<T>;
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

template <uint32_t T>
HMOE_AG void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = w.cols / 256, rb = static_cast<int64_t>(w.row_bytes());
  thread_local std::vector<int8_t> buf;
  thread_local std::vector<float> dx;
  buf.resize(static_cast<size_t>(n * ng * 256) + 32);
  dx.resize(static_cast<size_t>(n * ng));
  int8_t* xp = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 31) & ~uintptr_t{31});
  const uint8_t* perm = kLayout.xperm[kBlocks16<T> ? 1 : 0];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < ng; ++g) {
      const int8_t* x = xa.q.data() + (t0 + t) * xa.cols + 256 * g;
      int8_t* o = xp + (t * ng + g) * 256;
      for (int p = 0; p < 256; p += 8) std::memcpy(o + p, x + perm[p], 8);  // chunks of 8 columns
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)];
    }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = w.row(r);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(a, rb, xp + t * ng * 256, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(a, rb, xp + t * ng * 256, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<T, 1>(a, rb, xp + t * ng * 256, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
  }
}

}  // namespace

bool lowbit_rows_q8_avx2_grid(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
  }();
  if (!isa) return false;
  switch (w.ext) {
    case kIq2xxs: rows<kIq2xxs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq2xs: rows<kIq2xs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq2s: rows<kIq2s>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq3xxs: rows<kIq3xxs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq3s: rows<kIq3s>(xa, t0, n, w, r0, r1, y, ldy); return true;
    default: return false;
  }
}

}  // namespace hmoe::cpu::detail
