// Gated DeltaNet on the GPU (see deltanet.h): the conv + silu + q/k norm +
// gates per token, the conv window update per sequence, the delta rule as a
// chunked kernel for prompts and a one-step recurrence for decode, and the
// gated output norm.
//
// The chunked kernel v1 (v2: gpu/deltanet_chunked.cu): one block per (sequence, value head, slice of
// up to 32 value columns); the columns of the state are independent in the
// delta rule, so slices split the work without talking to each other. Per
// chunk of C tokens, in shared memory: k and q rows, the decays' running
// sum G, A[i][j] = beta_i exp(G_i - G_j) k_i.k_j (j < i) and
// QK[i][j] = exp(G_i - G_j) q_i.k_j (j <= i); the updates
// u = (I + A)^-1 (beta (v - exp(G) S0^T k)) by forward substitution (one warp,
// column per lane), then o = exp(G) S0^T q + QK u and the state
// S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j u_j^T. Chunks run in order.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"
#include "gpu/deltanet_chunked.h"
#include "gpu/deltanet_io.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

struct Dims {
  int nk, nv, dk, dv, ck;
  int64_t cdim;
};
Dims dims(const DeltaNetShape& sh) {
  return {static_cast<int>(sh.nk), static_cast<int>(sh.nv), static_cast<int>(sh.dk), static_cast<int>(sh.dv), static_cast<int>(sh.conv_k),
          sh.conv_dim()};
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// Column of conv channel c ([q | k | v]) in the fused product's row.
__device__ __forceinline__ int64_t conv_src(int64_t c, const Dims& d) {
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk, r = d.nv / d.nk, group = 2 * d.dk + 2 * r * d.dv;
  if (c < K) return (c / d.dk) * group + c % d.dk;
  if (c < 2 * K) return ((c - K) / d.dk) * group + d.dk + (c - K) % d.dk;
  const int64_t v = c - 2 * K;
  return (v / (r * d.dv)) * group + 2 * d.dk + v % (r * d.dv);
}
__device__ __forceinline__ int64_t z_src(int64_t j, const Dims& d) {
  const int64_t r = d.nv / d.nk, group = 2 * d.dk + 2 * r * d.dv;
  return (j / (r * d.dv)) * group + 2 * d.dk + r * d.dv + j % (r * d.dv);
}
__device__ __forceinline__ float* state_of(const DeltaNetGroups& gr, int g, int64_t off) {
  return reinterpret_cast<float*>(static_cast<uintptr_t>(gr.state[g]) + static_cast<uintptr_t>(off));
}

__global__ void prepare_kernel(const float* proj, int64_t ld, DeltaNetGroups gr, int64_t tok0, Dims d, const float* conv_w, const float* a_neg,
                               const float* dt_bias, int64_t state_off, float* conv_out, float* gate, float* beta, float qscale) {
  extern __shared__ float sm[];
  const int64_t i = tok0 + blockIdx.x;
  const int g = gr.tok_group[i];
  const int64_t st = gr.start[g], t = i - st, W = d.ck - 1;
  const bool fresh = gr.fresh[g] != 0;
  const float* win = state_of(gr, g, state_off);
  for (int64_t c = threadIdx.x; c < d.cdim; c += blockDim.x) {
    const int64_t sc = conv_src(c, d);
    float acc = 0;
    for (int j = 0; j < d.ck; ++j) {
      const int64_t e = t + j;
      const float x = e < W ? (fresh ? 0.0f : win[e * d.cdim + c]) : proj[static_cast<int64_t>(gr.order[st + e - W]) * ld + sc];
      acc += conv_w[c * d.ck + j] * x;
    }
    sm[c] = silu_f(acc);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int h = warp; h < 2 * d.nk; h += warps) {
    float* v = sm + static_cast<int64_t>(h) * d.dk;
    float ss = 0;
    for (int j = lane; j < d.dk; j += 32) ss += v[j] * v[j];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss + 1e-6f) * (h < d.nk ? qscale : 1.0f);
    __syncwarp();
    for (int j = lane; j < d.dk; j += 32) v[j] *= inv;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d.cdim; c += blockDim.x) conv_out[i * d.cdim + c] = sm[c];
  if (threadIdx.x < d.nv) {
    const int hv = threadIdx.x, r = d.nv / d.nk, gk = hv / r, j = hv % r;
    const float* ba = proj + static_cast<int64_t>(gr.order[i]) * ld + 2 * static_cast<int64_t>(d.nk) * d.dk + 2 * static_cast<int64_t>(d.nv) * d.dv;
    const float b = ba[gk * 2 * r + j], a = ba[gk * 2 * r + r + j] + dt_bias[hv];
    const float sp = a > 20.0f ? a : log1pf(expf(a));
    beta[i * d.nv + hv] = sigmoid_f(b);
    gate[i * d.nv + hv] = a_neg[hv] * sp;
  }
}

