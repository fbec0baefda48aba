// The "direct" decode kernels of GGUF Q4_K, Q5_K, Q6_K and Q8_0 blocks
// (gpu/gguf_direct.h; selected by gpu::set_gguf_decode_kernel, the default):
// dense GEMV for 1-8 tokens, the routed experts' gate/up per (token, slot)
// pair and their down product with SwiGLU and the weighted sum fused.
//
// Why this shape (issue 26: the staged kernels of gpu/gguf_gemv.cu made a
// Q4_K_M decode step read its weights at 17% of the H100's bandwidth).
// A lane owns one unit (64 weights of a row: a quarter super-block, or two
// Q8_0 blocks) and loads that unit's bytes straight from global memory into
// registers with 16-byte loads: Q4_K/Q5_K super-blocks are 16-byte aligned
// (their header, then the unit's 32 code bytes); Q6_K and Q8_0 groups start
// on any even byte, so the lane loads the aligned 16-byte windows that hold
// its bytes (every window holds bytes of the unit's own group, so nothing
// outside the matrix's 16-byte chunks is touched) and shifts them into place
// with selects and funnel shifts. Nothing is staged in shared memory and
// there is no per-unit integer division: the weights cross the L1 once.
// Each warp step loads RR rows (lanes of a row slot: the units of a row;
// rows of up to 32 units share a warp in power-of-two slots, longer rows are
// walked 32 units at a time) before decoding any, so a warp keeps
// RR x 32 units' bytes in flight, and 16 warps per SM (2 blocks of 8, <= 128
// registers) keep 40-70 KB per SM outstanding: the ~3 MB in flight the H100
// needs at 3 TB/s.
//
// Activations: quantized per 32 in shared memory by each block exactly as the
// staged kernels do (two int8 planes, x ~ d (q1 + q2 / 254), code sums per
// 16), but stored unit by unit in the order the lanes read them: for unit u
// and token t, the 16 codes of run k of plane p at XP[(t * 8 + 4 p + k) * U
// + u] (16 bytes), so the 32 lanes of a warp read 512 consecutive bytes
// (no bank conflicts), and per (t, u) the four runs' scales and code sums.
// A run's product is then the staged kernels' expression term for term:
// xd * (a * (254 dot1 + dot2) - c * sx); only the order of the fp32 sums
// over runs differs.
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/gguf_direct.h"
#include "gpu/gguf_units.cuh"

