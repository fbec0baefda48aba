// Memory-bound kernels of the step: embedding, (residual add +) RMSNorm,
// per-head norm + rotary, KV-cache store, SwiGLU, add. One block per row.
#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/kernels.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

__global__ void embedding_kernel(const uint16_t* table, const int32_t* ids, int64_t hidden, float* out) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const uint16_t* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = bf2f(row[i]);
}

// Rows up to kNormPer * blockDim.x values keep them in registers (every load
// issued before the first use); longer rows take the two-pass loop.
constexpr int kNormPer = 8, kNormThreads = 512;
__device__ __forceinline__ float norm_weight(const uint16_t* w, int64_t j) { return bf2f(w[j]); }
__device__ __forceinline__ float norm_weight(const float* w, int64_t j) { return w[j]; }
// W: uint16_t (bf16 weights) or float.
template <class W>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(float* x, const float* delta, const int32_t* rows, int64_t d, const W* w,
                                                                    float eps, uint16_t* y, float* y_f32) {
  pdl_wait();
  pdl_trigger();
  const int64_t i = blockIdx.x, r = rows ? rows[i] : i;
  float* xr = x + r * d;
  float ss = 0;
  if (d <= static_cast<int64_t>(kNormPer) * blockDim.x) {
    float v[kNormPer];
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      v[k] = j < d ? xr[j] : 0.0f;
    }
    if (delta) {
#pragma unroll
      for (int k = 0; k < kNormPer; ++k) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (j < d) v[k] += delta[r * d + j];
      }
#pragma unroll
      for (int k = 0; k < kNormPer; ++k) {
        const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
        if (j < d) xr[j] = v[k];
      }
    }
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) ss += v[k] * v[k];
    ss = block_sum(ss);
    const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
      if (j >= d) continue;
      const float o = norm_weight(w, j) * (v[k] * inv);
      y[i * d + j] = f2bf(o);
      if (y_f32) y_f32[i * d + j] = o;
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = xr[j];
    if (delta) {
      v += delta[r * d + j];
      xr[j] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = norm_weight(w, j) * (xr[j] * inv);
    y[i * d + j] = f2bf(v);
    if (y_f32) y_f32[i * d + j] = v;
  }
}

// One block per (token, head), hd threads.
__global__ void qk_norm_rope_kernel(float* x, int64_t ld, int64_t hd, const uint16_t* w, float eps, const int32_t* pos,
                                    const float* inv_freq) {
  __shared__ float v[256];
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int i = threadIdx.x;
  float* xh = x + t * ld + h * hd;
  const float a = xh[i];
  const float ss = block_sum(a * a);
  const float inv = rsqrtf(ss / static_cast<float>(hd) + eps);
  v[i] = bf2f(w[i]) * (a * inv);
  __syncthreads();
  const int half = static_cast<int>(hd / 2);
  if (i < half) {
    const float f = static_cast<float>(pos[t]) * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(f))), s = static_cast<float>(sin(static_cast<double>(f)));
    const float p = v[i], q = v[i + half];
    xh[i] = p * c - q * s;
    xh[i + half] = q * c + p * s;
  }
}

