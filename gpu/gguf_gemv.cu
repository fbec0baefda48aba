// GGUF blocks as stored on the GPU (gpu/quant.h): GEMV for decode, the
// decode routed-expert pair kernels, and dequantization to bf16 for the
// cuBLAS path of big passes. Q4_K, Q5_K, Q6_K, Q8_0 and the low-bit types
// (Q2_K, Q3_K, IQ1-IQ4, MXFP4: gpu/gguf_lowbit_units.h) read the file's bytes.
//
// Why this shape. At decode every matrix is small (a few MB per layer), so a
// kernel is bound by how many bytes it keeps in flight and by its fixed
// costs, not by arithmetic: each warp owns one task (R whole rows, or one
// row in segments of whole blocks) and copies the task's bytes into its own
// shared-memory staging area with 16-byte loads (aligned down: Q6_K and
// Q8_0 rows start on any even byte), then decodes from there. No block-wide
// barrier after the prologue; no routing pass for the experts (the grid's
// second dimension is the (token, slot) pair or the token).
//
// Decoding. A lane takes "units" of 64 weights: 4 runs of 16, each run 4
// words of int8 codes (q) with a scale a and an offset c, w = a * q - c
// (Q4_K/Q5_K: a = d * sc, c = dmin * m; Q6_K: a = d * sc, c = 32 a; Q8_0:
// a = d, c = 0). Activations are quantized per 32 by the block first (int8,
// scale amax / 127; plus the code sum of every 16), so a run's dot product
// is four dp4a and x_d * (a * sum - c * xsum16).
#include <cuda_fp16.h>

#include <algorithm>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/gguf_units.cuh"
#include "gpu/gguf_direct.h"
#include "gpu/decode_fused.h"
#include "gpu/quant.h"

