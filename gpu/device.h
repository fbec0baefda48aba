// GPU probe. In a build without CUDA (gpu/*_nocuda.cpp) every function says
// so instead of failing to link; callers fall back to the CPU and print why.
#pragma once
#include <string>

namespace hmoe::gpu {

struct DeviceInfo {
  int index = -1;
  std::string name;
  size_t total_bytes = 0, free_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};

// True when hmoe was built with CUDA.
bool built_with_cuda();
// Number of usable CUDA devices (0 without CUDA, driver or GPU).
int device_count();
// One line saying what the GPU situation is ("not built with CUDA",
// "no CUDA device found: <driver message>", "1 x NVIDIA H200 ...").
std::string describe();
DeviceInfo device_info(int index);

}  // namespace hmoe::gpu
