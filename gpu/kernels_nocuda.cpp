// CPU-only build: every kernel launcher says "not built with CUDA".
#include <atomic>

#include "configs/error.h"
#include "gpu/kernels.h"

namespace hmoe::gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) { fail(ErrorKind::unsupported, std::string("gpu::") + what + ": not built with CUDA"); }
std::atomic<int> tiles_kernel{3};
}  // namespace

void embedding(const bf16_t*, const int32_t*, int64_t, int64_t, float*, Stream&) { no_cuda("embedding"); }
void add_rms_norm(float*, const float*, const int32_t*, int64_t, int64_t, const bf16_t*, float, bf16_t*, float*, Stream&) {
  no_cuda("add_rms_norm");
}
void add_rms_norm(float*, const float*, const int32_t*, int64_t, int64_t, const float*, float, bf16_t*, float*, Stream&) { no_cuda("add_rms_norm"); }
void qk_norm_rope(float*, int64_t, int64_t, int64_t, int64_t, const bf16_t*, float, const int32_t*, const float*, Stream&) {
  no_cuda("qk_norm_rope");
}
void kv_store(const float*, const float*, int64_t, int64_t, int64_t, const int32_t*, bf16_t*, bf16_t*, Stream&) { no_cuda("kv_store"); }
void qkv_norm_rope_store(float*, int64_t, int64_t, int64_t, int64_t, int64_t, const bf16_t*, const bf16_t*, float, const int32_t*, const float*,
                         const int32_t*, bf16_t*, bf16_t*, Stream&) {
  no_cuda("qkv_norm_rope_store");
}
void attention(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, const bf16_t*, const bf16_t*, const int32_t*, const int32_t*,
               const int32_t*, int64_t, float, float*, bf16_t*, Stream&) {
  no_cuda("attention");
}
int64_t attention_splits(int64_t, int64_t, int64_t) { no_cuda("attention_splits"); }
void attention_tiles(const float*, int64_t, int64_t, const int32_t*, int64_t, int64_t, int64_t, const bf16_t*, const bf16_t*, const int32_t*,
                     const int32_t*, const int32_t*, float, bf16_t*, Stream&) {
  no_cuda("attention_tiles");
}
int64_t attention_scratch_floats(int64_t, int64_t, int64_t, int64_t) { no_cuda("attention_scratch_floats"); }
// The choice is kept (it reads back as in a CUDA build) though no kernel runs.
void set_attention_tiles_kernel(int version) { tiles_kernel.store(version == 2 || version == 3 ? version : 1); }
int attention_tiles_kernel() { return tiles_kernel.load(); }
void silu_mul(const float*, int64_t, int64_t, bf16_t*, bf16_t*, Stream&) { no_cuda("silu_mul"); }
void split_bf16(const float*, int64_t, bf16_t*, bf16_t*, Stream&) { no_cuda("split_bf16"); }
void router_topk(const float*, int64_t, int64_t, int64_t, bool, int32_t*, float*, Stream&) { no_cuda("router_topk"); }
void router_gemv_topk(const bf16_t*, int64_t, const bf16_t*, int64_t, int64_t, int64_t, bool, float*, int32_t*, int32_t*, float*, Stream&) {
  no_cuda("router_gemv_topk");
}
int64_t router_gemv_max_tokens() { return 8; }
void moe_route(const int32_t*, int64_t, int64_t, int32_t*, int32_t*, Stream&) { no_cuda("moe_route"); }
void moe_experts(const bf16_t*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*, const float*, const int32_t*, const int32_t*,
                 const bf16_t*, const bf16_t*, bf16_t*, float*, float*, Stream&, bf16_t*) {
  no_cuda("moe_experts");
}
void add(const float*, const float*, int64_t, float*, Stream&) { no_cuda("add"); }
Blas::Blas(Stream&) { no_cuda("Blas"); }
Blas::~Blas() = default;
void Blas::gemm(const bf16_t*, int64_t, const bf16_t*, int64_t, int64_t, float*, int64_t) { no_cuda("Blas::gemm"); }
void Blas::gemm_add(const bf16_t*, int64_t, const bf16_t*, int64_t, int64_t, float*, int64_t) { no_cuda("Blas::gemm_add"); }
void Blas::gemm_f32(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t) { no_cuda("Blas::gemm_f32"); }

}  // namespace hmoe::gpu