namespace hmoe::gpu {
using namespace detail;
using namespace detail::gguf;

namespace {

constexpr int kStage = 4432;                  // staging bytes per warp
constexpr int kSpan = kStage - 32;            // largest span staged (room for the alignment shift and word reads past it)
constexpr int kLoads = (kStage / 16 + 31) / 32;  // 16-byte loads per lane and step

enum Mode { kDense = 0, kGateUp = 1, kDown = 2, kDequant = 3 };

struct Params {
  const uint8_t* data;
  const uint8_t* end;  // data + bytes(): nothing past it is read
  int64_t rb;          // row bytes
  int cols, rows;      // rows: of the matrix (dense), of one expert (MoE), to dequantize (dequant)
  int R, SG, nseg, tasks;
  const uint16_t* x;   // dense, gate/up: bf16 activations [n or tokens, cols]
  const float* gu;     // down: [pairs, 2 * cols] gate/up products
  int n, k;
  float* y;
  int64_t ldy;
  const int32_t* ids;
  const float* weights;
  LowbitTables tabs;   // the IQ codebooks (low-bit types)
  // Dense with the input norm fused (nw set): x is read as hb = bf16(nw *
  // (xres + delta) / rms) (gpu::add_rms_norm's values, which block (0, 0)
  // writes to hb); the block that counts itself last in counter adds delta
  // to xres and resets the counter.
  float* xres;
  const float* delta;
  const uint16_t* nw;
  float eps;
  uint16_t* hb;
  float* hf;
  int32_t* counter;
  uint16_t* out;       // dequant: bf16 [rows, cols]
  int64_t r0;          // dequant: first row
};

__device__ __forceinline__ uint4 load_tail(const uint8_t* a, const uint8_t* end) {
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) h[i] = a + 2 * i + 2 <= end ? *reinterpret_cast<const uint16_t*>(a + 2 * i) : 0u;
  return make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
}

__host__ __device__ constexpr int align16(int b) { return (b + 15) / 16 * 16; }

// Shared memory of the activation slots: two int8 code planes, scale per
// 32, code sums per 16 of each plane.
__host__ __device__ constexpr int x_bytes(int nx, int cols) { return align16(nx * (2 * (cols / 4) + cols / 32 + 2 * (cols / 16)) * 4); }

// One staged task of a warp: rows [row0, row0 + Rv) of the matrix or expert,
// starting at matrix row mrow0; out: where row0's result goes.
struct Task {
  int64_t mrow0;
  int row0, Rv;
  float* out;
  int slot;  // activation slot (gate/up: the token's slot 0; down: the warp's)
};

template <class F, int TB, int MODE>
__global__ void __launch_bounds__(512) gg_kernel(Params p) {
  extern __shared__ __align__(16) uint8_t sm[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
  const int cols = p.cols, c4 = cols / 4, nb32 = cols / 32, nb16 = cols / 16;
  const int nx = MODE == kDense ? TB : (MODE == kGateUp ? 1 : (MODE == kDown ? p.k : 0));
  int32_t* xq1 = reinterpret_cast<int32_t*>(sm);
  int32_t* xq2 = xq1 + nx * c4;
  float* xd = reinterpret_cast<float*>(xq2 + nx * c4);
  int32_t* xs1 = reinterpret_cast<int32_t*>(xd + nx * nb32);
  int32_t* xs2 = xs1 + nx * nb16;
  uint8_t* stage_all = sm + x_bytes(nx, cols);
  uint8_t* st = stage_all + warp * kStage;
  float* red = reinterpret_cast<float*>(stage_all + W * kStage) + warp * TB * 64;  // [TB][64] per warp
  float* dsum = reinterpret_cast<float*>(stage_all + W * kStage) + W * TB * 64;    // down: [W][8]
  const int by = blockIdx.y;

  // Tasks: row groups of the matrix (dense, dequant); (slot, row group) of
  // the token's experts (gate/up); row groups with the block's warps as the
  // token's slots (down, block-uniform). Persistent: a warp walks its tasks
  // with the next step's bytes loaded before the current step is computed.
  const int ntask = MODE == kGateUp ? p.k * p.tasks : p.tasks;
  const int first = MODE == kDown ? static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x) * W + warp;
  const int stride = MODE == kDown ? static_cast<int>(gridDim.x) : static_cast<int>(gridDim.x) * W;
  const int U = cols / 64, groups = cols / F::EB;
  auto task_of = [&](int task, Task& tk) {
    int rg = task, j = 0;
    if (MODE == kGateUp) {
      j = task / p.tasks;
      rg = task - j * p.tasks;
    }
    tk.row0 = rg * p.R;
    tk.Rv = min(p.R, p.rows - tk.row0);
    tk.slot = MODE == kDown ? warp : 0;
    tk.mrow0 = tk.row0;
    tk.out = p.y;
    // The routing through L2 (ld.global.cg): the down kernel reads it before
    // its wait, when an L1 line of an earlier layer's routing could be stale.
    if (MODE == kGateUp) {
      const int pair = by * p.k + j;
      tk.mrow0 += static_cast<int64_t>(__ldcg(p.ids + pair)) * p.rows;
      tk.out = p.y + static_cast<int64_t>(pair) * p.rows;
    }
    if (MODE == kDown) tk.mrow0 += static_cast<int64_t>(__ldcg(p.ids + by * p.k + warp)) * p.rows;
    if (MODE == kDequant) tk.mrow0 += p.r0;
  };
  auto span = [&](const Task& tk, int seg, const uint8_t*& g0, const uint8_t*& g1) {
    const uint8_t* base = p.data + tk.mrow0 * p.rb;
    if (p.nseg == 1) {
      g0 = base;
      g1 = base + tk.Rv * p.rb;
    } else {
      const int64_t o0 = static_cast<int64_t>(seg) * p.SG * F::BB;
      g0 = base + o0;
      g1 = base + min(o0 + static_cast<int64_t>(p.SG) * F::BB, p.rb);
    }
  };
  uint4 pre[kLoads];
  auto load = [&](const Task& tk, int seg) {
    const uint8_t *g0, *g1;
    span(tk, seg, g0, g1);
    const uint8_t* a0 = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(g0) & ~static_cast<uintptr_t>(15));
    const int nu4 = static_cast<int>((g1 - a0 + 15) / 16);
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const int i = lane + 32 * c;
      if (i < nu4) {
        const uint8_t* a = a0 + 16 * i;
        pre[c] = a + 16 <= p.end ? __ldg(reinterpret_cast<const uint4*>(a)) : load_tail(a, p.end);
      }
    }
  };

  // The first task's bytes are requested before waiting for the kernel in
  // front (programmatic launch, gpu/common.cuh) where nothing they depend on
  // can still be in flight: dense products (resident weights that no kernel
  // writes) and the down kernel, whose routing was written before the
  // gate/up kernel in front of it passed its own wait (and so before this
  // grid was launched); its gate/up products are read after the wait.
  // Gate/up reads the routing of the kernel right in front; dequantization
  // writes scratch that kernel may read: both wait first.
  constexpr bool kEarly = MODE == kDense || MODE == kDown;
  if (!kEarly) {
    pdl_wait();
    pdl_trigger();
  }
  Task cur{}, nxt{};
  int task = first, seg = 0;
  if (task < ntask) {
    task_of(task, cur);
    load(cur, 0);
  }
  if (kEarly) {
    pdl_wait();
    pdl_trigger();
  }

  // Fused input norm (one token, 256 threads): 1 / rms as add_rms_norm's
  // block computes it, bit for bit (its 256 threads are this block's; over
  // 2048 columns its 512 are two per thread here).
  const bool norm = MODE == kDense && TB == 1 && p.nw != nullptr;
  float ninv = 0.0f;
  if (norm) {
    __shared__ float npart[16];
    const int vt = cols <= 2048 ? 256 : 512, per = (cols + vt - 1) / vt;
    for (int hh = 0; hh < vt / 256; ++hh) {
      const int tv = static_cast<int>(threadIdx.x) + 256 * hh;
      float ss = 0.0f;
#pragma unroll 4
      for (int i = 0; i < per; ++i) {
        const int j = tv + vt * i;
        if (j >= cols) continue;
        float u = p.xres[j];
        if (p.delta) u += p.delta[j];
        ss += u * u;
      }
      ss = warp_sum(ss);
      if (lane == 0) npart[warp + 8 * hh] = ss;
    }
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < vt / 32; ++w) r += npart[w];
    ninv = rsqrtf(r / static_cast<float>(cols) + p.eps);
  }

  // Prologue: the block's activation slots as two int8 planes per 32,
  // x ~ d * (q1 + q2 / 254) (about 16 bits), one lane per 32.
  if (MODE != kDequant) {
    for (int b = threadIdx.x; b < nx * nb32; b += blockDim.x) {
      const int sl = b / nb32, c0 = (b % nb32) * 32;
      float v[32];
      if (MODE == kDown) {
        swiglu32(p.gu + static_cast<int64_t>(by * p.k + sl) * 2 * cols + c0, cols, v);
      } else {
        const int t = MODE == kDense ? by * TB + sl : by;
        if (MODE == kDense && t >= p.n) {
#pragma unroll
          for (int i = 0; i < 32; ++i) v[i] = 0.0f;
        } else if (norm) {  // add_rms_norm's values, rounded to bf16 as hb holds them
          const int64_t o = static_cast<int64_t>(t) * cols + c0;
          const float* xr = p.xres + o;
          const float* dr = p.delta ? p.delta + o : nullptr;
          const bool writer = blockIdx.x == 0 && by == 0;
#pragma unroll
          for (int i = 0; i < 32; ++i) {
            float u = xr[i];
            if (dr) u += dr[i];
            const float f = bf2f(p.nw[c0 + i]) * (u * ninv);
            const uint16_t fb = f2bf(f);
            v[i] = bf2f(fb);
            if (writer) {
              p.hb[o + i] = fb;
              if (p.hf) p.hf[o + i] = f;
            }
          }
        } else {
          const uint4* xr = reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(t) * cols + c0);
#pragma unroll
          for (int i = 0; i < 4; ++i) unpack8(xr[i], v + 8 * i);
        }
      }
      int s1[2], s2[2];
      uint32_t w1[8], w2[8];
      const float d = quantize32_planes(v, w1, w2, s1, s2);
      uint4* d1 = reinterpret_cast<uint4*>(xq1 + sl * c4 + c0 / 4);
      uint4* d2 = reinterpret_cast<uint4*>(xq2 + sl * c4 + c0 / 4);
      d1[0] = make_uint4(w1[0], w1[1], w1[2], w1[3]);
      d1[1] = make_uint4(w1[4], w1[5], w1[6], w1[7]);
      d2[0] = make_uint4(w2[0], w2[1], w2[2], w2[3]);
      d2[1] = make_uint4(w2[4], w2[5], w2[6], w2[7]);
      xd[sl * nb32 + c0 / 32] = d / 254.0f;
      xs1[sl * nb16 + c0 / 16] = s1[0];
      xs1[sl * nb16 + c0 / 16 + 1] = s1[1];
      xs2[sl * nb16 + c0 / 16] = s2[0];
      xs2[sl * nb16 + c0 / 16 + 1] = s2[1];
    }
    __syncthreads();
  }
  if (norm && p.delta) {  // every block has read xres once the last one counts itself: the residual update
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(p.counter, 1) == static_cast<int>(gridDim.x * gridDim.y) - 1;
    __syncthreads();
    if (last) {
      for (int t = 0; t < p.n; ++t)
        for (int j = threadIdx.x; j < cols; j += blockDim.x) p.xres[static_cast<int64_t>(t) * cols + j] += p.delta[static_cast<int64_t>(t) * cols + j];
      if (threadIdx.x == 0) *p.counter = 0;
    }
  }

  float tot[TB];
