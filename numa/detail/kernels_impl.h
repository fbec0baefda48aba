// Private to numa/: the per-ISA row kernels behind cpu::gemm_rows.
#pragma once
#include <cstdint>

#include "numa/kernels.h"

namespace hmoe::cpu::detail {

// Weight formats the micro-kernels are specialised on.
enum class Fmt { f32, bf16, f16, q8, q4 };
Fmt fmt_of(const Mat& w);

void rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void rows_bf16dot_avx512(const uint16_t* xb, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);

// The scalar reference path over any view (rows dequantized by row_to_f32).
void rows_scalar(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);

// Element k of row r, dequantized (scalar paths and tails).
float weight_at(const Mat& w, int64_t r, int64_t k);

}  // namespace hmoe::cpu::detail
