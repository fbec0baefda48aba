// Block-quantized weight formats: the GGUF/ggml block types and the formats
// of quantized Hugging Face checkpoints that do not fit the int8 per-channel
// / int4 group-wise views (FP8 e4m3 with block scales, int8 with group
// scales and zero points; numa/quant_hf.h fills them). A cpu::Mat with
// quant == Quant::ext (io/tensor/mat.h) names one by its ExtType. This file
// knows the formats' bytes (sizes, checks, scalar decoding); the CPU matrix
// kernels on them are numa/quant_gguf.h, the GPU's gpu/quant.h.
//
// Why a separate family: ggml blocks carry their scales inline (a Q4_K row
// is a run of 144-byte super-blocks), so they cannot be repacked into the
// int4 view without losing the file's bytes-per-weight; they are computed on
// as stored, dequantizing one block at a time.
//
// Layout of a Mat with quant == Quant::ext (cpu::Mat::ext holds the ExtType):
//  - ggml types: data is [rows][cols / block_elems] blocks of block_bytes,
//    exactly as in the GGUF file; scales/zeros null, group 0.
//  - fp8_e4m3: data fp8 e4m3 [rows, cols]; scales [rows, ceil(cols/group)]
//    f32 multipliers (DeepSeek-V3 `weight_scale_inv` expanded per row);
//    w = fp8(q) * scale. NaN encodings (0x7f/0xff) read as +-480.
//  - int8_group: data u8 [rows, cols]; scales and zeros [rows, ceil(cols/group)]
//    f32; w = (q - zero) * scale; zeros null means zero point 128.
//
// Thread safety: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/tensor/mat.h"

namespace hmoe::cpu {

enum class ExtType : uint32_t {
  // ggml block types (ids as in ggml.h enum ggml_type)
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  // hmoe formats for HF checkpoints (ids past ggml's)
  fp8_e4m3 = 1000,
  int8_group = 1001,
};

struct ExtTypeInfo {
  const char* name;
  int32_t block_elems;  // elements per block (1 for the element formats)
  int32_t block_bytes;  // bytes per block
};
// nullptr when `type` is not an ExtType.
const ExtTypeInfo* ext_type_info(uint32_t type);
// True when a ggml type id is one the GGUF loader maps onto these kernels.
bool ggml_type_supported(uint32_t ggml_type);

// A Mat view of ggml blocks [rows, cols] at data (no copy). Throws
// Error(bad_model) naming `what` when cols is not a multiple of the block.
Mat ext_view(ExtType type, const void* data, int64_t rows, int64_t cols, const std::string& what);

// Sizes, checks and scalar decoding of ext views (the cpu::Mat hooks).
size_t ext_row_bytes(uint32_t type, int64_t cols);
void ext_check(const Mat& w, const std::string& what);
std::string ext_type_name(const Mat& w);
void ext_row_to_f32(const Mat& w, int64_t r, float* dst);
float ext_weight_at(const Mat& w, int64_t r, int64_t k);

// Dequantizes one ggml block (block_elems values) to fp32 (scalar reference).
void dequant_block(ExtType type, const uint8_t* block, float* out);
// Integer codes of one block of the types with per-run affine scales (Q4_0,
// Q4_1, Q5_0, Q5_1: runs of 32; Q5_K: 8 runs of 32; Q6_K: 16 runs of 16):
// value k = scale[k / run] * (code[k] - zero[k / run]), code < 64. Equal to
// dequant_block exactly for Q4_0, Q5_0, Q6_K (integer zero points) and up to
// fp32 rounding of zero = -min / scale for the others. What the GPU repacks
// these types from (gpu/quant.h). ggml_code_run: the run (0: other types).
int ggml_code_run(ExtType type);
void ggml_block_codes(ExtType type, const uint8_t* block, uint8_t* code, float* scale, float* zero);
// fp8 e4m3 byte to fp32 (exact; NaN encodings give +-480, see above).
float fp8_e4m3_to_f32(uint8_t b);

}  // namespace hmoe::cpu
