// Qwen3-Next's gated full attention and gated shared expert, the parts the
// plain GQA kernels do not cover (see deltanet.h): q with its output gate,
// zero-centred q/k norms (weights given as 1 + w), partial rotary, the gate
// on the attention output and the sigmoid-scaled shared expert.
#include <cmath>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

// One block per (token, head): q heads first, then k heads; hd threads.
__global__ void gated_qkv_kernel(const float* x, int64_t ld, int heads, int kv_heads, int hd, int rot, const float* wq, const float* wk, float eps,
                                 const int32_t* pos, const float* inv_freq, const int32_t* slots, uint16_t* kc, uint16_t* vc, float* q_out) {
  __shared__ float v[256];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, i = threadIdx.x;
  const bool is_k = h >= heads;
  const float* src = is_k ? x + t * ld + static_cast<int64_t>(heads) * 2 * hd + static_cast<int64_t>(h - heads) * hd
                          : x + t * ld + static_cast<int64_t>(h) * 2 * hd;
  const float a = src[i];
  const float ss = block_sum(a * a);
  const float inv = rsqrtf(ss / static_cast<float>(hd) + eps);
  v[i] = (is_k ? wk : wq)[i] * (a * inv);
  __syncthreads();
  const int half = rot / 2;
  float r = v[i];
  if (i < rot) {
    const int f_i = i < half ? i : i - half;
    const float f = static_cast<float>(pos[t]) * inv_freq[f_i];
    const float c = static_cast<float>(cos(static_cast<double>(f))), sn = static_cast<float>(sin(static_cast<double>(f)));
    r = i < half ? v[i] * c - v[i + half] * sn : v[i] * c + v[i - half] * sn;
  }
  if (!is_k) {
    q_out[(t * heads + h) * hd + i] = r;
    return;
  }
  const int64_t width = static_cast<int64_t>(kv_heads) * hd, slot = slots[t], col = static_cast<int64_t>(h - heads) * hd;
  kc[slot * width + col + i] = f2bf(r);
  vc[slot * width + col + i] = f2bf(x[t * ld + static_cast<int64_t>(heads) * 2 * hd + width + col + i]);
}

__global__ void gate_kernel(uint16_t* attn, const float* x, int64_t n, int64_t ld, int64_t heads, int64_t hd, uint16_t* hi, uint16_t* lo) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * heads * hd) return;
  const int64_t t = idx / (heads * hd), h = (idx / hd) % heads, i = idx % hd;
  const float g = x[t * ld + h * 2 * hd + hd + i];
  const float v = bf2f(attn[idx]) / (1.0f + expf(-g));
  if (!hi) {
    attn[idx] = f2bf(v);
    return;
  }
  const uint16_t h16 = f2bf(v);
  hi[idx] = h16;
  lo[idx] = f2bf(v - bf2f(h16));
}

__global__ void add_sigmoid_scaled_kernel(float* d, const float* y, const float* logit, int64_t n, int64_t hidden) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hidden) return;
  const float s = 1.0f / (1.0f + expf(-logit[idx / hidden]));
  d[idx] += s * y[idx];
}

unsigned blocks(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

void gated_qkv_prepare(const float* x, int64_t n, int64_t ld, int64_t heads, int64_t kv_heads, int64_t hd, int64_t rot, const float* wq,
                       const float* wk, float eps, const int32_t* pos, const float* inv_freq, const int32_t* slots, uint16_t* kc, uint16_t* vc,
                       float* q_out, Stream& s) {
  if (hd % 32 != 0 || hd > 256 || rot % 2 != 0 || rot > hd || rot < 0)
    fail(ErrorKind::unsupported, "gated attention on the GPU: head_dim " + std::to_string(hd) + " with " + std::to_string(rot) +
                                     " rotary dimensions (head_dim a multiple of 32 up to 256, rotary dimensions even)");
  if (n <= 0) return;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(heads + kv_heads));
  gated_qkv_kernel<<<grid, static_cast<unsigned>(hd), 0, cs(s)>>>(x, ld, static_cast<int>(heads), static_cast<int>(kv_heads), static_cast<int>(hd),
                                                                  static_cast<int>(rot), wq, wk, eps, pos, inv_freq, slots, kc, vc, q_out);
  HMOE_CUDA_LAUNCHED();
}

void gated_attention_gate(uint16_t* attn, const float* x, int64_t n, int64_t ld, int64_t heads, int64_t hd, Stream& s, uint16_t* hi, uint16_t* lo) {
  if (n <= 0) return;
  if ((hi == nullptr) != (lo == nullptr)) fail(ErrorKind::internal, "gated_attention_gate: hi and lo go together");
  gate_kernel<<<blocks(n * heads * hd, 256), 256, 0, cs(s)>>>(attn, x, n, ld, heads, hd, hi, lo);
  HMOE_CUDA_LAUNCHED();
}

void add_sigmoid_scaled(float* d, const float* y, const float* logit, int64_t n, int64_t hidden, Stream& s) {
  if (n <= 0) return;
  add_sigmoid_scaled_kernel<<<blocks(n * hidden, 256), 256, 0, cs(s)>>>(d, y, logit, n, hidden);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
