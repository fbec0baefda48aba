// The chunked delta rule, v2 (gpu/deltanet.h, DeltaNetKernel::v2): two
// launches instead of v1's one block per (sequence, value head, column
// slice) that recomputes everything a chunk needs in every slice.
//
// Phase 1, one block per (chunk, value head), all chunks at once: the
// chunk's running decay sum G, KK = k k^T and QK = q k^T (tensor cores),
// A[i][j] = beta_i exp(G_i - G_j) KK[i][j] (j < i), then (I + A)^-1 applied
// to [beta exp(G) k | beta v] by forward substitution, a column per thread
// held in registers: W (C x dk) and U (C x dv). W, the masked decayed
// QK[i][j] = exp(G_i - G_j) q_i.k_j (j <= i) and the factors exp(G_i),
// exp(G_last - G_i), exp(G_last) go to the scratch; U goes to `out`, in the
// rows and columns where the chunk's outputs will be written.
//
// Phase 2, one block per (sequence, value head, 32 value columns), chunks
// in order, the state's columns in shared memory:
//   u = U - W S,  o = exp(G) (q S) + QK u,  S = exp(G_last) S + k^T (exp(G_last - G) u),
// all products on tensor cores in 3xTF32 (each fp32 operand split into a
// TF32 hi and lo part, hi.hi + hi.lo + lo.hi accumulated in fp32), which
// keeps the fp32 kernel's accuracy (about 2^-21 relative per product
// instead of TF32's 2^-11); each warp takes strips of 16 rows x 32 columns
// so that an A fragment serves both column tiles. A chunk's rows arrive by
// asynchronous copies (all in flight at once) while the next chunk's are
// prefetched into L2.
//
// Padded rows of a chunk's last part (L < C tokens) are zero in k, q, W, U
// and the factors, so they add nothing to the state or the outputs.
//
// Phase 1's kernel and the 3xTF32 pieces live in gpu/deltanet_tf32.cuh
// (v3, gpu/deltanet_v3.cu, shares them).
#include <algorithm>
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

