// The decode router in one launch (gpu::router_gemv_topk, gpu/kernels.h),
// optionally with the post-attention residual add + RMSNorm in front of it
// (gpu::add_rms_norm_router_topk, gpu/decode_fused.h).
//
// Why this shape. At decode the router reads 0.5 MB (128 experts x 2048
// bf16) for one to eight tokens: a cuBLAS product, a top-k launch and a norm
// launch before them cost more in launch gaps than in bytes. Here warp w of
// block b takes router rows b * 8 + w, b * 8 + w + 8 * gridDim.x, ... (the
// first row's weights requested before waiting for the kernel in front,
// programmatic launch) and writes their logits; the block that counts
// itself last in `counter` runs the softmax top-k per token (warp t: tokens
// t, t + 8, ...), writes the updated residual rows and sets the counter back
// to 0. With the norm, every block normalises the n rows itself into shared
// memory (x + delta read, never written, until the last block's update), so
// no block waits for another before its product.
#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/decode_fused.h"
#include "gpu/kernels.h"
#include "gpu/norm_warp.cuh"
#include "gpu/router_topk.cuh"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32, kTokens = 8, kChunks = 8;  // chunks: 16-byte loads per lane held at once
constexpr int kNormMax = 8192;  // hidden of the fused norm

struct RouterArgs {
  const uint16_t* x;  // bf16 [n, hidden] (without the norm)
  float* xres;        // with the norm: the residual rows, += delta by the last block
  const float* delta;
  const uint16_t* norm_w;
  float eps;
  uint16_t* hb;  // normed rows (written by block 0)
  float* hf;     // ... in fp32 (optional)
  int n, hidden;
  const uint16_t* w;
  int experts, k;
  bool normalize;
  float* logits;
  int32_t* counter;
  int32_t* ids;
  float* weights;
};

template <bool NORM>
__global__ void __launch_bounds__(kThreads) router_kernel(RouterArgs a) {
  extern __shared__ __align__(16) uint8_t sm[];
  float* p = reinterpret_cast<float*>(sm);                           // [kWarps][experts] softmax scratch
  uint16_t* xs = reinterpret_cast<uint16_t*>(p + kWarps * a.experts);  // NORM: [n][hidden] normed rows (bf16)
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, H = a.hidden, h8 = H / 8;
  const int stride = gridDim.x * kWarps;
  int row = blockIdx.x * kWarps + warp;
  uint4 wr[kChunks];
  auto fetch = [&](int r, int c0) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = c0 + lane + 32 * i;
      if (r < a.experts && c < h8) wr[i] = __ldg(reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(r) * H) + c);
    }
  };
  fetch(row, 0);
  pdl_wait();
  pdl_trigger();

  if (NORM) {
    // Warp t normalises token t (tokens in parallel) in add_rms_norm's order
    // (gpu/norm_warp.cuh); the values are read again (from L1) to write them.
    for (int t = warp; t < a.n; t += kWarps) {
      const float* xr = a.xres + static_cast<int64_t>(t) * H;
      const float* dr = a.delta ? a.delta + static_cast<int64_t>(t) * H : nullptr;
      const float inv = warp_rms_inv(xr, dr, H, a.eps);
      for (int j = lane; j < H; j += 32) {
        float v = xr[j];
        if (dr) v += dr[j];
        const float o = bf2f(a.norm_w[j]) * (v * inv);
        const uint16_t ob = f2bf(o);
        xs[t * H + j] = ob;
        if (blockIdx.x == 0) {
          a.hb[static_cast<int64_t>(t) * H + j] = ob;
          if (a.hf) a.hf[static_cast<int64_t>(t) * H + j] = o;
        }
      }
    }
    __syncthreads();
  }

  for (; row < a.experts; row += stride) {
    float acc[kTokens];
#pragma unroll
    for (int t = 0; t < kTokens; ++t) acc[t] = 0;
    for (int c0 = 0; c0 < h8; c0 += 32 * kChunks) {
      if (c0 > 0) fetch(row, c0);
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = c0 + lane + 32 * i;
        if (c >= h8) continue;
        float wf[8], xf[8];
        unpack8(wr[i], wf);
#pragma unroll
        for (int t = 0; t < kTokens; ++t) {
          if (t >= a.n) break;
          const uint4 xv = NORM ? reinterpret_cast<const uint4*>(xs + t * H)[c]
                                : __ldg(reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(t) * H) + c);
          unpack8(xv, xf);
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[t] += wf[q] * xf[q];
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= a.n) break;
      const float v = warp_sum(acc[t]);
      if (lane == 0) a.logits[static_cast<int64_t>(t) * a.experts + row] = v;
    }
    if (row + stride < a.experts) fetch(row + stride, 0);
  }
  __threadfence();  // every writer's logits visible device-wide before the block counts itself
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = warp; t < a.n; t += kWarps)
    softmax_topk_warp(a.logits + static_cast<int64_t>(t) * a.experts, a.experts, a.k, a.normalize, p + warp * a.experts, a.ids + t * a.k,
                      a.weights + t * a.k);
  if (NORM && a.delta) {  // every block has read x: the residual update
    for (int t = 0; t < a.n; ++t)
      for (int j = threadIdx.x; j < H; j += kThreads) a.xres[static_cast<int64_t>(t) * H + j] += a.delta[static_cast<int64_t>(t) * H + j];
  }
  if (threadIdx.x == 0) *a.counter = 0;
}