#pragma unroll
  for (int t = 0; t < TB; ++t) tot[t] = 0.0f;
  while (task < ntask) {
    const uint8_t *g0, *g1;
    span(cur, seg, g0, g1);
    const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(g0) & 15);
    const int nu4 = static_cast<int>((g1 - g0 + shift + 15) / 16);
#pragma unroll
    for (int c = 0; c < kLoads; ++c) {
      const int i = lane + 32 * c;
      if (i < nu4) reinterpret_cast<uint4*>(st)[i] = pre[c];
    }
    __syncwarp();
    int ntask_ = task, nseg_ = seg + 1;
    if (nseg_ == p.nseg) {
      nseg_ = 0;
      ntask_ = task + stride;
    }
    if (ntask_ < ntask) {
      if (ntask_ != task) task_of(ntask_, nxt);
      else nxt = cur;
      load(nxt, nseg_);
    }

    const int seg_groups = p.nseg == 1 ? groups : min(p.SG, groups - seg * p.SG);
    const int nunits = p.nseg == 1 ? cur.Rv * U : seg_groups * F::UPB;
    float part[2][TB];
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
      const int idx = lane + 32 * ii;
#pragma unroll
      for (int t = 0; t < TB; ++t) part[ii][t] = 0.0f;
      if (idx < nunits) {
        int r = 0, gl, q, off, eg;
        if (p.nseg == 1) {
          r = idx / U;
          const int u = idx - r * U;
          gl = u / F::UPB;
          q = u - gl * F::UPB;
          off = shift + r * static_cast<int>(p.rb) + gl * F::BB;
          eg = gl * F::EB;
        } else {
          gl = idx / F::UPB;
          q = idx - gl * F::UPB;
          off = shift + gl * F::BB;
          eg = (seg * p.SG + gl) * F::EB;
        }
        Run run[4];
        F::unit(st, off, q, run, p.tabs);
        if (MODE == kDequant) {
          uint16_t* o = p.out + static_cast<int64_t>(cur.row0 + r) * cols + eg;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            uint32_t hv[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const uint32_t w = run[k].w[i / 2];
              const float lo = run_value(run[k].a, static_cast<int8_t>(w >> (16 * (i & 1))), run[k].c);
              const float hi = run_value(run[k].a, static_cast<int8_t>(w >> (16 * (i & 1) + 8)), run[k].c);
              hv[i] = static_cast<uint32_t>(f2bf(lo)) | (static_cast<uint32_t>(f2bf(hi)) << 16);
            }
            uint4* o4 = reinterpret_cast<uint4*>(o + run[k].e);
            o4[0] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
            o4[1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
          }
        } else {
#pragma unroll
          for (int t = 0; t < TB; ++t) {
            const int sl = MODE == kDense ? t : cur.slot;
            const int32_t* x1 = xq1 + sl * c4;
            const int32_t* x2 = xq2 + sl * c4;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int E = eg + run[k].e;
              const int4 a1 = *reinterpret_cast<const int4*>(x1 + E / 4);
              const int4 a2 = *reinterpret_cast<const int4*>(x2 + E / 4);
              int d1 = __dp4a(static_cast<int>(run[k].w[0]), a1.x, 0);
              d1 = __dp4a(static_cast<int>(run[k].w[1]), a1.y, d1);
              d1 = __dp4a(static_cast<int>(run[k].w[2]), a1.z, d1);
              d1 = __dp4a(static_cast<int>(run[k].w[3]), a1.w, d1);
              int d2 = __dp4a(static_cast<int>(run[k].w[0]), a2.x, 0);
              d2 = __dp4a(static_cast<int>(run[k].w[1]), a2.y, d2);
              d2 = __dp4a(static_cast<int>(run[k].w[2]), a2.z, d2);
              d2 = __dp4a(static_cast<int>(run[k].w[3]), a2.w, d2);
              const int sdot = 254 * d1 + d2, sx = 254 * xs1[sl * nb16 + E / 16] + xs2[sl * nb16 + E / 16];
              part[ii][t] += xd[sl * nb32 + E / 32] * (run[k].a * static_cast<float>(sdot) - run[k].c * static_cast<float>(sx));
            }
          }
        }
      }
    }
    // Row sums: one row per task (lane sums, reduced when the row is done), or
    // R rows of U units: by shuffles within groups of U lanes when U divides
    // 32, else through shared memory (lane r adds row r's U partial sums).
    float rowres[TB];
