// CPU-only build: the fused decode kernels say "not built with CUDA".
#include "configs/error.h"
#include "gpu/decode_fused.h"

namespace hmoe::gpu {

bool norm_router_fits(int64_t, int64_t, int64_t) { return false; }
void add_rms_norm_router_topk(float*, const float*, int64_t, int64_t, const bf16_t*, float, bf16_t*, float*, const bf16_t*, int64_t, int64_t, bool,
                              float*, int32_t*, int32_t*, float*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::add_rms_norm_router_topk: not built with CUDA");
}

void norm_rope_store_attention(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const bf16_t*, const bf16_t*, float, const int32_t*, const float*,
                               const int32_t*, bf16_t*, bf16_t*, const int32_t*, const int32_t*, const int32_t*, int64_t, float, float*, bf16_t*,
                               Stream&) {
  fail(ErrorKind::unsupported, "gpu::norm_rope_store_attention: not built with CUDA");
}

bool norm_gemv_fits(const GgufWeight&, int64_t) { return false; }
void add_rms_norm_gguf_gemv(float*, const float*, int64_t, const bf16_t*, float, bf16_t*, float*, const GgufWeight&, float*, int64_t, int32_t*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::add_rms_norm_gguf_gemv: not built with CUDA");
}

}  // namespace hmoe::gpu
