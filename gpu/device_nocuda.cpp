#include "configs/error.h"
#include "gpu/device.h"

namespace hmoe::gpu {
bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string describe() { return "not built with CUDA: everything runs on the CPU"; }
DeviceInfo device_info(int index) {
  fail(ErrorKind::unsupported, "GPU " + std::to_string(index) + " requested, but hmoe was not built with CUDA");
}
}  // namespace hmoe::gpu
