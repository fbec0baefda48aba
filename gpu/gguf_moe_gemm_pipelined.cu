// The pipelined grouped GGUF expert product (gpu::gguf_moe_gemm with
// GgufPrefillKernel::pipelined*, gpu/quant.h): same contract and numerics
// as the simple kernel (gpu/gguf_moe_gemm.cu: every weight dequantized to
// bf16 by the format's units, run_value then round to nearest, products on
// mma.sync m16n8k16 with fp32 accumulation), built to keep the tensor cores
// busy instead of waiting on memory and on the dequantization.
//
// Why this shape (issue 27: the simple kernel ran 40-47 TFLOP/s on an H100
// at Qwen3-30B-A3B prefill shapes, ~256-512 rows per expert):
//  - Tiles of BM = 128 sorted rows (64 for passes with few rows per expert)
//    x BN = 128 weight rows: each dequantized weight feeds twice the rows of
//    the simple kernel's 64, halving the dequantization per product. 8
//    warps as 2 x 4, each BM/2 x 32 (64 fp32 accumulators a thread at 128).
//  - Sub-steps of 64 columns: the weights of a sub-step are one unit (64
//    weights, 4 runs of 16) of every weight row, 2 runs per thread, so the
//    dequantization is spread evenly. A unit's runs are not always 64
//    consecutive columns (Q6_K's unit q holds columns 128h + 16g + 32k,
//    k = 0..3): the activation tile is loaded in the same run order
//    (slot_col), so the 16-column mma steps pair the right columns.
//  - A software pipeline with one barrier per sub-step. In sub-step j the
//    block multiplies stage j (activations and dequantized weights in
//    shared memory), dequantizes sub-step j + 1 into the other weight stage
//    (two), and cp.async copies sub-step j + 2's activations (three stages:
//    two sub-steps of lead for the gathered token rows) and, every 4
//    sub-steps, the next 256 columns' raw blocks of the 128 weight rows
//    (two stages; 16-byte copies from the aligned-down row start, the
//    decoders then read those bytes from shared memory). No thread waits on
//    a global load it issued in the same sub-step.
//  - Warps 0-3 multiply first and then dequantize, warps 4-7 the other way
//    round: each SM sub-partition holds one of each (warp % 4), so the
//    tensor-core and integer/fp32 work of a sub-step overlap.
//  - Cheaper conversions (store_run): a code becomes an exact float through
//    the mantissa of 2^23 (a byte permute and a subtraction) rather than an
//    integer-to-float conversion, and bf16 pairs come from one bf16x2
//    conversion; the conversion units were the dequantization's limit.
//  - ldmatrix.x4 fragment loads (rows padded by 8 bf16: 144-byte rows put
//    an 8 x 8 matrix's rows in distinct banks); one x4 gives a 16 x 16 A
//    fragment or the B fragments of two 8-column tiles.
//  - The grid keeps an expert's tiles adjacent (blockIdx.x: the 128-row
//    weight tiles of one row tile, then the expert's next row tile), so a
//    wave of blocks reads a few experts' weights, from L2 after the first.
// Shared memory: (3 BM + 2 BN) x 72 bf16 plus 2 x 128 raw rows of the
// 256-column span (its bytes + 32, rounded to 16): 169,984 bytes at BM = 128
// for Q8_0; one block per SM. GPUs that cannot give a block that much
// (sm_86, sm_89: about 100 KB) run the simple kernel instead.
// Checked here only by compiling for sm_90 and by host-side simulations of
// the index maps (copies, decoder run order, ldmatrix, mma fragments,
// epilogue) and of the pipeline's buffer hazards (k37b); the GPU tests
// (tests/gpu/test_gpu_gguf_native.cpp, test_gpu_gguf_lowbit.cpp) run it.
// No host synchronisation: the tile bound comes from the pair count, as in
// the simple kernel, and blocks past the real count exit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/gguf_moe_gemm.cuh"

