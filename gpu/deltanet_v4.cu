// The chunked delta rule, v4 (gpu/deltanet.h, DeltaNetKernel::v4). Two
// launches; the only scratch is two C x C matrices and the decay factors
// per (chunk, value head), small enough to stay in L2 between them.
//
// Per chunk of C tokens with entering state S (dk x dv), G the running sum
// of the decays, K, Q, V the chunk's rows:
//   A  = strictly lower, A[i][j] = beta_i exp(G_i - G_j) k_i.k_j
//   Tb = (I + A)^-1 diag(beta)
//   u  = Tb (V - diag(exp G) K S)
//   o  = diag(exp G) Q S + QKm u,  QKm[i][j] = exp(G_i - G_j) q_i.k_j (j <= i)
//   S' = exp(G_last) S + K^T (diag(exp(G_last - G)) u)
// (tests/engine/test_deltanet_v4_blocked.cpp emulates exactly this on the
// CPU, the scratch records and the blocked inverse included, against the
// token-by-token recurrence.)
//
// Phase 1, one block per (chunk slot, key head), all chunks at once: k k^T
// and q k^T (3xTF32 tensor cores, the tiles on and below the diagonal),
// then per value head of the key head: G (a warp scan), A, (I + A)^-1
// blocked in 16 x 16 blocks: the
// diagonal blocks by forward substitution (a column per thread, in
// registers), the blocks below by T_ij = -T_ii sum_{m=j}^{i-1} A_im T_mj,
// one block diagonal at a time. Writes Tb, QKm and the factors exp(G_i),
// exp(G_last - G_i), exp(G_last) (zero on a ragged chunk's padded rows, so
// they add nothing).
//
// Phase 2, one block per (sequence, value head, 32 value columns), chunks in
// order, the state's columns in shared memory. This walk (8 warps, walk 1:
// the default, measured on an H100) and a 16-warp one (walk 2,
// gpu/deltanet_v4_walk.cu, not run on a GPU yet): set_deltanet_v4_walk.
// Per chunk, 8 warps:
//   A: [K; Q] S, 2C x dk x 32 (warp w < C/16: K strip w, R = V - exp(G) K S;
//      warp 4 + i: Q strip i, exp(G) Q S)
//   B: u = Tb R (strips x 16 columns, k only up to the diagonal)
//   C: S = exp(G_last) S + K^T (exp(G_last - G) u), O = exp(G) Q S + QKm u
// all in 3xTF32 (mma3x). The next chunk's rows are copied asynchronously
// as early as its region allows: K, QKm and the factors (double-buffered) at
// the chunk's start, Q and V after A, Tb after B (both prefetched into L2 at
// the chunk's start). v4 writes only the outputs into `out`.
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

// The record (gpu/deltanet_v4.cuh).
__host__ __device__ constexpr int64_t v4_rec_floats(int64_t C) { return v4::rec_floats(C); }

constexpr int kV4Threads = 256;
constexpr int kV4Cols = 32;         // value columns per phase-2 block
constexpr int kV4Ld = kV4Cols + 8;  // row stride of the state / V / R / u / O tiles

int64_t v4_prep_smem(int64_t C, int64_t dk) { return (2 * C * (C + 4) + 2 * C + std::max(2 * C * (dk + 4), 3 * C * (C + 4))) * 4; }
// The walk's: K, QKm and the factors twice (this chunk's and the next's), C = 64 and dk = 128: 221 KiB.
int64_t v4_walk_smem(int64_t C, int64_t dk) {
  return (dk * kV4Ld + 3 * C * (dk + 4) + C * kV4Ld + 3 * C * (C + 4) + 2 * (2 * C + 8) + 4 * C * kV4Ld) * 4;
}

