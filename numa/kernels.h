// CPU matrix kernels: activations in fp32, weights in bf16/f16/f32, fp32
// accumulation. Each has a scalar reference (for tests) and AVX-512 / AVX2
// paths chosen at run time by cpuid.
//
// Layout: a weight matrix W is row-major [rows, cols] (the Hugging Face
// nn.Linear layout [out_features, in_features]); y = x W^T.
#pragma once
#include <cstdint>

#include "io/dtype.h"
#include "numa/thread_pool.h"

namespace hmoe::cpu {

struct Mat {
  DType dtype = DType::f32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes() const { return static_cast<size_t>(cols) * dtype_size(dtype); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes(); }
};

enum class Isa { scalar, avx2, avx512 };
Isa best_isa();
const char* isa_name(Isa isa);
// Forces an ISA (tests compare paths); returns the previous one. Not thread-safe.
Isa set_isa_for_testing(Isa isa);

// y[t, r] (row stride ldy) = sum_k x[t, k] (row stride ldx) * W[r, k], for
// t < n and r0 <= r < r1. Single-threaded; the building block of the others.
void gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Same over all rows, split across the pool's threads by row blocks.
void gemm(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool);
// Plain scalar reference (double accumulation) for tests.
void gemm_reference(const float* x, int64_t n, const Mat& w, float* y);

// Converts one weight row (or any run of elements) to fp32.
void to_f32(DType t, const void* src, float* dst, int64_t n);

}  // namespace hmoe::cpu
