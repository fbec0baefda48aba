// Zero-copy hand-off kernels (gpu/handoff.h).
#include "gpu/check.h"
#include "gpu/common.cuh"
#include "gpu/handoff.h"

namespace hmoe::gpu {

using detail::cs;

namespace {

constexpr int kThreads = 512, kUnroll = 8;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void handoff_down_kernel(const float* hf, const int32_t* ids, const float* w, int64_t nh, int64_t nk, float* hf_m, int32_t* ids_m,
                                    float* w_m, uint32_t* ready, uint64_t* ts) {
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0 && ts) ts[0] = global_ns();
  const int64_t n4 = nh / 4;
  const float4* src = reinterpret_cast<const float4*>(hf);
  float4* dst = reinterpret_cast<float4*>(hf_m);
  for (int64_t i = t; i < n4; i += kThreads) dst[i] = src[i];
  for (int64_t i = 4 * n4 + t; i < nh; i += kThreads) hf_m[i] = hf[i];
  for (int64_t i = t; i < nk; i += kThreads) {
    ids_m[i] = ids[i];
    w_m[i] = w[i];
  }
  __threadfence_system();  // every thread's stores reach host memory before the flag
  __syncthreads();
  if (t == 0) {
    if (ts) ts[1] = global_ns();
    __threadfence_system();
    store_release_sys(ready, 1u);
  }
}

__global__ void handoff_wait_add_kernel(uint32_t* done, const float* out_m, int64_t nh, float* d, uint64_t* ts) {
  __shared__ uint32_t seen;
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) {
    uint32_t v;
    while ((v = load_acquire_sys(done)) == 0) {
    }
    if (ts) ts[0] = global_ns();
    *reinterpret_cast<volatile uint32_t*>(done) = 0;  // ready for the next replay
    seen = v;
  }
  __syncthreads();
  if (seen == kHandoffRelease) {  // every load of a round in flight before the stores: one PCIe round trip per 64 KB
    const float4* src = reinterpret_cast<const float4*>(out_m);
    float4* dst = reinterpret_cast<float4*>(d);
    const int64_t n4 = nh / 4;
    for (int64_t base = 0; base < n4; base += kThreads * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads + t;
        if (i < n4) v[u] = __ldcv(src + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kThreads + t;
        if (i < n4) dst[i] = v[u];
      }
    }
  }
  if (ts) {
    __syncthreads();
    if (t == 0) ts[1] = global_ns();
  }
}

__global__ void handoff_signal_kernel(uint32_t* flag, uint64_t* ts) {
  if (ts) ts[0] = global_ns();
  __threadfence_system();
  store_release_sys(flag, 1u);
}

}  // namespace

void handoff_down(const float* hf, const int32_t* ids, const float* w, int64_t nh, int64_t nk, float* hf_m, int32_t* ids_m, float* w_m,
                  uint32_t* ready, uint64_t* ts, Stream& s) {
  handoff_down_kernel<<<1, kThreads, 0, cs(s)>>>(hf, ids, w, nh, nk, hf_m, ids_m, w_m, ready, ts);
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void handoff_wait_add(uint32_t* done, const float* out_m, int64_t nh, float* d, uint64_t* ts, Stream& s) {
  if (nh % 4 != 0 || reinterpret_cast<uintptr_t>(out_m) % 16 != 0 || reinterpret_cast<uintptr_t>(d) % 16 != 0)
    fail(ErrorKind::internal, "gpu::handoff_wait_add: rows must be float4-aligned");
  handoff_wait_add_kernel<<<1, kThreads, 0, cs(s)>>>(done, out_m, nh, d, ts);
  HMOE_CUDA_CHECK(cudaGetLastError());
}

void handoff_signal(uint32_t* flag, uint64_t* ts, Stream& s) {
  handoff_signal_kernel<<<1, 1, 0, cs(s)>>>(flag, ts);
  HMOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace hmoe::gpu
