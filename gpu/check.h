// CUDA status codes become hmoe::Error(device) with the call and file:line.
// Private to gpu/*.cu.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "configs/error.h"

namespace hmoe::gpu::detail {

[[noreturn]] inline void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  fail(ErrorKind::device, std::string(file) + ":" + std::to_string(line) + ": " + call + ": " + cudaGetErrorName(e) + " (" +
                              cudaGetErrorString(e) + ")");
}
[[noreturn]] inline void cublas_fail(cublasStatus_t e, const char* call, const char* file, int line) {
  fail(ErrorKind::device, std::string(file) + ":" + std::to_string(line) + ": " + call + ": cuBLAS status " + std::to_string(static_cast<int>(e)));
}

}  // namespace hmoe::gpu::detail

#define HMOE_CUDA_CHECK(call)                                                                   \
  do {                                                                                          \
    cudaError_t hmoe_e_ = (call);                                                               \
    if (hmoe_e_ != cudaSuccess) ::hmoe::gpu::detail::cuda_fail(hmoe_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define HMOE_CUBLAS_CHECK(call)                                                                        \
  do {                                                                                                 \
    cublasStatus_t hmoe_s_ = (call);                                                                   \
    if (hmoe_s_ != CUBLAS_STATUS_SUCCESS) ::hmoe::gpu::detail::cublas_fail(hmoe_s_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: reports bad launch configurations at the launch site.
#define HMOE_CUDA_LAUNCHED() HMOE_CUDA_CHECK(cudaGetLastError())
