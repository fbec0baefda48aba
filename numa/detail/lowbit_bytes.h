// Private to numa/: unaligned little-endian reads of ggml block fields, for
// the low-bit kernels (quant_gguf_lowbit_avx512.cpp, _vbmi.cpp, _planes.cpp).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace hmoe::cpu::detail::lowbit_bytes {

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
// An fp16 field as fp32 (F16C).
__attribute__((target("f16c"))) inline float half(const uint8_t* p) { return _cvtsh_ss(u16(p)); }

}  // namespace hmoe::cpu::detail::lowbit_bytes
