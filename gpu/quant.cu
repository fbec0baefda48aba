// Dequantize-fused GEMV and grouped expert kernels for the formats of
// gpu/quant.h. One kernel template, instantiated per format, token tile TB
// and rows per warp R, in three modes: dense rows, expert gate/up (SwiGLU
// epilogue) and expert down (routing-weight epilogue).
//
// Work split: a block holds a tile of <= TB tokens' activations in shared
// memory (bf16, 16-byte chunks XOR-swizzled so that the lanes' strided reads
// do not collide on banks, plus the sum of every run of 16 for the formats
// that need it). Each warp owns R weight rows and walks them in steps of 32
// "units" (32 weights each: one lane per unit), with the next step's bytes
// loaded before the current step is computed. A unit is two runs of 16
// weights at element offsets e0, e1: int4 / Q4_K: the low and the high
// nibbles of 16 bytes; Q8_0: one block; fp8: two 16-byte loads, 512 bytes
// apart so that a warp's loads are contiguous. Per run, the lane sums
// w * x over the tokens in fp32 and then applies the run's scale (and, for
// the offset formats, subtracts the offset times the run's activation sum).
// Q8_0 blocks (34 bytes, 2-byte aligned) are first copied by the warp with
// 16-byte loads into a per-warp staging area, then read by each lane.
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/quant.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kStageU4 = 69;  // Q8_0 staging per row: 32 blocks (1088 bytes) + 16 bytes of padding

enum Mode { kDense = 0, kGateUp = 1, kDown = 2 };

struct Params {
  const uint8_t* data;
  const float* scales;
  const float* zeros;
  int64_t row_bytes;
  int cols, groups, group;
  int rows;  // dense: matrix rows; gate_up: inter; down: hidden (rows per expert)
  // activations / outputs
  const uint16_t* x;
  int n;  // dense: tokens
  float* y;
  int64_t ldy;
  int k;  // moe: slots per token
  const int32_t* offsets;
  const int32_t* pair_list;
  const float* weights;
  uint16_t* act;
  float* partial;
};

// Swizzled position of 16-byte chunk c of a token row (groups of 4 chunks permuted).
__device__ __forceinline__ int swz(int c) { return c ^ ((c >> 3) & 3); }

__device__ __forceinline__ float nib_f(uint32_t v, int k) {  // 128 + byte k of v (< 16)
  return __uint_as_float(__byte_perm(v, 0x43000000u, 0x7054u | (static_cast<uint32_t>(k) << 8)));
}

// ---- formats ----------------------------------------------------------------
// Each format: Unit (one lane's 32 weights of one row, in registers),
// load(p, row, it, lane, unit) (global loads; Q8_0: staging registers),
// prepare(...) (Q8_0: staging -> per-lane words), w8(unit, run, half, out),
// fold(unit, run, acc, xsum), and offsets(p, it, lane, e0, e1).

struct Int4 {
  static constexpr bool kXsum = true;
  struct Unit {
    uint4 q;
    float a, b;
  };
  __device__ static void offsets(const Params&, int it, int lane, int& e0, int& e1) {
    e0 = (it * 32 + lane) * 32;
    e1 = e0 + 16;
  }
  __device__ static void load(const Params& p, int row, int it, int lane, bool active, Unit& u) {
    if (!active) return;
    const int unit = it * 32 + lane;
    u.q = __ldg(reinterpret_cast<const uint4*>(p.data + row * p.row_bytes) + unit);
    const int g = unit * 32 / p.group;
    const float s = __ldg(p.scales + static_cast<int64_t>(row) * p.groups + g);
    const float z = p.zeros ? __ldg(p.zeros + static_cast<int64_t>(row) * p.groups + g) : 8.0f;
    u.a = s;
    u.b = s * (128.0f + z);
  }
  __device__ static void w8(const Unit& u, int run, int half, float* w) {
    const uint32_t wd[2] = {half ? u.q.z : u.q.x, half ? u.q.w : u.q.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = run ? (wd[i] >> 4) & 0x0F0F0F0Fu : wd[i] & 0x0F0F0F0Fu;
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = nib_f(v, k);
    }
  }
  __device__ static float fold(const Unit& u, int, float acc, float xs) { return u.a * acc - u.b * xs; }
};