#pragma unroll
    for (int t = 0; t < TB; ++t) rowres[t] = 0.0f;
    const bool done = seg + 1 == p.nseg;
    if (MODE != kDequant) {
      if (p.R == 1) {
#pragma unroll
        for (int t = 0; t < TB; ++t) tot[t] += part[0][t] + part[1][t];
        if (done) {
#pragma unroll
          for (int t = 0; t < TB; ++t) {
            rowres[t] = warp_sum(tot[t]);
            tot[t] = 0.0f;
          }
        }
      } else if (32 % U == 0) {
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int t = 0; t < TB; ++t) {
            float v = part[ii][t];
            for (int o = U / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane % U == 0) red[t * 64 + (lane + 32 * ii) / U] = v;
          }
        __syncwarp();
        if (lane < cur.Rv) {
#pragma unroll
          for (int t = 0; t < TB; ++t) rowres[t] = red[t * 64 + lane];
        }
      } else {
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int t = 0; t < TB; ++t) red[t * 64 + lane + 32 * ii] = part[ii][t];
        __syncwarp();
        if (lane < cur.Rv) {
#pragma unroll
          for (int t = 0; t < TB; ++t) {
            float sum = 0.0f;
            for (int u = 0; u < U; ++u) sum += red[t * 64 + lane * U + u];
            rowres[t] = sum;
          }
        }
      }
    }
    if (done && lane < cur.Rv) {  // lane r holds row row0 + r (R == 1: every lane holds it; lane 0 writes)
      if (MODE == kDense) {
#pragma unroll
        for (int t = 0; t < TB; ++t)
          if (by * TB + t < p.n) p.y[static_cast<int64_t>(by * TB + t) * p.ldy + cur.row0 + lane] = rowres[t];
      } else if (MODE == kGateUp) {
        cur.out[cur.row0 + lane] = rowres[0];
      } else if (MODE == kDown) {
        dsum[warp * 8 + lane] = rowres[0];
      }
    }
    if (MODE == kDown && done) {  // the block's warps are the token's k slots: weighted sum in slot order
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < cur.Rv) {
        float sum = 0.0f;
        for (int j = 0; j < p.k; ++j) sum += __ldg(p.weights + by * p.k + j) * dsum[j * 8 + threadIdx.x];
        p.y[static_cast<int64_t>(by) * p.ldy + cur.row0 + threadIdx.x] = sum;
      }
      __syncthreads();
    }
    __syncwarp();
    task = ntask_;
    seg = nseg_;
    if (task < ntask) cur = nxt;
  }
}