// q heads (blockIdx.y < heads) and k heads of one row: qk_norm_rope_kernel's
// arithmetic; a k head also stores its rotated keys and the row's values of
// that head into the cache (kv_store_kernel's), so one launch does all three.
__global__ void qkv_norm_rope_store_kernel(float* x, int64_t ld, int heads, int64_t hd, const uint16_t* wq, const uint16_t* wk, float eps,
                                           const int32_t* pos, const float* inv_freq, int kv_heads, const int32_t* slots, uint16_t* kc,
                                           uint16_t* vc) {
  __shared__ float v[256];
  pdl_wait();
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, i = threadIdx.x;
  const bool is_k = h >= heads;
  const uint16_t* w = is_k ? wk : wq;
  float* xh = x + t * ld + static_cast<int64_t>(h) * hd;  // k heads follow the q heads
  const float a = xh[i];
  const float ss = block_sum(a * a);
  const float inv = rsqrtf(ss / static_cast<float>(hd) + eps);
  v[i] = bf2f(w[i]) * (a * inv);
  __syncthreads();
  const int half = static_cast<int>(hd / 2);
  if (i < half) {
    const float f = static_cast<float>(pos[t]) * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(f))), s = static_cast<float>(sin(static_cast<double>(f)));
    const float p = v[i], q = v[i + half];
    const float r0 = p * c - q * s, r1 = q * c + p * s;
    xh[i] = r0;
    xh[i + half] = r1;
    if (is_k) {
      const int64_t width = static_cast<int64_t>(kv_heads) * hd, slot = slots[t], col = static_cast<int64_t>(h - heads) * hd;
      kc[slot * width + col + i] = f2bf(r0);
      kc[slot * width + col + i + half] = f2bf(r1);
    }
  }
  if (is_k) {
    const int64_t width = static_cast<int64_t>(kv_heads) * hd, slot = slots[t], col = static_cast<int64_t>(h - heads) * hd;
    vc[slot * width + col + i] = f2bf(x[t * ld + static_cast<int64_t>(heads + kv_heads) * hd + col + i]);
  }
}

__global__ void kv_store_kernel(const float* k, const float* v, int64_t ld, int64_t width, const int32_t* slots, uint16_t* kc,
                                uint16_t* vc) {
  const int64_t t = blockIdx.x, slot = slots[t];
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    kc[slot * width + i] = f2bf(k[t * ld + i]);
    vc[slot * width + i] = f2bf(v[t * ld + i]);
  }
}

__global__ void silu_mul_kernel(const float* gu, int64_t n, int64_t inter, uint16_t* h, uint16_t* h_lo) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * inter) return;
  const int64_t t = idx / inter, i = idx % inter;
  const float g = gu[t * 2 * inter + i], u = gu[t * 2 * inter + inter + i];
  store_bf16_pair(h, h_lo, idx, g / (1.0f + expf(-g)) * u);
}

__device__ __forceinline__ void split_one(const float* x, int64_t i, uint16_t* hi, uint16_t* lo) {
  const float v = x[i];
  const uint16_t h = f2bf(v);
  if (hi) hi[i] = h;
  if (lo) lo[i] = f2bf(v - bf2f(h));
}

__global__ void split_bf16_kernel(const float* x, int64_t count, uint16_t* hi, uint16_t* lo) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < count) split_one(x, idx, hi, lo);
}

// Four values a thread (x 16-byte, hi and lo 8-byte aligned); the thread past the last four takes the rest.
__global__ void split_bf16_x4_kernel(const float* x, int64_t count, uint16_t* hi, uint16_t* lo) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, groups = count / 4;
  if (g == groups) {
    for (int64_t i = 4 * groups; i < count; ++i) split_one(x, i, hi, lo);
    return;
  }
  if (g > groups) return;
  const float4 v = reinterpret_cast<const float4*>(x)[g];
  const uint16_t h0 = f2bf(v.x), h1 = f2bf(v.y), h2 = f2bf(v.z), h3 = f2bf(v.w);
  auto pack = [](uint16_t a, uint16_t b) { return static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16); };
  if (hi) reinterpret_cast<uint2*>(hi)[g] = make_uint2(pack(h0, h1), pack(h2, h3));
  if (lo)
    reinterpret_cast<uint2*>(lo)[g] = make_uint2(pack(f2bf(v.x - bf2f(h0)), f2bf(v.y - bf2f(h1))), pack(f2bf(v.z - bf2f(h2)), f2bf(v.w - bf2f(h3))));
}

__global__ void add_kernel(const float* x, const float* d, int64_t count, float* y) {
  pdl_wait();
  pdl_trigger();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < count) y[idx] = x[idx] + d[idx];
}

unsigned blocks_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

void embedding(const bf16_t* table, const int32_t* ids, int64_t n, int64_t hidden, float* out, Stream& s) {
  if (n <= 0) return;
  launch_pdl(s, embedding_kernel, dim3(static_cast<unsigned>(n)), dim3(256), 0, table, ids, hidden, out);
}

