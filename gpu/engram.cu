// Engram module kernels (see gpu/engram.h). One block per row for the gate
// (row reductions), one thread per (row, channel) for the conv and the store.
#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/engram.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

__global__ void engram_gate_kernel(float* x, const float* d, const float* proj, int64_t h, const float* key_b, const float* value_b,
                                   const float* key_norm, const float* query_norm, const float* conv_norm, float eps, float conv_eps,
                                   float* v, float* vn) {
  const int64_t i = blockIdx.x;
  float* xr = x + i * h;
  const float* kr = proj + i * 2 * h;
  const float* vr = kr + h;
  float ssx = 0, ssk = 0, dot = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float xv = xr[c];
    if (d) {
      xv += d[i * h + c];
      xr[c] = xv;
    }
    const float kv = kr[c] + key_b[c];
    ssx += xv * xv;
    ssk += kv * kv;
    dot += (kv * key_norm[c]) * (xv * query_norm[c]);
  }
  ssx = block_sum(ssx);
  ssk = block_sum(ssk);
  dot = block_sum(dot);
  const float hf = static_cast<float>(h);
  const float s = dot * rsqrtf(ssk / hf + eps) * rsqrtf(ssx / hf + eps) / sqrtf(hf);
  const float sign = s > 0 ? 1.0f : (s < 0 ? -1.0f : 0.0f);
  const float z = sign * sqrtf(fmaxf(fabsf(s), 1e-6f));
  const float g = 1.0f / (1.0f + expf(-z));
  float ssv = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float val = g * (vr[c] + value_b[c]);
    v[i * h + c] = val;
    ssv += val * val;
  }
  ssv = block_sum(ssv);
  const float inv = rsqrtf(ssv / hf + conv_eps);
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) vn[i * h + c] = conv_norm[c] * (v[i * h + c] * inv);
}

__global__ void engram_conv_kernel(const float* v, const float* vn, const float* hist, int64_t hist_stride, const int32_t* src,
                                   const float* conv_w, int64_t n, int64_t h, int64_t k, float* x) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * h) return;
  const int64_t i = idx / h, c = idx % h;
  float a = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t w = src[i * k + j];
    if (w == -1) continue;
    const float in = w >= 0 ? vn[static_cast<int64_t>(w) * h + c] : hist[(-2 - static_cast<int64_t>(w)) * hist_stride + c];
    a += conv_w[c * k + j] * in;
  }
  x[idx] += v[idx] + a / (1.0f + expf(-a));
}

__global__ void engram_store_kernel(const float* vn, int64_t n, int64_t h, int64_t modules, const int32_t* dst, float* hist,
                                    int64_t hist_stride) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= modules * n * h) return;
  const int64_t m = idx / (n * h), i = (idx / h) % n, c = idx % h;
  const int32_t r = dst[i];
  if (r < 0) return;
  hist[static_cast<int64_t>(r) * hist_stride + m * h + c] = vn[idx];
}

unsigned blocks_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

void engram_gate(float* x, const float* d, const float* proj, int64_t n, int64_t h, const float* key_b, const float* value_b,
                 const float* key_norm, const float* query_norm, const float* conv_norm, float eps, float conv_eps, float* v, float* vn,
                 Stream& s) {
  if (n <= 0) return;
  engram_gate_kernel<<<static_cast<unsigned>(n), 256, 0, cs(s)>>>(x, d, proj, h, key_b, value_b, key_norm, query_norm, conv_norm, eps,
                                                                  conv_eps, v, vn);
  HMOE_CUDA_LAUNCHED();
}

void engram_conv(const float* v, const float* vn, const float* hist, int64_t hist_stride, const int32_t* src, const float* conv_w,
                 int64_t n, int64_t h, int64_t k, float* x, Stream& s) {
  if (n <= 0) return;
  engram_conv_kernel<<<blocks_for(n * h, 256), 256, 0, cs(s)>>>(v, vn, hist, hist_stride, src, conv_w, n, h, k, x);
  HMOE_CUDA_LAUNCHED();
}

void engram_store(const float* vn, int64_t n, int64_t h, int64_t modules, const int32_t* dst, float* hist, int64_t hist_stride,
                  Stream& s) {
  if (n <= 0 || modules <= 0) return;
  engram_store_kernel<<<blocks_for(modules * n * h, 256), 256, 0, cs(s)>>>(vn, n, h, modules, dst, hist, hist_stride);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
