// The Gated DeltaNet's memory-bound ends, vectorised (gpu/deltanet.h:
// deltanet_prepare and deltanet_gated_norm take these under
// DeltaNetKernel::v3 where the shape allows; gpu/deltanet.cu has the plain
// kernels they replace).
//
// Conv + gates: a warp per (tile of kTile ordered tokens, 128 conv channels),
// a lane per 4 channels (float4 loads of the fused product's rows, the
// conv weights in registers); per token the 4 taps' rows (the previous
// ones hit L1: the warp just read them), silu, and for q and k the head's
// sum of squares by shuffles among its dk / 4 lanes (heads never straddle a
// warp: 128 % dk == 0). One more slice of blocks per tile computes the
// gates. Needs conv_k 4, dk dividing 128 and a multiple of 4, dv and the
// product's row stride multiples of 4, 16-byte aligned buffers.
//
// Gated norm: a warp per (token, value head), a lane per 4 values (float4
// loads of the core output and of z, 8-byte bf16 stores). Needs dv and
// the row stride multiples of 4.
#include <cmath>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"
#include "gpu/deltanet_chunked.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kTile = 32;          // ordered tokens per conv warp
constexpr int kSpan = 128;         // conv channels per warp
constexpr int kConvWarps = 8;      // warps (spans) per conv block
constexpr int kBatch = 4;          // tokens whose rows are loaded together

struct IoDims {
  int nk, nv, dk, dv;
  int64_t cdim;
};

__device__ __forceinline__ float silu3(float x) { return x / (1.0f + expf(-x)); }