namespace hmoe::gpu::detail::gguf_direct {
namespace {

using gguf::h2f;
using gguf::k_scale_min;
using gguf::Run;
using gguf::pack4;
using gguf::quantize32_planes;
using gguf::swiglu32;

__device__ __forceinline__ uint4 ldg16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Bulk prefetch of [p, p + bytes) into L2 (sm_90 TMA; p and bytes multiples of 16).
__device__ __forceinline__ void l2_prefetch(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// out[i] = the 4 bytes at byte offset o + 4 (FIRST + i) of the words w (o
// even, 0 <= o < 16; words past NIN read as 0).
template <int FIRST, int NOUT, int NIN>
__device__ __forceinline__ void shift_bytes(const uint32_t (&w)[NIN], int o, uint32_t* out) {
  auto W = [&](int i) { return i < NIN ? w[i] : 0u; };
  const bool b8 = (o & 8) != 0, b4 = (o & 4) != 0;
  const int sh = (o & 3) * 8;
  uint32_t a[NOUT + 1];
#pragma unroll
  for (int i = 0; i <= NOUT; ++i) {
    const int j = FIRST + i;
    const uint32_t lo = b4 ? W(j + 1) : W(j), hi = b4 ? W(j + 3) : W(j + 2);
    a[i] = b8 ? hi : lo;
  }
#pragma unroll
  for (int i = 0; i < NOUT; ++i) out[i] = __funnelshift_r(a[i], a[i + 1], sh);
}

template <int N>
__device__ __forceinline__ void words(const uint4* v, uint32_t (&w)[4 * N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    w[4 * i] = v[i].x;
    w[4 * i + 1] = v[i].y;
    w[4 * i + 2] = v[i].z;
    w[4 * i + 3] = v[i].w;
  }
}

// ---- formats: group bytes BB, elements EB, units per group UPB, rows per warp step RR
// load(g, q, raw): the unit q of the group at g; decode(raw, q, run): its 4
// runs as gpu/gguf_units.cuh decodes them; locate(e, q, k): the unit and run
// of element e (a multiple of 16) of a group.

struct Q4K {
  static constexpr int BB = 144, EB = 256, UPB = 4, RR = 4;
  struct Raw {
    uint4 h, a, b;
  };
  __device__ __forceinline__ static void load(const uint8_t* g, int q, Raw& r) {
    r.h = ldg16(g);
    r.a = ldg16(g + 16 + 32 * q);
    r.b = ldg16(g + 32 + 32 * q);
  }
  __device__ __forceinline__ static void decode(const Raw& r, int q, Run* o) {
    const float d = h2f(r.h.x), dmin = h2f(r.h.x >> 16);
    int sc0, m0, sc1, m1;
    k_scale_min(r.h.y, r.h.z, r.h.w, 2 * q, sc0, m0);
    k_scale_min(r.h.y, r.h.z, r.h.w, 2 * q + 1, sc1, m1);
    const uint32_t w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[0].w[i] = w[i] & 0x0F0F0F0Fu;
      o[1].w[i] = w[4 + i] & 0x0F0F0F0Fu;
      o[2].w[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
      o[3].w[i] = (w[4 + i] >> 4) & 0x0F0F0F0Fu;
    }
    const float a0 = d * static_cast<float>(sc0), c0 = dmin * static_cast<float>(m0);
    const float a1 = d * static_cast<float>(sc1), c1 = dmin * static_cast<float>(m1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k].a = k < 2 ? a0 : a1;
      o[k].c = k < 2 ? c0 : c1;
    }
  }
  __device__ __forceinline__ static void locate(int e, int& q, int& k) {
    q = e >> 6;
    k = (e >> 4) & 3;
  }
};

struct Q5K {
  static constexpr int BB = 176, EB = 256, UPB = 4, RR = 2;
  struct Raw {
    uint4 h, h0, h1, a, b;
  };
  __device__ __forceinline__ static void load(const uint8_t* g, int q, Raw& r) {
    r.h = ldg16(g);
    r.h0 = ldg16(g + 16);
    r.h1 = ldg16(g + 32);
    r.a = ldg16(g + 48 + 32 * q);
    r.b = ldg16(g + 64 + 32 * q);
  }
  __device__ __forceinline__ static void decode(const Raw& r, int q, Run* o) {
    const float d = h2f(r.h.x), dmin = h2f(r.h.x >> 16);
    int sc0, m0, sc1, m1;
    k_scale_min(r.h.y, r.h.z, r.h.w, 2 * q, sc0, m0);
    k_scale_min(r.h.y, r.h.z, r.h.w, 2 * q + 1, sc1, m1);
    const uint32_t w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
    const uint32_t h[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
    const int b0 = 2 * q, b1 = 2 * q + 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[0].w[i] = (w[i] & 0x0F0F0F0Fu) | (((h[i] >> b0) & 0x01010101u) << 4);
      o[1].w[i] = (w[4 + i] & 0x0F0F0F0Fu) | (((h[4 + i] >> b0) & 0x01010101u) << 4);
      o[2].w[i] = ((w[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> b1) & 0x01010101u) << 4);
      o[3].w[i] = ((w[4 + i] >> 4) & 0x0F0F0F0Fu) | (((h[4 + i] >> b1) & 0x01010101u) << 4);
    }
    const float a0 = d * static_cast<float>(sc0), c0 = dmin * static_cast<float>(m0);
    const float a1 = d * static_cast<float>(sc1), c1 = dmin * static_cast<float>(m1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k].a = k < 2 ? a0 : a1;
      o[k].c = k < 2 ? c0 : c1;
    }
  }
  __device__ __forceinline__ static void locate(int e, int& q, int& k) {
    q = e >> 6;
    k = (e >> 4) & 3;
  }
};

// Q6_K: ql[128] qh[64] scales[16] d; unit q = (half h, group g) reads ql at
// 64h + 16g and 64h + 32 + 16g, qh at 128 + 32h + 16g, the scales and d: the
// windows 4h+g .. 4h+g+3, 8+2h+g, 9+2h+g, 12 and 13 of the 16-byte grid the
// group starts in (at byte o of window 0).
struct Q6K {
  static constexpr int BB = 210, EB = 256, UPB = 4, RR = 2;
  struct Raw {
    uint4 ab[4], c[2], s[2];
    int o;
  };
  __device__ __forceinline__ static void load(const uint8_t* g, int q, Raw& r) {
    r.o = static_cast<int>(reinterpret_cast<uintptr_t>(g) & 15);
    const uint8_t* base = g - r.o;
    const int h = q >> 1, gg = q & 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.ab[i] = ldg16(base + 16 * (4 * h + gg + i));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.c[i] = ldg16(base + 16 * (8 + 2 * h + gg + i));
      r.s[i] = ldg16(base + 16 * (12 + i));
    }
  }
  __device__ __forceinline__ static void decode(const Raw& r, int q, Run* o) {
    const int h = q >> 1, g = q & 1;
    uint32_t ab[16], cw[8], sw[8], A[4], B[4], C[4], S[5];
    words<4>(r.ab, ab);
    words<2>(r.c, cw);
    words<2>(r.s, sw);
    shift_bytes<0, 4>(ab, r.o, A);
    shift_bytes<8, 4>(ab, r.o, B);
    shift_bytes<0, 4>(cw, r.o, C);
    shift_bytes<0, 5>(sw, r.o, S);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[0].w[i] = (A[i] & 0x0F0F0F0Fu) | ((C[i] & 0x03030303u) << 4);
      o[1].w[i] = (B[i] & 0x0F0F0F0Fu) | (((C[i] >> 2) & 0x03030303u) << 4);
      o[2].w[i] = ((A[i] >> 4) & 0x0F0F0F0Fu) | (((C[i] >> 4) & 0x03030303u) << 4);
      o[3].w[i] = ((B[i] >> 4) & 0x0F0F0F0Fu) | (((C[i] >> 6) & 0x03030303u) << 4);
    }
    const uint32_t slo = h ? S[2] : S[0], shi = h ? S[3] : S[1];
    const float d = h2f(S[4]);
    const int sc[4] = {static_cast<int8_t>(slo >> (8 * g)), static_cast<int8_t>(slo >> (8 * g + 16)), static_cast<int8_t>(shi >> (8 * g)),
                       static_cast<int8_t>(shi >> (8 * g + 16))};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[k].a = d * static_cast<float>(sc[k]);
      o[k].c = 32.0f * o[k].a;
    }
  }
  __device__ __forceinline__ static void locate(int e, int& q, int& k) {  // e = 128h + 32k + 16g + l
    const int h = e >> 7, g = (e >> 4) & 1;
    k = (e >> 5) & 3;
    q = 2 * h + g;
  }
};

