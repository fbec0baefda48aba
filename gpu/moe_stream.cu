// Pinning in place and the gather/combine kernels of streamed MoE layers (see moe_stream.h).
#include <string>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/moe_stream.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

__global__ void gather_rows_kernel(const uint4* x, int h8, int k, const int32_t* pair_list, int64_t pairs, uint4* xs) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= pairs * h8) return;
  const int64_t i = idx / h8, c = idx % h8;
  xs[idx] = x[static_cast<int64_t>(pair_list[i] / k) * h8 + c];
}

__global__ void invert_kernel(const int32_t* pair_list, int64_t pairs, int32_t* inv) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < pairs) inv[pair_list[i]] = static_cast<int32_t>(i);
}

__global__ void combine_sorted_kernel(const float* ys, const int32_t* inv, const float* weights, int64_t n, int k, int64_t hidden, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hidden) return;
  const int64_t t = idx / hidden, h = idx % hidden;
  float s = 0;
  for (int j = 0; j < k; ++j) {
    const int64_t p = t * k + j;
    s += weights[p] * ys[static_cast<int64_t>(inv[p]) * hidden + h];
  }
  out[idx] = s;
}

unsigned blocks_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

HostRegistration::~HostRegistration() {
  if (base_ && owned_) cudaHostUnregister(base_);
}
HostRegistration::HostRegistration(HostRegistration&& o) noexcept : base_(o.base_), bytes_(o.bytes_), owned_(o.owned_) {
  o.base_ = nullptr;
  o.bytes_ = 0;
}
HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  std::swap(base_, o.base_);
  std::swap(bytes_, o.bytes_);
  std::swap(owned_, o.owned_);
  return *this;
}

HostRegistration HostRegistration::try_pin(const void* p, size_t bytes, std::string* why, bool read_only_first) {
  HostRegistration r;
  if (!p || !bytes) return r;
  const uintptr_t page = 4096, a = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  void* base = reinterpret_cast<void*>(a);
  int ro = 0, dev = 0;
  const bool ro_ok = cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev) == cudaSuccess && ro;
  cudaGetLastError();
  const unsigned plain = cudaHostRegisterPortable, read_only = cudaHostRegisterPortable | cudaHostRegisterReadOnly;
  // Read-only mappings (a checkpoint file) ask for the read-only flag first: the driver then never asks the kernel for writable pages.
  cudaError_t e = cudaHostRegister(base, b - a, read_only_first && ro_ok ? read_only : plain);
  if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();  // not sticky; clear it
    if (ro_ok) {  // the other flag set (without read-only support both attempts would be the plain one)
      const cudaError_t e2 = cudaHostRegister(base, b - a, read_only_first ? plain : read_only);
      if (e2 == cudaSuccess || e2 == cudaErrorHostMemoryAlreadyRegistered) e = e2;
      else cudaGetLastError();
    }
  }
  if (e == cudaErrorHostMemoryAlreadyRegistered) {  // pinned by the caller already: usable, not ours to unregister
    cudaGetLastError();
    r.base_ = base;
    r.bytes_ = b - a;
    r.owned_ = false;
    return r;
  }
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
    return r;
  }
  r.base_ = base;
  r.bytes_ = b - a;
  return r;
}

void copy_batch_to_device(void* const* dsts, const void* const* srcs, const size_t* bytes, size_t count, Stream& s) {
  if (count == 0) return;
#if CUDART_VERSION >= 12080
  static bool batch_ok = true;  // cleared once when the driver refuses the batch call
  if (batch_ok && count > 1) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t e = cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<const void**>(srcs), const_cast<size_t*>(bytes), count, &attr, &idx, 1, cs(s));
#else
    size_t fail_idx = 0;
    const cudaError_t e =
        cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs), const_cast<size_t*>(bytes), count, &attr, &idx, 1, &fail_idx, cs(s));
#endif
    if (e == cudaSuccess) return;
    cudaGetLastError();  // not sticky: fall back to one copy each
    batch_ok = false;
  }
#endif
  for (size_t i = 0; i < count; ++i) HMOE_CUDA_CHECK(cudaMemcpyAsync(dsts[i], srcs[i], bytes[i], cudaMemcpyHostToDevice, cs(s)));
}

void moe_gather_rows(const bf16_t* x, int64_t hidden, int64_t k, const int32_t* pair_list, int64_t pairs, bf16_t* xs, Stream& s) {
  if (hidden % 8 != 0) fail(ErrorKind::unsupported, "gpu::moe_gather_rows: hidden must be a multiple of 8");
  if (pairs <= 0) return;
  const int h8 = static_cast<int>(hidden / 8);
  gather_rows_kernel<<<blocks_for(pairs * h8, 256), 256, 0, cs(s)>>>(reinterpret_cast<const uint4*>(x), h8, static_cast<int>(k), pair_list, pairs,
                                                                      reinterpret_cast<uint4*>(xs));
  HMOE_CUDA_LAUNCHED();
}

void moe_combine_sorted(const float* ys, const int32_t* pair_list, const float* weights, int64_t n, int64_t k, int64_t hidden, int32_t* inv,
                        float* out, Stream& s) {
  if (n <= 0) return;
  invert_kernel<<<blocks_for(n * k, 256), 256, 0, cs(s)>>>(pair_list, n * k, inv);
  HMOE_CUDA_LAUNCHED();
  combine_sorted_kernel<<<blocks_for(n * hidden, 256), 256, 0, cs(s)>>>(ys, inv, weights, n, static_cast<int>(k), hidden, out);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