// Phase 1: grid (key heads, slots), slots in reverse order: the blocks run
// roughly in order of their index, so the first chunks' rows and records are
// the last ones touched, the likeliest still in L2 when the walk starts on
// them. k k^T and q k^T depend on the key head only: computed once, then
// each of its value heads' record (its own decays and betas) from them.
template <int C>
__global__ void __launch_bounds__(kV4Threads, 2) v4_prep_kernel(const float* conv_out, const float* gate, const float* beta, DeltaNetGroups gr,
                                                                 int64_t g0, int64_t gn, V2Dims d, int64_t max_rec, float* scratch) {
  static_assert(C % 16 == 0 && C <= 64, "chunks of 16, 32 or 64");
  constexpr int ldc = C + 4, nb = C / 16;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nwarps = blockDim.x >> 5;
  ChunkSpan span;
  const int64_t slot = static_cast<int64_t>(gridDim.y) - 1 - blockIdx.y;
  if (!block_chunk<C>(gr, g0, gn, max_rec, span, slot)) return;
  const int hk = blockIdx.x, r = d.nv / d.nk;
  const int64_t t0 = span.t0;
  const int L = span.L;
  const int ldk = d.dk + 4;
  extern __shared__ __align__(128) float v4_sm[];
  float* KK = v4_sm;          // [C][ldc] k k^T
  float* QK = KK + C * ldc;   // [C][ldc] q k^T
  float* Gs = QK + C * ldc;   // [C] running decay sum of the value head in hand
  float* Bs = Gs + C;         // [C] its betas
  float* un = Bs + C;         // k and q rows, then A, T = (I + A)^-1 and the inverse's partial sums X
  float* ks = un;             // [C][ldk]
  float* qs = ks + C * ldk;   // [C][ldk]
  float* A = un;              // [C][ldc]
  float* T = A + C * ldc;     // [C][ldc]
  float* X = T + C * ldc;     // [C][ldc]
  load_qk_rows<C>(conv_out, t0, L, d, hk, qs, ks, ldk);
  __syncthreads();
  // k k^T and q k^T, the tiles on and below the diagonal.
  constexpr int ntri = nb * (nb + 1) / 2;
  for (int t = warp; t < 2 * ntri; t += nwarps) {
    int idx = t % ntri, ti = 0;
    while (idx > ti) {
      idx -= ti + 1;
      ++ti;
    }
    const int tj = idx;
    Acc acc[1];
    wm::fill_fragment(acc[0], 0.0f);
    mma3x<true, false, 1>(acc, (t < ntri ? ks : qs) + ti * 16 * ldk, ldk, ks + tj * 16 * ldk, ldk, d.dk);
    wm::store_matrix_sync((t < ntri ? KK : QK) + ti * 16 * ldc + tj * 16, acc[0], ldc, wm::mem_row_major);
  }
  __syncthreads();  // k and q rows no longer read: A, T, X take their place
  for (int hv = hk * r; hv < (hk + 1) * r; ++hv) {
    if (tid < C) {
      Gs[tid] = tid < L ? gate[(t0 + tid) * d.nv + hv] : 0.0f;  // padded rows: no decay, so G stays G_last
      Bs[tid] = tid < L ? beta[(t0 + tid) * d.nv + hv] : 0.0f;
    }
    __syncthreads();
    if (warp == 0) {  // inclusive running sum of the decays, two values per lane
      float a = lane < C ? Gs[lane] : 0.0f, b = lane + 32 < C ? Gs[lane + 32] : 0.0f;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float ta = __shfl_up_sync(0xffffffffu, a, o), tb = __shfl_up_sync(0xffffffffu, b, o);
        if (lane >= o) {
          a += ta;
          b += tb;
        }
      }
      b += __shfl_sync(0xffffffffu, a, 31);
      if (lane < C) Gs[lane] = a;
      if (lane + 32 < C) Gs[lane + 32] = b;
    }
    __syncthreads();
    float* rec = scratch + (slot * d.nv + hv) * v4_rec_floats(C);
    float* Tbg = rec;
    float* QKg = Tbg + C * C;
    float* Fg = QKg + C * C;
    const float glast = Gs[C - 1];
    for (int p = tid; p < C * C; p += blockDim.x) {
      const int i = p / C, j = p % C;
      const bool in = j <= i && i < L;  // tiles above the diagonal were never computed: select, never multiply by 0
      const float e = in ? expf(Gs[i] - Gs[j]) : 0.0f;
      if (j / 16 <= i / 16) QKg[p] = in ? e * QK[i * ldc + j] : 0.0f;  // the tiles on and below the diagonal only
      A[i * ldc + j] = in && j < i ? Bs[i] * e * KK[i * ldc + j] : 0.0f;
      if (i / 16 < j / 16) T[i * ldc + j] = 0.0f;  // the blocks above the diagonal
    }
    if (tid < C) {
      Fg[tid] = tid < L ? expf(Gs[tid]) : 0.0f;
      Fg[C + tid] = tid < L ? expf(glast - Gs[tid]) : 0.0f;
    }
    if (tid < 8) Fg[2 * C + tid] = tid == 0 ? expf(glast) : 0.0f;
    __syncthreads();
    if (tid < C) {  // diagonal blocks: column j of (I + A_bb)^-1, forward substitution
      const int b = tid / 16, j = tid % 16;
      const float* Ab = A + (b * 16) * ldc + b * 16;
      float t[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) t[i] = i == j ? 1.0f : 0.0f;
#pragma unroll
      for (int i = 1; i < 16; ++i) {
        float acc = t[i];
#pragma unroll
        for (int m = 0; m < i; ++m) acc -= Ab[i * ldc + m] * t[m];
        t[i] = acc;
      }
      float* Tc = T + (b * 16) * ldc + b * 16 + j;
#pragma unroll
      for (int i = 0; i < 16; ++i) Tc[i * ldc] = t[i];
    }
    __syncthreads();
    for (int dd = 1; dd < nb; ++dd) {  // block diagonal dd: (ib, jb) = (jb + dd, jb)
      for (int p = tid; p < (nb - dd) * 256; p += blockDim.x) {
        const int jb = p / 256, ib = jb + dd, rr = (p / 16) % 16, c = p % 16;
        const float* Ar = A + (ib * 16 + rr) * ldc;
        float acc = 0;
        for (int m = jb * 16; m < ib * 16; ++m) acc += Ar[m] * T[m * ldc + jb * 16 + c];
        X[(ib * 16 + rr) * ldc + jb * 16 + c] = acc;
      }
      __syncthreads();
      for (int p = tid; p < (nb - dd) * 256; p += blockDim.x) {
        const int jb = p / 256, ib = jb + dd, rr = (p / 16) % 16, c = p % 16;
        const float* Tr = T + (ib * 16 + rr) * ldc + ib * 16;
        float acc = 0;
#pragma unroll
        for (int m = 0; m < 16; ++m) acc += Tr[m] * X[(ib * 16 + m) * ldc + jb * 16 + c];
        T[(ib * 16 + rr) * ldc + jb * 16 + c] = -acc;
      }
      __syncthreads();
    }
    for (int p = tid; p < C * C; p += blockDim.x) {
      const int i = p / C, j = p % C;
      if (j / 16 <= i / 16) Tbg[p] = T[i * ldc + j] * Bs[j];
    }
    __syncthreads();  // the next value head's G, beta, A and T overwrite these
  }
}