// Q8_0: a unit is two 34-byte blocks (68 bytes from an even byte o of its
// first 16-byte window): 5 windows, a sixth when o > 12.
struct Q80 {
  static constexpr int BB = 68, EB = 64, UPB = 1, RR = 2;
  struct Raw {
    uint4 v[6];
    int o;
  };
  __device__ __forceinline__ static void load(const uint8_t* g, int, Raw& r) {
    r.o = static_cast<int>(reinterpret_cast<uintptr_t>(g) & 15);
    const uint8_t* base = g - r.o;
#pragma unroll
    for (int i = 0; i < 5; ++i) r.v[i] = ldg16(base + 16 * i);
    r.v[5] = r.o > 12 ? ldg16(base + 80) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ static void decode(const Raw& r, int, Run* o) {
    uint32_t w[24], u[17];
    words<6>(r.v, w);
    shift_bytes<0, 17>(w, r.o, u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[0].w[i] = __funnelshift_r(u[i], u[i + 1], 16);
      o[1].w[i] = __funnelshift_r(u[4 + i], u[5 + i], 16);
      o[2].w[i] = u[9 + i];
      o[3].w[i] = u[13 + i];
    }
    const float d0 = h2f(u[0]), d1 = h2f(u[8] >> 16);
    o[0].a = o[1].a = d0;
    o[2].a = o[3].a = d1;
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k].c = 0.0f;
  }
  __device__ __forceinline__ static void locate(int e, int& q, int& k) {
    q = 0;
    k = e >> 4;
  }
};

enum Mode { kDense = 0, kGateUp = 1, kDown = 2 };

// Rows per warp step: the format's, at most 2 from 4 tokens up (registers).
template <class F, int TB>
constexpr int kRR = TB >= 4 && F::RR > 2 ? 2 : F::RR;

// Shared memory of nx activation slots of U units: 160 bytes per (slot, unit).
__host__ __device__ constexpr int x_bytes(int nx, int U) { return nx * U * 160; }