// ---- host ---------------------------------------------------------------------

struct Fmt {
  int BB, EB, UPB;
};
Fmt fmt_of(GgufType t) {
  switch (t) {
    case GgufType::q4_k: return {Q4K::BB, Q4K::EB, Q4K::UPB};
    case GgufType::q5_k: return {Q5K::BB, Q5K::EB, Q5K::UPB};
    case GgufType::q6_k: return {Q6K::BB, Q6K::EB, Q6K::UPB};
    case GgufType::q8_0: return {Q80::BB, Q80::EB, Q80::UPB};
    case GgufType::q2_k: return {Q2K::BB, Q2K::EB, Q2K::UPB};
    case GgufType::q3_k: return {Q3K::BB, Q3K::EB, Q3K::UPB};
    case GgufType::iq1_s: return {IQ1S::BB, IQ1S::EB, IQ1S::UPB};
    case GgufType::iq1_m: return {IQ1M::BB, IQ1M::EB, IQ1M::UPB};
    case GgufType::iq2_xxs: return {IQ2XXS::BB, IQ2XXS::EB, IQ2XXS::UPB};
    case GgufType::iq2_xs: return {IQ2XS::BB, IQ2XS::EB, IQ2XS::UPB};
    case GgufType::iq2_s: return {IQ2S::BB, IQ2S::EB, IQ2S::UPB};
    case GgufType::iq3_xxs: return {IQ3XXS::BB, IQ3XXS::EB, IQ3XXS::UPB};
    case GgufType::iq3_s: return {IQ3S::BB, IQ3S::EB, IQ3S::UPB};
    case GgufType::iq4_xs: return {IQ4XS::BB, IQ4XS::EB, IQ4XS::UPB};
    case GgufType::iq4_nl: return {IQ4NL::BB, IQ4NL::EB, IQ4NL::UPB};
    case GgufType::mxfp4: return {MXFP4::BB, MXFP4::EB, MXFP4::UPB};
  }
  return {1, 1, 1};
}

