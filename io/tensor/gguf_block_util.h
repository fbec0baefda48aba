// Small helpers shared by the scalar and SIMD GGUF block kernels
// (io/tensor/quant_blocks.cpp; numa/quant_gguf_simd.cpp and the q8 kernels).
#pragma once
#include <cstdint>
#include <cstring>

#include "io/dtype.h"

namespace hmoe::cpu::detail {

// The little-endian f16 at p (block scales and mins).
inline float gguf_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q4_K/Q5_K: sub-block j's 6-bit scale and min, packed 8 pairs into 12 bytes.
inline void gguf_scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K/Q5_K: all 8 scales (sc) and mins (mn) of a super-block, one per
// byte (sub-block j in byte j), from the 12 packed bytes at s.
inline void gguf_scales_mins_k4(const uint8_t* s, uint64_t& sc, uint64_t& mn) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, s, 4);
  std::memcpy(&u1, s + 4, 4);
  std::memcpy(&u2, s + 8, 4);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, mn_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
  sc = sc_lo | static_cast<uint64_t>(sc_hi) << 32;
  mn = mn_lo | static_cast<uint64_t>(mn_hi) << 32;
}

}  // namespace hmoe::cpu::detail
