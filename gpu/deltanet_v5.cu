// The chunked delta rule, v5 (gpu/deltanet.h, DeltaNetKernel::v5): v4's
// per-chunk algebra in "WY" form, so that the sequential walk over the
// chunks does only the two products that need the state.
//
// Per chunk with entering state S, in v4's terms (gpu/deltanet_v4.cu):
//   u  = Tb (V - diag(exp G) K S) = U - W S,  U = Tb V,  W = Tb diag(exp G) K
//   S' = exp(G_last) S + K^T diag(exp(G_last - G)) u
//   o  = diag(exp G) Q S + QKm u
// U and W do not depend on S; only u and S' do.
//
// Phase 1, all chunks at once: v4's phase 1 (per (chunk, key head): Tb,
// QKm and the factors per value head, gpu/deltanet_v4.cu), then one block
// per (chunk slot, value head): W = (Tb diag(exp G)) K (C x dk) to the
// scratch and U = Tb V (C x dv) into `out` (the chunk's rows, over which
// the walk writes u and phase 3 the outputs); 3xTF32, k only up to the
// diagonal tile (Tb is lower triangular).
//
// Phase 2, the walk: one block per (sequence, value head, 32 value columns),
// 16 warps, the state's 32 columns in shared memory. Per chunk:
//   - the entering state S to the scratch (phase 3 reads it);
//   - P1: u = U - W S (C x dk x 32): 8 tiles of 16 x 16, each split over
//     two warps by halves of dk (8 k steps each instead of 16), the second
//     half handed over through shared memory and a named barrier of the
//     pair; u to `out` and exp(G_last - G) u to shared memory;
//   - P2: S = exp(G_last) S + K^T (exp(G_last - G) u) (dk x C x 32): 16
//     tiles, one per warp, C k steps.
// Two block barriers per chunk (after P1; at the chunk's end, where the
// next chunk's copies are waited for). The next chunk's W, K, U and factors
// (72 KiB for C 64, dk 128) are copied by cp.async into the other of two
// buffers at the start of each chunk, a whole chunk ahead of their use.
// Why 32 columns and 16 warps: at 32k tokens the walk is bound per chunk by
// the L2 -> shared traffic of W and K (64 KiB a block, the same for any
// slice width) and by its 3xTF32 products (1.6 MFLOP each, split over the
// SM's four tensor cores by 16 warps); 16-column slices (256 blocks, two per
// SM) would double the traffic per SM for the same products, and with W and
// K double-buffered a block would still take 175 KiB, so two would not fit
// an SM (256 blocks on 132 SMs: two waves); 64-column slices (64 blocks)
// would leave half the SMs idle. 16 warps rather than 8 halve the
// dependent k steps of P1 and give each tensor core four warps.
//
// Phase 3, all chunks at once: one block per (chunk slot, value head, 64
// value columns): o = (exp(G) Q) S_c + QKm u, over u in `out`.
//
// Scratch (fp32), per chunk slot and value head: v4's record (Tb, QKm,
// factors: 2 C^2 + 2C + 8 floats), W (C dk) and the entering state
// (dk dv): records, then all W, then all states. C 64, dk = dv = 128
// (Qwen3-Next-80B-A3B, 32 value heads): 128.5 KiB per (slot, value head),
// 4.0 MiB per slot; a step of 2048 tokens of one sequence (33 slots, as
// deltanet_v2_slots counts) takes 132.6 MiB. The engine runs prompts in
// steps of max_num_batched_tokens (2048 by default), so the scratch is
// bounded by the step, not by the prompt.
//
// tests/engine/test_deltanet_v5_wy.cpp emulates exactly this on the CPU
// (records, W and U, the walk's split sums, phase 3) against the
// token-by-token recurrence.
#include <algorithm>
#include <atomic>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"
#include "gpu/deltanet_chunked.h"
#include "gpu/deltanet_tf32.cuh"
#include "gpu/deltanet_v4.cuh"

