// Prefill attention on tensor cores (gpu::attention_tiles, gpu/kernels.h):
// flash-attention style over the paged KV cache. One block of 4 warps per
// (query tile of <= 64 consecutive rows of one sequence, query head): the
// tile's queries (bf16) stay in shared memory; keys and values stream
// through in tiles of 64 slots gathered from the slot list; each warp owns
// 16 query rows: S = Q K^T with WMMA bf16 16x16x16 (fp32 accumulate), a
// causal mask from each row's length, online softmax in fp32, P (bf16)
// times V accumulated into an fp32 output tile in shared memory (rows are
// rescaled there, since WMMA fragments hide their row mapping).
// Compared with gpu::attention (one block per token and head, every key
// read from global memory per token), the K/V traffic falls by the tile's
// 64 rows and the products run on tensor cores.
#include <mma.h>

#include <algorithm>
#include <vector>

#include "configs/error.h"
#include "gpu/common.cuh"
#include "gpu/kernels.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kTq = 64, kTk = 64, kThreads = 128;
using namespace nvcuda;

template <int HD>
constexpr size_t tile_smem() {
  return static_cast<size_t>(kTq * HD * 2 + 2 * kTk * HD * 2 + kTq * kTk * 4 + kTq * kTk * 2 + kTq * HD * 4 + kTq * 12);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) attention_tile_kernel(const float* q, int64_t ldq, const int32_t* tiles, int heads, int kv_heads,
                                                                  const __nv_bfloat16* kc, const __nv_bfloat16* vc, const int32_t* slot_lists,
                                                                  const int32_t* offsets, const int32_t* lens, float scale, uint16_t* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kTq][HD]
  __nv_bfloat16* Ks = Qs + kTq * HD;                           // [kTk][HD]
  __nv_bfloat16* Vs = Ks + kTk * HD;                           // [kTk][HD]
  float* S = reinterpret_cast<float*>(Vs + kTk * HD);          // [kTq][kTk]
  __nv_bfloat16* P = reinterpret_cast<__nv_bfloat16*>(S + kTq * kTk);  // [kTq][kTk]
  float* O = reinterpret_cast<float*>(P + kTq * kTk);          // [kTq][HD]
  float* M = O + kTq * HD;                                     // running max per row
  float* L = M + kTq;                                          // running sum per row
  int* Len = reinterpret_cast<int*>(L + kTq);                  // keys per row (0: padding row)

  const int tile = blockIdx.x, h = blockIdx.y, g = h / (heads / kv_heads);
  const int r0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int i = tid; i < kTq * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    Qs[i] = __float2bfloat16(r < cnt ? q[static_cast<int64_t>(r0 + r) * ldq + h * HD + d] : 0.0f);
    O[i] = 0.0f;
  }
  if (tid < kTq) {
    M[tid] = -INFINITY;
    L[tid] = 0.0f;
    Len[tid] = tid < cnt ? lens[r0 + tid] : 0;
  }
  __syncthreads();
  int maxlen = 0;
  for (int r = 0; r < cnt; ++r) maxlen = max(maxlen, Len[r]);
  const int32_t* sl = slot_lists + offsets[r0];
  const int64_t row = static_cast<int64_t>(kv_heads) * HD;
  constexpr int C = HD / 8;  // 16-byte chunks per key row

  for (int base = 0; base < maxlen; base += kTk) {
    const int kn = min(kTk, maxlen - base);
    for (int i = tid; i < kTk * C; i += kThreads) {
      const int j = i / C, c = i % C;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (j < kn) {
        const int64_t slot = sl[base + j];
        kv = reinterpret_cast<const uint4*>(kc + slot * row + g * HD)[c];
        vv = reinterpret_cast<const uint4*>(vc + slot * row + g * HD)[c];
      }
      reinterpret_cast<uint4*>(Ks)[i] = kv;
      reinterpret_cast<uint4*>(Vs)[i] = vv;
    }
    __syncthreads();
    // S[warp rows] = Q K^T.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTk / 16];
#pragma unroll
      for (int n = 0; n < kTk / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
      for (int k = 0; k < HD / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, Qs + warp * 16 * HD + k * 16, HD);
#pragma unroll
        for (int n = 0; n < kTk / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;  // b[k][n] = K[n][k]
          wmma::load_matrix_sync(b, Ks + n * 16 * HD + k * 16, HD);
          wmma::mma_sync(acc[n], a, b, acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kTk / 16; ++n) wmma::store_matrix_sync(S + warp * 16 * kTk + n * 16, acc[n], kTk, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of the warp's rows (two keys per lane), P in bf16, O rows rescaled.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = warp * 16 + rr, len = Len[r];
      const int c0 = lane, c1 = lane + 32;
      const float s0 = base + c0 < len ? S[r * kTk + c0] * scale : -INFINITY;
      const float s1 = base + c1 < len ? S[r * kTk + c1] * scale : -INFINITY;
      const float mold = M[r], mnew = fmaxf(mold, warp_max(fmaxf(s0, s1)));
      float p0 = 0.0f, p1 = 0.0f, corr = 1.0f;
      if (mnew != -INFINITY) {
        p0 = s0 == -INFINITY ? 0.0f : __expf(s0 - mnew);
        p1 = s1 == -INFINITY ? 0.0f : __expf(s1 - mnew);
        corr = mold == -INFINITY ? 0.0f : __expf(mold - mnew);
      }
      const float sum = warp_sum(p0 + p1);
      P[r * kTk + c0] = __float2bfloat16(p0);
      P[r * kTk + c1] = __float2bfloat16(p1);
      for (int d = lane; d < HD; d += 32) O[r * HD + d] *= corr;
      __syncwarp();
      if (lane == 0) {
        M[r] = mnew;
        L[r] = L[r] * corr + sum;
      }
    }
    __syncwarp();
    // O[warp rows] += P V.
#pragma unroll
    for (int f = 0; f < HD / 16; ++f) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, O + warp * 16 * HD + f * 16, HD, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kTk / 16; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, P + warp * 16 * kTk + k * 16, kTk);
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(b, Vs + k * 16 * HD + f * 16, HD);
        wmma::mma_sync(o, a, b, o);
      }
      wmma::store_matrix_sync(O + warp * 16 * HD + f * 16, o, HD, wmma::mem_row_major);
    }
    __syncthreads();  // K/V tiles are overwritten next
  }
  __syncthreads();
  for (int i = tid; i < cnt * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    const float l = L[r];
    out[(static_cast<int64_t>(r0 + r) * heads + h) * HD + d] = f2bf(l > 0 ? O[r * HD + d] / l : 0.0f);
  }
}

