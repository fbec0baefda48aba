// Grouped routed-expert product on tensor cores with the GGUF blocks
// dequantized in shared memory (gpu::gguf_moe_gemm, gpu/quant.h): the prefill
// path of resident GGUF experts. No bf16 copy of the experts, no per-expert
// launches and no host synchronisation: one launch per product.
//
// Tiles. A block computes 64 sorted rows (one expert's routed tokens, from
// the device offsets) x 128 output rows. Per K step of 256 columns it copies
// the 64 activation rows (bf16) and dequantizes the expert's 128 x 256
// weights (the format's units, gpu/gguf_units.cuh and gpu/gguf_lowbit_units.h)
// into shared memory (rows padded by 8 bf16: conflict-free fragment reads),
// then 8 warps (2 x 4, each 32 x 32) run mma.sync m16n8k16 (bf16 in, fp32
// accumulate). The grid's second dimension covers an upper bound of the
// 64-row tiles over all experts (pairs / 64 + experts); a block past the
// real count exits after scanning the offsets, so the launch can be
// captured in a graph.
//
// This is the "simple" kernel (GgufPrefillKernel::simple; the default is pipelined); the
// launcher below sends the pipelined choices to gpu/gguf_moe_gemm_pipelined.cu
// (128-row tiles, a cp.async pipeline, issue 27).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/gguf_moe_gemm.cuh"

namespace hmoe::gpu {
using namespace detail;
using namespace detail::gguf;
using namespace detail::moe_gemm;

namespace {

constexpr int BM = 64, BN = 128, BK = 256, LDS = BK + 8, kThreads = 256;
constexpr size_t kSmem = static_cast<size_t>(BM + BN) * LDS * 2;

__device__ __forceinline__ uint32_t ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <class F>
__global__ void __launch_bounds__(kThreads) moe_gemm_kernel(GemmParams p) {
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* Xs = smem;             // [BM][LDS]
  uint16_t* Ws = smem + BM * LDS;  // [BN][LDS]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // This block's tile: the expert and its first sorted row.
  int e = -1, m0 = 0, mend = 0;
  if (!locate_tile(p.offsets, p.experts, blockIdx.y, BM, e, m0, mend)) return;
  const int mcnt = min(BM, mend - m0), n0 = blockIdx.x * BN;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t2 = (lane & 3) * 2;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

  for (int kb = 0; kb < p.cols; kb += BK) {
    // Activations: 64 rows x 32 chunks of 8 bf16.
    for (int i = tid; i < BM * (BK / 8); i += kThreads) {
      const int r = i / (BK / 8), c = i % (BK / 8);
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < mcnt) {
        const int64_t src = p.rowmap ? __ldg(p.rowmap + m0 + r) / p.k_div : m0 + r;
        v = __ldg(reinterpret_cast<const uint4*>(p.a + src * p.cols + kb) + c);
      }
      *reinterpret_cast<uint4*>(Xs + r * LDS + c * 8) = v;
    }
    // Weights: 128 rows x 4 units of 64, decoded from global memory.
    for (int u = tid; u < BN * 4; u += kThreads) {
      const int r = u >> 2, q = u & 3;
      const uint8_t* row = p.w + (static_cast<int64_t>(e) * p.rows_per_expert + n0 + r) * p.rb;
      const uint8_t* al = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(row) & ~static_cast<uintptr_t>(3));
      const int lead = static_cast<int>(row - al);
      Run run[4];
      int eg;
      if (F::EB == 256) {
        F::unit(al, lead + (kb / 256) * F::BB, q, run, p.tabs);
        eg = 0;
      } else {  // Q8_0, IQ4_NL, MXFP4: a group is 64 elements
        F::unit(al, lead + (kb / 64 + q) * F::BB, 0, run, p.tabs);
        eg = 64 * q;
      }
      uint16_t* o = Ws + r * LDS + eg;
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
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint16_t* b = Xs + (wm * 32 + mt * 16) * LDS + kk + t2;
        af[mt][0] = ld32(b + g * LDS);
        af[mt][1] = ld32(b + (g + 8) * LDS);
        af[mt][2] = ld32(b + g * LDS + 8);
        af[mt][3] = ld32(b + (g + 8) * LDS + 8);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const uint16_t* wb = Ws + (wn * 32 + nt * 8 + g) * LDS + kk + t2;
        const uint32_t b0 = ld32(wb), b1 = ld32(wb + 8);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma16816(acc[mt][nt], af[mt], b0, b1);
      }
    }
    __syncthreads();
  }
  // C rows: sorted positions m0 + row (row stride rows_per_expert).
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * 32 + mt * 16 + g + 8 * half;
      if (r >= mcnt) continue;
      float* crow = p.c + static_cast<int64_t>(m0 + r) * p.rows_per_expert + n0 + wn * 32 + t2;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) *reinterpret_cast<float2*>(crow + nt * 8) = make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
    }
}