namespace hmoe::gpu {
using namespace detail;
using namespace dn;

namespace {

constexpr int kV5Threads = 256;      // phase 1's W / U blocks and phase 3's
constexpr int kV5WalkThreads = 512;  // the walk: 16 warps
constexpr int kV5Cols = 32;          // value columns per walk block
constexpr int kV5Ld = kV5Cols + 8;   // row stride of the walk's state / U / u tiles
constexpr int kV5OutCols = 64;       // value columns per phase-3 block
constexpr int kV5OutLd = kV5OutCols + 8;
constexpr int kV5Stage = 16 * 20;    // a warp's 16 x 16 staging tile (row stride 20)

// Floats of one walk buffer: W [C][dk + 4], K [C][dk + 4], U [C][kV5Ld], exp(G_last - G_i) [C], exp(G_last), padding.
__host__ __device__ constexpr int64_t v5_buf_floats(int64_t C, int64_t dk) { return 2 * C * (dk + 4) + C * kV5Ld + C + 8; }

int64_t v5_wu_smem(int64_t C, int64_t dk, int64_t dv) { return (2 * C * (C + 4) + C * (dk + 4) + C * (dv + 4) + (kV5Threads / 32) * kV5Stage) * 4; }
// C 64, dk 128: 202.6 KiB.
int64_t v5_walk_smem(int64_t C, int64_t dk) { return (dk * kV5Ld + 2 * v5_buf_floats(C, dk) + 3 * C * kV5Ld) * 4; }
int64_t v5_out_smem(int64_t C, int64_t dk) {
  return (C * std::max<int64_t>(dk + 4, kV5OutLd) + dk * kV5OutLd + C * (C + 4) + C * kV5OutLd) * 4;
}

// Where the scratch's parts start (floats).
struct V5Scratch {
  float* recs;    // [slots][nv] v4 records
  float* ws;      // [slots][nv][C][dk]
  float* states;  // [slots][nv][dk][dv] the state entering each chunk
};
V5Scratch v5_parts(float* scratch, int64_t C, int64_t slots, const V2Dims& d) {
  V5Scratch p;
  p.recs = scratch;
  p.ws = p.recs + slots * d.nv * v4::rec_floats(C);
  p.states = p.ws + slots * d.nv * C * d.dk;
  return p;
}

__device__ __forceinline__ void pair_sync(int id) { asm volatile("bar.sync %0, 64;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void pair_arrive(int id) { asm volatile("bar.arrive %0, 64;" ::"r"(id) : "memory"); }

// Phase 1, second launch: grid (slots, value heads). W = (Tb diag(exp G)) K to ws, U = Tb V into out's rows of the
// chunk. Tb's rows past a ragged chunk's end are zero (v4's phase 1), so are W's.
template <int C>
__global__ void __launch_bounds__(kV5Threads, 2) v5_wu_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, int64_t gn, V2Dims d,
                                                              int64_t max_rec, const float* recs, float* ws, float* out) {
  constexpr int ldc = C + 4, mt = C / 16;
  ChunkSpan span;
  if (!block_chunk<C>(gr, g0, gn, max_rec, span)) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
  const int64_t slot = blockIdx.x, t0 = span.t0;
  const int L = span.L, hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const int ldk = d.dk + 4, ldv = d.dv + 4, q4 = d.dk / 4, v4n = d.dv / 4;
  extern __shared__ __align__(128) float v5_sm[];
  float* Tbs = v5_sm;           // [C][ldc] Tb (tiles on and below the diagonal)
  float* Tes = Tbs + C * ldc;   // [C][ldc] Tb diag(exp G)
  float* Ks = Tes + C * ldc;    // [C][ldk]
  float* Vs = Ks + C * ldk;     // [C][ldv]
  float* stage = Vs + C * ldv;  // per warp [16][20]
  const float* rec = recs + (slot * d.nv + hv) * v4::rec_floats(C);
  const float* eg = rec + 2 * C * C;
  for (int p = tid; p < C * C / 4; p += blockDim.x) {
    const int i = p / (C / 4), j = (p % (C / 4)) * 4;
    if (j / 16 <= i / 16) {
      const float4 t = *reinterpret_cast<const float4*>(rec + i * C + j);
      *reinterpret_cast<float4*>(Tbs + i * ldc + j) = t;
      *reinterpret_cast<float4*>(Tes + i * ldc + j) = make_float4(t.x * eg[j], t.y * eg[j + 1], t.z * eg[j + 2], t.w * eg[j + 3]);
    }
  }
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int p = tid; p < C * q4; p += blockDim.x) {
    const int i = p / q4, c = (p % q4) * 4;
    *reinterpret_cast<float4*>(Ks + i * ldk + c) =
        i < L ? *reinterpret_cast<const float4*>(conv_out + (t0 + i) * d.cdim + K + static_cast<int64_t>(hk) * d.dk + c) : zero4;
  }
  for (int p = tid; p < C * v4n; p += blockDim.x) {
    const int i = p / v4n, c = (p % v4n) * 4;
    *reinterpret_cast<float4*>(Vs + i * ldv + c) =
        i < L ? *reinterpret_cast<const float4*>(conv_out + (t0 + i) * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + c) : zero4;
  }
  __syncthreads();
  const int tw = d.dk / 16, tu = d.dv / 16, ntask = mt * (tw + tu);
  float* st = stage + warp * kV5Stage;
  float* wdst = ws + (slot * d.nv + hv) * C * d.dk;
  for (int t = warp; t < ntask; t += nwarps) {
    const bool isw = t < mt * tw;
    const int u = isw ? t : t - mt * tw, nt = isw ? tw : tu, ti = u / nt, tj = u % nt;
    Acc acc[1];
    wm::fill_fragment(acc[0], 0.0f);
    mma3<true, true, 1>(acc, (isw ? Tes : Tbs) + ti * 16 * ldc, ldc, isw ? Ks + tj * 16 : Vs + tj * 16, isw ? ldk : ldv, 16 * (ti + 1));
    wm::store_matrix_sync(st, acc[0], 20, wm::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 64; e += 32) {
      const int r = e / 4, c = (e % 4) * 4, i = ti * 16 + r;
      const float4 v = *reinterpret_cast<const float4*>(st + r * 20 + c);
      if (isw) *reinterpret_cast<float4*>(wdst + i * d.dk + tj * 16 + c) = v;
      else if (i < L) *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + tj * 16 + c) = v;
    }
    __syncwarp();
  }
}

// Phase 2: grid (groups, value heads, column slices of kV5Cols); a slice of fewer columns runs with zero columns up
// to 32, which no product mixes into the others and nothing writes out.
template <int C>
__global__ void __launch_bounds__(kV5WalkThreads, 1) v5_walk_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, V2Dims d, int64_t state_off,
                                                                    int64_t max_rec, float* out, const float* recs, const float* ws, float* states) {
  static_assert(C % 16 == 0 && C <= 64, "chunks of 16, 32 or 64: at most 8 tiles in P1");
  constexpr int mt = C / 16, c4 = kV5Cols / 4;
  const int g = static_cast<int>(g0 + blockIdx.x);
  const int64_t cnt = gr.count[g];
  if (cnt <= max_rec) return;
  __shared__ int64_t s_base;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
  if (warp == 0) {
    const int64_t b = first_slot(gr, g0, g, max_rec, C);
    if (tid == 0) s_base = b;
  }
  const int hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int c0 = blockIdx.z * kV5Cols, nc = min(kV5Cols, d.dv - c0), n4 = nc / 4, q4 = d.dk / 4, kt = d.dk / 16;
  const int64_t st = gr.start[g], K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t HS = static_cast<int64_t>(d.dk) * d.dv, R4 = v4::rec_floats(C), bf = v5_buf_floats(C, d.dk);
  const int ldk = d.dk + 4;
  const bool fresh = gr.fresh[g] != 0;
  float* S = v2_state(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * HS;
  extern __shared__ __align__(128) float v5_sm[];
  float* Ss = v5_sm;                 // [dk][kV5Ld] the state's columns
  float* bufs = Ss + d.dk * kV5Ld;   // 2 x { W [C][ldk], K [C][ldk], U [C][kV5Ld], exp(G_last - G) [C], exp(G_last), pad }
  float* Ps = bufs + 2 * bf;         // [C][kV5Ld] P1's second halves
  float* Uo = Ps + C * kV5Ld;        // [C][kV5Ld] u
  float* Un = Uo + C * kV5Ld;        // [C][kV5Ld] exp(G_last - G) u
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int p = tid; p < d.dk * c4; p += blockDim.x) {
    const int r = p / c4, c = (p % c4) * 4;
    const float4 v = fresh || c >= nc ? zero4 : *reinterpret_cast<const float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c);
    *reinterpret_cast<float4*>(Ss + r * kV5Ld + c) = v;
  }
  __syncthreads();
  const int64_t base = s_base, nch = (cnt + C - 1) / C;
  auto load = [&](int64_t ci) {
    float* Wb = bufs + (ci & 1) * bf;
    float* Kb = Wb + C * ldk;
    float* Ub = Kb + C * ldk;
    float* Fb = Ub + C * kV5Ld;
    const int64_t t0 = st + ci * C;
    const int L = static_cast<int>(min(static_cast<int64_t>(C), cnt - ci * C));
    const float* wsrc = ws + ((base + ci) * d.nv + hv) * C * d.dk;
    for (int p = tid; p < C * q4; p += blockDim.x) {
      const int i = p / q4, c = (p % q4) * 4;
      cp_async16(Wb + i * ldk + c, wsrc + i * d.dk + c);
      if (i < L) cp_async16(Kb + i * ldk + c, conv_out + (t0 + i) * d.cdim + K + static_cast<int64_t>(hk) * d.dk + c);
      else *reinterpret_cast<float4*>(Kb + i * ldk + c) = zero4;
    }
    for (int p = tid; p < C * c4; p += blockDim.x) {
      const int i = p / c4, c = (p % c4) * 4;
      if (i < L && c < nc) cp_async16(Ub + i * kV5Ld + c, out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c);
      else *reinterpret_cast<float4*>(Ub + i * kV5Ld + c) = zero4;
    }
    const float* f = recs + ((base + ci) * d.nv + hv) * R4 + 2 * C * C + C;  // exp(G_last - G_i), exp(G_last), zeros
    for (int p = tid; p < (C + 8) / 4; p += blockDim.x) cp_async16(Fb + 4 * p, f + 4 * p);
  };
  load(0);
  cp_async_commit();
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int64_t t0 = st + ci * C;
    const int L = static_cast<int>(min(static_cast<int64_t>(C), cnt - ci * C));
    cp_async_wait_all();
    __syncthreads();  // this chunk's buffer, the state after the last chunk's P2, u and its copy free
    if (ci + 1 < nch) {  // into the other buffer, last read in chunk ci - 1
      load(ci + 1);
      cp_async_commit();
    }
    const float* Wb = bufs + (ci & 1) * bf;
    const float* Kb = Wb + C * ldk;
    const float* Ub = Kb + C * ldk;
    const float* Fb = Ub + C * kV5Ld;
    float* Sc = states + ((base + ci) * d.nv + hv) * HS;
    for (int p = tid; p < d.dk * n4; p += blockDim.x) {
      const int r = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(Sc + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kV5Ld + c);
    }
    // P1: u = U - W S; tile (ti, half) by warps tile and tile + 8, one half of dk each.
    {
      const int tile = warp & 7, kh = warp >> 3, kk = d.dk / 2;
      if (tile < 2 * mt && kh < 2) {
        const int ti = tile >> 1, half = tile & 1;
        Acc acc[1];
        wm::fill_fragment(acc[0], 0.0f);
        mma3x<true, true, 1>(acc, Wb + ti * 16 * ldk + kh * kk, ldk, Ss + kh * kk * kV5Ld + half * 16, kV5Ld, kk);
        float* pt = Ps + ti * 16 * kV5Ld + half * 16;
        if (kh == 1) {
          wm::store_matrix_sync(pt, acc[0], kV5Ld, wm::mem_row_major);
          pair_arrive(1 + tile);
        } else {
          pair_sync(1 + tile);
          Acc part;
          wm::load_matrix_sync(part, pt, kV5Ld, wm::mem_row_major);
#pragma unroll
          for (int e = 0; e < part.num_elements; ++e) acc[0].x[e] += part.x[e];
          float* ut = Uo + ti * 16 * kV5Ld + half * 16;
          wm::store_matrix_sync(ut, acc[0], kV5Ld, wm::mem_row_major);
          __syncwarp();
          for (int e = lane; e < 256; e += 32) {
            const int r = e / 16, c = e % 16, i = ti * 16 + r;
            const float v = Ub[i * kV5Ld + half * 16 + c] - ut[r * kV5Ld + c];
            ut[r * kV5Ld + c] = v;
            Un[i * kV5Ld + half * 16 + c] = Fb[i] * v;
          }
        }
      }
    }
    __syncthreads();
    for (int p = tid; p < L * n4; p += blockDim.x) {  // u to out (phase 3 reads it), while P2 runs
      const int i = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Uo + i * kV5Ld + c);
    }
    // P2: S = exp(G_last) S + K^T (exp(G_last - G) u), tiles of 16 state rows x 16 columns.
    const float dl = Fb[C];
    for (int t = warp; t < 2 * kt; t += nwarps) {
      const int strip = t >> 1, half = t & 1;
      Acc acc[1];
      float* tile = Ss + strip * 16 * kV5Ld + half * 16;
      wm::load_matrix_sync(acc[0], tile, kV5Ld, wm::mem_row_major);
#pragma unroll
      for (int e = 0; e < acc[0].num_elements; ++e) acc[0].x[e] *= dl;
      mma3x<false, true, 1>(acc, Kb + strip * 16, ldk, Un + half * 16, kV5Ld, C);
      wm::store_matrix_sync(tile, acc[0], kV5Ld, wm::mem_row_major);
    }
  }
  __syncthreads();
  for (int p = tid; p < d.dk * n4; p += blockDim.x) {
    const int r = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kV5Ld + c);
  }
}