// The slots' activations in the lanes' order (see the top of the file).
template <class F, int MODE>
__device__ void quantize_x(const Params& p, int nx, int TB, uint4* XP, float* XD, int* XS) {
  const int cols = p.cols, nb32 = cols / 32, U = p.U, by = blockIdx.y;
  for (int b = threadIdx.x; b < nx * nb32; b += blockDim.x) {
    const int sl = b / nb32, c0 = (b % nb32) * 32;
    float v[32];
    if (MODE == kDown) {
      swiglu32(p.gu + static_cast<int64_t>(by * p.k + sl) * 2 * cols + c0, cols, v);
    } else {
      const int t = MODE == kDense ? by * TB + sl : by;
      if (t >= p.n) {
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = 0.0f;
      } else {
        const uint4* xr = reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(t) * cols + c0);
#pragma unroll
        for (int i = 0; i < 4; ++i) unpack8(xr[i], v + 8 * i);
      }
    }
    int s1[2], s2[2];
    uint32_t w1[8], w2[8];
    const float d = quantize32_planes(v, w1, w2, s1, s2);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int e = c0 + 16 * hh;
      int q, k;
      F::locate(e % F::EB, q, k);
      const int u = (e / F::EB) * F::UPB + q;
      XP[(sl * 8 + k) * U + u] = make_uint4(w1[4 * hh], w1[4 * hh + 1], w1[4 * hh + 2], w1[4 * hh + 3]);
      XP[(sl * 8 + 4 + k) * U + u] = make_uint4(w2[4 * hh], w2[4 * hh + 1], w2[4 * hh + 2], w2[4 * hh + 3]);
      XD[(sl * U + u) * 4 + k] = d / 254.0f;
      XS[(sl * U + u) * 4 + k] = 254 * s1[hh] + s2[hh];
    }
  }
}

// acc += the unit's 4 runs against slot sl's activations.
__device__ __forceinline__ float unit_dot(const Run* r, const uint4* XP, const float* XD, const int* XS, int U, int sl, int u) {
  const float4 xd = *reinterpret_cast<const float4*>(XD + (sl * U + u) * 4);
  const int4 sx = *reinterpret_cast<const int4*>(XS + (sl * U + u) * 4);
  const float xdk[4] = {xd.x, xd.y, xd.z, xd.w};
  const int sxk[4] = {sx.x, sx.y, sx.z, sx.w};
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint4 a1 = XP[(sl * 8 + k) * U + u], a2 = XP[(sl * 8 + 4 + k) * U + u];
    int d1 = __dp4a(static_cast<int>(r[k].w[0]), static_cast<int>(a1.x), 0);
    d1 = __dp4a(static_cast<int>(r[k].w[1]), static_cast<int>(a1.y), d1);
    d1 = __dp4a(static_cast<int>(r[k].w[2]), static_cast<int>(a1.z), d1);
    d1 = __dp4a(static_cast<int>(r[k].w[3]), static_cast<int>(a1.w), d1);
    int d2 = __dp4a(static_cast<int>(r[k].w[0]), static_cast<int>(a2.x), 0);
    d2 = __dp4a(static_cast<int>(r[k].w[1]), static_cast<int>(a2.y), d2);
    d2 = __dp4a(static_cast<int>(r[k].w[2]), static_cast<int>(a2.z), d2);
    d2 = __dp4a(static_cast<int>(r[k].w[3]), static_cast<int>(a2.w), d2);
    acc += xdk[k] * (r[k].a * static_cast<float>(254 * d1 + d2) - r[k].c * static_cast<float>(sxk[k]));
  }
  return acc;
}

