// Small helpers shared by the scalar and SIMD GGUF block kernels
// (numa/quant_gguf.cpp, numa/quant_gguf_simd.cpp). Private to numa/.
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

}  // namespace hmoe::cpu::detail