struct Q4K {
  static constexpr bool kXsum = true;
  struct Unit {
    uint4 q;
    float a0, b0, a1, b1;
  };
  __device__ static void offsets(const Params&, int it, int lane, int& e0, int& e1) {
    const int unit = it * 32 + lane, sb = unit >> 3, qi = unit & 7;
    e0 = sb * 256 + 64 * (qi >> 1) + 16 * (qi & 1);
    e1 = e0 + 32;
  }
  __device__ static int byte_of(uint4 h, int i) {  // byte i of the 12 scale bytes (block bytes 4..15)
    const uint32_t w = i < 4 ? h.y : (i < 8 ? h.z : h.w);
    return static_cast<int>((w >> (8 * (i & 3))) & 0xFFu);
  }
  __device__ static void scale_min(uint4 h, int j, int& sc, int& m) {
    if (j < 4) {
      sc = byte_of(h, j) & 63;
      m = byte_of(h, j + 4) & 63;
    } else {
      sc = (byte_of(h, j + 4) & 0xF) | ((byte_of(h, j - 4) >> 6) << 4);
      m = (byte_of(h, j + 4) >> 4) | ((byte_of(h, j) >> 6) << 4);
    }
  }
  __device__ static void load(const Params& p, int row, int it, int lane, bool active, Unit& u) {
    if (!active) return;
    const int unit = it * 32 + lane, sb = unit >> 3, qi = unit & 7;
    const uint8_t* blk = p.data + row * p.row_bytes + static_cast<int64_t>(sb) * 144;
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(blk));
    u.q = __ldg(reinterpret_cast<const uint4*>(blk + 16) + qi);
    const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xFFFFu)));
    const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
    int sc, m;
    scale_min(h, 2 * (qi >> 1), sc, m);
    u.a0 = d * static_cast<float>(sc);
    u.b0 = 128.0f * u.a0 + dmin * static_cast<float>(m);
    scale_min(h, 2 * (qi >> 1) + 1, sc, m);
    u.a1 = d * static_cast<float>(sc);
    u.b1 = 128.0f * u.a1 + dmin * static_cast<float>(m);
  }
  __device__ static void w8(const Unit& u, int run, int half, float* w) {
    const uint32_t wd[2] = {half ? u.q.z : u.q.x, half ? u.q.w : u.q.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = run ? (wd[i] >> 4) & 0x0F0F0F0Fu : wd[i] & 0x0F0F0F0Fu;
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = nib_f(v, k);
    }
  }
  __device__ static float fold(const Unit& u, int run, float acc, float xs) {
    return run ? u.a1 * acc - u.b1 * xs : u.a0 * acc - u.b0 * xs;
  }
};

struct Fp8 {
  static constexpr bool kXsum = false;
  struct Unit {
    uint4 q0, q1;
    float a0, a1;  // scale * 256 (the halves below are the value / 256)
  };
  __device__ static void offsets(const Params& p, int it, int lane, int& e0, int& e1) {
    if ((it + 1) * 1024 <= p.cols) {  // a full step: two contiguous 512-byte warp loads
      e0 = it * 1024 + 16 * lane;
      e1 = e0 + 512;
    } else {
      e0 = (it * 32 + lane) * 32;
      e1 = e0 + 16;
    }
  }
  __device__ static void load(const Params& p, int row, int it, int lane, bool active, Unit& u) {
    if (!active) return;
    int e0, e1;
    offsets(p, it, lane, e0, e1);
    const uint8_t* rp = p.data + row * p.row_bytes;
    u.q0 = __ldg(reinterpret_cast<const uint4*>(rp + e0));
    u.q1 = __ldg(reinterpret_cast<const uint4*>(rp + e1));
    const float* sp = p.scales + static_cast<int64_t>(row) * p.groups;
    u.a0 = __ldg(sp + e0 / p.group) * 256.0f;
    u.a1 = __ldg(sp + e1 / p.group) * 256.0f;
  }
  // Two e4m3 bytes at bits 8..15 and 24..31 of t to two f16 (value / 256), as fp32.
  __device__ static void pair(uint32_t t, float* w) {
    const uint32_t h = (t & 0x80008000u) | ((t >> 1) & 0x3F803F80u);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    w[0] = f.x;
    w[1] = f.y;
  }
  __device__ static void w8(const Unit& u, int run, int half, float* w) {
    const uint4 q = run ? u.q1 : u.q0;
    const uint32_t wd[2] = {half ? q.z : q.x, half ? q.w : q.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      pair(__byte_perm(wd[i], 0u, 0x1404u), w + 4 * i);
      pair(__byte_perm(wd[i], 0u, 0x3424u), w + 4 * i + 2);
    }
  }
  __device__ static float fold(const Unit& u, int run, float acc, float) { return (run ? u.a1 : u.a0) * acc; }
};