template <int HD>
void launch(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, const bf16_t* kc,
            const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, cudaStream_t st) {
  constexpr size_t smem = tile_smem<HD>();
  static bool attr = false;  // one host thread per stack; set once per process
  if (!attr) {
    HMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_tile_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    attr = true;
  }
  attention_tile_kernel<HD><<<dim3(static_cast<unsigned>(ntiles), static_cast<unsigned>(heads)), kThreads, smem, st>>>(
      q, ldq, tiles, static_cast<int>(heads), static_cast<int>(kv_heads), reinterpret_cast<const __nv_bfloat16*>(kc),
      reinterpret_cast<const __nv_bfloat16*>(vc), slot_lists, offsets, lens, scale, out);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace

void attention_tiles(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, int64_t hd,
                     const bf16_t* kc, const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale,
                     bf16_t* out, Stream& s) {
  if (hd != 64 && hd != 128) fail(ErrorKind::unsupported, "gpu::attention_tiles: head_dim " + std::to_string(hd) + " (need 64 or 128)");
  if (kv_heads <= 0 || heads % kv_heads != 0) fail(ErrorKind::invalid_argument, "gpu::attention_tiles: heads must be a multiple of kv_heads");
  if (ntiles <= 0) return;
  if (ntiles > INT32_MAX || heads > 65535) fail(ErrorKind::unsupported, "gpu::attention_tiles: too many tiles or heads");
  if (hd == 64) launch<64>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, cs(s));
  else launch<128>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, cs(s));
}

}  // namespace hmoe::gpu