// Phase 2: grid (groups, value heads, column slices of kV4Cols). A slice of
// fewer columns (dv not a multiple of 32) runs with zero columns up to 32,
// which no product mixes into the others and nothing writes out.
template <int C>
__global__ void __launch_bounds__(kV4Threads, 1) v4_walk_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, V2Dims d, int64_t state_off,
                                                                int64_t max_rec, float* out, const float* recs) {
  static_assert(C % 16 == 0 && C <= 64, "chunks of 16, 32 or 64: at most 4 strips, warps 0-3 and 4-7");
  constexpr int mt = C / 16, ldc = C + 4, c4 = kV4Cols / 4;
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
  const int c0 = blockIdx.z * kV4Cols, nc = min(kV4Cols, d.dv - c0), n4 = nc / 4, q4 = d.dk / 4, kt = d.dk / 16;
  const int64_t st = gr.start[g], K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t R = v4_rec_floats(C);
  const int ldk = d.dk + 4;
  const bool fresh = gr.fresh[g] != 0;
  float* S = v2_state(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * d.dk * d.dv;
  extern __shared__ __align__(128) float v4_sm[];
  float* Ss = v4_sm;                // [dk][kV4Ld] the state's columns
  float* Kb = Ss + d.dk * kV4Ld;    // 2 x [C][ldk] K of chunks ci (buffer ci & 1) and ci + 1
  float* Qs = Kb + 2 * C * ldk;     // [C][ldk]
  float* Vs = Qs + C * ldk;         // [C][kV4Ld]
  float* Tbs = Vs + C * kV4Ld;      // [C][ldc]
  float* QKb = Tbs + C * ldc;       // 2 x [C][ldc] QKm, as K
  float* Fb = QKb + 2 * C * ldc;    // 2 x [2C + 8] exp(G_i), exp(G_last - G_i), exp(G_last), as K
  float* Rs = Fb + 2 * (2 * C + 8); // [C][kV4Ld] V - exp(G) K S
  float* Us = Rs + C * kV4Ld;       // [C][kV4Ld] u
  float* U2s = Us + C * kV4Ld;      // [C][kV4Ld] exp(G_last - G) u
  float* Os = U2s + C * kV4Ld;      // [C][kV4Ld] the outputs
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int p = tid; p < d.dk * c4; p += blockDim.x) {
    const int r = p / c4, c = (p % c4) * 4;
    const float4 v = fresh || c >= nc ? zero4 : *reinterpret_cast<const float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c);
    *reinterpret_cast<float4*>(Ss + r * kV4Ld + c) = v;
  }
  __syncthreads();
  const int64_t base = s_base, nch = (cnt + C - 1) / C;
  auto span_of = [&](int64_t ci, int64_t& t0, int& L) {
    t0 = st + ci * C;
    L = static_cast<int>(min(static_cast<int64_t>(C), cnt - ci * C));
  };
  auto rec_of = [&](int64_t ci) { return recs + ((base + ci) * d.nv + hv) * R; };
  // key-head rows (off 0: q, K: k) of chunk ci into dst, zero past L
  auto load_rows = [&](int64_t ci, int64_t off, float* dst) {
    int64_t t0;
    int L;
    span_of(ci, t0, L);
    for (int p = tid; p < C * q4; p += blockDim.x) {
      const int i = p / q4, c = (p % q4) * 4;
      if (i < L) cp_async16(dst + i * ldk + c, conv_out + (t0 + i) * d.cdim + off + static_cast<int64_t>(hk) * d.dk + c);
      else *reinterpret_cast<float4*>(dst + i * ldk + c) = zero4;
    }
  };
  auto load_v = [&](int64_t ci) {
    int64_t t0;
    int L;
    span_of(ci, t0, L);
    for (int p = tid; p < C * c4; p += blockDim.x) {
      const int i = p / c4, c = (p % c4) * 4;
      if (i < L && c < nc) cp_async16(Vs + i * kV4Ld + c, conv_out + (t0 + i) * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + c0 + c);
      else *reinterpret_cast<float4*>(Vs + i * kV4Ld + c) = zero4;
    }
  };
  auto load_cc = [&](const float* src, float* dst) {  // a C x C matrix of the record: its tiles on and below the diagonal
    for (int p = tid; p < C * C / 4; p += blockDim.x) {
      const int i = p / (C / 4), j = (p % (C / 4)) * 4;
      if (j / 16 <= i / 16) cp_async16(dst + i * ldc + j, src + i * C + j);
    }
  };
  auto load_f = [&](int64_t ci) {
    const float* Fg = rec_of(ci) + 2 * C * C;
    float* Fs = Fb + (ci & 1) * (2 * C + 8);
    for (int p = tid; p < (2 * C + 8) / 4; p += blockDim.x) cp_async16(Fs + 4 * p, Fg + 4 * p);
  };
  load_rows(0, K, Kb);
  load_rows(0, 0, Qs);
  load_v(0);
  load_cc(rec_of(0), Tbs);
  load_cc(rec_of(0) + C * C, QKb);
  load_f(0);
  for (int64_t ci = 0; ci < nch; ++ci) {
    int64_t t0;
    int L;
    span_of(ci, t0, L);
    const bool more = ci + 1 < nch;
    float* Ks = Kb + (ci & 1) * C * ldk;
    float* QKs = QKb + (ci & 1) * C * ldc;
    const float* Fs = Fb + (ci & 1) * (2 * C + 8);
    cp_async_wait_all();
    __syncthreads();
    if (more) {  // the next chunk's K, QKm and factors into the other buffers (last read in chunk ci - 1), the rest into L2
      load_rows(ci + 1, K, Kb + ((ci + 1) & 1) * C * ldk);
      load_cc(rec_of(ci + 1) + C * C, QKb + ((ci + 1) & 1) * C * ldc);
      load_f(ci + 1);
      cp_async_commit();
      int64_t tn;
      int Ln;
      span_of(ci + 1, tn, Ln);
      const float* rn = rec_of(ci + 1);
      constexpr int tb_lines = (C + 31) / 32;  // 128-byte lines per row of Tb
      const int row_lines = (d.dk * 4 + 127) / 128;
      for (int p = tid; p < C * tb_lines; p += blockDim.x) {  // Tb's tiles on and below the diagonal
        const int i = p / tb_lines, l = p % tb_lines;
        if (32 * l < 16 * (i / 16 + 1)) prefetch_l2(rn + i * C + 32 * l);
      }
      for (int p = tid; p < Ln * row_lines; p += blockDim.x) {  // q rows (k's are being copied already)
        const int i = p / row_lines, l = p % row_lines;
        prefetch_l2(conv_out + (tn + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + l * 32);
      }
      for (int p = tid; p < Ln; p += blockDim.x) prefetch_l2(conv_out + (tn + p) * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + c0);
    }
    // A: [K; Q] S. K strips -> R = V - exp(G) K S; Q strips -> O = exp(G) Q S.
    const bool kwarp = warp < mt, qwarp = warp >= 4 && warp - 4 < mt;
    if (kwarp || qwarp) {
      const int ti = kwarp ? warp : warp - 4;
      Acc acc[2];
      wm::fill_fragment(acc[0], 0.0f);
      wm::fill_fragment(acc[1], 0.0f);
      mma3x<true, true, 2>(acc, (kwarp ? Ks : Qs) + ti * 16 * ldk, ldk, Ss, kV4Ld, d.dk);
      float* tile = (kwarp ? Rs : Os) + ti * 16 * kV4Ld;
      wm::store_matrix_sync(tile, acc[0], kV4Ld, wm::mem_row_major);
      wm::store_matrix_sync(tile + 16, acc[1], kV4Ld, wm::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 16 * kV4Cols; e += 32) {
        const int r = ti * 16 + e / kV4Cols, c = e % kV4Cols;
        const float x = Fs[r] * tile[(e / kV4Cols) * kV4Ld + c];
        tile[(e / kV4Cols) * kV4Ld + c] = kwarp ? Vs[r * kV4Ld + c] - x : x;
      }
    }
    __syncthreads();
    if (more) {  // Q and V are read only in A
      load_rows(ci + 1, 0, Qs);
      load_v(ci + 1);
      cp_async_commit();
    }
    // B: u = Tb R, tasks of 16 rows x 16 columns, k up to the diagonal (Tb is lower triangular).
    for (int t = warp; t < 2 * mt; t += nwarps) {
      const int ti = t >> 1, half = t & 1;
      Acc acc[1];
      wm::fill_fragment(acc[0], 0.0f);
      mma3x<true, true, 1>(acc, Tbs + ti * 16 * ldc, ldc, Rs + half * 16, kV4Ld, 16 * (ti + 1));
      float* tile = Us + ti * 16 * kV4Ld + half * 16;
      wm::store_matrix_sync(tile, acc[0], kV4Ld, wm::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int r = e / 16, c = e % 16;
        U2s[(ti * 16 + r) * kV4Ld + half * 16 + c] = Fs[C + ti * 16 + r] * tile[r * kV4Ld + c];
      }
    }
    __syncthreads();
    if (more) {  // Tb is read only in B
      load_cc(rec_of(ci + 1), Tbs);
      cp_async_commit();
    }
    // C: S = exp(G_last) S + K^T (exp(G_last - G) u) in strips of 16 state rows (a warp each for dk 128);
    // O += QKm u in tiles of 16 x 16, the longest (the last rows') first, to warps 0, 1, ...
    const float dl = Fs[2 * C];
    for (int t = warp; t < kt; t += nwarps) {
      Acc acc[2];
      float* tile = Ss + t * 16 * kV4Ld;
      wm::load_matrix_sync(acc[0], tile, kV4Ld, wm::mem_row_major);
      wm::load_matrix_sync(acc[1], tile + 16, kV4Ld, wm::mem_row_major);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] *= dl;
      mma3x<false, true, 2>(acc, Ks + t * 16, ldk, U2s, kV4Ld, C);
      wm::store_matrix_sync(tile, acc[0], kV4Ld, wm::mem_row_major);
      wm::store_matrix_sync(tile + 16, acc[1], kV4Ld, wm::mem_row_major);
    }
    for (int o = warp; o < 2 * mt; o += nwarps) {
      const int ti = mt - 1 - o / 2, half = o & 1;
      Acc acc[1];
      float* tile = Os + ti * 16 * kV4Ld + half * 16;
      wm::load_matrix_sync(acc[0], tile, kV4Ld, wm::mem_row_major);
      mma3x<true, true, 1>(acc, QKs + ti * 16 * ldc, ldc, Us + half * 16, kV4Ld, 16 * (ti + 1));
      wm::store_matrix_sync(tile, acc[0], kV4Ld, wm::mem_row_major);
    }
    __syncthreads();
    for (int p = tid; p < L * n4; p += blockDim.x) {
      const int i = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Os + i * kV4Ld + c);
    }
  }
  for (int p = tid; p < d.dk * n4; p += blockDim.x) {
    const int r = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kV4Ld + c);
  }
}