__global__ void conv_window_kernel(const float* proj, int64_t ld, DeltaNetGroups gr, int64_t g0, Dims d, int64_t state_off) {
  const int g = static_cast<int>(g0 + blockIdx.x);
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= d.cdim) return;
  const int64_t cnt = gr.count[g], st = gr.start[g], W = d.ck - 1, sc = conv_src(c, d);
  const bool fresh = gr.fresh[g] != 0;
  float* win = state_of(gr, g, state_off);
  auto input = [&](int64_t e) { return e < W ? (fresh ? 0.0f : win[e * d.cdim + c]) : proj[static_cast<int64_t>(gr.order[st + e - W]) * ld + sc]; };
  constexpr int kMaxW = 8;
  if (W <= kMaxW) {  // every new row loaded before any is stored: the loads overlap
    float v[kMaxW];
#pragma unroll
    for (int j = 0; j < kMaxW; ++j)
      if (j < W) v[j] = input(cnt + j);
#pragma unroll
    for (int j = 0; j < kMaxW; ++j)
      if (j < W) win[j * d.cdim + c] = v[j];
    return;
  }
  for (int64_t j = 0; j < W; ++j) win[j * d.cdim + c] = input(cnt + j);  // reads index cnt + j > j: not yet overwritten
}

constexpr int kSlice = 32;  // value columns per block
constexpr int kChunkThreads = 256;

int64_t chunk_smem_floats(const Dims& d, int64_t C) {
  const int64_t dvs = std::min<int64_t>(d.dv, kSlice);
  return d.dk * dvs + 2 * C * d.dk + 2 * C * C + C * dvs + 3 * C;
}