// How rows map on warp tasks: short rows R at a time (at most 2 units per
// lane), long rows one at a time in segments of SG groups.
Params plan(const GgufWeight& w, int64_t rows) {
  const Fmt f = fmt_of(w.type);
  Params p{};
  p.data = static_cast<const uint8_t*>(w.data);
  p.end = p.data + w.bytes();
  p.rb = static_cast<int64_t>(w.row_bytes());
  p.cols = static_cast<int>(w.cols);
  p.rows = static_cast<int>(rows);
  const int U = p.cols / 64, groups = p.cols / f.EB;
  if (U <= 32 && 2 * p.rb <= kSpan) {
    p.R = std::min<int>(8, std::min<int>(64 / U, static_cast<int>(kSpan / p.rb)));
    p.SG = groups;
    p.nseg = 1;
  } else if (p.rb <= kSpan && U <= 64) {
    p.R = 1;
    p.SG = groups;
    p.nseg = 1;
  } else {
    p.R = 1;
    p.SG = std::min(kSpan / f.BB, 64 / f.UPB);
    p.nseg = (groups + p.SG - 1) / p.SG;
  }
  p.tasks = (p.rows + p.R - 1) / p.R;
  if (gguf_type_lowbit(w.type)) p.tabs = device_lowbit_tables();
  return p;
}

size_t smem_bytes(int nx, int cols, int warps, int tb) {
  return static_cast<size_t>(x_bytes(nx, cols)) + static_cast<size_t>(warps) * kStage + static_cast<size_t>(warps) * tb * 64 * 4 +
         static_cast<size_t>(warps) * 8 * 4;
}

template <class F, int TB, int MODE>
void launch_one(const Params& p, dim3 grid, int warps, size_t smem, Stream& st) {
  if (smem > 227 * 1024) fail(ErrorKind::unsupported, "gpu GGUF kernels: " + std::to_string(p.cols) + " columns need too much shared memory");
  auto kern = gg_kernel<F, TB, MODE>;
  if (smem > 48 * 1024) HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_pdl(st, kern, grid, dim3(static_cast<unsigned>(warps * 32)), smem, p);
}

