// The Gated DeltaNet's memory-bound ends, vectorised (gpu/deltanet_io.h;
// deltanet_prepare and deltanet_gated_norm take them where the shape
// allows, whatever the delta-rule kernel; gpu/deltanet.cu has the plain
// kernels they replace).
//
// Conv + gates, v1 (tiled): a warp per (tile of kTile ordered tokens, 128
// conv channels), a lane per 4 channels (float4 loads of the fused
// product's rows, the conv weights in registers); per token the 4 taps'
// rows (the previous ones hit L1: the warp just read them), silu, and for q
// and k the head's sum of squares by shuffles among its dk / 4 lanes (heads
// never straddle a warp: 128 % dk == 0). One more slice of blocks per tile
// computes the gates.
// v2 (sliding): the same slices, but a warp's token indices (batch row,
// group, position in the sequence) are loaded once per 32 tokens, a lane
// per token, and handed out by shuffles (v1 chained four dependent loads,
// group, start, order, row, per batch of 4 tokens); each token's row is
// loaded once (8 tokens' rows in flight per warp) and the taps slide in
// registers: only a tile's first token and a sequence's first token read
// earlier taps from the window or from rows before the tile. Tiles are as
// long as makes one resident wave of blocks (v1's 32-token tiles made 1.5
// waves of a 2048-token step on an H100, the last one half empty).
//
// Gated norm: a warp per (token, value head), a lane per 4 values (float4
// loads of the core output and of z, 8-byte bf16 stores).
#include <algorithm>
#include <atomic>
#include <cmath>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"
#include "gpu/deltanet_io.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kTile = 32;          // ordered tokens per conv warp
constexpr int kSpan = 128;         // conv channels per warp
constexpr int kConvWarps = 8;      // warps (spans) per conv block
constexpr int kBatch = 4;          // v1: tokens whose rows are loaded together
constexpr int kSlide = 8;          // v2: tokens whose new rows are loaded together

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
// Read-only for the kernel's lifetime (the fused product's rows, the window).
__device__ __forceinline__ float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// The gates of ordered tokens [i0, i1): beta = sigmoid(b), gate = a_neg softplus(a + dt_bias); a block's threads.
__device__ __forceinline__ void gates_slice(const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t i0, int64_t i1, const IoDims& d,
                                            const float* a_neg, const float* dt_bias, float* gate, float* beta) {
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
}

// Lane's 4 channels of one token: the conv over taps x0..x3 (oldest first), silu, the q / k head's l2 norm (times
// scale) where normed; every lane of the warp takes part (the norm's shuffles).
__device__ __forceinline__ float4 conv_token(const float (&w)[4][4], const float4& x0, const float4& x1, const float4& x2, const float4& x3,
                                             int seg, bool normed, float scale) {
  float o[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    auto comp = [&](const float4& v) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; };
    o[k] = silu3(w[k][0] * comp(x0) + w[k][1] * comp(x1) + w[k][2] * comp(x2) + w[k][3] * comp(x3));
  }
  float ss = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3];
  for (int off = seg >> 1; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = normed ? scale / sqrtf(ss + 1e-6f) : 1.0f;
  return make_float4(o[0] * inv, o[1] * inv, o[2] * inv, o[3] * inv);
}

// Grid (token tiles, channel blocks + 1): blockIdx.y < channel blocks: conv; the last: gates.
__global__ void __launch_bounds__(kConvWarps * 32) prepare_tiled_kernel(const float* proj, int64_t ld, DeltaNetGroups gr, int64_t tok0, int64_t ntok,
                                                                     IoDims d, const float* conv_w, const float* a_neg, const float* dt_bias,
                                                                     int64_t state_off, float* conv_out, float* gate, float* beta, float qscale) {
  const int64_t i0 = tok0 + static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t i1 = min(i0 + kTile, tok0 + ntok);
  if (blockIdx.y == gridDim.y - 1) return gates_slice(proj, ld, gr, i0, i1, d, a_neg, dt_bias, gate, beta);
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
      const float4 o = conv_token(w, x[u][0], x[u][1], x[u][2], x[u][3], seg, normed, scale);
      const int64_t i = ib + u;
      if (i >= i1 || !active) continue;
      *reinterpret_cast<float4*>(conv_out + i * d.cdim + c) = o;
    }
  }
}

