// gpu::add_rms_norm's 1 / rms of a row, bit for bit, computed by one warp
// (gpu/decode_fused.cu, gpu/gguf_gemv.cu fuse the norm into the launch that
// reads its output). Private to gpu/*.cu.
#pragma once
#include "gpu/common.cuh"

namespace hmoe::gpu::detail {

// 1 / sqrt(mean((x + d)^2) + eps) over h values (d may be null), summed in
// add_rms_norm's order: its block of 256 threads (h <= 2048) or 512, thread
// tv summing the squares of values tv + vt * i in i order, each warp's sum
// as its lane 0 gets it from the butterfly, the warps' sums in warp order;
// here the block's warps are virtual warps of one real warp. Every lane of
// the warp gets the value.
__device__ inline float warp_rms_inv(const float* x, const float* d, int h, float eps) {
  const int lane = threadIdx.x & 31;
  const int vt = h <= 2048 ? 256 : 512, vw = vt / 32, per = (h + vt - 1) / vt;
  float part[16];
#pragma unroll
  for (int w = 0; w < 16; ++w) part[w] = 0;
#pragma unroll 4
  for (int i = 0; i < per; ++i) {
#pragma unroll
    for (int w = 0; w < 16; ++w) {
      const int j = lane + 32 * w + i * vt;
      if (w >= vw || j >= h) continue;
      float v = x[j];
      if (d) v += d[j];
      part[w] += v * v;
    }
  }
  float ss = 0;
#pragma unroll
  for (int w = 0; w < 16; ++w)
    if (w < vw) ss += __shfl_sync(0xffffffffu, warp_sum(part[w]), 0);
  return rsqrtf(ss / static_cast<float>(h) + eps);
}

}  // namespace hmoe::gpu::detail
