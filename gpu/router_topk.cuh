// The softmax top-k selection of the routers (gpu/moe.cu, gpu/decode_fused.cu),
// one warp per token. Private to gpu/*.cu.
#pragma once
#include "gpu/common.cuh"

namespace hmoe::gpu::detail {

// Softmax over one row of `experts` logits, then the k largest (ties: lower
// index), renormalised when `normalize`; one warp, p: `experts` floats of
// the warp's shared memory. The row is read through L2 (it may have been
// written by other blocks of the same grid).
__device__ inline void softmax_topk_warp(const float* row, int experts, int k, bool normalize, float* p, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, __ldcg(row + e));
  mx = warp_max(mx);
  float sum = 0;
  for (int e = lane; e < experts; e += 32) {
    p[e] = expf(__ldcg(row + e) - mx);
    sum += p[e];
  }
  sum = warp_sum(sum);
  __syncwarp();
  for (int e = lane; e < experts; e += 32) p[e] /= sum;
  __syncwarp();
  float chosen_sum = 0;
  for (int j = 0; j < k; ++j) {
    float best = -1;
    int best_e = experts;
    for (int e = lane; e < experts; e += 32)
      if (p[e] > best) {
        best = p[e];
        best_e = e;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
      }
    }
    if (lane == 0) {
      ids[j] = best_e;
      weights[j] = best;
      p[best_e] = -2;  // below any probability
    }
    chosen_sum += best;
    __syncwarp();
  }
  if (normalize && lane == 0)
    for (int j = 0; j < k; ++j) weights[j] /= chosen_sum;
}

}  // namespace hmoe::gpu::detail