// One kernel for the three modes. Dense: warps walk passes of G * RR rows
// (TB tokens, blockIdx.y = token group). Gate/up: warps walk (slot, pass)
// tasks of token blockIdx.y. Down: the block's warps are the token's k slots
// and walk the same passes (block-uniform), then sum the slots' rows.
template <class F, int TB, int MODE>
__global__ void __launch_bounds__(MODE == kDown ? 512 : 256, MODE == kDown ? 1 : 2) gd_kernel(Params p) {
  extern __shared__ __align__(16) uint8_t sm[];
  constexpr int RR = kRR<F, TB>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
  const int U = p.U, P = p.P, G = p.G, UPL = p.UPL;
  const int nx = MODE == kDense ? TB : (MODE == kGateUp ? 1 : p.k);
  uint4* XP = reinterpret_cast<uint4*>(sm);
  float* XD = reinterpret_cast<float*>(sm + static_cast<size_t>(nx) * U * 128);
  int* XS = reinterpret_cast<int*>(XD + nx * U * 4);
  float* dsum = reinterpret_cast<float*>(sm + x_bytes(nx, U));  // down: [k][G * RR]
  const int by = blockIdx.y, rs = lane / P, lu = lane - rs * P, RP = G * RR;
  const int npass = p.passes, ntask = MODE == kGateUp ? p.k * npass : npass;
  const int first = MODE == kDown ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) * W + warp;
  const int stride = MODE == kDown ? static_cast<int>(gridDim.x) : static_cast<int>(gridDim.x) * W;

  // Task -> first matrix row of its pass and the slot whose activations it reads.
  auto rows_of = [&](int task, int64_t& mrow0, int& pass, int& slot) {
    pass = task;
    slot = 0;
    mrow0 = 0;
    if (MODE == kGateUp) {
      slot = task / npass;
      pass = task - slot * npass;
      mrow0 = static_cast<int64_t>(__ldcg(p.ids + by * p.k + slot)) * p.rows;
    } else if (MODE == kDown) {
      slot = warp;
      mrow0 = static_cast<int64_t>(__ldcg(p.ids + by * p.k + warp)) * p.rows;
    }
  };
  typename F::Raw raw[RR];
  auto load = [&](int64_t mrow0, int pass, int j) {
    const int u = lu + 32 * j;
    if (u >= U) return;
    const int grp = u / F::UPB, q = u - grp * F::UPB;
#pragma unroll
    for (int rr = 0; rr < RR; ++rr) {
      const int row = pass * RP + rr * G + rs;
      if (row < p.rows) F::load(p.data + (mrow0 + row) * p.rb + static_cast<int64_t>(grp) * F::BB, q, raw[rr]);
    }
  };

  // The bytes of a task's pass (RP consecutive rows) go to L2 with one bulk
  // prefetch by lane 0 (the TMA unit: no registers, no load slots): the
  // warp's first two tasks before the wait and its prologue, then two tasks
  // ahead of the one it decodes, so DRAM keeps streaming while the warp
  // waits on its own loads (L2 hits) and computes.
  auto prefetch = [&](int tk) {
    if (tk >= ntask || lane != 0) return;
    int64_t m0;
    int ps, sl;
    rows_of(tk, m0, ps, sl);
    const int r0 = ps * RP, nr = min(RP, p.rows - r0);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p.data + (m0 + r0) * p.rb) & ~static_cast<uintptr_t>(15);
    uintptr_t e = (reinterpret_cast<uintptr_t>(p.data + (m0 + r0 + nr) * p.rb) + 15) & ~static_cast<uintptr_t>(15);
    const uintptr_t lim = reinterpret_cast<uintptr_t>(p.end) & ~static_cast<uintptr_t>(15);
    if (e > lim) e = lim;
    if (e > a) l2_prefetch(reinterpret_cast<const void*>(a), static_cast<uint32_t>(e - a));
  };

  // Weights are prefetched before the wait (dense: resident weights no
  // kernel writes; down: its routing was written before the gate/up kernel
  // in front passed its own wait); gate/up reads the routing of the kernel
  // right in front, so it waits first.
  constexpr bool kEarly = MODE != kGateUp;
  if (!kEarly) {
    pdl_wait();
    pdl_trigger();
  }
  prefetch(first);
  prefetch(first + stride);
  if (kEarly) {
    pdl_wait();
    pdl_trigger();
  }
  quantize_x<F, MODE>(p, nx, TB, XP, XD, XS);
  __syncthreads();
  int task = first, j = 0, pass = 0, slot = 0;
  int64_t mrow0 = 0;
  if (task < ntask) {
    rows_of(task, mrow0, pass, slot);
    load(mrow0, pass, 0);
  }

  float acc[RR][TB];
#pragma unroll
  for (int rr = 0; rr < RR; ++rr)
