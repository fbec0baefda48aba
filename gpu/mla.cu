// Multi-head latent attention and DeepSeek routing kernels (see gpu/mla.h);
// the latent attention itself is gpu/mla_latent.cu. Expanded attention,
// version 1: one block per (token, head), keys in chunks of 64 (a warp per
// key for the scores, online softmax across chunks); no split-K.
// head_matmul reads each weight row once per 4 tokens.
#include <string>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/mla.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kAttnThreads = 128, kKeyChunk = 64, kHmTokens = 4, kHmRows = 8;

__global__ void rms_norm_rows_kernel(const float* x, int64_t ldx, int64_t d, const uint16_t* w, float eps, uint16_t* y, uint16_t* y_lo) {
  const int64_t t = blockIdx.x;
  const float* xr = x + t * ldx;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) store_bf16_pair(y, y_lo, t * d + j, bf2f(w[j]) * (xr[j] * inv));
}

// Thread i < dim/2 of the caller's block reads pair i of src and returns the
// rotated pair (rotate-half order) in (lo, hi).
__device__ __forceinline__ void rope_pair(const float* src, int i, int half, int pos, const float* inv_freq, float factor, bool interleave,
                                          float& lo, float& hi) {
  const float a = interleave ? src[2 * i] : src[i];
  const float b = interleave ? src[2 * i + 1] : src[i + half];
  const float f = static_cast<float>(pos) * inv_freq[i];
  const float c = static_cast<float>(cos(static_cast<double>(f))) * factor;
  const float s = static_cast<float>(sin(static_cast<double>(f))) * factor;
  lo = a * c - b * s;
  hi = b * c + a * s;
}

// grid (n, heads), dim/2 threads.
__global__ void mla_rope_kernel(float* x, int64_t ldx, int64_t hx, const float* inv_freq, int dim, float factor, bool interleave,
                                const int32_t* pos) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int i = threadIdx.x, half = dim / 2;
  float* v = x + t * ldx + h * hx;
  float lo, hi;
  rope_pair(v, i, half, pos[t], inv_freq, factor, interleave, lo, hi);
  __syncthreads();  // every pair read before any is written back
  v[i] = lo;
  v[i + half] = hi;
}

// One block per token.
__global__ void mla_kv_store_kernel(const float* kv, int64_t ldkv, int64_t r, const uint16_t* norm_w, float eps, const float* inv_freq,
                                    int dim, float factor, bool interleave, const int32_t* pos, const int32_t* slots, uint16_t* cache) {
  const int64_t t = blockIdx.x, lw = r + dim;
  const float* src = kv + t * ldkv;
  uint16_t* dst = cache + static_cast<int64_t>(slots[t]) * lw;
  float ss = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) ss += src[j] * src[j];
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(r) + eps);
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) dst[j] = f2bf(bf2f(norm_w[j]) * (src[j] * inv));
  const int half = dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float lo, hi;
    rope_pair(src + r, i, half, pos[t], inv_freq, factor, interleave, lo, hi);
    dst[r + i] = f2bf(lo);
    dst[r + i + half] = f2bf(hi);
  }
}

