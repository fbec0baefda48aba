// CPU matrix kernels on the block-quantized formats of
// io/tensor/quant_blocks.h (GGUF/ggml blocks, FP8, int8 groups), reached
// from numa/kernels.* through one hook (cpu::Quant::ext): fp32 activations,
// fp32 accumulation, dequantizing one block at a time in registers: the
// exact path. By default the ggml types with integer kernels (Q4_K, Q5_K,
// Q6_K, Q8_0, Q4_0, Q5_0) instead quantize the activations to 8 bits as
// llama.cpp does and multiply in integers (numa/quant_gguf_q8.h, setting
// cpu_gguf_int8); gemm_rows here stays exact.
//
// Kernels: scalar (reference), AVX2+FMA+F16C and AVX-512 (F+BW), chosen by
// cpu::best_isa() at run time (numa/quant_gguf_rows.cpp,
// numa/quant_gguf_simd.cpp). Thread safety: pure functions.
#pragma once
#include <cstdint>

#include "io/tensor/quant_blocks.h"
#include "numa/kernels.h"

namespace hmoe::cpu {

// The hook used by numa/kernels.cpp for Quant::ext.
void ext_gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);

namespace detail {  // quant_gguf_simd.cpp
void ext_rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void ext_rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
}  // namespace detail

}  // namespace hmoe::cpu
