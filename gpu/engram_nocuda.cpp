// CPU-only build: the Engram kernel launchers say "not built with CUDA".
#include "configs/error.h"
#include "gpu/engram.h"

namespace hmoe::gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) { fail(ErrorKind::unsupported, std::string("gpu::") + what + ": not built with CUDA"); }
}  // namespace

void engram_gate(float*, const float*, const float*, int64_t, int64_t, const float*, const float*, const float*, const float*, const float*,
                 float, float, float*, float*, Stream&) {
  no_cuda("engram_gate");
}
void engram_conv(const float*, const float*, const float*, int64_t, const int32_t*, const float*, int64_t, int64_t, int64_t, float*,
                 Stream&) {
  no_cuda("engram_conv");
}
void engram_store(const float*, int64_t, int64_t, int64_t, const int32_t*, float*, int64_t, Stream&) { no_cuda("engram_store"); }

}  // namespace hmoe::gpu