// Phase 2: grid (groups, value heads, column slices of kCols). A slice of
// fewer columns (dv not a multiple of kCols) runs with zero columns up to
// kCols, which no product mixes into the others and nothing writes out.
template <int C>
__global__ void __launch_bounds__(kScanThreads) v2_scan_kernel(const float* conv_out, DeltaNetGroups gr, int64_t g0, V2Dims d, int64_t state_off,
                                                               int64_t max_rec, float* out, const float* scratch) {
  constexpr int NB = kCols / 16, c4 = kCols / 4;
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
  const int c0 = blockIdx.z * kCols, nc = min(kCols, d.dv - c0);
  const int64_t st = gr.start[g], K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const int64_t R = rec_floats(C, d.dk);
  // Strides: 4 banks apart for the row-major A operands (W, q, QK), 8 apart for the
  // column-major A (k) and the row-major B (S, u): wmma's tf32 loads then hit 32 banks.
  const int ldk = d.dk + 4, ldk2 = d.dk + 8, ldc = C + 4;
  const bool fresh = gr.fresh[g] != 0;
  float* S = v2_state(gr, g, state_off) + (d.ck - 1) * d.cdim + static_cast<int64_t>(hv) * d.dk * d.dv;
  extern __shared__ __align__(128) float v2_sm[];
  float* Ss = v2_sm;              // [dk][kLdS] the state's columns
  float* Ws = Ss + d.dk * kLdS;   // [C][ldk]
  float* qs = Ws + C * ldk;       // [C][ldk]
  float* ks = qs + C * ldk;       // [C][ldk2]
  float* QKs = ks + C * ldk2;     // [C][ldc]
  float* us = QKs + C * ldc;      // [C][kLdS] U, then u
  float* us2 = us + C * kLdS;     // [C][kLdS] exp(G_last - G_i) u_i
  float* os = us2 + C * kLdS;     // [C][kLdS]
  float* Fs = os + C * kLdS;      // [2C + 4] exp(G_i), exp(G_last - G_i), exp(G_last)
  const int q4 = d.dk / 4;
  for (int p = tid; p < d.dk * c4; p += blockDim.x) {
    const int r = p / c4, c = (p % c4) * 4;
    const float4 v = fresh || c >= nc ? make_float4(0, 0, 0, 0) : *reinterpret_cast<const float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c);
    *reinterpret_cast<float4*>(Ss + r * kLdS + c) = v;
  }
  __syncthreads();
  const int64_t base = s_base, nch = (cnt + C - 1) / C;
  const int mt = C / 16, kt = d.dk / 16;
  const float4 zero4 = make_float4(0, 0, 0, 0);
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int64_t t0 = st + ci * C;
    const int L = static_cast<int>(min(static_cast<int64_t>(C), cnt - ci * C));
    const float* rec = scratch + ((base + ci) * d.nv + hv) * R;
    const float* Wg = rec;
    const float* QKg = Wg + C * d.dk;
    const float* Fg = QKg + C * C;
    // This chunk's rows into shared memory (asynchronous copies, all in flight at once).
    for (int p = tid; p < C * q4; p += blockDim.x) {
      const int i = p / q4, c = (p % q4) * 4;
      if (i < L) {
        const float* row = conv_out + (t0 + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + c;
        cp_async16(Ws + i * ldk + c, Wg + i * d.dk + c);
        cp_async16(qs + i * ldk + c, row);
        cp_async16(ks + i * ldk2 + c, row + K);
      } else {
        *reinterpret_cast<float4*>(Ws + i * ldk + c) = zero4;
        *reinterpret_cast<float4*>(qs + i * ldk + c) = zero4;
        *reinterpret_cast<float4*>(ks + i * ldk2 + c) = zero4;
      }
    }
    for (int p = tid; p < C * C / 4; p += blockDim.x) {
      const int i = p / (C / 4), j = (p % (C / 4)) * 4;
      cp_async16(QKs + i * ldc + j, QKg + i * C + j);
    }
    for (int p = tid; p < C * c4; p += blockDim.x) {
      const int i = p / c4, c = (p % c4) * 4;
      if (i < L && c < nc) cp_async16(us + i * kLdS + c, out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c);
      else *reinterpret_cast<float4*>(us + i * kLdS + c) = zero4;
    }
    for (int p = tid; p < (2 * C + 4) / 4; p += blockDim.x) cp_async16(Fs + 4 * p, Fg + 4 * p);
    if (ci + 1 < nch) {  // the next chunk's rows into L2 meanwhile
      const int64_t tn = t0 + C;
      const int Ln = static_cast<int>(min(static_cast<int64_t>(C), cnt - (ci + 1) * C));
      const float* rn = rec + d.nv * R;
      const int rec_lines = static_cast<int>((R * 4 + 127) / 128), row_lines = (d.dk * 4 + 127) / 128;
      for (int p = tid; p < rec_lines; p += blockDim.x) prefetch_l2(reinterpret_cast<const char*>(rn) + p * 128);
      for (int p = tid; p < Ln * row_lines; p += blockDim.x) {
        const int i = p / row_lines, l = p % row_lines;
        const float* row = conv_out + (tn + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + l * 32;
        prefetch_l2(row);
        prefetch_l2(row + K);
      }
      for (int p = tid; p < Ln; p += blockDim.x) prefetch_l2(out + (tn + p) * V + static_cast<int64_t>(hv) * d.dv + c0);
    }
    cp_async_wait_all();
    __syncthreads();
    const float dl = Fs[2 * C];
    // Strips of 16 rows x kCols: u = U - W S (and exp(G_last - G) u beside it); o = exp(G) (q S).
    for (int t = warp; t < 2 * mt; t += nwarps) {
      const int ti = t % mt;
      Acc prod[NB];
#pragma unroll
      for (int n = 0; n < NB; ++n) wm::fill_fragment(prod[n], 0.0f);
      mma3<true, true, NB>(prod, (t < mt ? Ws : qs) + ti * 16 * ldk, ldk, Ss, kLdS, d.dk);
      if (t < mt) {
#pragma unroll
        for (int n = 0; n < NB; ++n) {
          Acc u;
          wm::load_matrix_sync(u, us + ti * 16 * kLdS + n * 16, kLdS, wm::mem_row_major);
#pragma unroll
          for (int e = 0; e < u.num_elements; ++e) u.x[e] -= prod[n].x[e];
          wm::store_matrix_sync(us + ti * 16 * kLdS + n * 16, u, kLdS, wm::mem_row_major);
        }
        __syncwarp();
        for (int e = lane; e < 16 * kCols; e += 32) {
          const int r = ti * 16 + e / kCols, c = e % kCols;
          us2[r * kLdS + c] = Fs[C + r] * us[r * kLdS + c];
        }
      } else {
#pragma unroll
        for (int n = 0; n < NB; ++n) wm::store_matrix_sync(os + ti * 16 * kLdS + n * 16, prod[n], kLdS, wm::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 16 * kCols; e += 32) {
          const int r = ti * 16 + e / kCols, c = e % kCols;
          os[r * kLdS + c] *= Fs[r];
        }
      }
    }
    __syncthreads();
    // o += QK u; S = exp(G_last) S + k^T (exp(G_last - G) u).
    for (int t = warp; t < mt + kt; t += nwarps) {
      Acc acc[NB];
      float* tile = t < mt ? os + t * 16 * kLdS : Ss + (t - mt) * 16 * kLdS;
#pragma unroll
      for (int n = 0; n < NB; ++n) wm::load_matrix_sync(acc[n], tile + n * 16, kLdS, wm::mem_row_major);
      if (t < mt) {
        mma3<true, true, NB>(acc, QKs + t * 16 * ldc, ldc, us, kLdS, C);
      } else {
#pragma unroll
        for (int n = 0; n < NB; ++n)
#pragma unroll
          for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] *= dl;
        mma3<false, true, NB>(acc, ks + (t - mt) * 16, ldk2, us2, kLdS, C);
      }
#pragma unroll
      for (int n = 0; n < NB; ++n) wm::store_matrix_sync(tile + n * 16, acc[n], kLdS, wm::mem_row_major);
    }
    __syncthreads();
    const int n4 = nc / 4;
    for (int p = tid; p < L * n4; p += blockDim.x) {
      const int i = p / n4, c = (p % n4) * 4;
      *reinterpret_cast<float4*>(out + (t0 + i) * V + static_cast<int64_t>(hv) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(os + i * kLdS + c);
    }
  }
  __syncthreads();
  const int n4 = nc / 4;
  for (int p = tid; p < d.dk * n4; p += blockDim.x) {
    const int r = p / n4, c = (p % n4) * 4;
    *reinterpret_cast<float4*>(S + static_cast<int64_t>(r) * d.dv + c0 + c) = *reinterpret_cast<const float4*>(Ss + r * kLdS + c);
  }
}