struct Q8 {
  static constexpr bool kXsum = false;
  struct Unit {
    uint4 st[3];     // staging: this lane's share of the warp's 16-byte loads
    uint32_t w[8];   // the block's 32 quants (after prepare)
    float d;
  };
  __device__ static void offsets(const Params&, int it, int lane, int& e0, int& e1) {
    e0 = (it * 32 + lane) * 32;
    e1 = e0 + 16;
  }
  __device__ static int stage_u4(const Params& p, int it) {  // 16-byte loads of this step (blocks * 34 / 16)
    const int blocks = min(32, p.cols / 32 - it * 32);
    return (blocks * 34 + 15) / 16;  // the row stride is padded to 16 bytes: a last partial load stays inside it
  }
  __device__ static void load(const Params& p, int row, int it, int lane, bool, Unit& u) {
    const int nu4 = stage_u4(p, it);
    const uint4* src = reinterpret_cast<const uint4*>(p.data + row * p.row_bytes + static_cast<int64_t>(it) * 1088);
#pragma unroll
    for (int c = 0; c < 3; ++c)
      if (lane + 32 * c < nu4) u.st[c] = __ldg(src + lane + 32 * c);
  }
  // Warp-collective: staging registers -> this warp's area -> the lane's block.
  __device__ static void prepare(const Params& p, int it, int lane, bool active, uint4* area, Unit& u) {
    const int nu4 = stage_u4(p, it);
#pragma unroll
    for (int c = 0; c < 3; ++c)
      if (lane + 32 * c < nu4) area[lane + 32 * c] = u.st[c];
    __syncwarp();
    if (active) {
      const uint32_t* w32 = reinterpret_cast<const uint32_t*>(area);
      const int off = lane * 34, qs = off + 2, base = qs >> 2, sh = (qs & 3) * 8;
      const uint32_t dh = (w32[off >> 2] >> ((off & 3) * 8)) & 0xFFFFu;
      u.d = __half2float(__ushort_as_half(static_cast<unsigned short>(dh)));
      uint32_t W[9];
#pragma unroll
      for (int i = 0; i < 9; ++i) W[i] = w32[base + i];
#pragma unroll
      for (int i = 0; i < 8; ++i) u.w[i] = __funnelshift_r(W[i], W[i + 1], sh);
    }
    __syncwarp();
  }
  __device__ static void w8(const Unit& u, int run, int half, float* w) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t v = u.w[4 * run + 2 * half + i] ^ 0x80808080u;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[4 * i + k] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7650u | static_cast<uint32_t>(k))) - 8388736.0f;
    }
  }
  __device__ static float fold(const Unit& u, int, float acc, float) { return u.d * acc; }
};

// int8_group: u8 codes, w = scale * (q - zero); the kernel sums (q - 128) * x
// and folds scale * acc - scale * (zero - 128) * sum(x) per run.
struct Int8 {
  static constexpr bool kXsum = true;
  struct Unit {
    uint4 q0, q1;
    float a0, b0, a1, b1;
  };
  __device__ static void offsets(const Params& p, int it, int lane, int& e0, int& e1) { Fp8::offsets(p, it, lane, e0, e1); }
  __device__ static void load(const Params& p, int row, int it, int lane, bool active, Unit& u) {
    if (!active) return;
    int e0, e1;
    offsets(p, it, lane, e0, e1);
    const uint8_t* rp = p.data + row * p.row_bytes;
    u.q0 = __ldg(reinterpret_cast<const uint4*>(rp + e0));
    u.q1 = __ldg(reinterpret_cast<const uint4*>(rp + e1));
    const int64_t base = static_cast<int64_t>(row) * p.groups;
    const int g0 = e0 / p.group, g1 = e1 / p.group;
    u.a0 = __ldg(p.scales + base + g0);
    u.a1 = __ldg(p.scales + base + g1);
    u.b0 = p.zeros ? u.a0 * (__ldg(p.zeros + base + g0) - 128.0f) : 0.0f;
    u.b1 = p.zeros ? u.a1 * (__ldg(p.zeros + base + g1) - 128.0f) : 0.0f;
  }
  __device__ static void w8(const Unit& u, int run, int half, float* w) {
    const uint4 q = run ? u.q1 : u.q0;
    const uint32_t wd[2] = {half ? q.z : q.x, half ? q.w : q.y};
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = __uint_as_float(__byte_perm(wd[i], 0x4B000000u, 0x7650u | static_cast<uint32_t>(k))) - 8388736.0f;
  }
  __device__ static float fold(const Unit& u, int run, float acc, float xs) { return run ? u.a1 * acc - u.b1 * xs : u.a0 * acc - u.b0 * xs; }
};