#pragma unroll
    for (int t = 0; t < TB; ++t) acc[rr][t] = 0.0f;
  while (task < ntask) {
    if (j == 0) prefetch(task + 2 * stride);
    const int u = lu + 32 * j;
    if (u < U) {
      const int grp = u / F::UPB, q = u - grp * F::UPB;
#pragma unroll
      for (int rr = 0; rr < RR; ++rr) {
        if (pass * RP + rr * G + rs < p.rows) {
          Run run[4];
          F::decode(raw[rr], q, run);
#pragma unroll
          for (int t = 0; t < TB; ++t) acc[rr][t] += unit_dot(run, XP, XD, XS, U, MODE == kDense ? t : (MODE == kGateUp ? 0 : slot), u);  // gate/up: the one token's activations serve every slot
        }
      }
    }
    const bool done = j + 1 == UPL;
    const int cur_pass = pass, cur_slot = slot;
    if (done) {
      j = 0;
      task += stride;
      if (task < ntask) rows_of(task, mrow0, pass, slot);
    } else {
      ++j;
    }
    if (task < ntask) load(mrow0, pass, j);  // the next step's bytes are requested before the row sums
    if (done) {
#pragma unroll
      for (int rr = 0; rr < RR; ++rr)
#pragma unroll
        for (int t = 0; t < TB; ++t) {
          float v = acc[rr][t];
          for (int o = P / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
          acc[rr][t] = v;
        }
      const int rbase = cur_pass * RP + rs;
      if (lu == 0 && rs < G) {
#pragma unroll
        for (int rr = 0; rr < RR; ++rr) {
          const int row = rbase + rr * G;
          if (row >= p.rows) continue;
          if (MODE == kDense) {
#pragma unroll
            for (int t = 0; t < TB; ++t)
              if (by * TB + t < p.n) p.y[static_cast<int64_t>(by * TB + t) * p.ldy + row] = acc[rr][0 + t];
          } else if (MODE == kGateUp) {
            p.y[static_cast<int64_t>(by * p.k + cur_slot) * p.rows + row] = acc[rr][0];
          } else {
            dsum[warp * RP + rr * G + rs] = acc[rr][0];
          }
        }
      }
      if (MODE == kDown) {  // the block's warps are the token's k slots: weighted sum in slot order
        __syncthreads();
        for (int i = threadIdx.x; i < RP; i += blockDim.x) {
          const int row = cur_pass * RP + i;
          if (row >= p.rows) break;
          float sum = 0.0f;
          for (int s = 0; s < p.k; ++s) sum += __ldg(p.weights + by * p.k + s) * dsum[s * RP + i];
          p.y[static_cast<int64_t>(by) * p.ldy + row] = sum;
        }
        __syncthreads();
      }
#pragma unroll
      for (int rr = 0; rr < RR; ++rr)
#pragma unroll
        for (int t = 0; t < TB; ++t) acc[rr][t] = 0.0f;
    }
  }
}

// ---- host ---------------------------------------------------------------------

int sm_count() {
  static int sms = [] {
    int dev = 0, n = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&dev));
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

int rr_of(GgufType t, int tb) {
  const int rr = t == GgufType::q4_k ? Q4K::RR : (t == GgufType::q5_k ? Q5K::RR : (t == GgufType::q6_k ? Q6K::RR : Q80::RR));
  return tb >= 4 && rr > 2 ? 2 : rr;
}

bool type_ok(GgufType t) { return t == GgufType::q4_k || t == GgufType::q5_k || t == GgufType::q6_k || t == GgufType::q8_0; }

// Row slots: rows of U <= 32 units share a warp in slots of P lanes (the
// power of two >= U); longer rows take the whole warp, UPL steps of 32 units.
Params plan(const GgufWeight& w, int64_t rows, int tb) {
  Params p{};
  p.data = static_cast<const uint8_t*>(w.data);
  p.end = p.data + w.bytes();
  p.rb = static_cast<int64_t>(w.row_bytes());
  p.cols = static_cast<int>(w.cols);
  p.rows = static_cast<int>(rows);
  p.U = p.cols / 64;
  if (p.U <= 32) {
    p.P = 1;
    while (p.P < p.U) p.P *= 2;
    p.G = 32 / p.P;
    p.UPL = 1;
  } else {
    p.P = 32;
    p.G = 1;
    p.UPL = (p.U + 31) / 32;
  }
  const int rp = p.G * rr_of(w.type, tb);
  p.passes = (p.rows + rp - 1) / rp;
  return p;
}

constexpr size_t kMaxSmem = 200 * 1024;

template <class F, int TB, int MODE>
void launch_one(const Params& p, dim3 grid, int threads, size_t smem, Stream& st) {
  auto kern = gd_kernel<F, TB, MODE>;
  if (smem > 48 * 1024) HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_pdl(st, kern, grid, dim3(static_cast<unsigned>(threads)), smem, p);
}