namespace hmoe::gpu::detail::moe_gemm {
using namespace detail::gguf;

namespace {

constexpr int BN = 128, SK = 64, LDX = SK + 8, kThreads = 256, kXStages = 3;

template <class F>
struct Span {  // one 256-column span of a weight row as stored
  static constexpr int bytes = F::BB * (256 / F::EB);
  static constexpr int stride = (bytes + 32 + 15) / 16 * 16;  // shared bytes per row: lead (<= 14) + bytes + the decoders' 8-byte over-read
  static constexpr int chunks = stride / 16;
};

template <class F, int BM>
constexpr size_t smem_bytes() {
  return (static_cast<size_t>(kXStages) * BM + 2 * BN) * LDX * 2 + static_cast<size_t>(2) * BN * Span<F>::stride;
}

// Column (within its 256-column span) of run slot k of unit q: the order in
// which the unit's runs arrive, which the activation tile follows.
template <class F>
__device__ __forceinline__ int slot_col(int q, int k) {
  if constexpr (std::is_same_v<F, Q6K>) return 128 * (q >> 1) + 16 * (q & 1) + 32 * k;
  else return 64 * q + 16 * k;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// 16 bytes, zero-filled past src_bytes (0 or 16).
__device__ __forceinline__ void cp16z(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Every copy group but the newest complete.
__device__ __forceinline__ void cp_wait_prev() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void ldsm4(uint32_t* r, const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// The 16 weights of a run as bf16 at o (16-byte aligned): the simple
// kernel's values bit for bit (run_value's a * q - c in two roundings, then
// round to nearest), with cheaper instructions: q as an exact float from its
// byte placed in the mantissa of 2^23 (biased by 128, then 2^23 + 128
// subtracted) instead of an integer conversion, and two weights per bf16x2
// conversion.
__device__ __forceinline__ void store_run(const Run& r, uint16_t* o) {
  uint32_t hv[8];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t x = r.w[m] ^ 0x80808080u;  // byte i: q_i + 128
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float q = __uint_as_float(__byte_perm(x, 0x4B000000u, 0x7540u + static_cast<uint32_t>(i))) - 8388736.0f;
      v[i] = __fsub_rn(__fmul_rn(r.a, q), r.c);
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
    hv[2 * m] = *reinterpret_cast<const uint32_t*>(&lo);
    hv[2 * m + 1] = *reinterpret_cast<const uint32_t*>(&hi);
  }
  uint4* o4 = reinterpret_cast<uint4*>(o);
  o4[0] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
  o4[1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
}

template <class F, int BM>
__global__ void __launch_bounds__(kThreads, 1) moe_gemm_pipelined_kernel(GemmParams p) {
  constexpr int WM = BM / 2, MT = WM / 16, SPAN = Span<F>::bytes, RAWS = Span<F>::stride, NCH = Span<F>::chunks;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint16_t* Xs = reinterpret_cast<uint16_t*>(smem_raw);  // [kXStages][BM][LDX]
  uint16_t* Ws = Xs + kXStages * BM * LDX;               // [2][BN][LDX]
  uint8_t* Raw = reinterpret_cast<uint8_t*>(Ws + 2 * BN * LDX);  // [2][BN][RAWS]

  int e = -1, m0 = 0, mend = 0;
  if (!locate_tile(p.offsets, p.experts, blockIdx.y, BM, e, m0, mend)) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int mcnt = min(BM, mend - m0), n0 = blockIdx.x * BN;
  const int S = p.cols / SK;  // sub-steps; a multiple of 4
  // Weight row 0 of this tile; row r is rb bytes further.
  const uint8_t* wrow0 = p.w + (static_cast<int64_t>(e) * p.rows_per_expert + n0) * p.rb;

  // Activation copies: this thread's chunk c (8 bf16) of rows xr + 32 i.
  constexpr int XR = BM / 32;
  const int xc = tid & 7, xr = tid >> 3;
  const uint16_t* xsrc[XR];
#pragma unroll
  for (int i = 0; i < XR; ++i) {
    const int r = xr + 32 * i;
    if (r < mcnt) {
      const int64_t src = p.rowmap ? __ldg(p.rowmap + m0 + r) / p.k_div : m0 + r;
      xsrc[i] = p.a + src * p.cols;
    } else {
      xsrc[i] = nullptr;  // zero-filled
    }
  }
  auto copy_x = [&](int j, int stage) {
    uint16_t* dst = Xs + stage * BM * LDX;
    const int col = 256 * (j >> 2) + slot_col<F>(j & 3, xc >> 1) + 8 * (xc & 1);
#pragma unroll
    for (int i = 0; i < XR; ++i) {
      uint16_t* d = dst + (xr + 32 * i) * LDX + 8 * xc;
      if (xsrc[i]) cp16(d, xsrc[i] + col);
      else cp16z(d, p.a, 0);
    }
  };
  // Raw blocks of span G (256 columns) of the 128 weight rows, from each row's aligned-down start.
  auto copy_raw = [&](int G) {
    uint8_t* dst = Raw + (G & 1) * BN * RAWS;
    for (int i = tid; i < BN * NCH; i += kThreads) {
      const int r = i / NCH, ch = i % NCH;
      const uint8_t* start = wrow0 + r * p.rb + static_cast<int64_t>(G) * SPAN;
      const uintptr_t al = reinterpret_cast<uintptr_t>(start) & ~static_cast<uintptr_t>(15);
      const uintptr_t end = (reinterpret_cast<uintptr_t>(start) + SPAN + 15) & ~static_cast<uintptr_t>(15);
      if (al + 16 * static_cast<uintptr_t>(ch) < end) cp16(dst + r * RAWS + 16 * ch, reinterpret_cast<const uint8_t*>(al + 16 * ch));
    }
  };
  // Sub-step j's weights as bf16 into its stage: thread t decodes the unit of
  // row t / 2 and stores runs 2 (t & 1) and 2 (t & 1) + 1 (slot k of the
  // 64-column stage: columns 16k..16k+15). Both lanes of a row read the same
  // raw words (a broadcast), so a warp's loads touch 16 rows.
  const int dr = tid >> 1, dh = tid & 1;
  auto dequant = [&](int j) {
    const uint8_t* start = wrow0 + dr * p.rb + static_cast<int64_t>(j >> 2) * SPAN;
    const int lead = static_cast<int>(reinterpret_cast<uintptr_t>(start) & 15);
    const uint8_t* s = Raw + ((j >> 2) & 1) * BN * RAWS + dr * RAWS;
    const int q = j & 3;
    Run run[4];
    if constexpr (F::EB == 256) F::unit(s, lead, q, run, p.tabs);
    else F::unit(s, lead + q * F::BB, 0, run, p.tabs);  // 64-element groups: group q of the span
    // Runs 2 dh and 2 dh + 1 chosen by register selects: a branch on dh would
    // split every warp (dh alternates between lanes) and serialise the halves.
    Run r0 = run[0], r1 = run[1];
    if (dh) {
      r0 = run[2];
      r1 = run[3];
    }
    uint16_t* o = Ws + (j & 1) * BN * LDX + dr * LDX + 32 * dh;
    store_run(r0, o);
    store_run(r1, o + 16);
  };

  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t2 = (lane & 3) * 2;
  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  // ldmatrix lane addresses: A rows lane % 16, column half lane / 16; B rows
  // (8-column tile pair) 8 (lane / 16) + lane % 8, column half (lane / 8) % 2.
  const int a_off = (wm * WM + (lane & 15)) * LDX + 8 * (lane >> 4);
  const int b_off = (wn * 32 + 8 * (lane >> 4) + (lane & 7)) * LDX + 8 * ((lane >> 3) & 1);
  auto mma_step = [&](int j, int xstage) {
    const uint16_t* xs = Xs + xstage * BM * LDX + a_off;
    const uint16_t* ws = Ws + (j & 1) * BN * LDX + b_off;
#pragma unroll
    for (int kk = 0; kk < SK; kk += 16) {
      uint32_t af[MT][4], bf[2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldsm4(af[mt], xs + mt * 16 * LDX + kk);
#pragma unroll
      for (int np = 0; np < 2; ++np) ldsm4(bf[np], ws + np * 16 * LDX + kk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma16816(acc[mt][nt], af[mt], bf[nt >> 1][2 * (nt & 1)], bf[nt >> 1][2 * (nt & 1) + 1]);
    }
  };

  // Copy groups, one committed per interval (between barriers): the
  // prologue's {raw span 0, X 0} and {X 1}; interval j's {X j + 2, raw span
  // j / 4 + 1 when j % 4 == 0}. Waiting for all but the newest at the end of
  // interval j completes X j + 1 (two intervals of lead) and a raw span one
  // interval after its issue, two before its first dequantization.
  copy_raw(0);
  copy_x(0, 0);
  cp_commit();
  if (S > 1) copy_x(1, 1);
  cp_commit();
  cp_wait_prev();
  __syncthreads();
  dequant(0);
  __syncthreads();
  const bool mma_first = warp < 4;
  int xstage = 0;  // j % kXStages
  for (int j = 0; j < S; ++j) {
    if (j + 2 < S) copy_x(j + 2, xstage == 0 ? 2 : xstage - 1);
    if ((j & 3) == 0 && (j >> 2) + 1 < S / 4) copy_raw((j >> 2) + 1);
    cp_commit();
    if (mma_first) {
      mma_step(j, xstage);
      if (j + 1 < S) dequant(j + 1);
    } else {
      if (j + 1 < S) dequant(j + 1);
      mma_step(j, xstage);
    }
    cp_wait_prev();
    __syncthreads();
    xstage = xstage == kXStages - 1 ? 0 : xstage + 1;
  }
  cp_wait_all();

  // C rows: sorted positions m0 + row (row stride rows_per_expert).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = wm * WM + mt * 16 + g + 8 * half;
      if (r >= mcnt) continue;
      float* crow = p.c + static_cast<int64_t>(m0 + r) * p.rows_per_expert + n0 + wn * 32 + t2;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) *reinterpret_cast<float2*>(crow + nt * 8) = make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
    }
}

template <class F, int BM>
bool launch_bm(const GemmParams& p, int64_t pairs, cudaStream_t st) {
  auto kern = moe_gemm_pipelined_kernel<F, BM>;
  constexpr size_t smem = smem_bytes<F, BM>();
  int dev = 0, optin = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&dev));
  HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (static_cast<size_t>(optin) < smem) return false;
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.rows_per_expert / BN), static_cast<unsigned>(tile_bound(pairs, p.experts, BM)));
  kern<<<grid, kThreads, smem, st>>>(p);
  HMOE_CUDA_LAUNCHED();
  return true;
}

template <class F>
bool launch_type(const GemmParams& p, int bm, int64_t pairs, cudaStream_t st) {
  return bm == 128 ? launch_bm<F, 128>(p, pairs, st) : launch_bm<F, 64>(p, pairs, st);
}

}  // namespace