void ensure_opt_in4() {
  static const bool done = [] {
    opt_in_smem(v4_prep_kernel<16>);
    opt_in_smem(v4_walk_kernel<16>);
    opt_in_smem(v4_prep_kernel<32>);
    opt_in_smem(v4_walk_kernel<32>);
    opt_in_smem(v4_prep_kernel<64>);
    opt_in_smem(v4_walk_kernel<64>);
    return true;
  }();
  (void)done;
}

std::atomic<int> phases4{3};  // set_deltanet_v4_phases
std::atomic<int> walk4{2};    // set_deltanet_v4_walk (2 since its H100 run of 2026-12-07: 6-8% faster, same tests)

template <int C>
void launch4(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const V2Dims& d,
             const DeltaNetShape& sh, int64_t state_off, int64_t max_rec, int64_t slots, float* scratch, float* out, Stream& s) {
  const int mask = phases4.load(std::memory_order_relaxed);
  if (mask & 1) {
    const dim3 g1(static_cast<unsigned>(d.nk), static_cast<unsigned>(slots));
    v4_prep_kernel<C><<<g1, kV4Threads, static_cast<size_t>(v4_prep_smem(C, d.dk)), cs(s)>>>(conv_out, gate, beta, gr, g0, gn, d, max_rec, scratch);
    HMOE_CUDA_LAUNCHED();
  }
  if (mask & 2) {
    if (walk4.load(std::memory_order_relaxed) == 1) {
      const dim3 g2(static_cast<unsigned>(gn), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kV4Cols - 1) / kV4Cols));
      v4_walk_kernel<C><<<g2, kV4Threads, static_cast<size_t>(v4_walk_smem(C, d.dk)), cs(s)>>>(conv_out, gr, g0, d, state_off, max_rec, out, scratch);
      HMOE_CUDA_LAUNCHED();
    } else {
      v4::walk16_launch(C, conv_out, gr, g0, gn, sh, state_off, max_rec, out, scratch, (mask & 4) == 0, s);
    }
  }
}

}  // namespace

