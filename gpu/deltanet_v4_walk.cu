// v4's walk (phase 2 of gpu/deltanet_v4.cu) on 16 warps (k36a; walk 2 of
// set_deltanet_v4_walk, the default since its H100 run of 2026-12-07). Same algebra and records as the first walk (8 warps, kept in
// gpu/deltanet_v4.cu for comparison: set_deltanet_v4_walk); what changes is
// how a chunk's products are cut into warp tasks.
//
// Why: the first walk's chunk (C = 64, dk = 128, 32 columns) took ~17 us on
// an H100 while its ~2,800 3xTF32 mma.sync (m16n8k8) need ~700 per
// scheduler, ~3 us at ~8 cycles each: with 8 warps (two per scheduler) and
// 32-column tasks of up to 16 dependent k-steps, the tensor units mostly
// wait (loads, tf32 splits, barriers). Here every step has 16 (or more)
// tasks of 16 x 16 outputs and at most 8 k-steps, four warps per scheduler:
//   A: P = K S, 16 tasks (4 strips x 2 column halves x 2 halves of the state
//      rows, the two partial sums added in a pass: R = V - exp(G) (P0 + P1));
//   B: u = Tb R (8 tasks of 2, 2, 4, 4, 6, 6, 8, 8 k-steps, a short and a long
//      one per scheduler) beside Q S (16 tasks, split as K S: 8 k-steps);
//   C: S = exp(G_last) S + K^T (exp(G_last - G) u) (16 tasks of 8 k-steps)
//      beside O = exp(G) (P0 + P1) + QKm u (8 tasks, paired as u's).
// Per scheduler (warps w, w + 4, w + 8, w + 12; C = 64, dk = 128): A 32,
// B 42, C 42 k-steps of 6 mma.sync, 696 mma per chunk (the first walk: 720
// on its busiest, in chains twice as long on half the warps). Q S moves
// from A to B, off the path K S -> u -> S'.
// Copies: K and the factors double-buffered (the next chunk's at the chunk's
// start), QKm at the chunk's start (read in C), V after the R pass, Q and Tb
// after B; everything but K prefetched into L2 a chunk ahead.
#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet_tf32.cuh"
#include "gpu/deltanet_v4.cuh"

