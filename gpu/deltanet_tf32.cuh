// Private to gpu/deltanet_chunked.cu, gpu/deltanet_v3.cu and gpu/deltanet_v4.cu: the chunked
// delta rule's shared device pieces: 3xTF32 tensor-core products (mma3),
// mma3x (the same with the hi.lo and lo.hi terms in accumulators of their own),
// the chunk-slot numbering (find_slot, first_slot; block_chunk, a
// slot-per-block kernel's chunk), asynchronous copies, and phase 1
// (v2_prep_kernel: every chunk's W, U, decayed q.k and decay factors;
// gpu/deltanet_chunked.cu tells the design). With KE (v3) phase 1 also
// writes exp(G_last - G_i) k_i after the record's factors.
#pragma once
#include <mma.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/deltanet.h"

namespace hmoe::gpu::dn {
namespace {
using namespace detail;
namespace wm = nvcuda::wmma;

constexpr int kCols = 32;            // value columns per phase-2 block
constexpr int kLdS = kCols + 8;      // row stride of the shared state / u / o tiles
constexpr int kPrepThreads = 256;
constexpr int kScanThreads = 256;

struct V2Dims {
  int nk, nv, dk, dv, ck;
  int64_t cdim;
};

// The margin the chunk choosers keep below the device's opt-in shared memory.
constexpr int64_t kSmemMargin = 1024;

// Lets `kern` take the device's opt-in limit of dynamic shared memory less
// its static shared memory (once per kernel, before any graph capture).
template <class Kern>
void opt_in_smem(Kern* kern) {
  cudaFuncAttributes fa{};
  HMOE_CUDA_CHECK(cudaFuncGetAttributes(&fa, kern));
  const int64_t bytes = smem_optin_limit() - static_cast<int64_t>(fa.sharedSizeBytes);
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The chunked launchers' checks (gpu/deltanet_chunked.h: 16-byte aligned
// device buffers; at most max_slots chunk slots and 65535 value heads in one
// launch) and the kernels' dimensions; `name` ("v2".."v4") names the kernel
// in the errors.
inline V2Dims chunked_launch_dims(const char* name, const float* conv_out, const float* out, const void* scratch, int64_t slots, int64_t max_slots,
                                  const DeltaNetShape& sh) {
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(conv_out) || misaligned(out) || misaligned(scratch) || scratch == nullptr)
    fail(ErrorKind::internal, std::string("gated deltanet ") + name + ": conv_out, out and the scratch must be 16-byte aligned device buffers");
  if (slots > max_slots || sh.nv > 65535)
    fail(ErrorKind::unsupported, std::string("gated deltanet ") + name + ": too many chunks (" + std::to_string(max_slots) +
                                     ") or value heads (65535) for one launch");
  return V2Dims{static_cast<int>(sh.nk), static_cast<int>(sh.nv), static_cast<int>(sh.dk), static_cast<int>(sh.dv), static_cast<int>(sh.conv_k),
                sh.conv_dim()};
}

// f(std::integral_constant<int, C>{}) for chunk C of 16, 32 or 64; another chunk is an internal error naming the kernel.
template <class F>
void with_chunk(const char* name, int64_t chunk, F&& f) {
  switch (chunk) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    default: fail(ErrorKind::internal, std::string("gated deltanet ") + name + ": chunk " + std::to_string(chunk) + " (16, 32 or 64)");
  }
}

__device__ __forceinline__ float* v2_state(const DeltaNetGroups& gr, int g, int64_t off) {
  return reinterpret_cast<float*>(static_cast<uintptr_t>(gr.state[g]) + static_cast<uintptr_t>(off));
}

// Floats of one (chunk slot, value head) record: W [C][dk], QK [C][C], eq [C], ek [C], exp(G_last), padding;
// v3's (KE) adds K' [C][dk], K'_i = exp(G_last - G_i) k_i.
__host__ __device__ constexpr int64_t rec_floats(int64_t C, int64_t dk) { return C * dk + C * C + 2 * C + 8; }
__host__ __device__ constexpr int64_t rec_floats(int64_t C, int64_t dk, bool ke) { return rec_floats(C, dk) + (ke ? C * dk : 0); }

using Acc = wm::fragment<wm::accumulator, 16, 16, 8, float>;

template <class F>
__device__ __forceinline__ void split_tf32(F& hi, F& lo) {
#pragma unroll
  for (int e = 0; e < hi.num_elements; ++e) {
    const float v = hi.x[e];
    const float h = wm::__float_to_tf32(v);
    hi.x[e] = h;
    lo.x[e] = wm::__float_to_tf32(v - h);
  }
}

// acc[n] += A (16 x K) B_n (K x 16) in 3xTF32 for NB tiles B_n side by
// side (B_n's columns 16 n.. of B; A's fragments loaded once for all), K a
// multiple of 8. a, b: the tiles' first elements. ARow: A[m][k] =
// a[m * lda + k], else a[k * lda + m]; BRow: B[k][n] = b[k * ldb + n], else
// b[n * ldb + k]. Shared memory, each tile address 32-byte aligned, lda /
// ldb multiples of 4.
template <bool ARow, bool BRow, int NB>
__device__ __forceinline__ void mma3(Acc (&acc)[NB], const float* a, int lda, const float* b, int ldb, int K) {
  using LA = std::conditional_t<ARow, wm::row_major, wm::col_major>;
  using LB = std::conditional_t<BRow, wm::row_major, wm::col_major>;
  wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, LA> ah, al;
  wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, LB> bh, bl;
  for (int k = 0; k < K; k += 8) {
    wm::load_matrix_sync(ah, ARow ? a + k : a + static_cast<int64_t>(k) * lda, lda);
    split_tf32(ah, al);
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const float* bn = BRow ? b + n * 16 : b + static_cast<int64_t>(n) * 16 * ldb;
      wm::load_matrix_sync(bh, BRow ? bn + static_cast<int64_t>(k) * ldb : bn + k, ldb);
      split_tf32(bh, bl);
      wm::mma_sync(acc[n], al, bh, acc[n]);
      wm::mma_sync(acc[n], ah, bl, acc[n]);
      wm::mma_sync(acc[n], ah, bh, acc[n]);
    }
  }
}

