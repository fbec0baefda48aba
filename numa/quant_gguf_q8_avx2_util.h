// Inline AVX2 helpers shared by the AVX2 kernels of the integer GGUF path
// (quant_gguf_q8_avx2.cpp: K types and Q4_0/Q5_0; quant_gguf_q8_avx2_q80.cpp:
// Q8_0). Internal to numa/: include only from files compiled for AVX2 call
// sites (every function carries the AVX2 target attribute).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#define HMOE_V256 __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail::avx2 {

HMOE_V256 inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
HMOE_V256 inline __m256i ld32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
HMOE_V256 inline __m128i ld16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
HMOE_V256 inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
// acc + a * b in fp32 with one rounding (the fused multiply-add of the numerics contract).
HMOE_V256 inline float fma1(float a, float b, float acc) { return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(acc))); }

// Lane sums of 8 vectors: lane i = the exact sum of v[i]'s lanes.
HMOE_V256 inline __m256i hsum8_i32(const __m256i* v) {
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
}
// Lane sums of 4 vectors of 4 lanes.
HMOE_V256 inline __m128i hsum4_i32(__m128i a, __m128i b, __m128i c, __m128i d) { return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d)); }

// v[m] <- the m-th dwords of v[0..7] (an 8 x 8 transpose of 32-bit elements).
HMOE_V256 inline void transpose_dwords(__m256i v[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
    v[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
  }
}

// What a thread's panel scratch holds: the packer (kind), the activations
// (Q8Acts::stamp, never 0 here) and the token block, so that a call on the
// same token block (the next row block of the same product, the up
// projection after the gate) skips the packing.
struct PanelKey {
  uint64_t stamp = 0;
  int64_t tx = -1, tn = 0;
  int kind = -1;
  bool operator==(const PanelKey&) const = default;
};

// This thread's scratch for the panels' packed activations: at least
// `vectors` 32-byte-aligned vectors, `floats` 32-byte-aligned floats (the
// activation scales, loaded 8 at a time with aligned loads) and `shorts`
// int16 (block sums), and the key of what they hold (cleared when they grow).
// Grows, never shrinks; valid until the thread's next call.
struct PanelScratch {
  __m256i* x;
  float* dx;
  int16_t* bs;
  PanelKey* key;
  // True when the scratch already holds `want` (stamped activations); otherwise records `want` as what the caller
  // packs now.
  bool holds(const PanelKey& want) const {
    if (want.stamp != 0 && *key == want) return true;
    *key = want;
    return false;
  }
};
inline PanelScratch panel_scratch(size_t vectors, size_t floats, size_t shorts = 0) {
  struct alignas(32) V32 {
    int8_t b[32];
  };
  thread_local std::vector<V32> xb;
  thread_local std::vector<float> dxb;
  thread_local std::vector<int16_t> bsb;
  thread_local PanelKey key;
  if (xb.size() < vectors || dxb.size() < floats + 8 || bsb.size() < shorts) key = PanelKey{};
  if (xb.size() < vectors) xb.resize(vectors);
  if (dxb.size() < floats + 8) dxb.resize(floats + 8);
  if (bsb.size() < shorts) bsb.resize(shorts);
  auto* dx = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(dxb.data()) + 31) & ~uintptr_t{31});
  return {reinterpret_cast<__m256i*>(xb.data()), dx, bsb.data(), &key};
}

}  // namespace hmoe::cpu::detail::avx2