namespace hmoe::gpu::v4 {
using namespace detail;
using namespace dn;

namespace {

constexpr int kWarps = 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kCols = 32;         // value columns per block
constexpr int kLd = kCols + 8;    // row stride of the state / V / R / P / u / O tiles

// u's (step B) and O's (step C) 16 x 16 tile of warp w < 2 mt: with 4 strips,
// warps w and w + 4 (one scheduler) get strips of 1 + 4 or 2 + 3 tiles' k.
__device__ __forceinline__ void tri_task(int w, int mt, int& ti, int& half) {
  half = w & 1;
  ti = mt == 4 && w >= 4 ? 3 - (w - 4) / 2 : w / 2;
}

template <int C>
__global__ void __launch_bounds__(kThreads, 1) walk16_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, V2Dims d, int64_t state_off,
                                                             int64_t max_rec, float* out, const float* recs, bool copies) {
  static_assert(C % 16 == 0 && C <= 64, "chunks of 16, 32 or 64: at most 4 strips");
  constexpr int mt = C / 16, ldc = C + 4, c4 = kCols / 4;
  const int g = static_cast<int>(g0 + blockIdx.x);
  const int64_t cnt = gr.count[g];
  if (cnt <= max_rec) return;
  __shared__ int64_t s_base;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (warp == 0) {
    const int64_t b = first_slot(gr, g0, g, max_rec, C);
    if (tid == 0) s_base = b;
  }
  const int hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int c0 = blockIdx.z * kCols, nc = min(kCols, d.dv - c0), n4 = nc / 4, q4 = d.dk / 4, kt = d.dk / 16, kh = d.dk / 2;
  const int64_t st = gr.start[g], K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t R = rec_floats(C);
  const int ldk = d.dk + 4;
  const bool fresh = gr.fresh[g] != 0;
  float* S = v2_state(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * d.dk * d.dv;
  extern __shared__ __align__(128) float w16_sm[];
  float* Ss = w16_sm;              // [dk][kLd] the state's columns
  float* Kb = Ss + d.dk * kLd;     // 2 x [C][ldk] K of chunks ci (buffer ci & 1) and ci + 1
  float* Qs = Kb + 2 * C * ldk;    // [C][ldk]
  float* Vs = Qs + C * ldk;        // [C][kLd]
  float* Tbs = Vs + C * kLd;       // [C][ldc]
  float* QKs = Tbs + C * ldc;      // [C][ldc]
  float* Fb = QKs + C * ldc;       // 2 x [2C + 8] exp(G_i), exp(G_last - G_i), exp(G_last), as K
  float* Rs = Fb + 2 * (2 * C + 8);  // [C][kLd] K S over the first half of the state rows, then V - exp(G) K S
  float* Ps = Rs + C * kLd;        // [C][kLd] the second half's partial sums: K S in A, Q S in B
  float* Us = Ps + C * kLd;        // [C][kLd] u
  float* U2s = Us + C * kLd;       // [C][kLd] exp(G_last - G) u
  float* Os = U2s + C * kLd;       // [C][kLd] Q S over the first half, then the outputs
  const float4 zero4 = make_float4(0, 0, 0, 0);
#pragma unroll 1
  for (int p = tid; p < d.dk * c4; p += kThreads) {
    const int r = p / c4, c = (p % c4) * 4;
    const float4 v = fresh || c >= nc ? zero4 : *reinterpret_cast<const float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c);
    *reinterpret_cast<float4*>(Ss + r * kLd + c) = v;
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
#pragma unroll 1
    for (int p = tid; p < C * q4; p += kThreads) {
      const int i = p / q4, c = (p % q4) * 4;
      if (i < L) cp_async16(dst + i * ldk + c, conv_out + (t0 + i) * d.cdim + off + static_cast<int64_t>(hk) * d.dk + c);
      else *reinterpret_cast<float4*>(dst + i * ldk + c) = zero4;
    }
  };
  auto load_v = [&](int64_t ci) {
    int64_t t0;
    int L;
    span_of(ci, t0, L);
#pragma unroll 1
    for (int p = tid; p < C * c4; p += kThreads) {
      const int i = p / c4, c = (p % c4) * 4;
      if (i < L && c < nc) cp_async16(Vs + i * kLd + c, conv_out + (t0 + i) * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + c0 + c);
      else *reinterpret_cast<float4*>(Vs + i * kLd + c) = zero4;
    }
  };
  auto load_cc = [&](const float* src, float* dst) {  // a C x C matrix of the record: its tiles on and below the diagonal
#pragma unroll 1
    for (int p = tid; p < C * C / 4; p += kThreads) {
      const int i = p / (C / 4), j = (p % (C / 4)) * 4;
      if (j / 16 <= i / 16) cp_async16(dst + i * ldc + j, src + i * C + j);
    }
  };
  auto load_f = [&](int64_t ci) {
    const float* Fg = rec_of(ci) + 2 * C * C;
    float* Fs = Fb + (ci & 1) * (2 * C + 8);
#pragma unroll 1
    for (int p = tid; p < (2 * C + 8) / 4; p += kThreads) cp_async16(Fs + 4 * p, Fg + 4 * p);
  };
  auto store_out = [&](int64_t ci) {
    int64_t t0;
    int L;
    span_of(ci, t0, L);
#pragma unroll 1
    for (int p = tid; p < L * n4; p += kThreads) {
      const int i = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Os + i * kLd + c);
    }
  };
  // 16 x 16 tile of X S (X: K or Q rows, strip ti) over the state rows of half hr, columns of half h, into dst.
  auto xs_task = [&](const float* X, int ti, int h, int hr, float* dst) {
    Acc acc[1];
    wm::fill_fragment(acc[0], 0.0f);
    mma3x<true, true, 1>(acc, X + ti * 16 * ldk + hr * kh, ldk, Ss + hr * kh * kLd + h * 16, kLd, kh);
    wm::store_matrix_sync(dst + ti * 16 * kLd + h * 16, acc[0], kLd, wm::mem_row_major);
  };
  load_rows(0, K, Kb);
  load_f(0);
  load_rows(0, 0, Qs);
  load_v(0);
  load_cc(rec_of(0), Tbs);
  cp_async_commit();
  // Copy groups, committed by every thread in every chunk (some empty), so that the counts below hold:
  // G1 at the start (QKm of ci; K and factors of ci + 1), G2 after the R pass (V), G3 after B (Q, Tb).
  for (int64_t ci = 0; ci < nch; ++ci) {
    const bool more = copies && ci + 1 < nch;  // the next chunk's copies (timing runs without: chunk 0's rows throughout)
    const int buf = copies ? static_cast<int>(ci & 1) : 0;
    const float* Ks = Kb + buf * C * ldk;
    const float* Fs = Fb + buf * (2 * C + 8);
    cp_async_wait<0>();
    __syncthreads();
    if (ci > 0) store_out(ci - 1);  // Os is next written in B, two barriers on
    if (copies || ci == 0) load_cc(rec_of(ci) + C * C, QKs);
    if (more) {
      load_rows(ci + 1, K, Kb + ((ci + 1) & 1) * C * ldk);
      load_f(ci + 1);
    }
    cp_async_commit();
    if (more) {  // into L2: the next chunk's q and v rows, Tb and QKm
      int64_t tn;
      int Ln;
      span_of(ci + 1, tn, Ln);
      const float* rn = rec_of(ci + 1);
      constexpr int cc_lines = (C + 31) / 32;  // 128-byte lines per row of Tb or QKm
      const int row_lines = (d.dk * 4 + 127) / 128;
#pragma unroll 1
      for (int p = tid; p < 2 * C * cc_lines; p += kThreads) {  // the tiles on and below the diagonal
        const int m = p / (C * cc_lines), i = (p / cc_lines) % C, l = p % cc_lines;
        if (32 * l < 16 * (i / 16 + 1)) prefetch_l2(rn + m * C * C + i * C + 32 * l);
      }
#pragma unroll 1
      for (int p = tid; p < Ln * row_lines; p += kThreads) {
        const int i = p / row_lines, l = p % row_lines;
        prefetch_l2(conv_out + (tn + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + l * 32);
      }
#pragma unroll 1
      for (int p = tid; p < Ln; p += kThreads) prefetch_l2(conv_out + (tn + p) * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + c0);
    }
    // A: K S in two halves of the state rows, then R = V - exp(G) (P0 + P1).
    for (int a = warp; a < 4 * mt; a += kWarps) xs_task(Ks, a >> 2, (a >> 1) & 1, a & 1, (a & 1) ? Ps : Rs);
    __syncthreads();
    for (int e = tid; e < C * kCols; e += kThreads) {
      const int r = e / kCols, o = r * kLd + e % kCols;
      Rs[o] = Vs[o] - Fs[r] * (Rs[o] + Ps[o]);
    }
    __syncthreads();
    if (more) load_v(ci + 1);  // V is read only in the R pass
    cp_async_commit();
    // B: u = Tb R (k up to the diagonal; U2 = exp(G_last - G) u) beside Q S in two halves (into Os and Ps: the R pass has read Ps).
    if (warp < 2 * mt) {
      int ti, h;
      tri_task(warp, mt, ti, h);
      Acc acc[1];
      wm::fill_fragment(acc[0], 0.0f);
      mma3x<true, true, 1>(acc, Tbs + ti * 16 * ldc, ldc, Rs + h * 16, kLd, 16 * (ti + 1));
      float* tile = Us + ti * 16 * kLd + h * 16;
      wm::store_matrix_sync(tile, acc[0], kLd, wm::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int r = e / 16, c = e % 16;
        U2s[(ti * 16 + r) * kLd + h * 16 + c] = Fs[C + ti * 16 + r] * tile[r * kLd + c];
      }
    }
    if (warp >= kWarps - 4 * mt) {
      const int a = warp - (kWarps - 4 * mt);
      xs_task(Qs, a >> 2, (a >> 1) & 1, a & 1, (a & 1) ? Ps : Os);
    }
    cp_async_wait<1>();  // G1 (QKm) done; G2 (V) may still be in flight
    __syncthreads();
    if (more) {  // Q and Tb are read only in B
      load_rows(ci + 1, 0, Qs);
      load_cc(rec_of(ci + 1), Tbs);
    }
    cp_async_commit();
    // C: the state strips, then (warps < 2 mt) the output tiles.
    const float dl = Fs[2 * C];
    for (int t = warp; t < 2 * kt; t += kWarps) {
      const int si = t >> 1, h = t & 1;
      float* tile = Ss + si * 16 * kLd + h * 16;
      Acc acc[1];
      wm::load_matrix_sync(acc[0], tile, kLd, wm::mem_row_major);
#pragma unroll
      for (int e = 0; e < acc[0].num_elements; ++e) acc[0].x[e] *= dl;
      mma3x<false, true, 1>(acc, Ks + si * 16, ldk, U2s + h * 16, kLd, C);
      wm::store_matrix_sync(tile, acc[0], kLd, wm::mem_row_major);
    }
    if (warp < 2 * mt) {
      int ti, h;
      tri_task(warp, mt, ti, h);
      float* tile = Os + ti * 16 * kLd + h * 16;
      const float* part = Ps + ti * 16 * kLd + h * 16;
      for (int e = lane; e < 256; e += 32) {
        const int r = e / 16, o = r * kLd + e % 16;
        tile[o] = Fs[ti * 16 + r] * (tile[o] + part[o]);
      }
      __syncwarp();
      Acc acc[1];
      wm::load_matrix_sync(acc[0], tile, kLd, wm::mem_row_major);
      mma3x<true, true, 1>(acc, QKs + ti * 16 * ldc, ldc, Us + h * 16, kLd, 16 * (ti + 1));
      wm::store_matrix_sync(tile, acc[0], kLd, wm::mem_row_major);
    }
  }
  __syncthreads();
  if (nch > 0) store_out(nch - 1);
#pragma unroll 1
  for (int p = tid; p < d.dk * n4; p += kThreads) {
    const int r = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kLd + c);
  }
}

