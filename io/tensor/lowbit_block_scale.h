// Writing blocks of the low-bit ggml types (io/tensor/quant_blocks_lowbit.h)
// rather than reading them: for the writers of random test and benchmark
// data (tests/quant_tools/lowbit_blocks.h, tools/slice_gguf), where random
// bytes with a chosen overall scale are valid blocks of every one of these
// formats. Kept apart from quant_blocks_lowbit.h, which the GPU kernels include.
#pragma once
#include <cstdint>

#include "io/tensor/quant_blocks.h"

namespace hmoe::cpu {

// Sets block's overall scale to d, leaving its codes and sub-scales: the f16
// d of most types (Q2_K: d and dmin = 1.5 d, so that the mins cancel the
// codes' mean as in real files; Q3_K: its d at byte 108; IQ1_M: d spread over
// the top nibbles of its four scale words; MXFP4: the e8m0 exponent of the
// power of two nearest |d|, scale 1 at 128). Defined in quant_blocks_lowbit.cpp.
void lowbit_set_block_scale(ExtType type, uint8_t* block, float d);

}  // namespace hmoe::cpu
