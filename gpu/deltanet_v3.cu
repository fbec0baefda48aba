// The chunked delta rule, v3 (gpu/deltanet.h, DeltaNetKernel::v3): v2's
// phase 1, then a walk over the chunks that computes only the states, then
// every chunk's outputs at once.
//
// Phase 1 (v2_prep_kernel<C, true>, gpu/deltanet_tf32.cuh): as v2 (W, the
// masked decayed QK, the factors to the scratch; U to `out`), plus
// K'_i = exp(G_last - G_i) k_i.
//
// Phase 2, one block per (sequence, value head, 32 value columns), chunks in
// order; per chunk c, with S the state entering it (columns in shared memory):
//   S -> scratch (S_c);  u = U - W S -> `out` (over U);  S = exp(G_last) S + K'^T u,
// two dependent 3xTF32 products (v2 has four and a wait on its loads); chunk
// c + 1's W, K' and U arrive by asynchronous copies into a second buffer
// while chunk c computes.
//
// Phase 3, one block per (chunk slot, value head, 64 value columns), all
// chunks at once: o = (exp(G) q) S_c + QK u, written over u in `out`.
//
// Scratch: slots x value heads records of rec_floats(C, dk, true) floats,
// then slots x value heads entering states of dk x dv floats.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"
#include "gpu/deltanet_chunked.h"
#include "gpu/deltanet_tf32.cuh"