template <class F>
struct IsQ8 {
  static constexpr bool value = false;
};
template <>
struct IsQ8<Q8> {
  static constexpr bool value = true;
};

// ---- the kernel -------------------------------------------------------------

template <class F, int TB, int R, int MODE>
__global__ void __launch_bounds__(512) quant_kernel(Params p) {
  extern __shared__ uint4 smem[];
  const int cols = p.cols, c16 = cols / 8;  // 16-byte chunks per token row
  uint4* xs = smem;                                                       // [TB][c16] swizzled
  float* xsum = reinterpret_cast<float*>(smem + TB * c16);                // [TB][cols/16]
  uint4* stage = smem + TB * c16 + (F::kXsum ? TB * cols / 64 : 0);       // [warps][R][kStageU4]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;

  // Token range and this warp's rows.
  int beg = 0, end = p.n, e = 0;
  if (MODE != kDense) {
    e = blockIdx.y;
    beg = p.offsets[e];
    end = p.offsets[e + 1];
    if (beg == end) return;
  }
  int row[R];
  bool row_ok[R];
  const int wg = blockIdx.x * warps + warp;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    int local;
    if (MODE == kGateUp) {
      const int v = wg * (R / 2) + (i % (R / 2));
      row_ok[i] = v < p.rows;
      local = (row_ok[i] ? v : 0) + (i >= R / 2 ? p.rows : 0);
      row[i] = e * 2 * p.rows + local;
    } else {
      const int r = wg * R + i;
      row_ok[i] = r < p.rows;
      local = row_ok[i] ? r : 0;
      row[i] = (MODE == kDown ? e * p.rows : 0) + local;
    }
  }
  const bool warp_live = row_ok[0];  // rows are assigned in order: the first is valid if any is
  const int units = cols / 32, iters = (units + 31) / 32;

  for (int g0 = beg; g0 < end; g0 += TB) {
    const int cnt = min(TB, end - g0);
    __syncthreads();
    for (int i = threadIdx.x; i < cnt * c16; i += blockDim.x) {
      const int j = i / c16, c = i % c16;
      const uint16_t* src;
      if (MODE == kDense) src = p.x + static_cast<int64_t>(g0 + j) * cols;
      else if (MODE == kGateUp) src = p.x + static_cast<int64_t>(p.pair_list[g0 + j] / p.k) * cols;
      else src = p.x + static_cast<int64_t>(p.pair_list[g0 + j]) * cols;
      xs[j * c16 + swz(c)] = reinterpret_cast<const uint4*>(src)[c];
    }
    __syncthreads();
    if (F::kXsum) {
      for (int i = threadIdx.x; i < cnt * (cols / 16); i += blockDim.x) {
        const int j = i / (cols / 16), r = i % (cols / 16);
        float a[8], b[8];
        unpack8(xs[j * c16 + swz(2 * r)], a);
        unpack8(xs[j * c16 + swz(2 * r + 1)], b);
        float s = 0;
#pragma unroll
        for (int q = 0; q < 8; ++q) s += a[q] + b[q];
        xsum[j * (cols / 16) + r] = s;
      }
      __syncthreads();
    }
    if (!warp_live) continue;

    float acc[R][TB];
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < TB; ++j) acc[i][j] = 0;

    typename F::Unit cur[R], nxt[R];