void check_router(const char* what, int64_t n, int64_t hidden, int64_t experts, int64_t k) {
  const std::string w = std::string("gpu::") + what;
  if (k < 1 || k > experts) fail(ErrorKind::invalid_argument, w + ": k must be in 1..experts");
  if (experts > 1024) fail(ErrorKind::unsupported, w + ": more than 1024 experts");
  if (hidden <= 0 || hidden % 8 != 0) fail(ErrorKind::invalid_argument, w + ": hidden must be a positive multiple of 8");
  if (n > kTokens) fail(ErrorKind::invalid_argument, w + ": more than 8 tokens");
}

template <bool NORM>
void launch_router(const RouterArgs& a, Stream& s) {
  const unsigned blocks = static_cast<unsigned>((a.experts + kWarps - 1) / kWarps);
  const size_t smem = static_cast<size_t>(kWarps * a.experts) * sizeof(float) + (NORM ? static_cast<size_t>(a.n * a.hidden) * 2 : 0);
  auto kern = router_kernel<NORM>;
  if (smem > 48 * 1024) HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_pdl(s, kern, dim3(blocks), dim3(kThreads), smem, a);
}

}  // namespace

int64_t router_gemv_max_tokens() { return kTokens; }

void router_gemv_topk(const bf16_t* x, int64_t n, const bf16_t* w, int64_t experts, int64_t hidden, int64_t k, bool normalize, float* logits,
                      int32_t* counter, int32_t* ids, float* weights, Stream& s) {
  check_router("router_gemv_topk", n, hidden, experts, k);
  if (n <= 0) return;
  RouterArgs a{};
  a.x = x;
  a.n = static_cast<int>(n);
  a.hidden = static_cast<int>(hidden);
  a.w = w;
  a.experts = static_cast<int>(experts);
  a.k = static_cast<int>(k);
  a.normalize = normalize;
  a.logits = logits;
  a.counter = counter;
  a.ids = ids;
  a.weights = weights;
  launch_router<false>(a, s);
}

bool norm_router_fits(int64_t n, int64_t hidden, int64_t experts) {
  return n >= 1 && n <= kTokens && hidden > 0 && hidden % 8 == 0 && hidden <= kNormMax && experts <= 1024;
}

void add_rms_norm_router_topk(float* x, const float* delta, int64_t n, int64_t hidden, const bf16_t* norm_w, float eps, bf16_t* hb, float* hf,
                              const bf16_t* w, int64_t experts, int64_t k, bool normalize, float* logits, int32_t* counter, int32_t* ids,
                              float* weights, Stream& s) {
  check_router("add_rms_norm_router_topk", n, hidden, experts, k);
  if (hidden > kNormMax) fail(ErrorKind::unsupported, "gpu::add_rms_norm_router_topk: hidden over 8192");
  if (n <= 0) return;
  RouterArgs a{};
  a.xres = x;
  a.delta = delta;
  a.norm_w = norm_w;
  a.eps = eps;
  a.hb = hb;
  a.hf = hf;
  a.n = static_cast<int>(n);
  a.hidden = static_cast<int>(hidden);
  a.w = w;
  a.experts = static_cast<int>(experts);
  a.k = static_cast<int>(k);
  a.normalize = normalize;
  a.logits = logits;
  a.counter = counter;
  a.ids = ids;
  a.weights = weights;
  launch_router<true>(a, s);
}

}  // namespace hmoe::gpu
