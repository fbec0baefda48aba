// CPU matrix rows on ext views: the run-time dispatch to the SIMD kernels in
// quant_gguf_simd.cpp, and the scalar path over the block decoding of
// io/tensor/quant_blocks.cpp.
#include <vector>

#include "numa/quant_gguf.h"

namespace hmoe::cpu {

namespace {

void scalar_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    ext_row_to_f32(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * ldx;
      float s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += xt[k] * row[static_cast<size_t>(k)];
      y[t * ldy + r] = s;
    }
  }
}

}  // namespace

void ext_gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  switch (best_isa()) {
    case Isa::avx512: detail::ext_rows_avx512(x, ldx, n, w, r0, r1, y, ldy); break;
    case Isa::avx2: detail::ext_rows_avx2(x, ldx, n, w, r0, r1, y, ldy); break;
    default: scalar_rows(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

}  // namespace hmoe::cpu