// grid (ceil(out/8), heads), 8 warps: warp w owns output row blockIdx.x*8 + w.
__global__ void head_matmul_kernel(const float* x, int64_t ldx, int64_t hx, int n, int in, int out, const uint16_t* w, int64_t hw,
                                   float* y, uint16_t* yb, int64_t ldy, int64_t hy) {
  extern __shared__ float xs[];  // kHmTokens rows of `in`
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, o = blockIdx.x * kHmRows + warp, in8 = in / 8;
  const uint4* wr = reinterpret_cast<const uint4*>(w + h * hw + static_cast<int64_t>(o) * in);
  for (int t0 = 0; t0 < n; t0 += kHmTokens) {
    const int cnt = min(kHmTokens, n - t0);
    __syncthreads();
    for (int i = threadIdx.x; i < cnt * in; i += blockDim.x) {
      const int j = i / in, c = i % in;
      xs[j * in + c] = x[static_cast<int64_t>(t0 + j) * ldx + h * hx + c];
    }
    __syncthreads();
    if (o >= out) continue;
    float acc[kHmTokens];
#pragma unroll
    for (int j = 0; j < kHmTokens; ++j) acc[j] = 0;
    for (int c = lane; c < in8; c += 32) {
      float wf[8];
      unpack8(wr[c], wf);
#pragma unroll
      for (int j = 0; j < kHmTokens; ++j)
        if (j < cnt) {
          const float* xr = xs + j * in + c * 8;
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[j] += wf[q] * xr[q];
        }
    }
#pragma unroll
    for (int j = 0; j < kHmTokens; ++j)
      if (j < cnt) {
        const float v = warp_sum(acc[j]);
        if (lane == 0) {
          const int64_t at = static_cast<int64_t>(t0 + j) * ldy + h * hy + o;
          if (y) y[at] = v;
          else yb[at] = f2bf(v);
        }
      }
  }
}

__global__ void gather_rows_kernel(const uint16_t* cache, int64_t ld, const int32_t* slot_lists, int64_t cols, uint16_t* out) {
  const int64_t i = blockIdx.x;
  const uint16_t* src = cache + static_cast<int64_t>(slot_lists[i]) * ld;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[i * cols + c] = src[c];
}

// grid (n, heads), kAttnThreads threads; smem: nope + rope query floats.
__global__ void mla_attention_expanded_kernel(const float* q, int64_t ldq, int heads, int nope, int rope, int vd, const float* kv,
                                              const uint16_t* cache, int64_t lw, int64_t r, const int32_t* slot_lists, const int32_t* offsets,
                                              const int32_t* lens, const int32_t* only, float scale, uint16_t* out, uint16_t* out_lo) {
  extern __shared__ float qs[];
  __shared__ float sc[kKeyChunk];
  const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (only && !only[t]) return;
  const int qk = nope + rope, ew = nope + vd;
  for (int i = tid; i < qk; i += kAttnThreads) qs[i] = q[static_cast<int64_t>(t) * ldq + static_cast<int64_t>(h) * qk + i];
  __syncthreads();
  const int len = lens[t], off = offsets[t];
  const int32_t* sl = slot_lists + off;
  const int64_t kv_ld = static_cast<int64_t>(heads) * ew;
  float m = -INFINITY, l = 0, acc = 0;
  for (int base = 0; base < len; base += kKeyChunk) {
    const int cn = min(kKeyChunk, len - base);
    for (int j = warp; j < cn; j += kAttnThreads / 32) {
      const float* kn = kv + static_cast<int64_t>(off + base + j) * kv_ld + static_cast<int64_t>(h) * ew;
      const uint16_t* kr = cache + static_cast<int64_t>(sl[base + j]) * lw + r;
      float s = 0;
      for (int i = lane; i < nope; i += 32) s += qs[i] * kn[i];
      for (int i = lane; i < rope; i += 32) s += qs[nope + i] * bf2f(kr[i]);
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
      if (tid < vd) part += p * kv[static_cast<int64_t>(off + base + j) * kv_ld + static_cast<int64_t>(h) * ew + nope + tid];
    }
    l = l * corr + psum;
    acc = acc * corr + part;
    m = nm;
    __syncthreads();
  }
  if (tid < vd) store_bf16_pair(out, out_lo, (static_cast<int64_t>(t) * heads + h) * vd + tid, len > 0 ? acc / l : 0.0f);
}

