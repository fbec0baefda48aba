// Causal GQA attention over the paged KV cache (bf16 K/V, fp32 math).
// Version 1: one block of 128 threads per (token, head); keys in chunks of
// 128, one warp per key for the scores, one thread per output dimension for
// the weighted V sum, online softmax across chunks.
// Version 2 (this): as 1, plus split-K (flash-decoding) when few (token,
// head) blocks face long contexts: each of S blocks takes a slice of the
// keys and writes (max, sum, acc); a second kernel combines the slices.
#include <algorithm>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/kernels.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kThreads = 128, kChunk = 128;

// splits == 1: writes out; else writes scratch[((t*heads + h)*splits + z)*(hd + 2)] = {m, l, acc[hd]}.
__global__ void attention_kernel(const float* q, int64_t ldq, int heads, int kv_heads, int hd, const uint16_t* kc, const uint16_t* vc,
                                 const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, int splits,
                                 float* scratch, uint16_t* out) {
  __shared__ float qs[128];
  __shared__ float sc[kChunk];
  const int t = blockIdx.x, h = blockIdx.y, z = blockIdx.z, g = h / (heads / kv_heads);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < hd) qs[tid] = q[static_cast<int64_t>(t) * ldq + h * hd + tid];
  __syncthreads();
  const int len = lens[t];
  const int per = (len + splits - 1) / splits;
  const int beg = min(len, z * per), end = min(len, beg + per);
  const int32_t* sl = slot_lists + offsets[t];
  const int64_t row = static_cast<int64_t>(kv_heads) * hd;
  float m = -INFINITY, l = 0, acc = 0;
  for (int base = beg; base < end; base += kChunk) {
    const int cn = min(kChunk, end - base);
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
  if (splits == 1) {
    if (tid < hd) out[(static_cast<int64_t>(t) * heads + h) * hd + tid] = f2bf(len > 0 ? acc / l : 0.0f);
    return;
  }
  float* dst = scratch + ((static_cast<int64_t>(t) * heads + h) * splits + z) * (hd + 2);
  if (tid == 0) {
    dst[0] = m;
    dst[1] = l;
  }
  if (tid < hd) dst[2 + tid] = acc;
}

// One block of hd threads per (token, head).
__global__ void attention_combine_kernel(int heads, int hd, int splits, const float* scratch, uint16_t* out) {
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const float* src = scratch + (static_cast<int64_t>(t) * heads + h) * splits * (hd + 2);
  float mx = -INFINITY;
  for (int z = 0; z < splits; ++z) mx = fmaxf(mx, src[z * (hd + 2)]);
  float l = 0, acc = 0;
  for (int z = 0; z < splits; ++z) {
    const float* p = src + z * (hd + 2);
    if (p[1] == 0) continue;  // an empty slice
    const float w = expf(p[0] - mx);
    l += w * p[1];
    acc += w * p[2 + d];
  }
  out[(static_cast<int64_t>(t) * heads + h) * hd + d] = f2bf(l > 0 ? acc / l : 0.0f);
}

}  // namespace

int64_t attention_splits(int64_t n, int64_t heads, int64_t max_len) {
  if (n * heads >= 512 || max_len <= 512) return 1;
  return std::min<int64_t>(32, (max_len + 255) / 256);
}

int64_t attention_scratch_floats(int64_t n, int64_t heads, int64_t hd, int64_t max_len) {
  const int64_t s = attention_splits(n, heads, max_len);
  return s == 1 ? 0 : n * heads * s * (hd + 2);
}

void attention(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* kc, const bf16_t* vc,
               const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale, float* scratch,
               bf16_t* out, Stream& s) {
  if (hd % 32 != 0 || hd > 128) fail(ErrorKind::unsupported, "gpu::attention: head_dim " + std::to_string(hd) + " (need 32, 64, 96 or 128)");
  if (kv_heads <= 0 || heads % kv_heads != 0) fail(ErrorKind::invalid_argument, "gpu::attention: heads must be a multiple of kv_heads");
  if (n <= 0) return;
  const int64_t splits = attention_splits(n, heads, max_len);
  if (splits > 1 && scratch == nullptr) fail(ErrorKind::internal, "gpu::attention: split-K needs scratch");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads), static_cast<unsigned>(splits));
  attention_kernel<<<grid, kThreads, 0, cs(s)>>>(q, ldq, static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(hd), kc, vc,
                                                 slot_lists, offsets, lens, scale, static_cast<int>(splits), scratch, out);
  HMOE_CUDA_LAUNCHED();
  if (splits > 1) {
    attention_combine_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), static_cast<unsigned>(hd), 0, cs(s)>>>(
        static_cast<int>(heads), static_cast<int>(hd), static_cast<int>(splits), scratch, out);
    HMOE_CUDA_LAUNCHED();
  }
}

}  // namespace hmoe::gpu