bool launch_pipelined(GgufType t, const GemmParams& p, int bm, int64_t pairs, cudaStream_t st) {
  switch (t) {
    case GgufType::q4_k: return launch_type<Q4K>(p, bm, pairs, st);
    case GgufType::q5_k: return launch_type<Q5K>(p, bm, pairs, st);
    case GgufType::q6_k: return launch_type<Q6K>(p, bm, pairs, st);
    case GgufType::q8_0: return launch_type<Q80>(p, bm, pairs, st);
    case GgufType::q2_k: return launch_type<Q2K>(p, bm, pairs, st);
    case GgufType::q3_k: return launch_type<Q3K>(p, bm, pairs, st);
    case GgufType::iq1_s: return launch_type<IQ1S>(p, bm, pairs, st);
    case GgufType::iq1_m: return launch_type<IQ1M>(p, bm, pairs, st);
    case GgufType::iq2_xxs: return launch_type<IQ2XXS>(p, bm, pairs, st);
    case GgufType::iq2_xs: return launch_type<IQ2XS>(p, bm, pairs, st);
    case GgufType::iq2_s: return launch_type<IQ2S>(p, bm, pairs, st);
    case GgufType::iq3_xxs: return launch_type<IQ3XXS>(p, bm, pairs, st);
    case GgufType::iq3_s: return launch_type<IQ3S>(p, bm, pairs, st);
    case GgufType::iq4_xs: return launch_type<IQ4XS>(p, bm, pairs, st);
    case GgufType::iq4_nl: return launch_type<IQ4NL>(p, bm, pairs, st);
    case GgufType::mxfp4: return launch_type<MXFP4>(p, bm, pairs, st);
  }
  return false;
}

}  // namespace hmoe::gpu::detail::moe_gemm