int64_t prep_smem(int64_t C, int64_t dk) { return (2 * C * (dk + 4) + 2 * C * (C + 4) + 3 * C) * 4; }
int64_t scan_smem(int64_t C, int64_t dk) { return (dk * kLdS + 2 * C * (dk + 4) + C * (dk + 8) + C * (C + 4) + 3 * C * kLdS + 2 * C + 4) * 4; }

// Every v2 kernel may take the device's opt-in shared memory (opt_in_smem;
// deltanet_v2_chunk keeps kSmemMargin below it), once, before any graph capture.
void ensure_opt_in() {
  static const bool done = [] {
    opt_in_smem(v2_prep_kernel<16, false>);
    opt_in_smem(v2_scan_kernel<16>);
    opt_in_smem(v2_prep_kernel<32, false>);
    opt_in_smem(v2_scan_kernel<32>);
    opt_in_smem(v2_prep_kernel<64, false>);
    opt_in_smem(v2_scan_kernel<64>);
    return true;
  }();
  (void)done;
}

template <int C>
void launch(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const V2Dims& d,
            int64_t state_off, int64_t max_rec, int64_t slots, float* scratch, float* out, Stream& s) {
  const dim3 g1(static_cast<unsigned>(slots), static_cast<unsigned>(d.nv));
  v2_prep_kernel<C, false><<<g1, kPrepThreads, static_cast<size_t>(prep_smem(C, d.dk)), cs(s)>>>(conv_out, gate, beta, gr, g0, gn, d, max_rec, out, scratch);
  HMOE_CUDA_LAUNCHED();
  const dim3 g2(static_cast<unsigned>(gn), static_cast<unsigned>(d.nv), static_cast<unsigned>((d.dv + kCols - 1) / kCols));
  v2_scan_kernel<C><<<g2, kScanThreads, static_cast<size_t>(scan_smem(C, d.dk)), cs(s)>>>(conv_out, gr, g0, d, state_off, max_rec, out, scratch);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace

int64_t deltanet_v2_chunk(const DeltaNetShape& sh, int64_t chunk) {
  if (sh.dk % 16 != 0 || sh.dv % 16 != 0 || sh.dk <= 0 || sh.dv <= 0) return 0;
  int64_t C = chunk > 0 ? chunk : 64;
  if (C != 16 && C != 32 && C != 64) return 0;
  while (C >= 16 && std::max(prep_smem(C, sh.dk), scan_smem(C, sh.dk)) > smem_optin_limit() - kSmemMargin) C /= 2;
  return C >= 16 ? C : 0;
}

int64_t deltanet_v2_slots(int64_t ntok, int64_t gn, int64_t v2_chunk) { return v2_chunk > 0 ? ntok / v2_chunk + gn : 0; }

int64_t deltanet_v2_scratch_bytes(const DeltaNetShape& sh, int64_t v2_chunk, int64_t slots) {
  return v2_chunk > 0 ? slots * sh.nv * rec_floats(v2_chunk, sh.dk) * 4 : 0;
}

void deltanet_v2_configure() { ensure_opt_in(); }

void deltanet_chunked_v2(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v2_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s) {
  if (gn <= 0 || slots <= 0) return;
  const V2Dims d = chunked_launch_dims("v2", conv_out, out, scratch, slots, 0x7fffffff, sh);
  ensure_opt_in();
  float* sc = static_cast<float*>(scratch);
  with_chunk("v2", v2_chunk, [&](auto c) {
    launch<decltype(c)::value>(conv_out, gate, beta, gr, g0, gn, d, state_off, max_recurrent, slots, sc, out, s);
  });
}

}  // namespace hmoe::gpu