template <int C>
void launch(const float* conv_out, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const V2Dims& d, int64_t state_off, int64_t max_rec,
            float* out, const float* recs, bool copies, Stream& s) {
  const dim3 grid(static_cast<unsigned>(gn), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kCols - 1) / kCols));
  walk16_kernel<C><<<grid, kThreads, static_cast<size_t>(walk16_smem(C, d.dk)), cs(s)>>>(conv_out, gr, g0, d, state_off, max_rec, out, recs, copies);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace

int64_t walk16_smem(int64_t C, int64_t dk) {
  return (dk * kLd + 3 * C * (dk + 4) + C * kLd + 2 * C * (C + 4) + 2 * (2 * C + 8) + 5 * C * kLd) * 4;
}

void walk16_configure() {
  static const bool done = [] {
    opt_in_smem(walk16_kernel<16>);
    opt_in_smem(walk16_kernel<32>);
    opt_in_smem(walk16_kernel<64>);
    return true;
  }();
  (void)done;
}

void walk16_launch(int C, const float* conv_out, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const DeltaNetShape& sh, int64_t state_off,
                   int64_t max_rec, float* out, const float* recs, bool copies, Stream& s) {
  walk16_configure();
  const V2Dims d{static_cast<int>(sh.nk), static_cast<int>(sh.nv), static_cast<int>(sh.dk), static_cast<int>(sh.dv), static_cast<int>(sh.conv_k),
                 sh.conv_dim()};
  switch (C) {
    case 16: launch<16>(conv_out, gr, g0, gn, d, state_off, max_rec, out, recs, copies, s); break;
    case 32: launch<32>(conv_out, gr, g0, gn, d, state_off, max_rec, out, recs, copies, s); break;
    case 64: launch<64>(conv_out, gr, g0, gn, d, state_off, max_rec, out, recs, copies, s); break;
    default: fail(ErrorKind::internal, "gated deltanet v4 walk: chunk " + std::to_string(C) + " (16, 32 or 64)");
  }
}

}  // namespace hmoe::gpu::v4