template <class F>
void launch(const GemmParams& p, dim3 grid, cudaStream_t st) {
  auto kern = moe_gemm_kernel<F>;
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  kern<<<grid, kThreads, kSmem, st>>>(p);
  HMOE_CUDA_LAUNCHED();
}

// Sorted rows per tile: the simple kernel's 64; the pipelined kernel's forced
// tile, or 128 where the pass averages at least 96 rows per expert.
int tile_rows(GgufPrefillKernel k, int64_t pairs, int64_t experts) {
  switch (k) {
    case GgufPrefillKernel::simple: return BM;
    case GgufPrefillKernel::pipelined64: return 64;
    case GgufPrefillKernel::pipelined128: return 128;
    case GgufPrefillKernel::pipelined: return pairs >= 96 * experts ? 128 : 64;
  }
  return BM;
}

}  // namespace

bool gguf_moe_gemm_supported(const GgufWeight& w, int64_t rows_per_expert) { return w.cols % BK == 0 && rows_per_expert % BN == 0 && rows_per_expert > 0; }

void gguf_moe_gemm(const bf16_t* a, const int32_t* rowmap, int64_t k_div, int64_t pairs, const int32_t* offsets, int64_t experts, const GgufWeight& w,
                   int64_t rows_per_expert, float* c, Stream& s) {
  check_gguf_weight(w, "gpu::gguf_moe_gemm");
  if (!gguf_moe_gemm_supported(w, rows_per_expert))
    fail(ErrorKind::unsupported, "gpu::gguf_moe_gemm: columns must be a multiple of 256 and rows per expert of 128 (got " + std::to_string(w.cols) +
                                     ", " + std::to_string(rows_per_expert) + ")");
  if (experts <= 0 || w.rows != experts * rows_per_expert || k_div < 1)
    fail(ErrorKind::invalid_argument, "gpu::gguf_moe_gemm: " + std::to_string(w.rows) + " weight rows are not " + std::to_string(experts) + " experts of " +
                                          std::to_string(rows_per_expert));
  if (pairs <= 0) return;
  const GgufPrefillKernel kern = gguf_prefill_kernel();
  const int64_t tiles = tile_bound(pairs, experts, BM);  // 64-row tiles: the most of any kernel
  if (tiles > 65535) fail(ErrorKind::unsupported, "gpu::gguf_moe_gemm: too many rows in one pass");
  GemmParams p{};
  p.a = a;
  p.rowmap = rowmap;
  p.k_div = static_cast<int>(k_div);
  p.offsets = offsets;
  p.experts = static_cast<int>(experts);
  p.w = static_cast<const uint8_t*>(w.data);
  p.rb = static_cast<int64_t>(w.row_bytes());
  p.cols = static_cast<int>(w.cols);
  p.rows_per_expert = static_cast<int>(rows_per_expert);
  p.c = c;
  if (gguf_type_lowbit(w.type)) p.tabs = device_lowbit_tables();
  cudaStream_t st = cs(s);
  // The pipelined kernel where the device gives a block its shared memory; else the simple one.
  if (kern != GgufPrefillKernel::simple && launch_pipelined(w.type, p, tile_rows(kern, pairs, experts), pairs, st)) return;
  const dim3 grid(static_cast<unsigned>(rows_per_expert / BN), static_cast<unsigned>(tiles));
  switch (w.type) {
    case GgufType::q4_k: return launch<Q4K>(p, grid, st);
    case GgufType::q5_k: return launch<Q5K>(p, grid, st);
    case GgufType::q6_k: return launch<Q6K>(p, grid, st);
    case GgufType::q8_0: return launch<Q80>(p, grid, st);
    case GgufType::q2_k: return launch<Q2K>(p, grid, st);
    case GgufType::q3_k: return launch<Q3K>(p, grid, st);
    case GgufType::iq1_s: return launch<IQ1S>(p, grid, st);
    case GgufType::iq1_m: return launch<IQ1M>(p, grid, st);
    case GgufType::iq2_xxs: return launch<IQ2XXS>(p, grid, st);
    case GgufType::iq2_xs: return launch<IQ2XS>(p, grid, st);
    case GgufType::iq2_s: return launch<IQ2S>(p, grid, st);
    case GgufType::iq3_xxs: return launch<IQ3XXS>(p, grid, st);
    case GgufType::iq3_s: return launch<IQ3S>(p, grid, st);
    case GgufType::iq4_xs: return launch<IQ4XS>(p, grid, st);
    case GgufType::iq4_nl: return launch<IQ4NL>(p, grid, st);
    case GgufType::mxfp4: return launch<MXFP4>(p, grid, st);
  }
}

}  // namespace hmoe::gpu
