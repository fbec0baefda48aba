// CPU-only build: every MLA / DeepSeek routing launcher says "not built with CUDA".
#include "configs/error.h"
#include "gpu/mla.h"

namespace hmoe::gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) { fail(ErrorKind::unsupported, std::string("gpu::") + what + ": not built with CUDA"); }
}  // namespace

void rms_norm_rows(const float*, int64_t, int64_t, int64_t, const bf16_t*, float, bf16_t*, bf16_t*, Stream&) { no_cuda("rms_norm_rows"); }
void mla_rope(float*, int64_t, int64_t, int64_t, int64_t, const MlaRopeArgs&, const int32_t*, Stream&) { no_cuda("mla_rope"); }
void mla_kv_store(const float*, int64_t, int64_t, int64_t, const bf16_t*, float, const MlaRopeArgs&, const int32_t*, const int32_t*, bf16_t*,
                  Stream&) {
  no_cuda("mla_kv_store");
}
void head_matmul(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const bf16_t*, int64_t, float*, bf16_t*, int64_t, int64_t,
                 Stream&) {
  no_cuda("head_matmul");
}
void mla_attention_latent(const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const bf16_t*, const int32_t*,
                          const int32_t*, const int32_t*, const int32_t*, float, float*, float*, Stream&) {
  no_cuda("mla_attention_latent");
}
int64_t mla_attention_latent_workspace(int64_t, int64_t, int64_t, int64_t) { return 0; }
void gather_rows(const bf16_t*, int64_t, const int32_t*, int64_t, int64_t, bf16_t*, Stream&) { no_cuda("gather_rows"); }
void mla_attention_expanded(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, const bf16_t*, int64_t, int64_t,
                            const int32_t*, const int32_t*, const int32_t*, const int32_t*, float, bf16_t*, bf16_t*, Stream&) {
  no_cuda("mla_attention_expanded");
}
void deepseek_topk(const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, float, int32_t*, float*, Stream&) {
  no_cuda("deepseek_topk");
}

}  // namespace hmoe::gpu