// Phase 3: grid (slots, value heads, column slices of kV5OutCols). o = (exp(G) Q) S_c + QKm u over u in out.
template <int C>
__global__ void __launch_bounds__(kV5Threads, 2) v5_out_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, int64_t gn, V2Dims d,
                                                               int64_t max_rec, const float* recs, const float* states, float* out) {
  static_assert(C % 16 == 0 && C <= 64, "at most 8 tasks: one per warp");
  constexpr int ldc = C + 4, mt = C / 16, o4 = kV5OutCols / 4;
  ChunkSpan span;
  if (!block_chunk<C>(gr, g0, gn, max_rec, span)) return;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int64_t slot = blockIdx.x, t0 = span.t0;
  const int L = span.L, hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int c0 = blockIdx.z * kV5OutCols, nc = min(kV5OutCols, d.dv - c0), n4 = nc / 4, q4 = d.dk / 4;
  const int64_t V = static_cast<int64_t>(d.nv) * d.dv, HS = static_cast<int64_t>(d.dk) * d.dv;
  const int ldk = d.dk + 4;
  extern __shared__ __align__(128) float v5_sm[];
  float* Qs = v5_sm;                                          // [C][ldk] exp(G) q; then the outputs [C][kV5OutLd]
  float* Ss = Qs + C * max(ldk, kV5OutLd);                    // [dk][kV5OutLd] S_c's columns
  float* QKs = Ss + d.dk * kV5OutLd;                          // [C][ldc] QKm (tiles on and below the diagonal)
  float* Us = QKs + C * ldc;                                  // [C][kV5OutLd] u
  const float* rec = recs + (slot * d.nv + hv) * v4::rec_floats(C);
  const float* eg = rec + 2 * C * C;
  const float* Sc = states + (slot * d.nv + hv) * HS;
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int p = tid; p < C * q4; p += blockDim.x) {
    const int i = p / q4, c = (p % q4) * 4;
    float4 v = zero4;
    if (i < L) {
      v = *reinterpret_cast<const float4*>(conv_out + (t0 + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + c);
      const float e = eg[i];
      v = make_float4(v.x * e, v.y * e, v.z * e, v.w * e);
    }
    *reinterpret_cast<float4*>(Qs + i * ldk + c) = v;
  }
  for (int p = tid; p < d.dk * o4; p += blockDim.x) {
    const int r = p / o4, c = (p % o4) * 4;
    *reinterpret_cast<float4*>(Ss + r * kV5OutLd + c) = c < nc ? *reinterpret_cast<const float4*>(Sc + static_cast<int64_t>(r) * d.dv + c0 + c) : zero4;
  }
  for (int p = tid; p < C * C / 4; p += blockDim.x) {
    const int i = p / (C / 4), j = (p % (C / 4)) * 4;
    if (j / 16 <= i / 16) *reinterpret_cast<float4*>(QKs + i * ldc + j) = *reinterpret_cast<const float4*>(rec + C * C + i * C + j);
  }
  for (int p = tid; p < C * o4; p += blockDim.x) {
    const int i = p / o4, c = (p % o4) * 4;
    *reinterpret_cast<float4*>(Us + i * kV5OutLd + c) =
        i < L && c < nc ? *reinterpret_cast<const float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) : zero4;
  }
  __syncthreads();
  const bool active = warp < 2 * mt;
  const int ti = warp >> 1, h = warp & 1;
  Acc acc[2];
  if (active) {
    wm::fill_fragment(acc[0], 0.0f);
    wm::fill_fragment(acc[1], 0.0f);
    mma3<true, true, 2>(acc, Qs + ti * 16 * ldk, ldk, Ss + h * 32, kV5OutLd, d.dk);
    mma3<true, true, 2>(acc, QKs + ti * 16 * ldc, ldc, Us + h * 32, kV5OutLd, 16 * (ti + 1));
  }
  __syncthreads();  // exp(G) q read by every warp: the outputs take its place
  float* Os = Qs;
  if (active) {
    wm::store_matrix_sync(Os + ti * 16 * kV5OutLd + h * 32, acc[0], kV5OutLd, wm::mem_row_major);
    wm::store_matrix_sync(Os + ti * 16 * kV5OutLd + h * 32 + 16, acc[1], kV5OutLd, wm::mem_row_major);
  }
  __syncthreads();
  for (int p = tid; p < L * n4; p += blockDim.x) {
    const int i = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Os + i * kV5OutLd + c);
  }
}

