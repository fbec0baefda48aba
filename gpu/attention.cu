// Causal GQA attention over the paged KV cache (bf16 K/V, fp32 math).
// Version 1: one block of 128 threads per (token, head); keys in chunks of
// 128, one warp per key for the scores, one thread per output dimension for
// the weighted V sum, online softmax across chunks. Serves prefill and
// decode alike; decode of a long context is bounded by the K/V bytes.
#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/kernels.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kThreads = 128, kChunk = 128;

__global__ void attention_kernel(const float* q, int64_t ldq, int heads, int kv_heads, int hd, const uint16_t* kc, const uint16_t* vc,
                                 const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, uint16_t* out) {
  __shared__ float qs[128];
  __shared__ float sc[kChunk];
  const int t = blockIdx.x, h = blockIdx.y, g = h / (heads / kv_heads);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < hd) qs[tid] = q[static_cast<int64_t>(t) * ldq + h * hd + tid];
  __syncthreads();
  const int len = lens[t];
  const int32_t* sl = slot_lists + offsets[t];
  const int64_t row = static_cast<int64_t>(kv_heads) * hd;
  float m = -INFINITY, l = 0, acc = 0;
  for (int base = 0; base < len; base += kChunk) {
    const int cn = min(kChunk, len - base);
    for (int j = warp; j < cn; j += kThreads / 32) {
      const uint16_t* kp = kc + static_cast<int64_t>(sl[base + j]) * row + g * hd;
      float s = 0;
      for (int d = lane; d < hd; d += 32) s += qs[d] * bf2f(kp[d]);
      s = warp_sum(s);
      if (lane == 0) sc[j] = s * scale;
    }
    __syncthreads();
    float cmax = -INFINITY;
    for (int j = 0; j < cn; ++j) cmax = fmaxf(cmax, sc[j]);
    const float nm = fmaxf(m, cmax), corr = expf(m - nm);
    float psum = 0, part = 0;
    for (int j = 0; j < cn; ++j) {
      const float p = expf(sc[j] - nm);
      psum += p;
      if (tid < hd) part += p * bf2f(vc[static_cast<int64_t>(sl[base + j]) * row + g * hd + tid]);
    }
    l = l * corr + psum;
    acc = acc * corr + part;
    m = nm;
    __syncthreads();
  }
  if (tid < hd) out[(static_cast<int64_t>(t) * heads + h) * hd + tid] = f2bf(len > 0 ? acc / l : 0.0f);
}

}  // namespace

void attention(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* kc, const bf16_t* vc,
               const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, Stream& s) {
  if (hd % 32 != 0 || hd > 128) fail(ErrorKind::unsupported, "gpu::attention: head_dim " + std::to_string(hd) + " (need 32, 64, 96 or 128)");
  if (kv_heads <= 0 || heads % kv_heads != 0) fail(ErrorKind::invalid_argument, "gpu::attention: heads must be a multiple of kv_heads");
  if (n <= 0) return;
  attention_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), kThreads, 0, cs(s)>>>(
      q, ldq, static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(hd), kc, vc, slot_lists, offsets, lens, scale, out);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