// Column of conv channel c ([q | k | v]) in the fused product's row (as gpu/deltanet.cu's conv_src).
__device__ __forceinline__ int64_t conv_col(int64_t c, const IoDims& d) {
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk, r = d.nv / d.nk, group = 2 * d.dk + 2 * r * d.dv;
  if (c < K) return (c / d.dk) * group + c % d.dk;
  if (c < 2 * K) return ((c - K) / d.dk) * group + d.dk + (c - K) % d.dk;
  const int64_t v = c - 2 * K;
  return (v / (r * d.dv)) * group + 2 * d.dk + v % (r * d.dv);
}
__device__ __forceinline__ int64_t z_col(int64_t j, const IoDims& d) {
  const int64_t r = d.nv / d.nk, group = 2 * d.dk + 2 * r * d.dv;
  return (j / (r * d.dv)) * group + 2 * d.dk + r * d.dv + j % (r * d.dv);
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Grid (token tiles, channel blocks + 1): blockIdx.y < channel blocks: conv; the last: gates.
__global__ void __launch_bounds__(kConvWarps * 32) prepare_v3_kernel(const float* proj, int64_t ld, DeltaNetGroups gr, int64_t tok0, int64_t ntok,
                                                                     IoDims d, const float* conv_w, const float* a_neg, const float* dt_bias,
                                                                     int64_t state_off, float* conv_out, float* gate, float* beta, float qscale) {
  const int64_t i0 = tok0 + static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t i1 = min(i0 + kTile, tok0 + ntok);
  if (blockIdx.y == gridDim.y - 1) {  // gates: beta = sigmoid(b), gate = a_neg softplus(a + dt_bias)
    const int r = d.nv / d.nk;
    const int64_t ba_off = 2 * static_cast<int64_t>(d.nk) * d.dk + 2 * static_cast<int64_t>(d.nv) * d.dv;
    for (int64_t p = threadIdx.x; p < (i1 - i0) * d.nv; p += blockDim.x) {
      const int64_t i = i0 + p / d.nv;
      const int hv = static_cast<int>(p % d.nv), gk = hv / r, j = hv % r;
      const float* ba = proj + static_cast<int64_t>(gr.order[i]) * ld + ba_off;
      const float b = ba[gk * 2 * r + j], a = ba[gk * 2 * r + r + j] + dt_bias[hv];
      const float sp = a > 20.0f ? a : log1pf(expf(a));
      beta[i * d.nv + hv] = 1.0f / (1.0f + expf(-b));
      gate[i * d.nv + hv] = a_neg[hv] * sp;
    }
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kConvWarps + warp) * kSpan + lane * 4;
  if (c - lane * 4 >= d.cdim) return;  // the whole warp past the channels
  const bool active = c < d.cdim;
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk, src = active ? conv_col(c, d) : 0;
  float w[4][4];  // [channel][tap]
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 v = active ? ld4(conv_w + (c + k) * 4) : make_float4(0, 0, 0, 0);
    w[k][0] = v.x;
    w[k][1] = v.y;
    w[k][2] = v.z;
    w[k][3] = v.w;
  }
  const bool normed = c < 2 * K;
  const float scale = c < K ? qscale : 1.0f;
  const int seg = d.dk / 4;  // lanes per q / k head (a power of two: dk divides 128)
  for (int64_t ib = i0; ib < i1; ib += kBatch) {
    float4 x[kBatch][4];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = ib + u;
#pragma unroll
      for (int j = 0; j < 4; ++j) x[u][j] = make_float4(0, 0, 0, 0);
      if (i >= i1 || !active) continue;
      const int g = gr.tok_group[i];
      const int64_t st = gr.start[g], t = i - st;
      const bool fresh = gr.fresh[g] != 0;
      const float* win = reinterpret_cast<const float*>(static_cast<uintptr_t>(gr.state[g]) + static_cast<uintptr_t>(state_off));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t tp = t - 3 + j;  // the input's position in the sequence's step (< 0: the window)
        if (tp < 0) {
          if (!fresh) x[u][j] = ld4(win + (3 + tp) * d.cdim + c);
        } else {
          x[u][j] = ld4(proj + static_cast<int64_t>(gr.order[st + tp]) * ld + src);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      float o[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        auto comp = [&](const float4& v) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; };
        const float a = w[k][0] * comp(x[u][0]) + w[k][1] * comp(x[u][1]) + w[k][2] * comp(x[u][2]) + w[k][3] * comp(x[u][3]);
        o[k] = silu3(a);
      }
      float ss = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3];
      for (int off = seg >> 1; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      const int64_t i = ib + u;
      if (i >= i1 || !active) continue;
      const float inv = normed ? scale / sqrtf(ss + 1e-6f) : 1.0f;
      *reinterpret_cast<float4*>(conv_out + i * d.cdim + c) = make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
    }
  }
}

__device__ __forceinline__ uint32_t pack_bf2(float a, float b) {
  return static_cast<uint32_t>(f2bf(a)) | (static_cast<uint32_t>(f2bf(b)) << 16);
}

// A warp per (ordered token, value head): blocks of 8 warps over tok0 + [0, ntok) x nv.
__global__ void __launch_bounds__(256) gated_norm_v3_kernel(const float* core, const float* proj, int64_t ld, DeltaNetGroups gr, int64_t tok0,
                                                            int64_t ntok, IoDims d, const float* w, float eps, uint16_t* y, uint16_t* y_lo, int64_t row0) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (item >= ntok * d.nv) return;
  const int lane = threadIdx.x & 31, hv = static_cast<int>(item % d.nv);
  const int64_t i = tok0 + item / d.nv, row = gr.order[i], V = static_cast<int64_t>(d.nv) * d.dv, out_row = row - row0;
  const float* o = core + i * V + static_cast<int64_t>(hv) * d.dv;
  constexpr int kMax = 4;  // float4s per lane: dv <= 512
  const int n4 = d.dv / 4;
  float4 v[kMax];
  float ss = 0;
