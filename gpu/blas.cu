// cuBLAS products: bf16 (or fp32) inputs, fp32 output and accumulation.
#include "gpu/common.cuh"
#include "gpu/kernels.h"
#include "gpu/memory_cap.h"

namespace hmoe::gpu {

Blas::Blas(Stream& s) {
  cublasHandle_t h = nullptr;
  HMOE_CUBLAS_CHECK(cublasCreate(&h));
  handle_ = h;
  HMOE_CUBLAS_CHECK(cublasSetStream(h, detail::cs(s)));
  constexpr size_t kWorkspace = 32u << 20;
  memory_ledger().acquire(kWorkspace, "the cuBLAS workspace");
  const cudaError_t e = cudaMalloc(&workspace_, kWorkspace);
  if (e != cudaSuccess) {
    memory_ledger().release(kWorkspace);
    workspace_ = nullptr;
    HMOE_CUDA_CHECK(e);
  }
  HMOE_CUBLAS_CHECK(cublasSetWorkspace(h, workspace_, kWorkspace));
}
Blas::~Blas() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_) {
    cudaFree(workspace_);
    memory_ledger().release(32u << 20);
  }
}

namespace {

// Column-major view: y^T [rows, n] = W [rows, cols] (stored as cols x rows, so op T) * x^T [cols, n].
void gemm_ex(void* handle, const void* x, const void* w, cudaDataType_t type, int64_t n, int64_t rows, int64_t cols, float* y, int64_t ldy,
             float beta = 0.0f) {
  if (n <= 0) return;
  const float alpha = 1.0f;
  HMOE_CUBLAS_CHECK(cublasGemmEx(static_cast<cublasHandle_t>(handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                                 static_cast<int>(cols), &alpha, w, type, static_cast<int>(cols), x, type, static_cast<int>(cols), &beta, y,
                                 CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void Blas::gemm(const bf16_t* x, int64_t n, const bf16_t* w, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  gemm_ex(handle_, x, w, CUDA_R_16BF, n, rows, cols, y, ldy);
}

void Blas::gemm_add(const bf16_t* x, int64_t n, const bf16_t* w, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  gemm_ex(handle_, x, w, CUDA_R_16BF, n, rows, cols, y, ldy, 1.0f);
}

void Blas::gemm_f32(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  gemm_ex(handle_, x, w, CUDA_R_32F, n, rows, cols, y, ldy);
}

}  // namespace hmoe::gpu
