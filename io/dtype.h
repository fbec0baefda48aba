// Element types of tensors in checkpoints and in memory, and the scalar
// conversions between them. Conversions are exact where the target can hold
// the value; float -> bf16/f16 rounds to nearest even.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace hmoe {

enum class DType : uint8_t { f32, f16, bf16, f64, i64, i32, i16, i8, u8, boolean, f8_e4m3, f8_e5m2 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype string; returns false when unknown.
bool dtype_from_name(const std::string& s, DType& out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace hmoe
