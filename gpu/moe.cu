// Router top-k and grouped routed experts for GPU-resident MoE layers.
// Version 1 of the experts: pairs (token, slot) are grouped by expert on the
// device (moe_route); a block owns 8 weight rows of one expert and walks its
// tokens 8 at a time, so each weight byte is read once per 8 tokens. Decode
// (a few tokens per expert) is bounded by the bytes of the active experts.
#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/kernels.h"
#include "gpu/router_topk.cuh"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per weight row

// One warp per token; logits of the row in shared memory.
__global__ void router_topk_kernel(const float* logits, int experts, int k, bool normalize, int32_t* ids, float* weights) {
  extern __shared__ float p[];
  pdl_wait();
  pdl_trigger();
  const int t = blockIdx.x;
  softmax_topk_warp(logits + static_cast<int64_t>(t) * experts, experts, k, normalize, p, ids + t * k, weights + t * k);
}

// Counting sort of pair indices by expert; one block.
__global__ void moe_route_kernel(const int32_t* ids, int pairs, int experts, int32_t* offsets, int32_t* pair_list) {
  extern __shared__ int32_t cnt[];  // experts counts, then experts cursors
  int32_t* cur = cnt + experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t acc = 0;
    for (int e = 0; e < experts; ++e) {
      offsets[e] = acc;
      cur[e] = acc;
      acc += cnt[e];
    }
    offsets[experts] = acc;
  }
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) pair_list[atomicAdd(&cur[ids[p]], 1)] = p;
}

