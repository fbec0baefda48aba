// Weight matrix views shared by the CPU kernels (numa/) and the CUDA
// backend (gpu/): a Mat names the bytes of a [rows, cols] matrix where they
// already are (a file map, a repacked buffer) with its element type or
// quantized layout; it owns nothing.
//
// Layout: a weight matrix W is row-major [rows, cols] (the Hugging Face
// nn.Linear layout [out_features, in_features]); y = x W^T.
//
// Quantized weight view (filled by the quantized-format loaders from
// GPTQ / AWQ / compressed-tensors / GGUF; they repack into this layout):
//  - int8_channel: dtype i8, data [rows, cols] int8, scales [rows] f32;
//    w[r,k] = q[r,k] * scales[r] (symmetric).
//  - int4_group: dtype u8, group g in {32, 64, 128}, cols % g == 0.
//    data [rows, cols/2] bytes; each run of 32 elements is 16 bytes where
//    byte i holds element i in its low nibble and element i+16 in its high
//    nibble (the ggml Q4 block order: unpacks with one shift and mask).
//    scales [rows, cols/g] f32; zeros [rows, cols/g] f32 zero points in
//    nibble units (asymmetric), or null for symmetric (zero point 8):
//    w[r,k] = (q[r,k] - zero[r,k/g]) * scale[r,k/g].
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/dtype.h"

namespace hmoe::cpu {

// Bytes of one row of an ext format (io/tensor/quant_blocks.cpp).
size_t ext_row_bytes(uint32_t type, int64_t cols);

// ext: a block format of io/tensor/quant_blocks.h (GGUF blocks, FP8, int8 groups);
// Mat::ext names it and the kernels there compute on it.
enum class Quant : uint8_t { none, int8_channel, int4_group, ext };
const char* quant_name(Quant q);

struct Mat {
  DType dtype = DType::f32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  Quant quant = Quant::none;
  const float* scales = nullptr;  // see the file comment
  const float* zeros = nullptr;   // int4 asymmetric only
  int32_t group = 0;              // int4 only (and ext formats with group scales)
  uint32_t ext = 0;               // Quant::ext only: cpu::ExtType

  int64_t groups() const {
    if (quant == Quant::ext) return group > 0 ? (cols + group - 1) / group : 0;
    return quant == Quant::int4_group ? cols / group : quant == Quant::int8_channel ? 1 : 0;
  }
  size_t row_bytes() const {
    if (quant == Quant::ext) return ext_row_bytes(ext, cols);
    return quant == Quant::int4_group ? static_cast<size_t>(cols / 2) : static_cast<size_t>(cols) * dtype_size(dtype);
  }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes(); }
  // Bytes a pass over the matrix streams: data, scales and zeros.
  size_t bytes() const {
    size_t b = static_cast<size_t>(rows) * row_bytes();
    if (scales) b += static_cast<size_t>(rows * groups()) * sizeof(float);
    if (zeros) b += static_cast<size_t>(rows * groups()) * sizeof(float);
    return b;
  }
  // Rows [r0, r1) as a view (scales and zeros follow).
  Mat slice_rows(int64_t r0, int64_t r1) const;
};

// Throws Error(unsupported / invalid_argument) naming `what` when the view is
// not one the kernels accept (dtype, group, shape, missing scales).
void check_mat(const Mat& w, const std::string& what);
std::string mat_type_name(const Mat& w);  // "bf16", "int8", "int4-g128-asym", ...

}  // namespace hmoe::cpu