void add_rms_norm(float* x, const float* delta, const int32_t* rows, int64_t n, int64_t d, const bf16_t* w, float eps, bf16_t* y,
                  float* y_f32, Stream& s) {
  if (n <= 0) return;
  const unsigned threads = d <= 8 * 256 ? 256 : kNormThreads;  // up to 8 values a thread in registers
  launch_pdl(s, add_rms_norm_kernel<uint16_t>, dim3(static_cast<unsigned>(n)), dim3(threads), 0, x, delta, rows, d, w, eps, y, y_f32);
}

void add_rms_norm(float* x, const float* delta, const int32_t* rows, int64_t n, int64_t d, const float* w, float eps, bf16_t* y,
                  float* y_f32, Stream& s) {
  if (n <= 0) return;
  const unsigned threads = d <= 8 * 256 ? 256 : kNormThreads;
  launch_pdl(s, add_rms_norm_kernel<float>, dim3(static_cast<unsigned>(n)), dim3(threads), 0, x, delta, rows, d, w, eps, y, y_f32);
}

void qk_norm_rope(float* x, int64_t n, int64_t ld, int64_t heads, int64_t hd, const bf16_t* w, float eps, const int32_t* pos,
                  const float* inv_freq, Stream& s) {
  if (hd % 32 != 0 || hd > 256) fail(ErrorKind::unsupported, "gpu::qk_norm_rope: head_dim " + std::to_string(hd) + " (need a multiple of 32, <= 256)");
  if (n <= 0) return;
  qk_norm_rope_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), static_cast<unsigned>(hd), 0, cs(s)>>>(
      x, ld, hd, w, eps, pos, inv_freq);
  HMOE_CUDA_LAUNCHED();
}

void qkv_norm_rope_store(float* x, int64_t n, int64_t ld, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* w_q, const bf16_t* w_k,
                         float eps, const int32_t* pos, const float* inv_freq, const int32_t* slots, bf16_t* kc, bf16_t* vc, Stream& s) {
  if (hd % 32 != 0 || hd > 256) fail(ErrorKind::unsupported, "gpu::qkv_norm_rope_store: head_dim " + std::to_string(hd) + " (need a multiple of 32, <= 256)");
  if (n <= 0) return;
  launch_pdl(s, qkv_norm_rope_store_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads + kv_heads)), dim3(static_cast<unsigned>(hd)), 0,
             x, ld, static_cast<int>(heads), hd, w_q, w_k, eps, pos, inv_freq, static_cast<int>(kv_heads), slots, kc, vc);
}

void kv_store(const float* k, const float* v, int64_t ld, int64_t n, int64_t width, const int32_t* slots, bf16_t* kc, bf16_t* vc,
              Stream& s) {
  if (n <= 0) return;
  kv_store_kernel<<<static_cast<unsigned>(n), 256, 0, cs(s)>>>(k, v, ld, width, slots, kc, vc);
  HMOE_CUDA_LAUNCHED();
}

void silu_mul(const float* gu, int64_t n, int64_t inter, bf16_t* h, bf16_t* h_lo, Stream& s) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n * inter, 256), 256, 0, cs(s)>>>(gu, n, inter, h, h_lo);
  HMOE_CUDA_LAUNCHED();
}

void split_bf16(const float* x, int64_t count, bf16_t* hi, bf16_t* lo, Stream& s) {
  if (count <= 0) return;
  auto aligned = [](const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; };
  if (aligned(x, 16) && aligned(hi, 8) && aligned(lo, 8))  // null is aligned
    split_bf16_x4_kernel<<<blocks_for(count / 4 + 1, 256), 256, 0, cs(s)>>>(x, count, hi, lo);
  else
    split_bf16_kernel<<<blocks_for(count, 256), 256, 0, cs(s)>>>(x, count, hi, lo);
  HMOE_CUDA_LAUNCHED();
}

void add(const float* x, const float* d, int64_t count, float* y, Stream& s) {
  if (count <= 0) return;
  launch_pdl(s, add_kernel, dim3(blocks_for(count, 256)), dim3(256), 0, x, d, count, y);
}

}  // namespace hmoe::gpu