// Chunks of group g: ceil(count / C) when the group is chunked (count > max_rec), else none.
__device__ __forceinline__ int chunks_of(const DeltaNetGroups& gr, int64_t g, int64_t max_rec, int C) {
  const int64_t c = gr.count[g];
  return c > max_rec ? static_cast<int>((c + C - 1) / C) : 0;
}

// Warp-wide: the group and chunk of chunk slot `slot` (slots number the
// chunks of groups [g0, g0 + gn) in order); false past the last chunk.
__device__ inline bool find_slot(const DeltaNetGroups& gr, int64_t g0, int64_t gn, int64_t max_rec, int C, int64_t slot, int& g, int64_t& chunk) {
  const int lane = threadIdx.x & 31;
  int64_t before = 0;
  for (int64_t b = 0; b < gn; b += 32) {
    const int n = b + lane < gn ? chunks_of(gr, g0 + b + lane, max_rec, C) : 0;
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    const int64_t end = before + incl, beg = end - n;
    const unsigned hit = __ballot_sync(0xffffffffu, n > 0 && slot >= beg && slot < end);
    if (hit) {
      const int src = __ffs(hit) - 1;
      g = static_cast<int>(g0 + b + src);
      chunk = slot - __shfl_sync(0xffffffffu, beg, src);
      return true;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return false;
}

// Warp-wide: the first slot of group g (the chunks of groups [g0, g)).
__device__ inline int64_t first_slot(const DeltaNetGroups& gr, int64_t g0, int g, int64_t max_rec, int C) {
  const int lane = threadIdx.x & 31;
  int64_t sum = 0;
  for (int64_t b = g0; b < g; b += 32) {
    int n = b + lane < g ? chunks_of(gr, b + lane, max_rec, C) : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    sum += n;
  }
  return sum;
}

// The tokens of one chunk: [t0, t0 + L) of the batch, L <= C.
struct ChunkSpan {
  int64_t t0;
  int L;
};

// Block-wide, called by every thread (one __syncthreads): warp 0 finds chunk
// slot `slot` (default blockIdx.x; find_slot) and shares it through the block's static shared
// memory (s_g, s_chunk: 12 bytes); false, for every thread, past the last chunk.
template <int C>
__device__ __forceinline__ bool block_chunk(const DeltaNetGroups& gr, int64_t g0, int64_t gn, int64_t max_rec, ChunkSpan& span, int64_t slot = -1) {
  __shared__ int s_g;
  __shared__ int64_t s_chunk;
  const int tid = threadIdx.x;
  if ((tid >> 5) == 0) {
    int g = -1;
    int64_t chunk = 0;
    const bool found = find_slot(gr, g0, gn, max_rec, C, slot < 0 ? static_cast<int64_t>(blockIdx.x) : slot, g, chunk);
    if (tid == 0) {
      s_g = found ? g : -1;
      s_chunk = chunk;
    }
  }
  __syncthreads();
  if (s_g < 0) return false;
  const int g = s_g;
  const int64_t cnt = gr.count[g];
  span.t0 = gr.start[g] + s_chunk * C;
  span.L = static_cast<int>(min(static_cast<int64_t>(C), cnt - s_chunk * C));
  return true;
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// A chunk's q and k rows of key head hk (tokens t0 .. t0 + L of conv_out,
// rows past L zero) into shared memory qs / ks, [C][ldk]; the whole block.
template <int C>
__device__ __forceinline__ void load_qk_rows(const float* conv_out, int64_t t0, int L, const V2Dims& d, int hk, float* qs, float* ks, int ldk) {
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk;
  const int q4 = d.dk / 4;
  for (int p = threadIdx.x; p < C * q4; p += blockDim.x) {
    const int i = p / q4, c = (p % q4) * 4;
    float4 qv = make_float4(0, 0, 0, 0), kv = qv;
    if (i < L) {
      const float* row = conv_out + (t0 + i) * d.cdim + static_cast<int64_t>(hk) * d.dk + c;
      qv = *reinterpret_cast<const float4*>(row);
      kv = *reinterpret_cast<const float4*>(row + K);
    }
    *reinterpret_cast<float4*>(qs + i * ldk + c) = qv;
    *reinterpret_cast<float4*>(ks + i * ldk + c) = kv;
  }
}

// Phase 1: grid (slots, value heads).
template <int C, bool KE>
__global__ void __launch_bounds__(kPrepThreads, 2) v2_prep_kernel(const float* conv_out, const float* gate, const float* beta, DeltaNetGroups gr,
                                                               int64_t g0, int64_t gn, V2Dims d, int64_t max_rec, float* out, float* scratch) {
  const int tid = threadIdx.x, warp = tid >> 5, nwarps = blockDim.x >> 5;
  ChunkSpan span;
  if (!block_chunk<C>(gr, g0, gn, max_rec, span)) return;
  const int hv = blockIdx.y, hk = hv / (d.nv / d.nk);
  const int64_t t0 = span.t0;
  const int L = span.L;
  const int64_t K = static_cast<int64_t>(d.nk) * d.dk, V = static_cast<int64_t>(d.nv) * d.dv;
  const int ldk = d.dk + 4, ldc = C + 4;
  extern __shared__ __align__(128) float v2_sm[];
  float* ks = v2_sm;           // [C][ldk]
  float* qs = ks + C * ldk;    // [C][ldk]
  float* KK = qs + C * ldk;    // [C][ldc]; then A
  float* QK = KK + C * ldc;    // [C][ldc]
  float* Gs = QK + C * ldc;    // [C]
  float* Bs = Gs + C;          // [C]
  float* Eq = Bs + C;          // [C] exp(G_i)
  if (tid < C) {
    Gs[tid] = tid < L ? gate[(t0 + tid) * d.nv + hv] : 0.0f;
    Bs[tid] = tid < L ? beta[(t0 + tid) * d.nv + hv] : 0.0f;
  }
  load_qk_rows<C>(conv_out, t0, L, d, hk, qs, ks, ldk);
  __syncthreads();
  if (tid == 0) {
    float acc = 0;
    for (int i = 0; i < C; ++i) {
      if (i < L) acc += Gs[i];
      Gs[i] = acc;  // padded rows: G_last
    }
  }
  // KK and QK, the tiles on and below the diagonal.
  constexpr int nt = C / 16, ntri = nt * (nt + 1) / 2;
  for (int t = warp; t < 2 * ntri; t += nwarps) {
    int idx = t % ntri, ti = 0;
    while (idx > ti) {
      idx -= ti + 1;
      ++ti;
    }
    const int tj = idx;
    const float* a = (t < ntri ? ks : qs) + ti * 16 * ldk;
    Acc acc[1];
    wm::fill_fragment(acc[0], 0.0f);
    mma3<true, false, 1>(acc, a, ldk, ks + tj * 16 * ldk, ldk, d.dk);
    wm::store_matrix_sync((t < ntri ? KK : QK) + ti * 16 * ldc + tj * 16, acc[0], ldc, wm::mem_row_major);
  }
  __syncthreads();
  float* rec = scratch + (static_cast<int64_t>(blockIdx.x) * d.nv + hv) * rec_floats(C, d.dk, KE);
  float* Wg = rec;
  float* QKg = Wg + C * d.dk;
  float* Fg = QKg + C * C;  // eq [C], ek [C], exp(G_last)
  const float glast = Gs[C - 1];
  for (int p = tid; p < C * C; p += blockDim.x) {
    const int i = p / C, j = p % C;
    const bool in = j <= i && i < L;  // tiles above the diagonal were never computed: select, never multiply by 0
    const float e = in ? expf(Gs[i] - Gs[j]) : 0.0f;
    QKg[p] = in ? e * QK[i * ldc + j] : 0.0f;
    KK[i * ldc + j] = in && j < i ? Bs[i] * e * KK[i * ldc + j] : 0.0f;
  }
  if (tid < C) {
    const float eq = tid < L ? expf(Gs[tid]) : 0.0f;
    Eq[tid] = eq;
    Fg[tid] = eq;
    Fg[C + tid] = tid < L ? expf(glast - Gs[tid]) : 0.0f;
  }
  if (tid == 0) Fg[2 * C] = expf(glast);
  __syncthreads();
  if constexpr (KE) {  // K' rows (padded rows: zero, as k's)
    float* Kg = Fg + 2 * C + 8;
    const int q4 = d.dk / 4;
    for (int p = tid; p < C * q4; p += blockDim.x) {
      const int i = p / q4, c = (p % q4) * 4;
      const float e = i < L ? expf(glast - Gs[i]) : 0.0f;
      float4 v = *reinterpret_cast<const float4*>(ks + i * ldk + c);
      v.x *= e;
      v.y *= e;
      v.z *= e;
      v.w *= e;
      *reinterpret_cast<float4*>(Kg + i * d.dk + c) = v;
    }
  }
  // (I + A) [W | U] = [beta exp(G) k | beta v], a column per thread.
  const float* A = KK;
  for (int c = tid; c < d.dk + d.dv; c += blockDim.x) {
    float w[C];
    const bool key = c < d.dk;
    const float* vcol = conv_out + t0 * d.cdim + 2 * K + static_cast<int64_t>(hv) * d.dv + (c - d.dk);
#pragma unroll
    for (int i = 0; i < C; ++i) w[i] = i < L ? Bs[i] * (key ? Eq[i] * ks[i * ldk + c] : vcol[i * d.cdim]) : 0.0f;
#pragma unroll
    for (int i = 1; i < C; ++i) {
      const float* Ar = A + i * ldc;
      float a0 = w[i], a1 = 0, a2 = 0, a3 = 0;
#pragma unroll
      for (int j = 0; j + 3 < i; j += 4) {
        const float4 av = *reinterpret_cast<const float4*>(Ar + j);
        a0 -= av.x * w[j];
        a1 -= av.y * w[j + 1];
        a2 -= av.z * w[j + 2];
        a3 -= av.w * w[j + 3];
      }
#pragma unroll
      for (int j = i & ~3; j < i; ++j) a0 -= Ar[j] * w[j];
      w[i] = (a0 + a1) + (a2 + a3);
    }
    if (key) {
#pragma unroll
      for (int i = 0; i < C; ++i)
        if (i < L) Wg[i * d.dk + c] = w[i];
    } else {
      float* ucol = out + t0 * V + static_cast<int64_t>(hv) * d.dv + (c - d.dk);
#pragma unroll
      for (int i = 0; i < C; ++i)
        if (i < L) ucol[i * V] = w[i];
    }
  }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// mma3 (above) with the hi.lo and lo.hi terms in accumulators
// of their own, added at the end: per k step the three products no longer
// wait on each other (the walk's latency is its cost).
template <bool ARow, bool BRow, int NB>
__device__ __forceinline__ void mma3x(Acc (&acc)[NB], const float* a, int lda, const float* b, int ldb, int K) {
  using LA = std::conditional_t<ARow, wm::row_major, wm::col_major>;
  using LB = std::conditional_t<BRow, wm::row_major, wm::col_major>;
  wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, LA> ah, al;
  wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, LB> bh, bl;
  Acc x1[NB], x2[NB];
#pragma unroll
  for (int n = 0; n < NB; ++n) {
    wm::fill_fragment(x1[n], 0.0f);
    wm::fill_fragment(x2[n], 0.0f);
  }
#pragma unroll 2
  for (int k = 0; k < K; k += 8) {
    wm::load_matrix_sync(ah, ARow ? a + k : a + static_cast<int64_t>(k) * lda, lda);
    split_tf32(ah, al);
#pragma unroll
    for (int n = 0; n < NB; ++n) {
      const float* bn = BRow ? b + n * 16 : b + static_cast<int64_t>(n) * 16 * ldb;
      wm::load_matrix_sync(bh, BRow ? bn + static_cast<int64_t>(k) * ldb : bn + k, ldb);
      split_tf32(bh, bl);
      wm::mma_sync(x1[n], al, bh, x1[n]);
      wm::mma_sync(x2[n], ah, bl, x2[n]);
      wm::mma_sync(acc[n], ah, bh, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < NB; ++n)
#pragma unroll
    for (int e = 0; e < acc[n].num_elements; ++e) acc[n].x[e] += x1[n].x[e] + x2[n].x[e];
}
}  // namespace
}  // namespace hmoe::gpu::dn