int64_t v4::prep_smem(int64_t C, int64_t dk) { return v4_prep_smem(C, dk); }

void v4::prep_configure() { ensure_opt_in4(); }

void v4::prep_launch(int C, const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                     const DeltaNetShape& sh, int64_t max_rec, int64_t slots, float* recs, Stream& s) {
  const V2Dims d = chunked_launch_dims("v5", conv_out, recs, recs, slots, 65535, sh);
  ensure_opt_in4();
  with_chunk("v5", C, [&](auto c) {
    constexpr int CC = decltype(c)::value;
    const dim3 g1(static_cast<unsigned>(d.nk), static_cast<unsigned>(slots));
    v4_prep_kernel<CC><<<g1, kV4Threads, static_cast<size_t>(v4_prep_smem(CC, d.dk)), cs(s)>>>(conv_out, gate, beta, gr, g0, gn, d, max_rec, recs);
    HMOE_CUDA_LAUNCHED();
  });
}

int64_t deltanet_v4_chunk(const DeltaNetShape& sh, int64_t chunk) {
  if (sh.dk % 16 != 0 || sh.dv % 16 != 0 || sh.dk <= 0 || sh.dv <= 0) return 0;
  int64_t C = chunk > 0 ? chunk : 64;
  if (C != 16 && C != 32 && C != 64) return 0;
  auto need = [&](int64_t c) { return std::max({v4_prep_smem(c, sh.dk), v4_walk_smem(c, sh.dk), v4::walk16_smem(c, sh.dk)}); };
  while (C >= 16 && need(C) > smem_optin_limit() - kSmemMargin) C /= 2;
  return C >= 16 ? C : 0;
}

int64_t deltanet_v4_scratch_bytes(const DeltaNetShape& sh, int64_t v4_chunk, int64_t slots) {
  return v4_chunk > 0 ? slots * sh.nv * v4_rec_floats(v4_chunk) * 4 : 0;
}

void deltanet_v4_configure() {
  ensure_opt_in4();
  v4::walk16_configure();
}

void set_deltanet_v4_phases(int mask) { phases4.store(mask & 7); }

void set_deltanet_v4_walk(int walk) { walk4.store(walk == 1 ? 1 : 2); }
int deltanet_v4_walk() { return walk4.load(); }

void deltanet_chunked_v4(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v4_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s) {
  if (gn <= 0 || slots <= 0) return;
  const V2Dims d = chunked_launch_dims("v4", conv_out, out, scratch, slots, 65535, sh);
  ensure_opt_in4();
  float* sc = static_cast<float*>(scratch);
  with_chunk("v4", v4_chunk, [&](auto c) {
    launch4<decltype(c)::value>(conv_out, gate, beta, gr, g0, gn, d, sh, state_off, max_recurrent, slots, sc, out, s);
  });
}

}  // namespace hmoe::gpu