// v2. Grid (token tiles of `tile`, channel blocks + 1 for the gates); a warp walks its tile in chunks of 32 tokens.
__global__ void __launch_bounds__(kConvWarps * 32, 3) prepare_sliding_kernel(const float* __restrict__ proj, int64_t ld, DeltaNetGroups gr, int64_t tok0,
                                                                          int64_t ntok, int tile, IoDims d, const float* __restrict__ conv_w,
                                                                          const float* a_neg, const float* dt_bias, int64_t state_off,
                                                                          float* __restrict__ conv_out, float* gate, float* beta, float qscale) {
  const int64_t i0 = tok0 + static_cast<int64_t>(blockIdx.x) * tile;
  const int nt = static_cast<int>(min(static_cast<int64_t>(tile), tok0 + ntok - i0));
  if (blockIdx.y == gridDim.y - 1) return gates_slice(proj, ld, gr, i0, i0 + nt, d, a_neg, dt_bias, gate, beta);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kConvWarps + warp) * kSpan + lane * 4;
  if (c - lane * 4 >= d.cdim) return;  // the whole warp past the channels
  const bool active = c < d.cdim;
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk, src = active ? conv_col(c, d) : 0;
  float w[4][4];  // [channel][tap]
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 v = active ? ldg4(conv_w + (c + k) * 4) : make_float4(0, 0, 0, 0);
    w[k][0] = v.x;
    w[k][1] = v.y;
    w[k][2] = v.z;
    w[k][3] = v.w;
  }
  const bool normed = c < 2 * K;
  const float scale = c < K ? qscale : 1.0f;
  const int seg = d.dk / 4;
  const float4 zero = make_float4(0, 0, 0, 0);
  float4 x0 = zero, x1 = zero, x2 = zero;  // the next token's taps 0..2 (its sequence's inputs t - 3, t - 2, t - 1)
  for (int c0 = 0; c0 < nt; c0 += 32) {
    const int cn = min(32, nt - c0);
    // Lane l: ordered token i0 + c0 + l's batch row, group and position in its sequence's step.
    int row_l = 0, group_l = 0, pos_l = 0;
    if (lane < cn) {
      const int64_t i = i0 + c0 + lane;
      row_l = gr.order[i];
      group_l = gr.tok_group[i];
      pos_l = static_cast<int>(i - gr.start[group_l]);
    }
    for (int b = 0; b < cn; b += kSlide) {
      float4 xn[kSlide];  // tap 3: the token's own row
#pragma unroll
      for (int u = 0; u < kSlide; ++u) {
        const int row = __shfl_sync(0xffffffffu, row_l, (b + u) & 31);
        xn[u] = active && b + u < cn ? ldg4(proj + static_cast<int64_t>(row) * ld + src) : zero;
      }
#pragma unroll
      for (int u = 0; u < kSlide; ++u) {
        const int k = b + u;
        if (k >= cn) break;  // the same for the whole warp
        const int t = __shfl_sync(0xffffffffu, pos_l, k);
        const int64_t i = i0 + c0 + k;
        if (c0 + k == 0 || t == 0) {  // the tile's first token or a sequence's: taps 0..2 from the window or from rows before the tile
          const int g = __shfl_sync(0xffffffffu, group_l, k);
          float4 tap[3] = {zero, zero, zero};
          if (active) {
            const bool fresh = gr.fresh[g] != 0;
            const float* win = reinterpret_cast<const float*>(static_cast<uintptr_t>(gr.state[g]) + static_cast<uintptr_t>(state_off));
#pragma unroll
            for (int j = 0; j < 3; ++j) {
              const int tp = t - 3 + j;
              if (tp < 0) tap[j] = fresh ? zero : ldg4(win + (3 + tp) * d.cdim + c);
              else tap[j] = ldg4(proj + static_cast<int64_t>(gr.order[i - t + tp]) * ld + src);
            }
          }
          x0 = tap[0];
          x1 = tap[1];
          x2 = tap[2];
        }
        const float4 o = conv_token(w, x0, x1, x2, xn[u], seg, normed, scale);
        if (active) *reinterpret_cast<float4*>(conv_out + i * d.cdim + c) = o;
        x0 = x1;
        x1 = x2;
        x2 = xn[u];
      }
    }
  }
}

__device__ __forceinline__ uint32_t pack_bf2(float a, float b) {
  return static_cast<uint32_t>(f2bf(a)) | (static_cast<uint32_t>(f2bf(b)) << 16);
}

