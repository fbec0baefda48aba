// CPU-only build: pinning and the streamed-expert kernels say "not built with CUDA".
#include <string>

#include "configs/error.h"
#include "gpu/moe_stream.h"

namespace hmoe::gpu {

HostRegistration::~HostRegistration() = default;
HostRegistration::HostRegistration(HostRegistration&& o) noexcept : base_(o.base_), bytes_(o.bytes_) {}
HostRegistration& HostRegistration::operator=(HostRegistration&&) noexcept { return *this; }
HostRegistration HostRegistration::try_pin(const void*, size_t, std::string* why, bool) {
  if (why) *why = "not built with CUDA";
  return {};
}
void copy_batch_to_device(void* const*, const void* const*, const size_t*, size_t, Stream&) {
  fail(ErrorKind::unsupported, "gpu::copy_batch_to_device: not built with CUDA");
}
void moe_gather_rows(const bf16_t*, int64_t, int64_t, const int32_t*, int64_t, bf16_t*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::moe_gather_rows: not built with CUDA");
}
void moe_combine_sorted(const float*, const int32_t*, const float*, int64_t, int64_t, int64_t, int32_t*, float*, Stream&) {
  fail(ErrorKind::unsupported, "gpu::moe_combine_sorted: not built with CUDA");
}

}  // namespace hmoe::gpu
