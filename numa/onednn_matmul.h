// oneDNN bf16 matmul on bf16 weights used in place (no reordered copy):
// y[m, N] = xb[m, K] W^T for a row-major bf16 W [N, K] (a cpu::Mat, or a row
// slice of one), handed to oneDNN as its K x N "ba" layout. Runs on oneDNN's
// own (OpenMP) threads from the calling thread. The expert engine uses it for
// prefill (experts with many tokens per step, numa/expert_engine.h).
//
// Why in place: a reordered (blocked) copy is what oneDNN is fastest on, but
// keeping it beside the plain weights doubles expert memory, and replacing
// the plain weights with it would leave decode (our kernels) without its
// layout. oneDNN's brgemm matmul packs plain weights on the fly; bench_gemm
// part 2 measures the difference (columns "W in place" and "W pre-reordered").
//
// Primitives are built once per (shape, strides, epilogue) and kept in this
// object (a cache hit in oneDNN's own primitive cache still costs ~10 us,
// too much for hundreds of expert matmuls per step). One caller at a time.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "numa/kernels.h"

namespace hmoe::numa {

class OnednnBf16 {
 public:
  OnednnBf16();
  ~OnednnBf16();
  // What the epilogue does with the product p = xb W^T (fp32):
  //  plain: y (fp32) = p
  //  swiglu: yb (bf16) = silu(p) * u, u fp32 [m, N] with row stride ldu
  // xb row stride ldx (elements), y/yb row stride ldy.
  void matmul(const uint16_t* xb, int64_t m, int64_t ldx, const cpu::Mat& w, float* y, int64_t ldy);
  void matmul_swiglu(const uint16_t* xb, int64_t m, int64_t ldx, const cpu::Mat& w, const float* u, int64_t ldu, uint16_t* yb, int64_t ldy);
  size_t primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether this CPU runs oneDNN's bf16 matmul (with the SwiGLU epilogue):
// probed once per process by building one small primitive of each kind.
// Debian's oneDNN has no bf16 matmul for CPUs without AVX-512 (an AVX2-only
// EPYC answers "could not create a primitive descriptor"): the expert engine
// then keeps its own kernels for prefill.
bool onednn_bf16_available();

// GFLOP/s of oneDNN's bf16 matmul on an m x n x k problem (weights reordered
// once, its OpenMP threads), best of reps: the peak the bf16 prefill rows are
// compared against; 0 where onednn_bf16_available() is false.
double onednn_bf16_gflops(int64_t m, int64_t n, int64_t k, int reps = 3);

}  // namespace hmoe::numa
