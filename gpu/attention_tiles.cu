// Prefill attention on tensor cores (gpu::attention_tiles, gpu/kernels.h):
// flash-attention style over the paged KV cache. One block of 4 warps per
// (query tile of <= 64 consecutive rows of one sequence, query head); each
// warp owns 16 query rows, kept as mma.sync A fragments in registers. Keys
// and values stream through shared memory in tiles of 64 slots gathered
// from the slot list (rows padded by 8 bf16 against bank conflicts). Per key
// tile a warp computes S = Q K^T with mma.sync m16n8k16 (bf16 in, fp32
// accumulate), masks each row at its length (causal), updates the running
// max and sum with quad shuffles, and multiplies P (the S accumulators
// repacked as bf16 A fragments) by V into fp32 output accumulators that
// stay in registers (FlashAttention-2's layout).
// Compared with gpu::attention (one block per token and head, every key
// read from global memory per token), K/V traffic falls by the tile's 64
// rows and both products run on tensor cores. sm_80 or newer.
// head_dim 256 (Qwen3-Next): a warp's output accumulators alone are 128
// registers a thread, so q's fragments are read from shared memory at each
// use instead of held in registers, and keys stream in tiles of 32 (32
// score registers fewer; Q + K + V tiles 66 KiB of shared memory, within
// sm_86's 99 KiB). head_dim 64 and 128 keep the code they had.
// set_attention_tiles_kernel(2 or 3) runs gpu/attention_tiles_v2.cu instead
// (this kernel where that one does not fit the device's shared memory).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "configs/error.h"
#include "gpu/attention_tiles_v2.h"
#include "gpu/common.cuh"
#include "gpu/kernels.h"

namespace hmoe::gpu {
using namespace detail;

namespace {

constexpr int kTq = 64, kThreads = 128;
std::atomic<int> tiles_kernel{3};  // set_attention_tiles_kernel (the setting gpu_attention_tiles_kernel: 3 since it ran on an H100)

template <int HD>
constexpr int padded() { return HD + 8; }
// Keys per tile, and whether q's A fragments live in registers (else read from shared memory per use).
template <int HD>
constexpr int key_tile() { return HD <= 128 ? 64 : 32; }
template <int HD>
constexpr bool q_in_registers() { return HD <= 128; }
template <int HD>
constexpr size_t tile_smem() {
  return static_cast<size_t>((kTq + 2 * key_tile<HD>()) * padded<HD>() * 2 + kTq * 4);
}

__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t pair16(const __nv_bfloat16* lo, const __nv_bfloat16* hi) {
  return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(lo)) | (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(hi)) << 16);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) attention_tile_kernel(const float* q, int64_t ldq, const int32_t* tiles, int heads, int kv_heads,
                                                                  const __nv_bfloat16* kc, const __nv_bfloat16* vc, const int32_t* slot_lists,
                                                                  const int32_t* offsets, const int32_t* lens, float scale, uint16_t* out) {
  constexpr int LD = padded<HD>(), KD = HD / 16, ND = HD / 8, kTk = key_tile<HD>();
  constexpr bool QR = q_in_registers<HD>();
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [kTq][LD]
  __nv_bfloat16* Ks = Qs + kTq * LD;                           // [kTk][LD]
  __nv_bfloat16* Vs = Ks + kTk * LD;                           // [kTk][LD]
  int* Len = reinterpret_cast<int*>(Vs + kTk * LD);            // keys per row (0: padding row)

  const int tile = blockIdx.x, h = blockIdx.y, grp = h / (heads / kv_heads);
  const int r0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t2 = (lane & 3) * 2;  // fragment row and column pair
  for (int i = tid; i < kTq * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    Qs[r * LD + d] = __float2bfloat16(r < cnt ? q[static_cast<int64_t>(r0 + r) * ldq + h * HD + d] : 0.0f);
  }
  if (tid < kTq) Len[tid] = tid < cnt ? lens[r0 + tid] : 0;
  __syncthreads();
  int maxlen = 0;
  for (int r = 0; r < cnt; ++r) maxlen = max(maxlen, Len[r]);
  const int row0 = warp * 16 + g, row1 = row0 + 8;
  const int len0 = Len[row0], len1 = Len[row1];
  // q's A fragment k (columns 16k..16k+15 of the warp's rows): from registers, or loaded from Qs at each use.
  uint32_t qa[QR ? KD : 1][4];
  auto q_frag = [&](int k, uint32_t* f) {
    const __nv_bfloat16* b = Qs + k * 16 + t2;
    f[0] = ld32(b + row0 * LD);
    f[1] = ld32(b + row1 * LD);
    f[2] = ld32(b + row0 * LD + 8);
    f[3] = ld32(b + row1 * LD + 8);
  };
  if constexpr (QR) {
#pragma unroll
    for (int k = 0; k < KD; ++k) q_frag(k, qa[k]);
  }
  float o[ND][4];
#pragma unroll
  for (int d = 0; d < ND; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // l: this thread's share of the row sums
  const float sl2 = scale * 1.4426950408889634f;               // exp(x) = exp2(x log2 e)
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
        kv = reinterpret_cast<const uint4*>(kc + slot * row + grp * HD)[c];
        vv = reinterpret_cast<const uint4*>(vc + slot * row + grp * HD)[c];
      }
      *reinterpret_cast<uint4*>(Ks + j * LD + c * 8) = kv;
      *reinterpret_cast<uint4*>(Vs + j * LD + c * 8) = vv;
    }
    __syncthreads();
    // S = Q K^T: kTk / 8 tiles of 8 keys; b[k][n] = K[n][k].
    float sc[kTk / 8][4];
    if constexpr (QR) {
#pragma unroll
      for (int nt = 0; nt < kTk / 8; ++nt) {
        sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
        const __nv_bfloat16* kr = Ks + (nt * 8 + g) * LD + t2;
#pragma unroll
        for (int k = 0; k < KD; ++k) mma16816(sc[nt], qa[k], ld32(kr + k * 16), ld32(kr + k * 16 + 8));
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kTk / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll 4
      for (int k = 0; k < KD; ++k) {
        uint32_t f[4];
        q_frag(k, f);
#pragma unroll
        for (int nt = 0; nt < kTk / 8; ++nt) {
          const __nv_bfloat16* kr = Ks + (nt * 8 + g) * LD + t2 + k * 16;
          mma16816(sc[nt], f, ld32(kr), ld32(kr + 8));
        }
      }
    }
    // Mask, scale (log2 units), running max per row (the quad of lanes sharing a row).
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kTk / 8; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key = base + nt * 8 + t2 + j;
        sc[nt][j] = key < len0 ? sc[nt][j] * sl2 : -INFINITY;
        sc[nt][2 + j] = key < len1 ? sc[nt][2 + j] * sl2 : -INFINITY;
        mx0 = fmaxf(mx0, sc[nt][j]);
        mx1 = fmaxf(mx1, sc[nt][2 + j]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float c0 = n0 == -INFINITY || m0 == -INFINITY ? (n0 == -INFINITY ? 1.0f : 0.0f) : exp2f(m0 - n0);
    const float c1 = n1 == -INFINITY || m1 == -INFINITY ? (n1 == -INFINITY ? 1.0f : 0.0f) : exp2f(m1 - n1);
    m0 = n0;
    m1 = n1;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kTk / 8; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sc[nt][j] = sc[nt][j] == -INFINITY ? 0.0f : exp2f(sc[nt][j] - n0);
        sc[nt][2 + j] = sc[nt][2 + j] == -INFINITY ? 0.0f : exp2f(sc[nt][2 + j] - n1);
        s0 += sc[nt][j];
        s1 += sc[nt][2 + j];
      }
    l0 = l0 * c0 + s0;
    l1 = l1 * c1 + s1;
#pragma unroll
    for (int d = 0; d < ND; ++d) {
      o[d][0] *= c0;
      o[d][1] *= c0;
      o[d][2] *= c1;
      o[d][3] *= c1;
    }
    // O += P V: P's accumulators of two key tiles are one A fragment of 16 keys; b[k][n] = V[k][n].
#pragma unroll
    for (int kk = 0; kk < kTk / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const __nv_bfloat16* vr = Vs + (kk * 16 + t2) * LD + g;
#pragma unroll
      for (int d = 0; d < ND; ++d) {
        const __nv_bfloat16* v = vr + d * 8;
        mma16816(o[d], pa, pair16(v, v + LD), pair16(v + 8 * LD, v + 9 * LD));
      }
    }
    __syncthreads();  // K/V tiles are overwritten next
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0 ? 1.0f / l0 : 0.0f, i1 = l1 > 0 ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int d = 0; d < ND; ++d) {
    const int col = d * 8 + t2;
    if (row0 < cnt) {
      uint16_t* dst = out + (static_cast<int64_t>(r0 + row0) * heads + h) * HD + col;
      dst[0] = f2bf(o[d][0] * i0);
      dst[1] = f2bf(o[d][1] * i0);
    }
    if (row1 < cnt) {
      uint16_t* dst = out + (static_cast<int64_t>(r0 + row1) * heads + h) * HD + col;
      dst[0] = f2bf(o[d][2] * i1);
      dst[1] = f2bf(o[d][3] * i1);
    }
  }
}