template <int TB, int MODE>
void launch(GgufType t, const Params& p, dim3 grid, int warps, size_t smem, Stream& st) {
  switch (t) {
    case GgufType::q4_k: return launch_one<Q4K, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::q5_k: return launch_one<Q5K, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::q6_k: return launch_one<Q6K, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::q8_0: return launch_one<Q80, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::q2_k: return launch_one<Q2K, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::q3_k: return launch_one<Q3K, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq1_s: return launch_one<IQ1S, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq1_m: return launch_one<IQ1M, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq2_xxs: return launch_one<IQ2XXS, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq2_xs: return launch_one<IQ2XS, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq2_s: return launch_one<IQ2S, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq3_xxs: return launch_one<IQ3XXS, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq3_s: return launch_one<IQ3S, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq4_xs: return launch_one<IQ4XS, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::iq4_nl: return launch_one<IQ4NL, TB, MODE>(p, grid, warps, smem, st);
    case GgufType::mxfp4: return launch_one<MXFP4, TB, MODE>(p, grid, warps, smem, st);
  }
}

constexpr int kWarps = 8;

unsigned blocks_for(int tasks, int warps) { return static_cast<unsigned>((tasks + warps - 1) / warps); }

// Blocks for a persistent launch: enough to fill the device a few blocks deep, at most one task per warp.
unsigned persistent_blocks(int64_t warp_tasks, int warps, int64_t per_y) {
  static int sms = [] {
    int dev = 0, n = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&dev));
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  const int64_t want = std::max<int64_t>(1, 2 * static_cast<int64_t>(sms) / std::max<int64_t>(per_y, 1));  // about one resident wave
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((warp_tasks + warps - 1) / warps, want)));
}

}  // namespace

void gguf_gemv(const GgufWeight& w, const bf16_t* x, int64_t n, float* y, int64_t ldy, Stream& s) {
  check_gguf_weight(w, "gpu::gguf_gemv");
  if (n < 0 || ldy < w.rows) fail(ErrorKind::invalid_argument, "gpu::gguf_gemv: bad token count or output stride");
  if (n == 0 || w.rows == 0) return;
  if (n > 65535 * 8) fail(ErrorKind::unsupported, "gpu::gguf_gemv: too many tokens for the decode kernels");
  if (gguf_decode_kernel() != GgufDecodeKernel::staged && gguf_direct::gemv_supported(w, n)) return gguf_direct::gemv(w, x, n, y, ldy, s);
  Params p = plan(w, w.rows);
  p.x = x;
  p.n = static_cast<int>(n);
  p.y = y;
  p.ldy = ldy;
  Stream& st = s;
  if (n == 1) return launch<1, kDense>(w.type, p, dim3(persistent_blocks(p.tasks, kWarps, 1)), kWarps, smem_bytes(1, p.cols, kWarps, 1), st);
  if (n <= 4) return launch<4, kDense>(w.type, p, dim3(persistent_blocks(p.tasks, kWarps, 1)), kWarps, smem_bytes(4, p.cols, kWarps, 4), st);
  const unsigned ty = static_cast<unsigned>((n + 7) / 8);
  launch<8, kDense>(w.type, p, dim3(persistent_blocks(p.tasks, kWarps, ty), ty), kWarps, smem_bytes(8, p.cols, kWarps, 8), st);
}

bool norm_gemv_fits(const GgufWeight& w, int64_t n) { return n == 1 && w.rows > 0 && w.cols <= 8192; }