void ensure_opt_in5() {
  static const bool done = [] {
    v4::prep_configure();
    opt_in_smem(v5_wu_kernel<16>);
    opt_in_smem(v5_walk_kernel<16>);
    opt_in_smem(v5_out_kernel<16>);
    opt_in_smem(v5_wu_kernel<32>);
    opt_in_smem(v5_walk_kernel<32>);
    opt_in_smem(v5_out_kernel<32>);
    opt_in_smem(v5_wu_kernel<64>);
    opt_in_smem(v5_walk_kernel<64>);
    opt_in_smem(v5_out_kernel<64>);
    return true;
  }();
  (void)done;
}

std::atomic<int> phases5{7};  // set_deltanet_v5_phases

template <int C>
void launch5(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const V2Dims& d,
             const DeltaNetShape& sh, int64_t state_off, int64_t max_rec, int64_t slots, float* scratch, float* out, Stream& s) {
  const int mask = phases5.load(std::memory_order_relaxed);
  const V5Scratch p = v5_parts(scratch, C, slots, d);
  if (mask & 1) {
    v4::prep_launch(C, conv_out, gate, beta, gr, g0, gn, sh, max_rec, slots, p.recs, s);
    const dim3 g1(static_cast<unsigned>(slots), static_cast<unsigned>(d.nv));
    v5_wu_kernel<C><<<g1, kV5Threads, static_cast<size_t>(v5_wu_smem(C, d.dk, d.dv)), cs(s)>>>(conv_out, gr, g0, gn, d, max_rec, p.recs, p.ws, out);
    HMOE_CUDA_LAUNCHED();
  }
  if (mask & 2) {
    const dim3 g2(static_cast<unsigned>(gn), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kV5Cols - 1) / kV5Cols));
    v5_walk_kernel<C><<<g2, kV5WalkThreads, static_cast<size_t>(v5_walk_smem(C, d.dk)), cs(s)>>>(conv_out, gr, g0, d, state_off, max_rec, out,
                                                                                               p.recs, p.ws, p.states);
    HMOE_CUDA_LAUNCHED();
  }
  if (mask & 4) {
    const dim3 g3(static_cast<unsigned>(slots), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kV5OutCols - 1) / kV5OutCols));
    v5_out_kernel<C><<<g3, kV5Threads, static_cast<size_t>(v5_out_smem(C, d.dk)), cs(s)>>>(conv_out, gr, g0, gn, d, max_rec, p.recs, p.states, out);
    HMOE_CUDA_LAUNCHED();
  }
}

}  // namespace