template <int TB, int MODE>
void launch(GgufType t, const Params& p, dim3 grid, int threads, size_t smem, Stream& st) {
  switch (t) {
    case GgufType::q4_k: return launch_one<Q4K, TB, MODE>(p, grid, threads, smem, st);
    case GgufType::q5_k: return launch_one<Q5K, TB, MODE>(p, grid, threads, smem, st);
    case GgufType::q6_k: return launch_one<Q6K, TB, MODE>(p, grid, threads, smem, st);
    case GgufType::q8_0: return launch_one<Q80, TB, MODE>(p, grid, threads, smem, st);
    default: fail(ErrorKind::internal, "gguf direct kernels: unsupported type");
  }
}

constexpr int kWarps = 8;

// Blocks of a persistent launch: two per SM over all blockIdx.y, at most one task per warp.
unsigned blocks(int64_t warp_tasks, int warps, int64_t ny) {
  const int64_t want = std::max<int64_t>(1, 2 * static_cast<int64_t>(sm_count()) / std::max<int64_t>(ny, 1));
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((warp_tasks + warps - 1) / warps, want)));
}

}  // namespace

bool gemv_supported(const GgufWeight& w, int64_t n) {
  if (!type_ok(w.type) || w.cols % 64 != 0) return false;
  const int tb = n <= 1 ? 1 : (n <= 2 ? 2 : (n <= 4 ? 4 : 8));
  return static_cast<size_t>(x_bytes(tb, static_cast<int>(w.cols / 64))) <= kMaxSmem;
}

bool moe_supported(const GgufWeight& gate_up, const GgufWeight& down, int64_t k) {
  return type_ok(gate_up.type) && type_ok(down.type) && k >= 1 && k <= 16 && static_cast<size_t>(x_bytes(1, static_cast<int>(gate_up.cols / 64))) <= kMaxSmem &&
         static_cast<size_t>(x_bytes(static_cast<int>(k), static_cast<int>(down.cols / 64))) + 16 * 64 * 4 <= kMaxSmem;
}

void gemv(const GgufWeight& w, const bf16_t* x, int64_t n, float* y, int64_t ldy, Stream& s) {
  const int threads = kWarps * 32;
  auto go = [&](auto tb) {
    constexpr int TB = decltype(tb)::value;
    Params p = plan(w, w.rows, TB);
    p.x = x;
    p.n = static_cast<int>(n);
    p.y = y;
    p.ldy = ldy;
    const unsigned ty = static_cast<unsigned>((n + TB - 1) / TB);
    launch<TB, kDense>(w.type, p, dim3(blocks(p.passes, kWarps, ty), ty), threads, static_cast<size_t>(x_bytes(TB, p.U)), s);
  };
  if (n == 1) return go(std::integral_constant<int, 1>{});
  if (n == 2) return go(std::integral_constant<int, 2>{});
  if (n <= 4) return go(std::integral_constant<int, 4>{});
  go(std::integral_constant<int, 8>{});
}

void moe_experts(const bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* weights, const GgufWeight& w_gate_up, const GgufWeight& w_down,
                 int64_t inter, float* gu, float* out, Stream& s) {
  const unsigned ny = static_cast<unsigned>(n);
  Params g = plan(w_gate_up, 2 * inter, 1);
  g.x = x;
  g.n = static_cast<int>(n);
  g.k = static_cast<int>(k);
  g.ids = ids;
  g.y = gu;
  launch<1, kGateUp>(w_gate_up.type, g, dim3(blocks(static_cast<int64_t>(g.passes) * k, kWarps, n), ny), kWarps * 32,
                     static_cast<size_t>(x_bytes(1, g.U)), s);
  const int64_t hidden = w_gate_up.cols;
  Params d = plan(w_down, hidden, 1);
  d.gu = gu;
  d.n = static_cast<int>(n);
  d.k = static_cast<int>(k);
  d.ids = ids;
  d.weights = weights;
  d.y = out;
  d.ldy = hidden;
  const size_t smem = static_cast<size_t>(x_bytes(static_cast<int>(k), d.U)) + static_cast<size_t>(k) * d.G * rr_of(w_down.type, 1) * 4;
  launch<1, kDown>(w_down.type, d, dim3(blocks(d.passes, 1, n), ny), static_cast<int>(k) * 32, smem, s);
}

}  // namespace hmoe::gpu::detail::gguf_direct