// act[p, r] = bf16(silu(gate_r . x_t) * (up_r . x_t)) for the expert's pairs p = (t, j).
template <int TB>
__global__ void moe_gate_up_kernel(const uint16_t* x, int hidden, int inter, int k, const uint16_t* w_gate_up, const int32_t* offsets,
                                   const int32_t* pair_list, uint16_t* act, uint16_t* act_lo) {
  extern __shared__ uint4 xs[];  // TB rows of hidden/8
  const int e = blockIdx.y, beg = offsets[e], end = offsets[e + 1];
  if (beg == end) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = blockIdx.x * kRowsPerBlock + warp, h8 = hidden / 8;
  const uint4* gate = reinterpret_cast<const uint4*>(w_gate_up + (static_cast<int64_t>(e) * 2 * inter + r) * hidden);
  const uint4* up = reinterpret_cast<const uint4*>(w_gate_up + (static_cast<int64_t>(e) * 2 * inter + inter + r) * hidden);
  for (int g0 = beg; g0 < end; g0 += TB) {
    const int cnt = min(TB, end - g0);
    __syncthreads();
    for (int i = threadIdx.x; i < cnt * h8; i += blockDim.x) {
      const int j = i / h8, c = i % h8, t = pair_list[g0 + j] / k;
      xs[j * h8 + c] = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(t) * hidden)[c];
    }
    __syncthreads();
    if (r >= inter) continue;
    float ag[TB], au[TB];
#pragma unroll
    for (int j = 0; j < TB; ++j) ag[j] = au[j] = 0;
#pragma unroll 4
    for (int c = lane; c < h8; c += 32) {
      float gf[8], uf[8], xf[8];
      unpack8(gate[c], gf);
      unpack8(up[c], uf);
#pragma unroll
      for (int j = 0; j < TB; ++j) {
        if (j < cnt) {
          unpack8(xs[j * h8 + c], xf);
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            ag[j] += gf[q] * xf[q];
            au[j] += uf[q] * xf[q];
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      if (j < cnt) {
        const float g = warp_sum(ag[j]), u = warp_sum(au[j]);
        if (lane == 0) {
          const float v = g / (1.0f + expf(-g)) * u;
          const int64_t at = static_cast<int64_t>(pair_list[g0 + j]) * inter + r;
          act[at] = f2bf(v);
          if (act_lo) act_lo[at] = f2bf(v - bf2f(act[at]));
        }
      }
    }
  }
}

// partial[p, r] = weights[p] * (down_r . act[p]); with act_lo, act[p] + act_lo[p].
template <int TB>
__global__ void moe_down_kernel(const uint16_t* act, const uint16_t* act_lo, int hidden, int inter, const float* weights, const uint16_t* w_down,
                                const int32_t* offsets, const int32_t* pair_list, float* partial) {
  extern __shared__ uint4 as[];  // TB rows of inter/8 (then TB rows of act_lo)
  const int e = blockIdx.y, beg = offsets[e], end = offsets[e + 1];
  if (beg == end) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = blockIdx.x * kRowsPerBlock + warp, i8 = inter / 8;
  const uint4* down = reinterpret_cast<const uint4*>(w_down + (static_cast<int64_t>(e) * hidden + r) * inter);
  for (int g0 = beg; g0 < end; g0 += TB) {
    const int cnt = min(TB, end - g0);
    __syncthreads();
    for (int i = threadIdx.x; i < cnt * i8; i += blockDim.x) {
      const int j = i / i8, c = i % i8;
      as[j * i8 + c] = reinterpret_cast<const uint4*>(act + static_cast<int64_t>(pair_list[g0 + j]) * inter)[c];
      if (act_lo) as[(TB + j) * i8 + c] = reinterpret_cast<const uint4*>(act_lo + static_cast<int64_t>(pair_list[g0 + j]) * inter)[c];
    }
    __syncthreads();
    if (r >= hidden) continue;
    float acc[TB];
#pragma unroll
    for (int j = 0; j < TB; ++j) acc[j] = 0;
#pragma unroll 4
    for (int c = lane; c < i8; c += 32) {
      float df[8], af[8];
      unpack8(down[c], df);
#pragma unroll
      for (int j = 0; j < TB; ++j) {
        if (j < cnt) {
          unpack8(as[j * i8 + c], af);
          if (act_lo) {
            float lf[8];
            unpack8(as[(TB + j) * i8 + c], lf);
#pragma unroll
            for (int q = 0; q < 8; ++q) af[q] += lf[q];
          }
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[j] += df[q] * af[q];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      if (j < cnt) {
        const float v = warp_sum(acc[j]);
        const int p = pair_list[g0 + j];
        if (lane == 0) partial[static_cast<int64_t>(p) * hidden + r] = weights[p] * v;
      }
    }
  }
}

// out[t, i] = sum_j partial[t*k + j, i], in slot order.
__global__ void moe_combine_kernel(const float* partial, int64_t n, int k, int64_t hidden, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hidden) return;
  const int64_t t = idx / hidden, i = idx % hidden;
  float s = 0;
  for (int j = 0; j < k; ++j) s += partial[(t * k + j) * hidden + i];
  out[idx] = s;
}

template <int TB>
void launch_experts(const bf16_t* x, int64_t n, int64_t hidden, int64_t inter, int64_t experts, int64_t k, const float* weights,
                    const int32_t* offsets, const int32_t* pair_list, const bf16_t* w_gate_up, const bf16_t* w_down, bf16_t* act,
                    bf16_t* act_lo, float* partial, cudaStream_t st) {
  const size_t smem_gu = static_cast<size_t>(TB) * hidden * 2, smem_dn = static_cast<size_t>(TB) * inter * 2 * (act_lo ? 2 : 1);
  if (smem_gu > 48 * 1024) HMOE_CUDA_CHECK(cudaFuncSetAttribute(moe_gate_up_kernel<TB>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_gu)));
  if (smem_dn > 48 * 1024) HMOE_CUDA_CHECK(cudaFuncSetAttribute(moe_down_kernel<TB>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_dn)));
  const dim3 g1(static_cast<unsigned>((inter + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(experts));
  moe_gate_up_kernel<TB><<<g1, kRowsPerBlock * 32, smem_gu, st>>>(x, static_cast<int>(hidden), static_cast<int>(inter), static_cast<int>(k),
                                                                   w_gate_up, offsets, pair_list, act, act_lo);
  HMOE_CUDA_LAUNCHED();
  const dim3 g2(static_cast<unsigned>((hidden + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(experts));
  moe_down_kernel<TB><<<g2, kRowsPerBlock * 32, smem_dn, st>>>(act, act_lo, static_cast<int>(hidden), static_cast<int>(inter), weights, w_down,
                                                                offsets, pair_list, partial);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace

void router_topk(const float* logits, int64_t n, int64_t experts, int64_t k, bool normalize, int32_t* ids, float* weights, Stream& s) {
  if (k < 1 || k > experts) fail(ErrorKind::invalid_argument, "gpu::router_topk: k must be in 1..experts");
  if (experts > 12 * 1024) fail(ErrorKind::unsupported, "gpu::router_topk: more than 12288 experts");
  if (n <= 0) return;
  launch_pdl(s, router_topk_kernel, dim3(static_cast<unsigned>(n)), dim3(32), static_cast<size_t>(experts) * sizeof(float), logits,
             static_cast<int>(experts), static_cast<int>(k), normalize, ids, weights);
}

void moe_route(const int32_t* ids, int64_t pairs, int64_t experts, int32_t* offsets, int32_t* pair_list, Stream& s) {
  if (experts <= 0 || experts > 4096) fail(ErrorKind::unsupported, "gpu::moe_route: experts must be in 1..4096");
  moe_route_kernel<<<1, 1024, static_cast<size_t>(2 * experts) * sizeof(int32_t), cs(s)>>>(ids, static_cast<int>(pairs),
                                                                                          static_cast<int>(experts), offsets, pair_list);
  HMOE_CUDA_LAUNCHED();
}

void moe_experts(const bf16_t* x, int64_t n, int64_t hidden, int64_t inter, int64_t experts, int64_t k, const int32_t* ids,
                 const float* weights, const int32_t* offsets, const int32_t* pair_list, const bf16_t* w_gate_up, const bf16_t* w_down,
                 bf16_t* act, float* partial, float* out, Stream& s, bf16_t* act_lo) {
  (void)ids;
  if (hidden % 8 != 0 || inter % 8 != 0)
    fail(ErrorKind::unsupported, "gpu::moe_experts: hidden and intermediate sizes must be multiples of 8");
  if (n <= 0) return;
  cudaStream_t st = cs(s);
  if (hidden <= 3072 && inter <= 3072)
    launch_experts<8>(x, n, hidden, inter, experts, k, weights, offsets, pair_list, w_gate_up, w_down, act, act_lo, partial, st);
  else launch_experts<2>(x, n, hidden, inter, experts, k, weights, offsets, pair_list, w_gate_up, w_down, act, act_lo, partial, st);
  moe_combine_kernel<<<static_cast<unsigned>((n * hidden + 255) / 256), 256, 0, st>>>(partial, n, static_cast<int>(k), hidden, out);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