void add_rms_norm_gguf_gemv(float* x, const float* delta, int64_t n, const bf16_t* norm_w, float eps, bf16_t* hb, float* hf, const GgufWeight& w,
                            float* y, int64_t ldy, int32_t* counter, Stream& s) {
  check_gguf_weight(w, "gpu::add_rms_norm_gguf_gemv");
  if (!norm_gemv_fits(w, n)) fail(ErrorKind::invalid_argument, "gpu::add_rms_norm_gguf_gemv: one token, 1..8192 columns and at least one row");
  if (ldy < w.rows) fail(ErrorKind::invalid_argument, "gpu::add_rms_norm_gguf_gemv: output stride below the rows");
  if (delta && !counter) fail(ErrorKind::invalid_argument, "gpu::add_rms_norm_gguf_gemv: a residual update needs the block counter");
  Params p = plan(w, w.rows);
  p.n = 1;
  p.y = y;
  p.ldy = ldy;
  p.xres = x;
  p.delta = delta;
  p.nw = norm_w;
  p.eps = eps;
  p.hb = hb;
  p.hf = hf;
  p.counter = counter;
  launch<1, kDense>(w.type, p, dim3(persistent_blocks(p.tasks, kWarps, 1)), kWarps, smem_bytes(1, p.cols, kWarps, 1), s);
}

void gguf_dequant(const GgufWeight& w, int64_t r0, int64_t rows, bf16_t* out, Stream& s) {
  check_gguf_weight(w, "gpu::gguf_dequant");
  if (r0 < 0 || rows < 0 || r0 + rows > w.rows) fail(ErrorKind::invalid_argument, "gpu::gguf_dequant: rows out of range");
  if (rows == 0) return;
  Params p = plan(w, rows);
  p.out = out;
  p.r0 = r0;
  launch<1, kDequant>(w.type, p, dim3(blocks_for(p.tasks, kWarps)), kWarps, smem_bytes(0, p.cols, kWarps, 1), s);
}

void gguf_moe_experts(const bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* weights, const GgufWeight& w_gate_up,
                      const GgufWeight& w_down, int64_t inter, float* gu, float* out, Stream& s) {
  check_gguf_weight(w_gate_up, "gpu::gguf_moe_experts gate/up");
  check_gguf_weight(w_down, "gpu::gguf_moe_experts down");
  const int64_t hidden = w_gate_up.cols;
  if (inter <= 0 || w_gate_up.rows % (2 * inter) != 0 || w_down.cols != inter || w_down.rows % hidden != 0 ||
      w_gate_up.rows / (2 * inter) != w_down.rows / hidden)
    fail(ErrorKind::invalid_argument, "gpu::gguf_moe_experts: weight shapes do not match hidden " + std::to_string(hidden) + ", inter " +
                                          std::to_string(inter));
  if (k < 1 || k > 16) fail(ErrorKind::unsupported, "gpu::gguf_moe_experts: k = " + std::to_string(k) + " (1..16 supported)");
  if (n <= 0) return;
  if (n > 65535) fail(ErrorKind::unsupported, "gpu::gguf_moe_experts: too many tokens for the decode kernels");
  if (gguf_decode_kernel() == GgufDecodeKernel::direct && gguf_direct::moe_supported(w_gate_up, w_down, k))
    return gguf_direct::moe_experts(x, n, k, ids, weights, w_gate_up, w_down, inter, gu, out, s);
  Stream& st = s;
  const unsigned ny = static_cast<unsigned>(n);
  Params g = plan(w_gate_up, 2 * inter);
  g.x = x;
  g.k = static_cast<int>(k);
  g.ids = ids;
  g.y = gu;
  launch<1, kGateUp>(w_gate_up.type, g, dim3(persistent_blocks(static_cast<int64_t>(g.tasks) * k, kWarps, n), ny), kWarps,
                     smem_bytes(1, g.cols, kWarps, 1), st);
  Params d = plan(w_down, hidden);
  d.gu = gu;
  d.k = static_cast<int>(k);
  d.ids = ids;
  d.weights = weights;
  d.y = out;
  d.ldy = hidden;
  if (d.R > 8) d.R = 8;  // the block's row sums hold 8 rows per slot
  d.tasks = (d.rows + d.R - 1) / d.R;
  launch<1, kDown>(w_down.type, d, dim3(persistent_blocks(d.tasks, 1, n), ny), static_cast<int>(k),
                   smem_bytes(static_cast<int>(k), d.cols, static_cast<int>(k), 1), st);
}

}  // namespace hmoe::gpu
