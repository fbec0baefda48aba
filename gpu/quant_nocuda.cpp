// CPU-only build: the quantized GPU launchers say "not built with CUDA". The
// host side (formats, checks, QDeviceMat, whose allocation throws the same
// way) is shared with the CUDA build.
#include "configs/error.h"
#include "gpu/quant.h"
#include "gpu/quant_weights.cpp"  // NOLINT(bugprone-suspicious-include): the one host implementation

namespace hmoe::gpu {

void quant_gemv(const QWeight&, const bf16_t*, int64_t, float*, int64_t, Stream&) {
  fail(ErrorKind::unsupported, "gpu::quant_gemv: not built with CUDA");
}

void quant_moe_experts(const bf16_t*, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, const int32_t*, const int32_t*,
                       const QWeight&, const QWeight&, bf16_t*, float*, float*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::quant_moe_experts: not built with CUDA");
}

void quant_dequant(const QWeight&, int64_t, int64_t, bf16_t*, Stream&) { fail(ErrorKind::unsupported, "gpu::quant_dequant: not built with CUDA"); }

void gguf_gemv(const GgufWeight&, const bf16_t*, int64_t, float*, int64_t, Stream&) { fail(ErrorKind::unsupported, "gpu::gguf_gemv: not built with CUDA"); }

void gguf_dequant(const GgufWeight&, int64_t, int64_t, bf16_t*, Stream&) { fail(ErrorKind::unsupported, "gpu::gguf_dequant: not built with CUDA"); }

void gguf_moe_experts(const bf16_t*, int64_t, int64_t, const int32_t*, const float*, const GgufWeight&, const GgufWeight&, int64_t, float*, float*,
                      Stream&) {
  fail(ErrorKind::unsupported, "gpu::gguf_moe_experts: not built with CUDA");
}

bool gguf_moe_gemm_supported(const GgufWeight& w, int64_t rows_per_expert) { return w.cols % 256 == 0 && rows_per_expert % 128 == 0 && rows_per_expert > 0; }

void gguf_moe_gemm(const bf16_t*, const int32_t*, int64_t, int64_t, const int32_t*, int64_t, const GgufWeight&, int64_t, float*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::gguf_moe_gemm: not built with CUDA");
}

void read_probe(const void*, size_t, uint32_t*, Stream&) { fail(ErrorKind::unsupported, "gpu::read_probe: not built with CUDA"); }

namespace detail::gguf {
LowbitTables device_lowbit_tables() { fail(ErrorKind::unsupported, "gpu::device_lowbit_tables: not built with CUDA"); }
}  // namespace detail::gguf

}  // namespace hmoe::gpu