// A warp per (ordered token, value head): blocks of 8 warps over tok0 + [0, ntok) x nv.
__global__ void __launch_bounds__(256) gated_norm_vec_kernel(const float* core, const float* proj, int64_t ld, DeltaNetGroups gr, int64_t tok0,
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

namespace {
std::atomic<DeltaNetIo> chosen_io{DeltaNetIo::automatic};
std::atomic<int64_t> chosen_tile{0};
}  // namespace
void set_deltanet_io(DeltaNetIo io, int64_t vec2_tile) {
  chosen_io.store(io);
  chosen_tile.store(vec2_tile);
}
DeltaNetIo deltanet_io() { return chosen_io.load(); }

bool deltanet_prepare_vec(int version, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok, const DeltaNetShape& sh,
                          const float* conv_w, const float* a_neg, const float* dt_bias, int64_t state_off, float* conv_out, float* gate, float* beta,
                          Stream& s) {
  if (sh.conv_k != 4 || sh.dk % 4 != 0 || kSpan % sh.dk != 0 || sh.dv % 4 != 0 || ld % 4 != 0 || state_off % 16 != 0) return false;
  if (!aligned16(proj) || !aligned16(conv_w) || !aligned16(conv_out)) return false;
  if (ntok <= 0) return true;
  const float qscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(sh.dk)));
  const int64_t slices = (sh.conv_dim() + kSpan * kConvWarps - 1) / (kSpan * kConvWarps) + 1;  // channel blocks and the gates
  if (version == 1) {
    const dim3 grid(static_cast<unsigned>((ntok + kTile - 1) / kTile), static_cast<unsigned>(slices));
    prepare_tiled_kernel<<<grid, kConvWarps * 32, 0, cs(s)>>>(proj, ld, gr, tok0, ntok, io_dims(sh), conv_w, a_neg, dt_bias, state_off, conv_out, gate,
                                                              beta, qscale);
    HMOE_CUDA_LAUNCHED();
    return true;
  }
  // v2: tiles as long as one resident wave of blocks allows (each block's warps then stream their rows to the end,
  // no second wave's tail), or the tile tests ask for.
  static const int64_t resident = [] {
    int dev = 0, sms = 0, per = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&dev));
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    HMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, prepare_sliding_kernel, kConvWarps * 32, 0));
    return std::max<int64_t>(1, static_cast<int64_t>(sms) * per);
  }();
  const int64_t tiles = std::max<int64_t>(1, std::min<int64_t>(ntok, resident / slices));
  int64_t tile = chosen_tile.load() > 0 ? chosen_tile.load() : (ntok + tiles - 1) / tiles;
  tile = std::min<int64_t>(tile, ntok);
  const dim3 grid(static_cast<unsigned>((ntok + tile - 1) / tile), static_cast<unsigned>(slices));
  prepare_sliding_kernel<<<grid, kConvWarps * 32, 0, cs(s)>>>(proj, ld, gr, tok0, ntok, static_cast<int>(tile), io_dims(sh), conv_w, a_neg, dt_bias,
                                                              state_off, conv_out, gate, beta, qscale);
  HMOE_CUDA_LAUNCHED();
  return true;
}

bool deltanet_gated_norm_vec(const float* core, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok,
                             const DeltaNetShape& sh, const float* w, float eps, uint16_t* y, Stream& s, uint16_t* y_lo, int64_t row0) {
  if (sh.dv % 4 != 0 || sh.dv > 512 || ld % 4 != 0 || (sh.nv / sh.nk * sh.dv) % 4 != 0) return false;
  if (!aligned16(core) || !aligned16(proj) || !aligned16(w) || (reinterpret_cast<uintptr_t>(y) & 7) != 0 ||
      (y_lo && (reinterpret_cast<uintptr_t>(y_lo) & 7) != 0))
    return false;
  if (ntok <= 0) return true;
  const int64_t items = ntok * sh.nv;
  gated_norm_vec_kernel<<<static_cast<unsigned>((items + 7) / 8), 256, 0, cs(s)>>>(core, proj, ld, gr, tok0, ntok, io_dims(sh), w, eps, y, y_lo, row0);
  HMOE_CUDA_LAUNCHED();
  return true;
}

}  // namespace hmoe::gpu