#pragma unroll
    for (int i = 0; i < R; ++i) F::load(p, row[i], 0, lane, lane < units, cur[i]);
    for (int it = 0; it < iters; ++it) {
      const bool active = it * 32 + lane < units;
      if (it + 1 < iters) {
        const bool next_active = (it + 1) * 32 + lane < units;
#pragma unroll
        for (int i = 0; i < R; ++i) F::load(p, row[i], it + 1, lane, next_active, nxt[i]);
      }
      if constexpr (IsQ8<F>::value) {
#pragma unroll
        for (int i = 0; i < R; ++i) F::prepare(p, it, lane, active, stage + (warp * R + i) * kStageU4, cur[i]);
      }
      if (active) {
        int e0, e1;
        F::offsets(p, it, lane, e0, e1);
#pragma unroll
        for (int run = 0; run < 2; ++run) {
          const int er = run ? e1 : e0;
          float ar[R][TB];
#pragma unroll
          for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < TB; ++j) ar[i][j] = 0;
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            float w[R][8];
#pragma unroll
            for (int i = 0; i < R; ++i) F::w8(cur[i], run, half, w[i]);
            const int c = swz(er / 8 + half);
#pragma unroll
            for (int j = 0; j < TB; ++j) {
              if (j < cnt) {
                float xf[8];
                unpack8(xs[j * c16 + c], xf);
#pragma unroll
                for (int i = 0; i < R; ++i)
#pragma unroll
                  for (int q = 0; q < 8; ++q) ar[i][j] = fmaf(w[i][q], xf[q], ar[i][j]);
              }
            }
          }
#pragma unroll
          for (int j = 0; j < TB; ++j) {
            if (j < cnt) {
              const float xsr = F::kXsum ? xsum[j * (cols / 16) + er / 16] : 0.0f;
#pragma unroll
              for (int i = 0; i < R; ++i) acc[i][j] += F::fold(cur[i], run, ar[i][j], xsr);
            }
          }
        }
      }
      if (it + 1 < iters) {
#pragma unroll
        for (int i = 0; i < R; ++i) cur[i] = nxt[i];
      }
    }

    // Epilogues.
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      if (j >= cnt) continue;
      float v[R];
#pragma unroll
      for (int i = 0; i < R; ++i) v[i] = warp_sum(acc[i][j]);
      if (lane != 0) continue;
      if (MODE == kDense) {
#pragma unroll
        for (int i = 0; i < R; ++i)
          if (row_ok[i]) p.y[static_cast<int64_t>(g0 + j) * p.ldy + row[i]] = v[i];
      } else if (MODE == kGateUp) {
        const int pr = p.pair_list[g0 + j];
#pragma unroll
        for (int i = 0; i < R / 2; ++i) {
          if (!row_ok[i]) continue;
          const float g = v[i], u = v[R / 2 + i];
          p.act[static_cast<int64_t>(pr) * p.rows + wg * (R / 2) + i] = f2bf(g / (1.0f + expf(-g)) * u);
        }
      } else {
        const int pr = p.pair_list[g0 + j];
        const float rw = p.weights[pr];
#pragma unroll
        for (int i = 0; i < R; ++i)
          if (row_ok[i]) p.partial[static_cast<int64_t>(pr) * p.rows + wg * R + i] = rw * v[i];
      }
    }
  }
}

// out[t, i] = sum_j partial[t*k + j, i], in slot order.
__global__ void combine_kernel(const float* partial, int64_t n, int k, int64_t hidden, float* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hidden) return;
  const int64_t t = idx / hidden, i = idx % hidden;
  float s = 0;
  for (int j = 0; j < k; ++j) s += partial[(t * k + j) * hidden + i];
  out[idx] = s;
}

// Rows [r0, r0 + rows) of w as bf16 (out row-major [rows][cols]): one warp
// per row, the format's units decoded as the product kernel reads them, the
// run's scale folded per weight (fold(w, 1) = scale * w - offset).
template <class F>
__global__ void __launch_bounds__(256) dequant_kernel(Params p, int r0, int rows, uint16_t* out) {
  extern __shared__ uint4 stage_all[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = blockIdx.x * (blockDim.x >> 5) + warp;
  if (r >= rows) return;  // whole warps only: the Q8 staging is warp-collective
  uint4* stage = stage_all + warp * kStageU4;
  const int units = p.cols / 32, iters = (units + 31) / 32;
  uint16_t* dst = out + static_cast<int64_t>(r) * p.cols;
  for (int it = 0; it < iters; ++it) {
    const bool active = it * 32 + lane < units;
    typename F::Unit u;
    F::load(p, r0 + r, it, lane, active, u);
    if constexpr (IsQ8<F>::value) F::prepare(p, it, lane, active, stage, u);
    if (!active) continue;
    int e0, e1;
    F::offsets(p, it, lane, e0, e1);
#pragma unroll
    for (int run = 0; run < 2; ++run) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float w[8];
        F::w8(u, run, half, w);
        uint16_t h[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) h[q] = f2bf(F::fold(u, run, w[q], F::kXsum ? 1.0f : 0.0f));
        *reinterpret_cast<uint4*>(dst + (run ? e1 : e0) + 8 * half) = *reinterpret_cast<const uint4*>(h);
      }
    }
  }
}

