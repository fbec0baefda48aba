// The low-bit ggml block types of the "dynamic" GGUF quants (DeepSeek-V3,
// Kimi-K2, gpt-oss files): Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS and MXFP4. They join the Quant::ext family
// of numa/quant_gguf.h (a Mat of ggml blocks as stored in the file; the ids
// are ggml.h's), which dispatches to this file for their bytes (sizes,
// scalar decoding); the CPU kernels are numa/quant_gguf_lowbit.h.
//
// One decomposition serves every type: a block of N weights (256, or 32 for
// IQ4_NL / MXFP4) is N signed integer codes and, per run of 16 weights, a
// scale and an offset:
//     w[k] = scale[k / 16] * code[k] + offset[k / 16]     (fp32 mul, then add)
// which reproduces gguf-py's reference dequantizer bit for bit (its order of
// fp32 operations: the IQ1 deltas of +-1/8 are folded into the codes as
// 8 * grid +- 1 with scale / 8, exact; offset is 0 except for Q2_K's mins).
// Codes: Q2_K 0..3, Q3_K -4..3, IQ1 -9..9, IQ2 -43..43, IQ3_XXS -62..62,
// IQ3_S -15..15, IQ4 -127..113, MXFP4 -12..12 (e2m1 doubled).
//
#pragma once
#include <cstdint>

#include "io/tensor/quant_blocks.h"

namespace hmoe::cpu {

// The types (ggml ids); not ExtType enumerators so that the switches over
// the older types stay as they are.
namespace lowbit {
constexpr ExtType q2_k = static_cast<ExtType>(10);
constexpr ExtType q3_k = static_cast<ExtType>(11);
constexpr ExtType iq2_xxs = static_cast<ExtType>(16);
constexpr ExtType iq2_xs = static_cast<ExtType>(17);
constexpr ExtType iq3_xxs = static_cast<ExtType>(18);
constexpr ExtType iq1_s = static_cast<ExtType>(19);
constexpr ExtType iq4_nl = static_cast<ExtType>(20);
constexpr ExtType iq3_s = static_cast<ExtType>(21);
constexpr ExtType iq2_s = static_cast<ExtType>(22);
constexpr ExtType iq4_xs = static_cast<ExtType>(23);
constexpr ExtType iq1_m = static_cast<ExtType>(29);
constexpr ExtType mxfp4 = static_cast<ExtType>(39);
inline constexpr ExtType kAll[] = {q2_k, q3_k, iq2_xxs, iq2_xs, iq3_xxs, iq1_s, iq4_nl, iq3_s, iq2_s, iq4_xs, iq1_m, mxfp4};
}  // namespace lowbit

// True for the ids above.
bool lowbit_type(uint32_t type);
// Name and block geometry; nullptr when not a low-bit type.
const ExtTypeInfo* lowbit_type_info(uint32_t type);

// Codes, per-16 scales and offsets of one block (block_elems codes,
// block_elems / 16 scales and offsets). Scalar; the reference.
void lowbit_block_codes(ExtType type, const uint8_t* block, int8_t* code, float* scale, float* offset);
// One block to fp32 (block_elems values), from the codes as stated above.
void lowbit_dequant_block(ExtType type, const uint8_t* block, float* out);

}  // namespace hmoe::cpu
