// Writes a safetensors file (header + data, 8-byte aligned header). Used by
// the built-in demo model and by tests that need checkpoints of their own.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace hmoe::io {

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, dtype_size * numel
};

// Throws Error(io) naming the path on failure; writes to path.tmp then renames.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace hmoe::io