__global__ void __launch_bounds__(kChunkThreads) chunked_kernel(const float* conv_out, const float* gate, const float* beta, DeltaNetGroups gr,
                                                                int64_t g0, Dims d, int64_t state_off, int64_t max_rec, int C, float* out) {
  const int g = static_cast<int>(g0 + blockIdx.x);
  const int64_t cnt = gr.count[g];
  if (cnt <= max_rec) return;
  const int hv = blockIdx.y, hk = hv / (d.nv / d.nk), DVS = d.dv < kSlice ? d.dv : kSlice;
  const int c0 = blockIdx.z * DVS, nc = min(DVS, d.dv - c0);
  const int64_t st = gr.start[g], K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const bool fresh = gr.fresh[g] != 0;
  float* S = state_of(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * d.dk * d.dv;
  extern __shared__ float sm[];
  float* Ss = sm;                 // [dk][DVS]
  float* ks = Ss + d.dk * DVS;    // [C][dk]
  float* qs = ks + C * d.dk;      // [C][dk]
  float* A = qs + C * d.dk;       // [C][C]
  float* QK = A + C * C;          // [C][C]
  float* us = QK + C * C;         // [C][DVS]
  float* G = us + C * DVS;        // [C]
  float* bt = G + C;              // [C]
  float* dj = bt + C;             // [C] exp(G_last - G_j)
  const int tid = threadIdx.x, bd = blockDim.x;
  for (int p = tid; p < d.dk * DVS; p += bd) {
    const int r = p / DVS, c = p % DVS;
    Ss[p] = fresh || c >= nc ? 0.0f : S[static_cast<int64_t>(r) * d.dv + c0 + c];
  }
  for (int64_t cs = 0; cs < cnt; cs += C) {
    const int L = static_cast<int>(min(static_cast<int64_t>(C), cnt - cs));
    for (int p = tid; p < L * d.dk; p += bd) {
      const int i = p / d.dk, r = p % d.dk;
      const float* row = conv_out + (st + cs + i) * d.cdim + static_cast<int64_t>(hk) * d.dk;
      qs[p] = row[r];
      ks[p] = row[K + r];
    }
    if (tid == 0) {
      float acc = 0;
      for (int i = 0; i < L; ++i) {
        acc += gate[(st + cs + i) * d.nv + hv];
        G[i] = acc;
        bt[i] = beta[(st + cs + i) * d.nv + hv];
      }
      for (int j = 0; j < L; ++j) dj[j] = expf(G[L - 1] - G[j]);
    }
    __syncthreads();
    for (int p = tid; p < L * L; p += bd) {
      const int i = p / L, j = p % L;
      if (j > i) continue;
      const float* qi = qs + i * d.dk;
      const float* ki = ks + i * d.dk;
      const float* kj = ks + j * d.dk;
      float dq = 0, dk = 0;
      for (int r = 0; r < d.dk; ++r) {
        dq += qi[r] * kj[r];
        dk += ki[r] * kj[r];
      }
      const float e = expf(G[i] - G[j]);
      QK[i * C + j] = e * dq;
      A[i * C + j] = j < i ? bt[i] * e * dk : 0.0f;
    }
    for (int p = tid; p < L * DVS; p += bd) {
      const int i = p / DVS, c = p % DVS;
      if (c >= nc) {
        us[p] = 0;
        continue;
      }
      const float* ki = ks + i * d.dk;
      float s = 0;
      for (int r = 0; r < d.dk; ++r) s += Ss[r * DVS + c] * ki[r];
      const float v = conv_out[(st + cs + i) * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + c0 + c];
      us[p] = bt[i] * (v - expf(G[i]) * s);
    }
    __syncthreads();
    if (tid < 32) {  // forward substitution: u_i -= sum_{j<i} A[i][j] u_j, a column per lane
      for (int i = 1; i < L; ++i) {
        if (tid < DVS) {
          float acc = us[i * DVS + tid];
          for (int j = 0; j < i; ++j) acc -= A[i * C + j] * us[j * DVS + tid];
          us[i * DVS + tid] = acc;
        }
        __syncwarp();
      }
    }
    __syncthreads();
    for (int p = tid; p < L * nc; p += bd) {
      const int i = p / nc, c = p % nc;
      const float* qi = qs + i * d.dk;
      float s = 0;
      for (int r = 0; r < d.dk; ++r) s += qi[r] * Ss[r * DVS + c];
      float o = expf(G[i]) * s;
      for (int j = 0; j <= i; ++j) o += QK[i * C + j] * us[j * DVS + c];
      out[(st + cs + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c] = o;
    }
    __syncthreads();
    const float last = expf(G[L - 1]);
    for (int p = tid; p < d.dk * nc; p += bd) {
      const int r = p / nc, c = p % nc;
      float s = last * Ss[r * DVS + c];
      for (int j = 0; j < L; ++j) s += dj[j] * ks[j * d.dk + r] * us[j * DVS + c];
      Ss[r * DVS + c] = s;
    }
    __syncthreads();
  }
  for (int p = tid; p < d.dk * nc; p += bd) {
    const int r = p / nc, c = p % nc;
    S[static_cast<int64_t>(r) * d.dv + c0 + c] = Ss[r * DVS + c];
  }
}

constexpr int kRecSlices = 4;  // row slices per column in the recurrent kernel
__global__ void __launch_bounds__(kSlice * kRecSlices) recurrent_kernel(const float* conv_out, const float* gate, const float* beta, DeltaNetGroups gr,
                                                                        int64_t g0, Dims d, int64_t state_off, int64_t max_rec, float* out) {
  const int g = static_cast<int>(g0 + blockIdx.x);
  const int64_t cnt = gr.count[g];
  if (cnt > max_rec) return;
  const int hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int lane = threadIdx.x % kSlice, sl = threadIdx.x / kSlice, col = blockIdx.z * kSlice + lane;
  const bool active = col < d.dv;
  const int64_t st = gr.start[g], K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  bool zero = gr.fresh[g] != 0;
  float* S = state_of(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * d.dk * d.dv;
  extern __shared__ float sm[];
  float* ks = sm;
  float* qs = ks + d.dk;
  __shared__ float red[kRecSlices][kSlice];
  for (int64_t t = 0; t < cnt; ++t) {
    const int64_t i = st + t;
    const float* row = conv_out + i * d.cdim + static_cast<int64_t>(hk) * d.dk;
    for (int r = threadIdx.x; r < d.dk; r += blockDim.x) {
      qs[r] = row[r];
      ks[r] = row[K + r];
    }
    const float decay = expf(gate[i * d.nv + hv]), b = beta[i * d.nv + hv];
    __syncthreads();
    float part = 0;
    if (active && !zero)
      for (int r = sl; r < d.dk; r += kRecSlices) part += S[static_cast<int64_t>(r) * d.dv + col] * ks[r];
    red[sl][lane] = part;
    __syncthreads();
    float kv = 0;
    for (int x = 0; x < kRecSlices; ++x) kv += red[x][lane];
    const float v = active ? conv_out[i * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + col] : 0.0f;
    const float u = b * (v - decay * kv);
    part = 0;
    if (active)
      for (int r = sl; r < d.dk; r += kRecSlices) {
        float* sp = S + static_cast<int64_t>(r) * d.dv + col;
        const float s = (zero ? 0.0f : decay * *sp) + ks[r] * u;
        *sp = s;
        part += s * qs[r];
      }
    __syncthreads();
    red[sl][lane] = part;
    __syncthreads();
    if (sl == 0 && active) {
      float o = 0;
      for (int x = 0; x < kRecSlices; ++x) o += red[x][lane];
      out[i * V + static_cast<int64_t>(hv) * d.dv + col] = o;
    }
    zero = false;
    __syncthreads();
  }
}

__global__ void gated_norm_kernel(const float* core, const float* proj, int64_t ld, DeltaNetGroups gr, int64_t tok0, Dims d, const float* w, float eps,
                                  uint16_t* y, uint16_t* y_lo, int64_t row0) {
  const int64_t i = tok0 + blockIdx.x, row = gr.order[i], V = static_cast<int64_t>(d.nv) * d.dv, out_row = row - row0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int hv = warp; hv < d.nv; hv += warps) {
    const float* o = core + i * V + static_cast<int64_t>(hv) * d.dv;
    float ss = 0;
    for (int j = lane; j < d.dv; j += 32) ss += o[j] * o[j];
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / static_cast<float>(d.dv) + eps);
    for (int j = lane; j < d.dv; j += 32) {
      const int64_t col = static_cast<int64_t>(hv) * d.dv + j;
      const float z = proj[row * ld + z_src(col, d)];
      const float val = w[j] * (o[j] * inv) * silu_f(z);
      const uint16_t hi = f2bf(val);
      y[out_row * V + col] = hi;
      if (y_lo) y_lo[out_row * V + col] = f2bf(val - bf2f(hi));
    }
  }
}

void check_shape(const DeltaNetShape& sh) {
  if (sh.nk <= 0 || sh.nv % sh.nk != 0 || sh.dk <= 0 || sh.dv <= 0 || sh.conv_k < 1 || sh.nv > 1024)
    fail(ErrorKind::unsupported, "gated deltanet on the GPU: value heads must be a multiple of key heads (<= 1024)");
}

int64_t smem_limit() { return smem_optin_limit(); }

// Tokens per chunk: `chunk` (0: 64), halved until the chunk's shared memory fits.
int chunk_of(const Dims& d, int64_t chunk) {
  int C = chunk > 0 ? static_cast<int>(std::min<int64_t>(chunk, 64)) : 64;
  while (C > 1 && chunk_smem_floats(d, C) * 4 > smem_limit()) C /= 2;
  if (chunk_smem_floats(d, C) * 4 > smem_limit())
    fail(ErrorKind::unsupported, "gated deltanet on the GPU: key head dimension " + std::to_string(d.dk) + " needs more shared memory than the GPU has");
  return C;
}

size_t configured_smem = 48 * 1024;  // the chunked kernel's opt-in so far

void ensure_smem(size_t bytes) {
  if (bytes <= configured_smem) return;
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  configured_smem = bytes;
}

}  // namespace

