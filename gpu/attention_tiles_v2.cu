// Prefill attention on tensor cores, second kernel (gpu/attention_tiles_v2.h;
// chosen by gpu::set_attention_tiles_kernel(2), gpu/kernels.h). Same query
// tiles, slot lists and numerics as gpu/attention_tiles.cu (q and the
// softmax weights rounded to bf16, mma.sync m16n8k16, fp32 accumulators,
// FlashAttention-2's running max and sum), reorganised for throughput. The
// first kernel reached 99.5 TFLOP/s at 8192 tokens (H200, hd 128): it loads
// K/V with plain loads and waits for them, builds V's B fragments from four
// 16-bit shared loads each, and every 64-row block reads its own K/V tiles.
// What this one does instead, and why:
//  - A block serves one 64-row query tile for G = 2 query heads that share a
//    kv head (G = 1 where heads / kv_heads is odd): 8 warps x 16 rows, so a
//    K/V tile gathered once serves 128 rows, halving the L2 traffic per
//    FLOP (at 300 TFLOP/s, 64 rows a tile would need about 4.7 TB/s of L2).
//    Pairing heads rather than taking 128 consecutive rows keeps the tile
//    list (attention_tile_list) and every caller unchanged, and both heads'
//    rows have the same causal lengths, so no block waits on a longer half.
//  - K/V tiles of 64 keys are gathered by cp.async (16 bytes a copy, the
//    slot read per key row) into two stages: tile t+1 lands while tile t is
//    multiplied. Keys past the tile's longest row are zero-filled (V rows
//    must be finite: 0 x NaN would poison the output).
//  - Fragments come from ldmatrix: K's B fragments non-transposed, V's with
//    .trans, q's A fragments from shared memory at each use for hd 128 and
//    256 (registers go to the accumulators: 128 a thread at hd 128 keeps two
//    blocks on an SM), from registers for hd 64. Rows padded by 8 bf16 make
//    the eight 16-byte rows of every ldmatrix land in distinct banks.
//  - Scores stay raw; the running max is kept in log2 units, and each weight
//    is one FFMA and ex2.approx (the scale folded into log2 e). The -inf
//    guards act on the row max only, never per element.
//  - Only tiles reaching past the block's shortest row are masked (at most
//    two per causal tile); a warp skips the tiles past its own longest row.
//  - Blocks run in reverse tile order with a tile's heads next to each
//    other: the last tiles of a prompt attend to the most keys, so the
//    longest blocks start first and the short ones fill the tail.
// Shared memory (rows of hd + 8 bf16): q 64 G rows, K and V 2 x 64 rows
// each: hd 64 54 KiB, hd 128 102 KiB (two blocks an SM on sm_90), hd 256
// 198 KiB (one block). Past the device's opt-in limit (sm_86/89 at hd 128
// and 256) attention_tiles_v2 returns false and the first kernel runs.
// Compiled for sm_90; not yet run on a GPU when written (k37c).
#include "gpu/attention_tiles_v2.h"

#include <cuda_bf16.h>

#include "gpu/common.cuh"