__global__ void read_probe_kernel(const uint4* data, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldg(data + i), b = __ldg(data + i + stride), c = __ldg(data + i + 2 * stride), d = __ldg(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldg(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // practically never: keeps the loads
}

Params params_of(const QWeight& w) {
  Params p{};
  p.data = static_cast<const uint8_t*>(w.data);
  p.scales = w.scales;
  p.zeros = w.zeros;
  p.row_bytes = static_cast<int64_t>(w.stride());
  p.cols = static_cast<int>(w.cols);
  p.groups = static_cast<int>(w.groups());
  p.group = w.group;
  return p;
}

template <class F, int TB, int R, int MODE>
void launch_one(const Params& p, unsigned gx, unsigned gy, cudaStream_t st) {
  const int c16 = p.cols / 8;
  // Warps per block: more when the token tile's shared memory allows only one block per SM.
  const size_t xbytes = static_cast<size_t>(TB) * c16 * 16 + (F::kXsum ? static_cast<size_t>(TB) * p.cols / 16 * 4 : 0);
  const int warps = xbytes > 64 * 1024 ? 16 : 8;
  const size_t smem = xbytes + (IsQ8<F>::value ? static_cast<size_t>(warps) * R * kStageU4 * 16 : 0);
  if (smem > 227 * 1024) fail(ErrorKind::unsupported, "gpu quant: " + std::to_string(p.cols) + " columns need too much shared memory");
  auto kern = quant_kernel<F, TB, R, MODE>;
  if (smem > 48 * 1024) HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int rows_per_block = warps * (MODE == kGateUp ? R / 2 : R);
  const unsigned bx = gx ? gx : static_cast<unsigned>((p.rows + rows_per_block - 1) / rows_per_block);
  kern<<<dim3(bx, gy), warps * 32, smem, st>>>(p);
  HMOE_CUDA_LAUNCHED();
}

// Token tile from the largest token count a block sees; rows per warp from the tile.
template <class F, int MODE>
void launch_tb(const Params& p, int64_t max_tokens, unsigned gy, cudaStream_t st) {
  // Four rows per warp only where the registers allow it (no spills at 128 registers).
  constexpr int R1 = std::is_same_v<F, Int4> || std::is_same_v<F, Q4K> ? 4 : 2;
  if (max_tokens <= 1) launch_one<F, 1, R1, MODE>(p, 0, gy, st);
  else if (max_tokens <= 2) launch_one<F, 2, 2, MODE>(p, 0, gy, st);
  else if (max_tokens <= 4) launch_one<F, 4, 2, MODE>(p, 0, gy, st);
  else launch_one<F, 8, 2, MODE>(p, 0, gy, st);
}

template <int MODE>
void launch(QFormat f, const Params& p, int64_t max_tokens, unsigned gy, cudaStream_t st) {
  switch (f) {
    case QFormat::q8_0: return launch_tb<Q8, MODE>(p, max_tokens, gy, st);
    case QFormat::q4_k: return launch_tb<Q4K, MODE>(p, max_tokens, gy, st);
    case QFormat::int4_group: return launch_tb<Int4, MODE>(p, max_tokens, gy, st);
    case QFormat::int8_group: return launch_tb<Int8, MODE>(p, max_tokens, gy, st);
    case QFormat::fp8_e4m3: return launch_tb<Fp8, MODE>(p, max_tokens, gy, st);
  }
}

}  // namespace

void read_probe(const void* data, size_t bytes, uint32_t* sink, Stream& s) {
  if (bytes % 16 != 0) fail(ErrorKind::invalid_argument, "gpu::read_probe: bytes must be a multiple of 16");
  int dev = 0, sms = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&dev));
  HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  read_probe_kernel<<<static_cast<unsigned>(sms * 4), 512, 0, cs(s)>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  HMOE_CUDA_LAUNCHED();
}