namespace {
std::atomic<DeltaNetKernel> chosen_kernel{DeltaNetKernel::v1};
}
void set_deltanet_kernel(DeltaNetKernel k) { chosen_kernel.store(k); }
DeltaNetKernel deltanet_kernel() { return chosen_kernel.load(); }

int64_t deltanet_layer_state_bytes(const DeltaNetShape& sh) {
  const int64_t floats = (sh.conv_k - 1) * sh.conv_dim() + sh.nv * sh.dk * sh.dv;
  return (floats * 4 + 255) / 256 * 256;
}

void deltanet_configure(const DeltaNetShape& sh) {
  check_shape(sh);
  const Dims d = dims(sh);
  ensure_smem(static_cast<size_t>(chunk_smem_floats(d, chunk_of(d, 0))) * 4);
  if (deltanet_kernel() == DeltaNetKernel::v2) deltanet_v2_configure();  // v2's and v3's launches do it too (tests, benchmarks)
  if (deltanet_kernel() == DeltaNetKernel::v3) deltanet_v3_configure();
  if (deltanet_kernel() == DeltaNetKernel::v4) deltanet_v4_configure();
  if (deltanet_kernel() == DeltaNetKernel::v5) deltanet_v5_configure();
}

void deltanet_prepare(const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok, const DeltaNetShape& sh,
                      const float* conv_w, const float* a_neg, const float* dt_bias, int64_t state_off, float* conv_out, float* gate,
                      float* beta, Stream& s) {
  check_shape(sh);
  if (ntok <= 0) return;
  const DeltaNetIo io = deltanet_io();
  if (io != DeltaNetIo::plain &&
      deltanet_prepare_vec(io == DeltaNetIo::vec1 ? 1 : 2, proj, ld, gr, tok0, ntok, sh, conv_w, a_neg, dt_bias, state_off, conv_out, gate, beta, s))
    return;
  if (sh.conv_dim() * 4 > 48 * 1024) fail(ErrorKind::unsupported, "gated deltanet on the GPU: conv_dim above 12288");
  const float qscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sh.dk)));
  const int threads = static_cast<int>(std::max<int64_t>(256, (sh.nv + 31) / 32 * 32));
  prepare_kernel<<<static_cast<unsigned>(ntok), threads, static_cast<size_t>(sh.conv_dim()) * 4, cs(s)>>>(proj, ld, gr, tok0, dims(sh), conv_w, a_neg,
                                                                                                      dt_bias, state_off, conv_out, gate, beta, qscale);
  HMOE_CUDA_LAUNCHED();
}

