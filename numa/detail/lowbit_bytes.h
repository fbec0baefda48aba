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

// The lines of bytes [p + ahead, p + ahead + n) into L1, and the same bytes
// 3 x ahead further into L2 (the kernels' weight streams; measured 0-5%
// better in the engine at one token on the dev box, never worse).
inline void prefetch(const uint8_t* p, int64_t ahead, int n) {
  const char* q = reinterpret_cast<const char*>(p) + ahead;
  for (int o = 0; o < n; o += 64) _mm_prefetch(q + o, _MM_HINT_T0);
  _mm_prefetch(q + n - 1, _MM_HINT_T0);
  const char* q2 = q + 3 * ahead;
  for (int o = 0; o < n; o += 64) _mm_prefetch(q2 + o, _MM_HINT_T1);
  _mm_prefetch(q2 + n - 1, _MM_HINT_T1);
}

// How far ahead a tile of R rows (tile_bytes = R x row bytes) prefetches its weight streams: the same place in
// the next tile's rows (k tiles on, the least k with k tiles >= 2 KiB) while that is at most 16 KiB, else 4 KiB
// ahead within each row (rows that long are streams of their own). A flat 4 KiB cap used to land inside the
// tile's own rows once a tile passed 4 KiB (4 rows of DeepSeek's 7168 columns in IQ4_NL: 16 KiB).
inline int64_t tile_ahead(int64_t tile_bytes) {
  const int64_t t = tile_bytes * ((2048 + tile_bytes - 1) / tile_bytes);
  return t <= 16384 ? t : 4096;
}

}  // namespace hmoe::cpu::detail::lowbit_bytes
