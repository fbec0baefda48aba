// Repacking of quantized Hugging Face weights into the views the CPU kernels
// compute on. Each function takes one layer's tensors exactly as the format
// stores them and returns an owned cpu::QuantMat (numa/kernels.h):
//
//  format                        stored as                                   repacked to
//  GPTQ 4-bit, g in {32,64,128}  qweight i32 [in/8, out] (k-packed nibbles),   int4_group (zero = qzeros+1 for
//  (trivial g_idx)               qzeros i32 [G, out/8], scales [G, out]        the v1 "gptq" format; sym -> null)
//  GPTQ 4-bit, g = -1            same, G = 1                                 int4_group, the row scale repeated
//  GPTQ 8-bit, any g             qweight [in/4, out], qzeros [G, out/4]      ext int8_group
//  GPTQ desc_act (g_idx not      as above plus g_idx i32 [in]                f32 rows (dequantized: the groups
//  k / g)                                                                    are not contiguous; exact, 8x bytes)
//  AWQ GEMM 4-bit                qweight i32 [in, out/8] (n-packed, order    int4_group (asymmetric)
//                                0,2,4,6,1,3,5,7), qzeros [G, out/8]
//  compressed-tensors            weight_packed i32 [out, in*b/32] (values    int4_group sym (b=4, zero 8) or
//  pack-quantized, symmetric     + 2^(b-1), k-packed), weight_scale [out, G] ext int8_group (b=8, zero 128)
//  FP8 e4m3 block                weight f8 [out, in], weight_scale_inv       ext fp8_e4m3 (data stays a view;
//                                [ceil(out/bo), ceil(in/bi)]                 scales expanded per row)
//
// Scales may be F16, BF16 or F32; they are widened to f32 exactly. Every
// problem (shapes that disagree, a group that does not divide, zero points
// out of range) throws Error(bad_model) naming `what` (the tensor).
#pragma once
#include <cstdint>
#include <string>

#include "io/dtype.h"
#include "numa/kernels.h"

namespace hmoe::cpu {

// A 2-D tensor as stored (row-major), for the repack functions.
struct RawTensor {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;
  const char* name = "";  // for messages
  float at_f32(int64_t r, int64_t c) const;  // float dtypes
  int32_t at_i32(int64_t r, int64_t c) const;
};

struct GptqParams {
  int bits = 4;             // 4 or 8
  int group = 128;          // -1: one group per row
  bool zero_plus_one = true;  // v1 "gptq" checkpoints store zero - 1
};
// qzeros may have data == nullptr (symmetric checkpoints without zeros: 2^(bits-1)); g_idx may too.
QuantMat repack_gptq(const RawTensor& qweight, const RawTensor& qzeros, const RawTensor& scales, const int32_t* g_idx,
                     int64_t in, int64_t out, const GptqParams& p, const std::string& what);
QuantMat repack_awq(const RawTensor& qweight, const RawTensor& qzeros, const RawTensor& scales, int64_t in, int64_t out, int group,
                    const std::string& what);
QuantMat repack_ct_packed(const RawTensor& packed, const RawTensor& scale, int64_t in, int64_t out, int bits, int group,
                          const std::string& what);
QuantMat fp8_block_view(const void* weight, const RawTensor& scale_inv, int64_t in, int64_t out, int block_out, int block_in,
                        const std::string& what);

// The effective int4/int8 group for a row of `in` columns stored with group
// `group` (-1: whole row): the smallest kernel group the scales repeat over.
int effective_group(int64_t in, int group, int bits);

}  // namespace hmoe::cpu