// Warp-wide argmax of v[0..count) (ties: lower index); every lane gets it.
__device__ __forceinline__ int warp_argmax(const float* v, int count, int lane) {
  float best = -INFINITY;
  int best_e = count;
  for (int e = lane; e < count; e += 32)
    if (v[e] > best || best_e == count) {  // strict: a lane's lower index wins ties
      best = v[e];
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
  return best_e;
}

// One warp per token; smem: score[E], masked[E], group score[n_group].
__global__ void deepseek_topk_kernel(const float* logits, const float* bias, int experts, int k, int n_group, int topk_group, bool normalize,
                                     float scaling, int32_t* ids, float* weights) {
  extern __shared__ float sm[];
  float* score = sm;
  float* masked = sm + experts;
  float* gs = sm + 2 * experts;
  const int t = blockIdx.x, lane = threadIdx.x, per = experts / n_group;
  const float* row = logits + static_cast<int64_t>(t) * experts;
  for (int e = lane; e < experts; e += 32) {
    const float s = 1.0f / (1.0f + expf(-row[e]));
    score[e] = s;
    masked[e] = s + bias[e];
  }
  __syncwarp();
  for (int g = lane; g < n_group; g += 32) {
    float top1 = -INFINITY, top2 = -INFINITY;
    for (int i = 0; i < per; ++i) {
      const float c = masked[g * per + i];
      if (c > top1) {
        top2 = top1;
        top1 = c;
      } else if (c > top2) {
        top2 = c;
      }
    }
    gs[g] = per >= 2 ? top1 + top2 : top1;
  }
  __syncwarp();
  unsigned long long keep = 0;
  for (int i = 0; i < topk_group; ++i) {
    const int g = warp_argmax(gs, n_group, lane);
    keep |= 1ull << g;
    __syncwarp();
    if (lane == 0) gs[g] = -INFINITY;
    __syncwarp();
  }
  for (int e = lane; e < experts; e += 32)
    if (!((keep >> (e / per)) & 1ull)) masked[e] = 0.0f;
  __syncwarp();
  float sum = 0;
  for (int j = 0; j < k; ++j) {
    const int e = warp_argmax(masked, experts, lane);
    sum += score[e];
    if (lane == 0) {
      ids[t * k + j] = e;
      weights[t * k + j] = score[e];
    }
    __syncwarp();
    if (lane == 0) masked[e] = -INFINITY;
    __syncwarp();
  }
  if (lane == 0) {
    const float denom = normalize ? sum + 1e-20f : 1.0f;
    for (int j = 0; j < k; ++j) weights[t * k + j] = (normalize ? weights[t * k + j] / denom : weights[t * k + j]) * scaling;
  }
}

void check_rope(const MlaRopeArgs& rope, const char* who) {
  if (rope.dim <= 0 || rope.dim % 2 != 0 || rope.dim > 256)
    fail(ErrorKind::unsupported, std::string(who) + ": rope dim " + std::to_string(rope.dim) + " (need even, <= 256)");
}

}  // namespace

void rms_norm_rows(const float* x, int64_t ldx, int64_t n, int64_t d, const bf16_t* w, float eps, bf16_t* y, bf16_t* y_lo, Stream& s) {
  if (n <= 0) return;
  rms_norm_rows_kernel<<<static_cast<unsigned>(n), 256, 0, cs(s)>>>(x, ldx, d, w, eps, y, y_lo);
  HMOE_CUDA_LAUNCHED();
}

void mla_rope(float* x, int64_t ldx, int64_t hx, int64_t n, int64_t heads, const MlaRopeArgs& rope, const int32_t* pos, Stream& s) {
  check_rope(rope, "gpu::mla_rope");
  if (n <= 0 || heads <= 0) return;
  mla_rope_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), static_cast<unsigned>(rope.dim / 2), 0, cs(s)>>>(
      x, ldx, hx, rope.inv_freq, static_cast<int>(rope.dim), rope.attention_factor, rope.interleave, pos);
  HMOE_CUDA_LAUNCHED();
}

void mla_kv_store(const float* kv, int64_t ldkv, int64_t n, int64_t r, const bf16_t* norm_w, float eps, const MlaRopeArgs& rope,
                  const int32_t* pos, const int32_t* slots, bf16_t* cache, Stream& s) {
  check_rope(rope, "gpu::mla_kv_store");
  if (n <= 0) return;
  mla_kv_store_kernel<<<static_cast<unsigned>(n), 256, 0, cs(s)>>>(kv, ldkv, r, norm_w, eps, rope.inv_freq, static_cast<int>(rope.dim),
                                                                  rope.attention_factor, rope.interleave, pos, slots, cache);
  HMOE_CUDA_LAUNCHED();
}