void deltanet_conv_window(const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const DeltaNetShape& sh,
                          int64_t state_off, Stream& s) {
  check_shape(sh);
  if (gn <= 0 || sh.conv_k < 2) return;
  const dim3 grid(static_cast<unsigned>(gn), static_cast<unsigned>((sh.conv_dim() + 255) / 256));
  conv_window_kernel<<<grid, 256, 0, cs(s)>>>(proj, ld, gr, g0, dims(sh), state_off);
  HMOE_CUDA_LAUNCHED();
}

void deltanet_chunked(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                      const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t chunk, float* out, Stream& s) {
  check_shape(sh);
  if (gn <= 0) return;
  const Dims d = dims(sh);
  const int C = chunk_of(d, chunk);
  const size_t smem = static_cast<size_t>(chunk_smem_floats(d, C)) * 4;
  ensure_smem(smem);
  const int dvs = static_cast<int>(std::min<int64_t>(sh.dv, kSlice));
  const dim3 grid(static_cast<unsigned>(gn), static_cast<unsigned>(sh.nv), static_cast<unsigned>((sh.dv + dvs - 1) / dvs));
  chunked_kernel<<<grid, kChunkThreads, smem, cs(s)>>>(conv_out, gate, beta, gr, g0, d, state_off, max_recurrent, C, out);
  HMOE_CUDA_LAUNCHED();
}