int64_t deltanet_v5_chunk(const DeltaNetShape& sh, int64_t chunk) {
  if (sh.dk % 16 != 0 || sh.dv % 16 != 0 || sh.dk <= 0 || sh.dv <= 0) return 0;
  int64_t C = chunk > 0 ? chunk : 64;
  if (C != 16 && C != 32 && C != 64) return 0;
  auto need = [&](int64_t c) {
    return std::max({v4::prep_smem(c, sh.dk), v5_wu_smem(c, sh.dk, sh.dv), v5_walk_smem(c, sh.dk), v5_out_smem(c, sh.dk)});
  };
  while (C >= 16 && need(C) > smem_optin_limit() - kSmemMargin) C /= 2;
  return C >= 16 ? C : 0;
}

int64_t deltanet_v5_scratch_bytes(const DeltaNetShape& sh, int64_t v5_chunk, int64_t slots) {
  const int64_t C = v5_chunk;
  return C > 0 ? slots * sh.nv * (v4::rec_floats(C) + C * sh.dk + sh.dk * sh.dv) * 4 : 0;
}

void deltanet_v5_configure() { ensure_opt_in5(); }

void set_deltanet_v5_phases(int mask) { phases5.store(mask & 7); }

void deltanet_chunked_v5(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v5_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s) {
  if (gn <= 0 || slots <= 0) return;
  const V2Dims d = chunked_launch_dims("v5", conv_out, out, scratch, slots, 65535, sh);
  ensure_opt_in5();
  float* sc = static_cast<float*>(scratch);
  with_chunk("v5", v5_chunk, [&](auto c) {
    launch5<decltype(c)::value>(conv_out, gate, beta, gr, g0, gn, d, sh, state_off, max_recurrent, slots, sc, out, s);
  });
}

}  // namespace hmoe::gpu