namespace hmoe::gpu {
using namespace detail;
using namespace dn;

namespace {

constexpr int kV3Threads = 256;
constexpr int kOutCols = 64;          // value columns per phase-3 block
constexpr int kLdO = kOutCols + 8;    // row stride of phase 3's state and u tiles
constexpr int kBufPad = 8;            // floats after a phase-2 buffer's exp(G_last) (keeps the next buffer 32-byte aligned)

__host__ __device__ constexpr int64_t v3_buf_floats(int64_t C, int64_t dk) { return C * (dk + 4) + C * (dk + 8) + C * kLdS + kBufPad; }
int64_t v3_scan_smem(int64_t C, int64_t dk) { return (dk * kLdS + C * kLdS + 2 * v3_buf_floats(C, dk)) * 4; }
int64_t v3_out_smem(int64_t C, int64_t dk) { return (C * (dk + 4) + dk * kLdO + C * (C + 4) + C * kLdO + C) * 4; }

// Phase 2: grid (groups, value heads, column slices of kCols); zero columns
// past dv, as v2.
template <int C>
__global__ void __launch_bounds__(kV3Threads) v3_scan_kernel(DeltaNetGroups gr, int64_t g0, V2Dims d, int64_t state_off, int64_t max_rec,
                                                             float* out, const float* recs, float* states) {
  constexpr int NB = kCols / 16, c4 = kCols / 4, mt = C / 16;
  const int g = static_cast<int>(g0 + blockIdx.x);
  const int64_t cnt = gr.count[g];
  if (cnt <= max_rec) return;
  __shared__ int64_t s_base;
  const int tid = threadIdx.x, warp = tid >> 5, nwarps = blockDim.x >> 5;
  if (warp == 0) {
    const int64_t b = first_slot(gr, g0, g, max_rec, C);
    if (tid == 0) s_base = b;
  }
  const int hv = blockIdx.y;
  const int c0 = blockIdx.z * kCols, nc = min(kCols, d.dv - c0), n4 = nc / 4, q4 = d.dk / 4, kt = d.dk / 16;
  const int64_t st = gr.start[g], V = static_cast<int64_t>(d.nv) * d.dv, HS = static_cast<int64_t>(d.dk) * d.dv;
  const int64_t R = rec_floats(C, d.dk, true);
  const int ldk = d.dk + 4, ldk2 = d.dk + 8;
  const bool fresh = gr.fresh[g] != 0;
  float* S = v2_state(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * HS;
  extern __shared__ __align__(128) float v3_sm[];
  float* Ss = v3_sm;              // [dk][kLdS] the state's columns
  float* us = Ss + d.dk * kLdS;   // [C][kLdS] u
  float* bufs = us + C * kLdS;    // 2 x { W [C][ldk], K' [C][ldk2], U [C][kLdS], exp(G_last), pad }
  const int64_t bf = v3_buf_floats(C, d.dk);
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int p = tid; p < d.dk * c4; p += blockDim.x) {
    const int r = p / c4, c = (p % c4) * 4;
    const float4 v = fresh || c >= nc ? zero4 : *reinterpret_cast<const float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c);
    *reinterpret_cast<float4*>(Ss + r * kLdS + c) = v;
  }
  __syncthreads();
  const int64_t base = s_base, nch = (cnt + C - 1) / C;
  // Chunk ci's W, K', U and exp(G_last) into buffer b (one commit group per thread).
  auto load = [&](int64_t ci, float* b) {
    const int64_t t0 = st + ci * C;
    const int L = static_cast<int>(min(static_cast<int64_t>(C), cnt - ci * C));
    const float* rec = recs + ((base + ci) * d.nv + hv) * R;
    const float* Wg = rec;
    const float* Fg = rec + C * d.dk + C * C;
    const float* Kg = rec + rec_floats(C, d.dk);
    float* Wb = b;
    float* Kb = Wb + C * ldk;
    float* Ub = Kb + C * ldk2;
    float* Fb = Ub + C * kLdS;
    for (int p = tid; p < C * q4; p += blockDim.x) {
      const int i = p / q4, c = (p % q4) * 4;
      if (i < L) {
        cp_async16(Wb + i * ldk + c, Wg + i * d.dk + c);
        cp_async16(Kb + i * ldk2 + c, Kg + i * d.dk + c);
      } else {
        *reinterpret_cast<float4*>(Wb + i * ldk + c) = zero4;
        *reinterpret_cast<float4*>(Kb + i * ldk2 + c) = zero4;
      }
    }
    for (int p = tid; p < C * c4; p += blockDim.x) {
      const int i = p / c4, c = (p % c4) * 4;
      if (i < L && c < nc) cp_async16(Ub + i * kLdS + c, out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c);
      else *reinterpret_cast<float4*>(Ub + i * kLdS + c) = zero4;
    }
    if (tid == 0) cp_async16(Fb, Fg + 2 * C);
    cp_async_commit();
  };
  load(0, bufs);
  for (int64_t ci = 0; ci < nch; ++ci) {
    float* cur = bufs + (ci & 1) * bf;
    if (ci + 1 < nch) {
      load(ci + 1, bufs + ((ci + 1) & 1) * bf);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* Wb = cur;
    const float* Kb = Wb + C * ldk;
    const float* Ub = Kb + C * ldk2;
    const float dl = Ub[C * kLdS];
    const int64_t t0 = st + ci * C;
    const int L = static_cast<int>(min(static_cast<int64_t>(C), cnt - ci * C));
    // The entering state to the scratch (phase 3's S_c).
    float* Sc = states + ((base + ci) * d.nv + hv) * HS;
    for (int p = tid; p < d.dk * n4; p += blockDim.x) {
      const int r = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(Sc + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kLdS + c);
    }
    // u = U - W S, 16 x 16 tiles.
    for (int t = warp; t < mt * NB; t += nwarps) {
      const int ti = t / NB, n = t % NB;
      Acc prod[1];
      wm::fill_fragment(prod[0], 0.0f);
      mma3x<true, true, 1>(prod, Wb + ti * 16 * ldk, ldk, Ss + n * 16, kLdS, d.dk);
      Acc u;
      wm::load_matrix_sync(u, Ub + ti * 16 * kLdS + n * 16, kLdS, wm::mem_row_major);
#pragma unroll
      for (int e = 0; e < u.num_elements; ++e) u.x[e] -= prod[0].x[e];
      wm::store_matrix_sync(us + ti * 16 * kLdS + n * 16, u, kLdS, wm::mem_row_major);
    }
    __syncthreads();
    for (int p = tid; p < L * n4; p += blockDim.x) {
      const int i = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(us + i * kLdS + c);
    }
    // S = exp(G_last) S + K'^T u, strips of 16 state rows x kCols.
    for (int t = warp; t < kt; t += nwarps) {
      Acc acc[NB];
#pragma unroll
      for (int n = 0; n < NB; ++n) {
        wm::load_matrix_sync(acc[n], Ss + t * 16 * kLdS + n * 16, kLdS, wm::mem_row_major);
#pragma unroll
        for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] *= dl;
      }
      mma3x<false, true, NB>(acc, Kb + t * 16, ldk2, us, kLdS, C);
#pragma unroll
      for (int n = 0; n < NB; ++n) wm::store_matrix_sync(Ss + t * 16 * kLdS + n * 16, acc[n], kLdS, wm::mem_row_major);
    }
    __syncthreads();
  }
  for (int p = tid; p < d.dk * n4; p += blockDim.x) {
    const int r = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kLdS + c);
  }
}