namespace hmoe::gpu::detail {
namespace {

constexpr int kTq = 64;  // query rows of a tile (attention_tile_list)
constexpr int kTk = 64;  // keys of a K/V tile

template <int HD, int G>
constexpr size_t v2_smem() {
  return static_cast<size_t>(G * kTq + 4 * kTk) * (HD + 8) * 2;
}
// Blocks an SM must fit (the register cap): 128 registers a thread below hd 256, 255 at 256.
template <int HD, int G>
constexpr int v2_min_blocks() {
  return (HD <= 128 ? 2 : 1) * (G == 1 ? 2 : 1);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void ldsm4(uint32_t a, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm4_t(uint32_t a, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
// 16 bytes global -> shared; bytes 0 writes zeros (src must still be a valid address).
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
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

// Grid: ntiles x heads / G blocks of 128 G threads. Warp w: head h0 + w / 4, tile rows 16 (w % 4) .. +15.
// Fragment lanes (m16n8k16): g = lane / 4 is the row (A, C) or column (B) within 8, t2 = 2 (lane % 4) the
// first of two consecutive columns (A, C) or rows (B); C's registers 0-1 are row g, 2-3 row g + 8.
template <int HD, int G>
__global__ void __launch_bounds__(128 * G, v2_min_blocks<HD, G>())
    attention_tiles_v2_kernel(const float* q, int64_t ldq, int ntiles, const int32_t* tiles, int heads, int kv_heads, const __nv_bfloat16* kc,
                              const __nv_bfloat16* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale,
                              uint16_t* out) {
  constexpr int LD = HD + 8, KD = HD / 16, ND = HD / 8, C = HD / 8, T = 128 * G;
  constexpr bool QR = HD <= 64;  // q's A fragments held in registers
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [G * kTq][LD], head-major
  __nv_bfloat16* KV = Qs + G * kTq * LD;                       // stage s: K [kTk][LD] at 2s, V at 2s + 1

  const int hgroups = heads / G;
  const int tile = ntiles - 1 - static_cast<int>(blockIdx.x) / hgroups, h0 = (static_cast<int>(blockIdx.x) % hgroups) * G;
  const int grp = h0 / (heads / kv_heads);
  const int r0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wh = warp >> 2, wr = (warp & 3) * 16;
  const int g = lane >> 2, t2 = (lane & 3) * 2;

  // Row lengths: the tile's longest and shortest (rows < cnt), this thread's two rows, the warp's longest.
  int lmax = 0, lmin = INT32_MAX;
  for (int r = lane; r < cnt; r += 32) {
    const int l = lens[r0 + r];
    lmax = max(lmax, l);
    lmin = min(lmin, l);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lmax = max(lmax, __shfl_xor_sync(0xffffffffu, lmax, o));
    lmin = min(lmin, __shfl_xor_sync(0xffffffffu, lmin, o));
  }
  const int row0 = wr + g, row1 = row0 + 8;
  const int len0 = row0 < cnt ? lens[r0 + row0] : 0, len1 = row1 < cnt ? lens[r0 + row1] : 0;
  int wlen = max(len0, len1);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wlen = max(wlen, __shfl_xor_sync(0xffffffffu, wlen, o));
  const int nk = (lmax + kTk - 1) / kTk;

  // K/V tile t into stage t & 1: one cp.async group per tile.
  const int32_t* sl = slot_lists + offsets[r0];
  const int64_t kv_row = static_cast<int64_t>(kv_heads) * HD;
  const __nv_bfloat16* kg = kc + static_cast<int64_t>(grp) * HD;
  const __nv_bfloat16* vg = vc + static_cast<int64_t>(grp) * HD;
  const uint32_t kv_s = smem_addr(KV);
  auto load_kv = [&](int t) {
    const int base = t * kTk;
    const uint32_t kd = kv_s + static_cast<uint32_t>((t & 1) * 2 * kTk * LD * 2), vd = kd + kTk * LD * 2;
    for (int i = tid; i < kTk * C; i += T) {
      const int j = i / C, c = i % C;
      const bool in = base + j < lmax;
      const int64_t off = (in ? static_cast<int64_t>(sl[base + j]) * kv_row : 0) + c * 8;
      const uint32_t so = static_cast<uint32_t>((j * LD + c * 8) * 2);
      cp16(kd + so, kg + off, in ? 16 : 0);
      cp16(vd + so, vg + off, in ? 16 : 0);
    }
    cp_commit();
  };
  if (nk > 0) load_kv(0);

  // q rows (fp32, any alignment) to bf16 while tile 0 is in flight.
  for (int i = tid; i < G * kTq * (HD / 2); i += T) {
    const int c = (i % (HD / 2)) * 2, rr = i / (HD / 2), r = rr % kTq;
    float a = 0.0f, b = 0.0f;
    if (r < cnt) {
      const float* src = q + static_cast<int64_t>(r0 + r) * ldq + static_cast<int64_t>(h0 + rr / kTq) * HD + c;
      a = src[0];
      b = src[1];
    }
    *reinterpret_cast<__nv_bfloat162*>(Qs + rr * LD + c) = __floats2bfloat162_rn(a, b);
  }
  __syncthreads();

  // ldmatrix lane addresses. A (q, row-major 16 x 16): lanes 0-15 rows 0-15 at column 0, 16-31 at column 8.
  // B of S = q K^T (K rows are the n index): matrices (keys 0-7, d 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
  // give b0, b1 of key columns 0-7 and b0, b1 of 8-15. B of O = P V (.trans; V rows are the k index):
  // matrices (keys 0-7, d 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) give b0, b1 of d 0-7 and of d 8-15.
  const uint32_t q_a = smem_addr(Qs + (wh * kTq + wr + (lane & 15)) * LD + (lane >> 4) * 8);
  const uint32_t k_a = static_cast<uint32_t>((((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
  const uint32_t v_a = static_cast<uint32_t>((((lane & 7) + (((lane >> 3) & 1) << 3)) * LD + (lane >> 4) * 8) * 2);
  uint32_t qa[QR ? KD : 1][4];
  if constexpr (QR) {
#pragma unroll
    for (int k = 0; k < KD; ++k) ldsm4(q_a + k * 32, qa[k]);
  }

  float o[ND][4];
#pragma unroll
  for (int d = 0; d < ND; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // m: running max x scale x log2 e; l: this thread's share of the sum
  const float sl2 = scale * 1.4426950408889634f;

  for (int t = 0; t < nk; ++t) {
    if (t + 1 < nk) {
      load_kv(t + 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const int base = t * kTk;
    if (base < wlen) {
      const uint32_t ks = kv_s + static_cast<uint32_t>((t & 1) * 2 * kTk * LD * 2), vs = ks + kTk * LD * 2;
      float s[kTk / 8][4];
#pragma unroll
      for (int n = 0; n < kTk / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < KD; ++k) {
        uint32_t af[4];
        if constexpr (QR) {
          af[0] = qa[k][0], af[1] = qa[k][1], af[2] = qa[k][2], af[3] = qa[k][3];
        } else {
          ldsm4(q_a + k * 32, af);
        }
#pragma unroll
        for (int np = 0; np < kTk / 16; ++np) {
          uint32_t b[4];
          ldsm4(ks + k_a + static_cast<uint32_t>((np * 16 * LD + k * 16) * 2), b);
          mma16816(s[2 * np], af, b[0], b[1]);
          mma16816(s[2 * np + 1], af, b[2], b[3]);
        }
      }
      if (base + kTk > lmin) {
#pragma unroll
        for (int n = 0; n < kTk / 8; ++n)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int key = base + n * 8 + t2 + j;
            if (key >= len0) s[n][j] = -INFINITY;
            if (key >= len1) s[n][2 + j] = -INFINITY;
          }
      }
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kTk / 8; ++n) {
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float n0 = fmaxf(m0, mx0 * sl2), n1 = fmaxf(m1, mx1 * sl2);
      // A row with no key yet (all -inf) subtracts 0: its weights and correction come out 0, never NaN.
      const float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
      const float c0 = ex2(m0 - u0), c1 = ex2(m1 - u1);
      m0 = n0;
      m1 = n1;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int n = 0; n < kTk / 8; ++n) {
        s[n][0] = ex2(fmaf(s[n][0], sl2, -u0));
        s[n][1] = ex2(fmaf(s[n][1], sl2, -u0));
        s[n][2] = ex2(fmaf(s[n][2], sl2, -u1));
        s[n][3] = ex2(fmaf(s[n][3], sl2, -u1));
        s0 += s[n][0] + s[n][1];
        s1 += s[n][2] + s[n][3];
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
      // O += P V: the score accumulators of key columns 16kk..+7 and +8..+15 are one A fragment.
#pragma unroll
      for (int kk = 0; kk < kTk / 16; ++kk) {
        const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < HD / 16; ++dp) {
          uint32_t b[4];
          ldsm4_t(vs + v_a + static_cast<uint32_t>((kk * 16 * LD + dp * 16) * 2), b);
          mma16816(o[2 * dp], pa, b[0], b[1]);
          mma16816(o[2 * dp + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's copy
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0 ? 1.0f / l0 : 0.0f, i1 = l1 > 0 ? 1.0f / l1 : 0.0f;
  const int h = h0 + wh;
  uint32_t* d0 = reinterpret_cast<uint32_t*>(out + (static_cast<int64_t>(r0 + row0) * heads + h) * HD + t2);
  uint32_t* d1 = reinterpret_cast<uint32_t*>(out + (static_cast<int64_t>(r0 + row1) * heads + h) * HD + t2);
#pragma unroll
  for (int d = 0; d < ND; ++d) {
    if (row0 < cnt) d0[d * 4] = pack_bf16(o[d][0] * i0, o[d][1] * i0);
    if (row1 < cnt) d1[d * 4] = pack_bf16(o[d][2] * i1, o[d][3] * i1);
  }
}

template <int HD, int G>
bool launch(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, const bf16_t* kc, const bf16_t* vc,
            const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, cudaStream_t st) {
  constexpr size_t smem = v2_smem<HD, G>();
  if (static_cast<int64_t>(smem) > smem_optin_limit()) return false;
  // Per launch (a cheap driver call; prefill steps only): the attribute belongs to the current device.
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_tiles_v2_kernel<HD, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int64_t blocks = ntiles * (heads / G);
  attention_tiles_v2_kernel<HD, G><<<static_cast<unsigned>(blocks), 128 * G, smem, st>>>(
      q, ldq, static_cast<int>(ntiles), tiles, static_cast<int>(heads), static_cast<int>(kv_heads), reinterpret_cast<const __nv_bfloat16*>(kc),
      reinterpret_cast<const __nv_bfloat16*>(vc), slot_lists, offsets, lens, scale, out);
  HMOE_CUDA_LAUNCHED();
  return true;
}

template <int HD>
bool launch_hd(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, const bf16_t* kc,
               const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, cudaStream_t st) {
  if ((heads / kv_heads) % 2 == 0)
    return launch<HD, 2>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  return launch<HD, 1>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
}

}  // namespace

bool attention_tiles_v2(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, int64_t hd,
                        const bf16_t* kc, const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale,
                        bf16_t* out, cudaStream_t st) {
  if (ntiles * heads > INT32_MAX) return false;
  if (hd == 64) return launch_hd<64>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  if (hd == 128) return launch_hd<128>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  if (hd == 256) return launch_hd<256>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  return false;
}

}  // namespace hmoe::gpu::detail
