// CPU matrix rows on ext views: the run-time dispatch to the SIMD kernels in
// quant_gguf_simd.cpp; the scalar path is the one of every view
// (detail::rows_scalar over the block decoding of io/tensor/quant_blocks.cpp).
#include "numa/detail/kernels_impl.h"
#include "numa/quant_gguf.h"
#include "numa/quant_gguf_lowbit.h"

namespace hmoe::cpu {

void ext_gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  if (lowbit_type(w.ext)) return lowbit_gemm_rows(x, ldx, n, w, r0, r1, y, ldy);
  switch (best_isa()) {
    case Isa::avx512: detail::ext_rows_avx512(x, ldx, n, w, r0, r1, y, ldy); break;
    case Isa::avx2: detail::ext_rows_avx2(x, ldx, n, w, r0, r1, y, ldy); break;
    default: detail::rows_scalar(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

}  // namespace hmoe::cpu