template <int HD>
void launch(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, const bf16_t* kc,
            const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, cudaStream_t st) {
  constexpr size_t smem = tile_smem<HD>();
  // Per launch (a cheap driver call; prefill steps only): the attribute belongs to the current device.
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_tile_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  attention_tile_kernel<HD><<<dim3(static_cast<unsigned>(ntiles), static_cast<unsigned>(heads)), kThreads, smem, st>>>(
      q, ldq, tiles, static_cast<int>(heads), static_cast<int>(kv_heads), reinterpret_cast<const __nv_bfloat16*>(kc),
      reinterpret_cast<const __nv_bfloat16*>(vc), slot_lists, offsets, lens, scale, out);
  HMOE_CUDA_LAUNCHED();
}

}  // namespace

void attention_tiles(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, int64_t hd,
                     const bf16_t* kc, const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale,
                     bf16_t* out, Stream& s) {
  if (!attention_tiles_takes(hd)) fail(ErrorKind::unsupported, "gpu::attention_tiles: head_dim " + std::to_string(hd) + " (need 64, 128 or 256)");
  if (kv_heads <= 0 || heads % kv_heads != 0) fail(ErrorKind::invalid_argument, "gpu::attention_tiles: heads must be a multiple of kv_heads");
  if (ntiles <= 0) return;
  if (ntiles > INT32_MAX || heads > 65535) fail(ErrorKind::unsupported, "gpu::attention_tiles: too many tiles or heads");
  const int version = tiles_kernel.load(std::memory_order_relaxed);
  if (version != 1 &&
      attention_tiles_v2(version == 3 ? 32 : 16, q, ldq, ntiles, tiles, heads, kv_heads, hd, kc, vc, slot_lists, offsets, lens, scale, out, cs(s)))
    return;
  if (hd == 64) launch<64>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, cs(s));
  else if (hd == 128) launch<128>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, cs(s));
  else launch<256>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, cs(s));
}

void set_attention_tiles_kernel(int version) { tiles_kernel.store(version == 2 || version == 3 ? version : 1); }
int attention_tiles_kernel() { return tiles_kernel.load(); }

}  // namespace hmoe::gpu