#pragma unroll
  for (int m = 0; m < kMax; ++m) {
    const int p = lane + 32 * m;
    v[m] = p < n4 ? ld4(o + 4 * p) : make_float4(0, 0, 0, 0);
    ss += v[m].x * v[m].x + v[m].y * v[m].y + v[m].z * v[m].z + v[m].w * v[m].w;
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(d.dv) + eps);
#pragma unroll
  for (int m = 0; m < kMax; ++m) {
    const int p = lane + 32 * m;
    if (p >= n4) continue;
    const int64_t col = static_cast<int64_t>(hv) * d.dv + 4 * p;
    const float4 z = ld4(proj + row * ld + z_col(col, d));
    const float4 ww = ld4(w + 4 * p);
    const float a0 = ww.x * (v[m].x * inv) * silu3(z.x), a1 = ww.y * (v[m].y * inv) * silu3(z.y);
    const float a2 = ww.z * (v[m].z * inv) * silu3(z.z), a3 = ww.w * (v[m].w * inv) * silu3(z.w);
    const uint2 hi = make_uint2(pack_bf2(a0, a1), pack_bf2(a2, a3));
    *reinterpret_cast<uint2*>(y + out_row * V + col) = hi;
    if (y_lo) {
      const float h0 = bf2f(static_cast<uint16_t>(hi.x & 0xffff)), h1 = bf2f(static_cast<uint16_t>(hi.x >> 16));
      const float h2 = bf2f(static_cast<uint16_t>(hi.y & 0xffff)), h3 = bf2f(static_cast<uint16_t>(hi.y >> 16));
      *reinterpret_cast<uint2*>(y_lo + out_row * V + col) = make_uint2(pack_bf2(a0 - h0, a1 - h1), pack_bf2(a2 - h2, a3 - h3));
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
IoDims io_dims(const DeltaNetShape& sh) {
  return {static_cast<int>(sh.nk), static_cast<int>(sh.nv), static_cast<int>(sh.dk), static_cast<int>(sh.dv), sh.conv_dim()};
}

}  // namespace

bool deltanet_prepare_v3(const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok, const DeltaNetShape& sh,
                         const float* conv_w, const float* a_neg, const float* dt_bias, int64_t state_off, float* conv_out, float* gate, float* beta,
                         Stream& s) {
  if (sh.conv_k != 4 || sh.dk % 4 != 0 || kSpan % sh.dk != 0 || sh.dv % 4 != 0 || ld % 4 != 0 || state_off % 16 != 0) return false;
  if (!aligned16(proj) || !aligned16(conv_w) || !aligned16(conv_out)) return false;
  if (ntok <= 0) return true;
  const float qscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sh.dk)));
  const int64_t blocks_c = (sh.conv_dim() + kSpan * kConvWarps - 1) / (kSpan * kConvWarps);
  const dim3 grid(static_cast<unsigned>((ntok + kTile - 1) / kTile), static_cast<unsigned>(blocks_c + 1));
  prepare_v3_kernel<<<grid, kConvWarps * 32, 0, cs(s)>>>(proj, ld, gr, tok0, ntok, io_dims(sh), conv_w, a_neg, dt_bias, state_off, conv_out, gate, beta,
                                                         qscale);
  HMOE_CUDA_LAUNCHED();
  return true;
}

bool deltanet_gated_norm_v3(const float* core, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok,
                            const DeltaNetShape& sh, const float* w, float eps, uint16_t* y, Stream& s, uint16_t* y_lo, int64_t row0) {
  if (sh.dv % 4 != 0 || sh.dv > 512 || ld % 4 != 0 || (sh.nv / sh.nk * sh.dv) % 4 != 0) return false;
  if (!aligned16(core) || !aligned16(proj) || !aligned16(w) || (reinterpret_cast<uintptr_t>(y) & 7) != 0 ||
      (y_lo && (reinterpret_cast<uintptr_t>(y_lo) & 7) != 0))
    return false;
  if (ntok <= 0) return true;
  const int64_t items = ntok * sh.nv;
  gated_norm_v3_kernel<<<static_cast<unsigned>((items + 7) / 8), 256, 0, cs(s)>>>(core, proj, ld, gr, tok0, ntok, io_dims(sh), w, eps, y, y_lo, row0);
  HMOE_CUDA_LAUNCHED();
  return true;
}

}  // namespace hmoe::gpu
