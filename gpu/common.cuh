// Device helpers shared by gpu/*.cu: bf16 conversion and reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "gpu/check.h"
#include "gpu/memory.h"

namespace hmoe::gpu::detail {

inline cudaStream_t cs(Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

// Programmatic dependent launch (sm_90+). A kernel launched by launch_pdl on
// a stream with programmatic_launch() may be scheduled before the kernel in
// front of it has finished; it must call pdl_wait() in every block before it
// reads anything that kernel (or any earlier one) wrote, and before it
// returns (so that a grid that completes implies its predecessors did).
// Work before pdl_wait() may only read what no kernel of the step writes
// (weights). pdl_trigger() lets the next kernel be scheduled; called after
// pdl_wait(), at most two kernels of a chain are resident at once. On older
// architectures and on plain launches both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the current device takes programmatic launches (compute 9.0+).
bool pdl_supported();

// The current device's shared memory per block with the opt-in (99 KiB on
// sm_86/89, 227 KiB on sm_90), read once per process.
int64_t smem_optin_limit();

// kern<<<grid, block, smem, s>>>(args...), with the programmatic-serialization
// attribute when s asks for it and the device takes it. Checks the launch.
template <class... KArgs, class... Args>
void launch_pdl(Stream& s, void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = cs(s);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = s.programmatic_launch() && pdl_supported() ? 1 : 0;
  HMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, static_cast<KArgs>(std::forward<Args>(args))...));
}

__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
__device__ __forceinline__ uint16_t f2bf(float f) {
  __nv_bfloat16 b = __float2bfloat16_rn(f);
  return *reinterpret_cast<uint16_t*>(&b);
}

// hi[i] = bf16(v) and, when lo is given, lo[i] = bf16(v - hi[i]): the pair
// keeps v to about 16 significant bits for products run on both (a split
// bf16 input, see engine/layers/mla_attention_gpu.cpp).
__device__ __forceinline__ void store_bf16_pair(uint16_t* hi, uint16_t* lo, int64_t i, float v) {
  const uint16_t h = f2bf(v);
  hi[i] = h;
  if (lo) lo[i] = f2bf(v - bf2f(h));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float r = 0;
  for (int i = 0; i < warps; ++i) r += part[i];
  return r;
}
// Eight bf16 values packed in a uint4, unpacked to fp32.
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

}  // namespace hmoe::gpu::detail
