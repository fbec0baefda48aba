// Device helpers shared by gpu/*.cu: bf16 conversion and reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/check.h"
#include "gpu/memory.h"

namespace hmoe::gpu::detail {

inline cudaStream_t cs(Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

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