// Phase 3: grid (slots, value heads, column tiles of kOutCols). Each warp
// takes at most one strip of 16 rows x 32 columns (C <= 64: 2 C / 16 <= 8 warps).
template <int C>
__global__ void __launch_bounds__(kV3Threads, 2) v3_out_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, int64_t gn, V2Dims d,
                                                               int64_t max_rec, float* out, const float* recs, const float* states) {
  static_assert(2 * C / 16 <= kV3Threads / 32, "one strip per warp");
  constexpr int mt = C / 16, o4 = kOutCols / 4, ldc = C + 4;
  const int tid = threadIdx.x, warp = tid >> 5;
  ChunkSpan span;
  if (!block_chunk<C>(gr, g0, gn, max_rec, span)) return;
  const int hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int c0 = blockIdx.z * kOutCols, nc = min(kOutCols, d.dv - c0), n4 = nc / 4, q4 = d.dk / 4;
  const int64_t t0 = span.t0;
  const int L = span.L;
  const int64_t V = static_cast<int64_t>(d.nv) * d.dv, HS = static_cast<int64_t>(d.dk) * d.dv, slot = blockIdx.x;
  const float* rec = recs + (slot * d.nv + hv) * rec_floats(C, d.dk, true);
  const float* QKg = rec + C * d.dk;
  const float* Fg = QKg + C * C;
  const float* Sc = states + (slot * d.nv + hv) * HS;
  const int ldk = d.dk + 4;
  extern __shared__ __align__(128) float v3_sm[];
  float* qs = v3_sm;              // [C][ldk] q, then exp(G) q; then the outputs [C][kLdO]
  float* Ss = qs + C * ldk;       // [dk][kLdO]
  float* QKs = Ss + d.dk * kLdO;  // [C][ldc]
  float* us = QKs + C * ldc;      // [C][kLdO]
  float* Fs = us + C * kLdO;      // [C] exp(G_i)
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int p = tid; p < C * q4; p += blockDim.x) {
    const int i = p / q4, c = (p % q4) * 4;
    if (i < L) cp_async16(qs + i * ldk + c, conv_out + (t0 + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + c);
    else *reinterpret_cast<float4*>(qs + i * ldk + c) = zero4;
  }
  for (int p = tid; p < d.dk * o4; p += blockDim.x) {
    const int r = p / o4, c = (p % o4) * 4;
    if (c < nc) cp_async16(Ss + r * kLdO + c, Sc + static_cast<int64_t>(r) * d.dv + c0 + c);
    else *reinterpret_cast<float4*>(Ss + r * kLdO + c) = zero4;
  }
  for (int p = tid; p < C * C / 4; p += blockDim.x) {
    const int i = p / (C / 4), j = (p % (C / 4)) * 4;
    cp_async16(QKs + i * ldc + j, QKg + i * C + j);
  }
  for (int p = tid; p < C * o4; p += blockDim.x) {
    const int i = p / o4, c = (p % o4) * 4;
    if (i < L && c < nc) cp_async16(us + i * kLdO + c, out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c);
    else *reinterpret_cast<float4*>(us + i * kLdO + c) = zero4;
  }
  for (int p = tid; p < C / 4; p += blockDim.x) cp_async16(Fs + 4 * p, Fg + 4 * p);
  cp_async_commit();  // wait_group waits on committed groups only: without it the copies above were never waited for
  cp_async_wait<0>();
  __syncthreads();
  for (int p = tid; p < C * q4; p += blockDim.x) {
    const int i = p / q4, c = (p % q4) * 4;
    float4* v = reinterpret_cast<float4*>(qs + i * ldk + c);
    const float e = Fs[i];
    v->x *= e;
    v->y *= e;
    v->z *= e;
    v->w *= e;
  }
  __syncthreads();
  Acc acc[2];
  const int ti = warp >> 1, half = warp & 1;
  const bool mine = warp < 2 * mt;
  if (mine) {
    wm::fill_fragment(acc[0], 0.0f);
    wm::fill_fragment(acc[1], 0.0f);
    mma3x<true, true, 2>(acc, qs + ti * 16 * ldk, ldk, Ss + half * 32, kLdO, d.dk);
    mma3x<true, true, 2>(acc, QKs + ti * 16 * ldc, ldc, us + half * 32, kLdO, C);
  }
  __syncthreads();  // every warp is done with qs: the outputs go there
  float* os = qs;
  if (mine) {
    wm::store_matrix_sync(os + ti * 16 * kLdO + half * 32, acc[0], kLdO, wm::mem_row_major);
    wm::store_matrix_sync(os + ti * 16 * kLdO + half * 32 + 16, acc[1], kLdO, wm::mem_row_major);
  }
  __syncthreads();
  for (int p = tid; p < L * n4; p += blockDim.x) {
    const int i = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(os + i * kLdO + c);
  }
}