void head_matmul(const float* x, int64_t ldx, int64_t hx, int64_t n, int64_t heads, int64_t in, int64_t out, const bf16_t* w, int64_t hw,
                 float* y, bf16_t* yb, int64_t ldy, int64_t hy, Stream& s) {
  if (in % 8 != 0 || hw % 8 != 0 || in > 2048 || reinterpret_cast<uintptr_t>(w) % 16 != 0)
    fail(ErrorKind::unsupported, "gpu::head_matmul: in (" + std::to_string(in) + ") and the head stride must be multiples of 8, in <= 2048, w 16-byte aligned");
  if (n <= 0 || heads <= 0 || out <= 0) return;
  const size_t smem = static_cast<size_t>(kHmTokens * in) * sizeof(float);
  const dim3 grid(static_cast<unsigned>((out + kHmRows - 1) / kHmRows), static_cast<unsigned>(heads));
  head_matmul_kernel<<<grid, kHmRows * 32, smem, cs(s)>>>(x, ldx, hx, static_cast<int>(n), static_cast<int>(in), static_cast<int>(out), w, hw, y,
                                                         yb, ldy, hy);
  HMOE_CUDA_LAUNCHED();
}

void gather_rows(const bf16_t* cache, int64_t ld, const int32_t* slot_lists, int64_t rows, int64_t cols, bf16_t* out, Stream& s) {
  if (rows <= 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(rows), 128, 0, cs(s)>>>(cache, ld, slot_lists, cols, out);
  HMOE_CUDA_LAUNCHED();
}

void mla_attention_expanded(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t nope, int64_t rope, int64_t vd, const float* kv,
                            const bf16_t* cache, int64_t lw, int64_t r, const int32_t* slot_lists, const int32_t* offsets,
                            const int32_t* lens, const int32_t* only, float scale, bf16_t* out, bf16_t* out_lo, Stream& s) {
  if (vd > kAttnThreads || nope + rope > 1024)
    fail(ErrorKind::unsupported, "gpu::mla_attention_expanded: v_head_dim " + std::to_string(vd) + " (need <= 128), qk_head_dim <= 1024");
  if (n <= 0) return;
  const size_t smem = static_cast<size_t>(nope + rope) * sizeof(float);
  mla_attention_expanded_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), kAttnThreads, smem, cs(s)>>>(
      q, ldq, static_cast<int>(heads), static_cast<int>(nope), static_cast<int>(rope), static_cast<int>(vd), kv, cache, lw, r, slot_lists, offsets,
      lens, only, scale, out, out_lo);
  HMOE_CUDA_LAUNCHED();
}

void deepseek_topk(const float* logits, const float* bias, int64_t n, int64_t experts, int64_t k, int64_t n_group, int64_t topk_group,
                   bool normalize, float scaling, int32_t* ids, float* weights, Stream& s) {
  if (experts <= 0 || experts > 4096 || n_group <= 0 || n_group > 64 || experts % n_group != 0 || topk_group <= 0 || topk_group > n_group ||
      k <= 0 || k > topk_group * (experts / n_group))
    fail(ErrorKind::invalid_argument, "gpu::deepseek_topk: inconsistent experts / k / n_group / topk_group (experts <= 4096, n_group <= 64)");
  if (n <= 0) return;
  const size_t smem = static_cast<size_t>(2 * experts + n_group) * sizeof(float);
  deepseek_topk_kernel<<<static_cast<unsigned>(n), 32, smem, cs(s)>>>(logits, bias, static_cast<int>(experts), static_cast<int>(k),
                                                                      static_cast<int>(n_group), static_cast<int>(topk_group), normalize, scaling,
                                                                      ids, weights);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
