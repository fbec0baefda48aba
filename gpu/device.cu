#include <cuda_runtime.h>

#include "configs/error.h"
#include "gpu/device.h"

namespace hmoe::gpu {
bool built_with_cuda() { return true; }
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
std::string describe() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device found (") + cudaGetErrorString(e) + "): everything runs on the CPU";
  }
  if (n == 0) return "no CUDA device found: everything runs on the CPU";
  DeviceInfo d = device_info(0);
  return std::to_string(n) + " CUDA device(s); 0: " + d.name + " sm_" + std::to_string(d.sm_major) + std::to_string(d.sm_minor) +
         ", " + std::to_string(d.total_bytes >> 20) + " MiB";
}
DeviceInfo device_info(int index) {
  cudaDeviceProp p{};
  cudaError_t e = cudaGetDeviceProperties(&p, index);
  if (e != cudaSuccess) fail(ErrorKind::device, std::string("cudaGetDeviceProperties(") + std::to_string(index) + "): " + cudaGetErrorString(e));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.total_bytes = p.totalGlobalMem;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  return d;
}
}  // namespace hmoe::gpu