void quant_dequant(const QWeight& w, int64_t r0, int64_t rows, bf16_t* out, Stream& s) {
  check_qweight(w, "gpu::quant_dequant");
  if (r0 < 0 || rows < 0 || r0 + rows > w.rows) fail(ErrorKind::invalid_argument, "gpu::quant_dequant: rows out of range");
  if (rows == 0) return;
  Params p = params_of(w);
  p.rows = static_cast<int>(w.rows);
  constexpr int warps = 8;
  const unsigned blocks = static_cast<unsigned>((rows + warps - 1) / warps);
  const size_t smem = static_cast<size_t>(warps) * kStageU4 * 16;
  auto go = [&](auto kern) {
    kern<<<blocks, warps * 32, smem, cs(s)>>>(p, static_cast<int>(r0), static_cast<int>(rows), out);
    HMOE_CUDA_LAUNCHED();
  };
  switch (w.format) {
    case QFormat::q8_0: return go(dequant_kernel<Q8>);
    case QFormat::q4_k: return go(dequant_kernel<Q4K>);
    case QFormat::int4_group: return go(dequant_kernel<Int4>);
    case QFormat::int8_group: return go(dequant_kernel<Int8>);
    case QFormat::fp8_e4m3: return go(dequant_kernel<Fp8>);
  }
}

void quant_gemv(const QWeight& w, const bf16_t* x, int64_t n, float* y, int64_t ldy, Stream& s) {
  check_qweight(w, "gpu::quant_gemv");
  if (n < 0 || ldy < w.rows) fail(ErrorKind::invalid_argument, "gpu::quant_gemv: bad token count or output stride");
  if (w.rows > INT32_MAX || w.cols > INT32_MAX / 16) fail(ErrorKind::unsupported, "gpu::quant_gemv: matrix too large");
  if (n == 0 || w.rows == 0) return;
  Params p = params_of(w);
  p.rows = static_cast<int>(w.rows);
  p.x = x;
  p.n = static_cast<int>(n);
  p.y = y;
  p.ldy = ldy;
  launch<kDense>(w.format, p, n, 1, cs(s));
}

void quant_moe_experts(const bf16_t* x, int64_t n, int64_t hidden, int64_t inter, int64_t experts, int64_t k, const float* weights,
                       const int32_t* offsets, const int32_t* pair_list, const QWeight& w_gate_up, const QWeight& w_down, bf16_t* act,
                       float* partial, float* out, Stream& s) {
  check_qweight(w_gate_up, "gpu::quant_moe_experts gate/up");
  check_qweight(w_down, "gpu::quant_moe_experts down");
  if (w_gate_up.cols != hidden || w_gate_up.rows != experts * 2 * inter || w_down.cols != inter || w_down.rows != experts * hidden)
    fail(ErrorKind::invalid_argument, "gpu::quant_moe_experts: weight shapes do not match hidden " + std::to_string(hidden) + ", inter " +
                                          std::to_string(inter) + ", experts " + std::to_string(experts));
  if (experts <= 0 || experts > 65535) fail(ErrorKind::unsupported, "gpu::quant_moe_experts: experts must be in 1..65535");
  if (n <= 0) return;
  cudaStream_t st = cs(s);
  Params p = params_of(w_gate_up);
  p.rows = static_cast<int>(inter);
  p.x = x;
  p.k = static_cast<int>(k);
  p.offsets = offsets;
  p.pair_list = pair_list;
  p.act = act;
  // Tokens per expert are known only on the device: the tile follows n (at most n per expert).
  launch<kGateUp>(w_gate_up.format, p, n, static_cast<unsigned>(experts), st);
  Params q = params_of(w_down);
  q.rows = static_cast<int>(hidden);
  q.x = act;
  q.k = static_cast<int>(k);
  q.offsets = offsets;
  q.pair_list = pair_list;
  q.weights = weights;
  q.partial = partial;
  launch<kDown>(w_down.format, q, n, static_cast<unsigned>(experts), st);
  combine_kernel<<<static_cast<unsigned>((n * hidden + 255) / 256), 256, 0, st>>>(partial, n, static_cast<int>(k), hidden, out);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace hmoe::gpu
