// CPU-only build: the zero-copy hand-off kernels say "not built with CUDA".
#include "configs/error.h"
#include "gpu/handoff.h"

namespace hmoe::gpu {

void handoff_down(const float*, const int32_t*, const float*, int64_t, int64_t, float*, int32_t*, float*, uint32_t*, uint64_t*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::handoff_down: not built with CUDA");
}
void handoff_wait_add(uint32_t*, const float*, int64_t, float*, uint64_t*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::handoff_wait_add: not built with CUDA");
}
void handoff_signal(uint32_t*, uint64_t*, Stream&) { fail(ErrorKind::unsupported, "gpu::handoff_signal: not built with CUDA"); }

}  // namespace hmoe::gpu