void deltanet_chunked(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                      const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t chunk, float* out, Stream& s, DeltaNetKernel kernel,
                      int64_t ntok, void* scratch) {
  check_shape(sh);
  if (kernel == DeltaNetKernel::v5) {
    const int64_t c5 = deltanet_v5_chunk(sh, chunk);
    if (c5 > 0)
      return deltanet_chunked_v5(conv_out, gate, beta, gr, g0, gn, sh, state_off, max_recurrent, c5, deltanet_v2_slots(ntok, gn, c5), scratch, out, s);
  }
  if (kernel == DeltaNetKernel::v4) {
    const int64_t c4 = deltanet_v4_chunk(sh, chunk);
    if (c4 > 0)
      return deltanet_chunked_v4(conv_out, gate, beta, gr, g0, gn, sh, state_off, max_recurrent, c4, deltanet_v2_slots(ntok, gn, c4), scratch, out, s);
  }
  if (kernel == DeltaNetKernel::v3) {
    const int64_t c3 = deltanet_v3_chunk(sh, chunk);
    if (c3 > 0)
      return deltanet_chunked_v3(conv_out, gate, beta, gr, g0, gn, sh, state_off, max_recurrent, c3, deltanet_v2_slots(ntok, gn, c3), scratch, out, s);
  }
  const int64_t c2 = kernel == DeltaNetKernel::v2 ? deltanet_v2_chunk(sh, chunk) : 0;
  if (c2 == 0) return deltanet_chunked(conv_out, gate, beta, gr, g0, gn, sh, state_off, max_recurrent, chunk, out, s);
  deltanet_chunked_v2(conv_out, gate, beta, gr, g0, gn, sh, state_off, max_recurrent, c2, deltanet_v2_slots(ntok, gn, c2), scratch, out, s);
}

int64_t deltanet_chunked_scratch_bytes(const DeltaNetShape& sh, DeltaNetKernel kernel, int64_t chunk, int64_t ntok, int64_t gn) {
  if (kernel == DeltaNetKernel::v5) {
    const int64_t c = deltanet_v5_chunk(sh, chunk);
    return deltanet_v5_scratch_bytes(sh, c, deltanet_v2_slots(ntok, gn, c));
  }
  if (kernel == DeltaNetKernel::v4) {
    const int64_t c = deltanet_v4_chunk(sh, chunk);
    return deltanet_v4_scratch_bytes(sh, c, deltanet_v2_slots(ntok, gn, c));
  }
  if (kernel == DeltaNetKernel::v3) {
    const int64_t c = deltanet_v3_chunk(sh, chunk);
    return deltanet_v3_scratch_bytes(sh, c, deltanet_v2_slots(ntok, gn, c));
  }
  if (kernel == DeltaNetKernel::v2) {
    const int64_t c = deltanet_v2_chunk(sh, chunk);
    return deltanet_v2_scratch_bytes(sh, c, deltanet_v2_slots(ntok, gn, c));
  }
  return 0;
}

void deltanet_recurrent(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                        const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, float* out, Stream& s) {
  check_shape(sh);
  if (gn <= 0) return;
  const dim3 grid(static_cast<unsigned>(gn), static_cast<unsigned>(sh.nv), static_cast<unsigned>((sh.dv + kSlice - 1) / kSlice));
  recurrent_kernel<<<grid, kSlice * kRecSlices, static_cast<size_t>(2 * sh.dk) * 4, cs(s)>>>(conv_out, gate, beta, gr, g0, dims(sh), state_off,
                                                                                             max_recurrent, out);
  HMOE_CUDA_LAUNCHED();
}

void deltanet_gated_norm(const float* core, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok,
                         const DeltaNetShape& sh, const float* w, float eps, uint16_t* y, Stream& s, uint16_t* y_lo, int64_t row0) {
  check_shape(sh);
  if (ntok <= 0) return;
  if (deltanet_io() != DeltaNetIo::plain && deltanet_gated_norm_vec(core, proj, ld, gr, tok0, ntok, sh, w, eps, y, s, y_lo, row0)) return;
  gated_norm_kernel<<<static_cast<unsigned>(ntok), 256, 0, cs(s)>>>(core, proj, ld, gr, tok0, dims(sh), w, eps, y, y_lo, row0);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