void ensure_opt_in3() {
  static const bool done = [] {
    opt_in_smem(v2_prep_kernel<16, true>);
    opt_in_smem(v3_scan_kernel<16>);
    opt_in_smem(v3_out_kernel<16>);
    opt_in_smem(v2_prep_kernel<32, true>);
    opt_in_smem(v3_scan_kernel<32>);
    opt_in_smem(v3_out_kernel<32>);
    opt_in_smem(v2_prep_kernel<64, true>);
    opt_in_smem(v3_scan_kernel<64>);
    opt_in_smem(v3_out_kernel<64>);
    return true;
  }();
  (void)done;
}

int64_t prep_smem3(int64_t C, int64_t dk) { return (2 * C * (dk + 4) + 2 * C * (C + 4) + 3 * C) * 4; }

std::atomic<int> phases{7};  // set_deltanet_v3_phases

template <int C>
void launch3(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const V2Dims& d,
             int64_t state_off, int64_t max_rec, int64_t slots, float* scratch, float* out, Stream& s) {
  float* states = scratch + slots * d.nv * rec_floats(C, d.dk, true);
  const int mask = phases.load(std::memory_order_relaxed);
  if (mask & 1) {
    const dim3 g1(static_cast<unsigned>(slots), static_cast<unsigned>(d.nv));
    v2_prep_kernel<C, true><<<g1, kPrepThreads, static_cast<size_t>(prep_smem3(C, d.dk)), cs(s)>>>(conv_out, gate, beta, gr, g0, gn, d, max_rec,
                                                                                                    out, scratch);
    HMOE_CUDA_LAUNCHED();
  }
  if (mask & 2) {
    const dim3 g2(static_cast<unsigned>(gn), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kCols - 1) / kCols));
    v3_scan_kernel<C><<<g2, kV3Threads, static_cast<size_t>(v3_scan_smem(C, d.dk)), cs(s)>>>(gr, g0, d, state_off, max_rec, out, scratch, states);
    HMOE_CUDA_LAUNCHED();
  }
  if (mask & 4) {
    const dim3 g3(static_cast<unsigned>(slots), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kOutCols - 1) / kOutCols));
    v3_out_kernel<C><<<g3, kV3Threads, static_cast<size_t>(v3_out_smem(C, d.dk)), cs(s)>>>(conv_out, gr, g0, gn, d, max_rec, out, scratch, states);
    HMOE_CUDA_LAUNCHED();
  }
}

}  // namespace

int64_t deltanet_v3_chunk(const DeltaNetShape& sh, int64_t chunk) {
  if (sh.dk % 16 != 0 || sh.dv % 16 != 0 || sh.dk <= 0 || sh.dv <= 0) return 0;
  int64_t C = chunk > 0 ? chunk : 64;
  if (C != 16 && C != 32 && C != 64) return 0;
  auto need = [&](int64_t c) { return std::max({prep_smem3(c, sh.dk), v3_scan_smem(c, sh.dk), v3_out_smem(c, sh.dk)}); };
  while (C >= 16 && need(C) > smem_optin_limit() - kSmemMargin) C /= 2;
  return C >= 16 ? C : 0;
}

int64_t deltanet_v3_scratch_bytes(const DeltaNetShape& sh, int64_t v3_chunk, int64_t slots) {
  return v3_chunk > 0 ? slots * sh.nv * (rec_floats(v3_chunk, sh.dk, true) + sh.dk * sh.dv) * 4 : 0;
}

void deltanet_v3_configure() { ensure_opt_in3(); }

void set_deltanet_v3_phases(int mask) { phases.store(mask & 7); }

void deltanet_chunked_v3(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v3_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s) {
  if (gn <= 0 || slots <= 0) return;
  const V2Dims d = chunked_launch_dims("v3", conv_out, out, scratch, slots, 0x7fffffff, sh);
  ensure_opt_in3();
  float* sc = static_cast<float*>(scratch);
  with_chunk("v3", v3_chunk, [&](auto c) {
    launch3<decltype(c)::value>(conv_out, gate, beta, gr, g0, gn, d, state_off, max_recurrent, slots, sc, out, s);
  });
}

}  // namespace hmoe::gpu
