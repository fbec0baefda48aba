// Prefill attention on tensor cores, second kernel (gpu/attention_tiles_v2.h;
// chosen by gpu::set_attention_tiles_kernel(2 or 3), gpu/kernels.h). Same
// query tiles, slot lists and numerics as gpu/attention_tiles.cu (q and the
// softmax weights rounded to bf16, mma.sync m16n8k16, fp32 accumulators,
// FlashAttention-2's running max and sum), reorganised for throughput. The
// first kernel reached 99.5 TFLOP/s at 8192 tokens (H200, hd 128): it loads
// K/V with plain loads and waits for them, builds V's B fragments from four
// 16-bit shared loads each, and every 64-row block reads its own K/V tiles.
// What this one does instead, and why:
//  - A block serves one 64-row query tile for G = 2 query heads that share a
//    kv head (G = 1 where heads / kv_heads is odd), so a K/V tile gathered
//    once serves 128 rows, halving the L2 traffic per FLOP (at 300 TFLOP/s,
//    64 rows a tile would need about 4.7 TB/s of L2). Pairing heads rather
//    than taking 128 consecutive rows keeps the tile list
//    (attention_tile_list) and every caller unchanged, and both heads' rows
//    have the same causal lengths, so no half of a block idles on a shorter
//    diagonal.
//  - K/V tiles of 64 keys are gathered by cp.async (16 bytes a copy, the
//    slot read per key row) into two stages: tile t+1 lands while tile t is
//    multiplied. Keys past the tile's longest row are zero-filled (V rows
//    must be finite: 0 x NaN would poison the output).
//  - Fragments come from ldmatrix: K's B fragments non-transposed, V's with
//    .trans, q's A fragments from shared memory at each use (registers go to
//    the accumulators). Rows padded by 8 bf16 put the eight 16-byte rows of
//    every ldmatrix in distinct banks.
//  - Rows a warp (MT m-tiles of 16): kernel 2 gives each of 8 warps 16 rows
//    (128 registers a thread at hd <= 128, two blocks an SM: 16 warps);
//    kernel 3 gives each of 4 warps 32 rows at hd 64 and 128, so that every
//    K and V fragment read from shared memory feeds two products (about 160
//    instead of 290 bytes of ldmatrix per mma at hd 128) at 255 registers a
//    thread (8 warps an SM; ptxas spills about 12 registers at hd 128) - the
//    layout of FlashAttention-2's hd 128 forward. Which is faster is for the
//    GPU to say. hd 256 always takes 16 rows a warp (its accumulators alone
//    are 128 registers).
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
// Warps of a block: G heads x 64 rows, MT m-tiles of 16 rows a warp.
template <int G, int MT>
constexpr int v2_threads() {
  return 32 * G * 4 / MT;
}
// Blocks an SM must fit (the register cap): 128 registers a thread for MT 1 below hd 256, else 255.
template <int HD, int G, int MT>
constexpr int v2_min_blocks() {
  return MT == 1 && HD <= 128 ? 65536 / 128 / v2_threads<G, MT>() : 65536 / 256 / v2_threads<G, MT>();
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

// Grid: ntiles x heads / G blocks of v2_threads<G, MT>. Warp w: head h0 + w / (4 / MT), tile rows
// 16 MT (w % (4 / MT)) .. +16 MT - 1, m-tile i its rows 16 i .. +15.
// Fragment lanes (m16n8k16): g = lane / 4 is the row (A, C) or column (B) within 8, t2 = 2 (lane % 4) the
// first of two consecutive columns (A, C) or rows (B); C's registers 0-1 are row g, 2-3 row g + 8.
template <int HD, int G, int MT>
__global__ void __launch_bounds__(v2_threads<G, MT>(), v2_min_blocks<HD, G, MT>())
    attention_tiles_v2_kernel(const float* q, int64_t ldq, int ntiles, const int32_t* tiles, int heads, int kv_heads, const __nv_bfloat16* kc,
                              const __nv_bfloat16* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale,
                              uint16_t* out) {
  constexpr int LD = HD + 8, KD = HD / 16, ND = HD / 8, C = HD / 8, T = v2_threads<G, MT>(), WPH = 4 / MT;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);  // [G * kTq][LD], head-major
  __nv_bfloat16* KV = Qs + G * kTq * LD;                       // stage s: K [kTk][LD] at 2s, V at 2s + 1

  const int hgroups = heads / G;
  const int tile = ntiles - 1 - static_cast<int>(blockIdx.x) / hgroups, h0 = (static_cast<int>(blockIdx.x) % hgroups) * G;
  const int grp = h0 / (heads / kv_heads);
  const int r0 = tiles[2 * tile], cnt = tiles[2 * tile + 1];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wh = warp / WPH, wr = (warp % WPH) * 16 * MT;
  const int g = lane >> 2, t2 = (lane & 3) * 2;

  // Row lengths: the tile's longest and shortest (rows < cnt), this thread's rows, the warp's longest.
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
  int len[MT][2];  // rows wr + 16 i + g and + 8
  int wlen = 0;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = wr + 16 * i + 8 * e + g;
      len[i][e] = row < cnt ? lens[r0 + row] : 0;
      wlen = max(wlen, len[i][e]);
    }
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
#pragma unroll
    for (int i = tid; i < kTk * C; i += T) {  // unrolled: every slot read in flight before the copies wait on them
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
  const uint32_t q_a = smem_addr(Qs + (wh * kTq + wr + (lane & 15)) * LD + (lane >> 4) * 8);  // m-tile i: + 16 i rows
  const uint32_t k_a = static_cast<uint32_t>((((lane & 7) + ((lane >> 4) << 3)) * LD + ((lane >> 3) & 1) * 8) * 2);
  const uint32_t v_a = static_cast<uint32_t>((((lane & 7) + (((lane >> 3) & 1) << 3)) * LD + (lane >> 4) * 8) * 2);

  float o[MT][ND][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int d = 0; d < ND; ++d) o[i][d][0] = o[i][d][1] = o[i][d][2] = o[i][d][3] = 0.0f;
  // m: running max x scale x log2 e; l: this thread's share of the row sum (rows g and g + 8 of each m-tile).
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
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
      float s[MT][kTk / 8][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int n = 0; n < kTk / 8; ++n) s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < KD; ++k) {
        uint32_t af[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) ldsm4(q_a + static_cast<uint32_t>((16 * i * LD + k * 16) * 2), af[i]);
#pragma unroll
        for (int np = 0; np < kTk / 16; ++np) {
          uint32_t b[4];
          ldsm4(ks + k_a + static_cast<uint32_t>((np * 16 * LD + k * 16) * 2), b);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma16816(s[i][2 * np], af[i], b[0], b[1]);
            mma16816(s[i][2 * np + 1], af[i], b[2], b[3]);
          }
        }
      }
      const bool edge = base + kTk > lmin;
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        if (edge) {
#pragma unroll
          for (int n = 0; n < kTk / 8; ++n)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int key = base + n * 8 + t2 + j;
              if (key >= len[i][0]) s[i][n][j] = -INFINITY;
              if (key >= len[i][1]) s[i][n][2 + j] = -INFINITY;
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < kTk / 8; ++n) {
          mx0 = fmaxf(mx0, fmaxf(s[i][n][0], s[i][n][1]));
          mx1 = fmaxf(mx1, fmaxf(s[i][n][2], s[i][n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m[i][0], mx0 * sl2), n1 = fmaxf(m[i][1], mx1 * sl2);
        // A row with no key yet (all -inf) subtracts 0: its weights and correction come out 0, never NaN.
        const float u0 = n0 == -INFINITY ? 0.0f : n0, u1 = n1 == -INFINITY ? 0.0f : n1;
        const float c0 = ex2(m[i][0] - u0), c1 = ex2(m[i][1] - u1);
        m[i][0] = n0;
        m[i][1] = n1;
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int n = 0; n < kTk / 8; ++n) {
          s[i][n][0] = ex2(fmaf(s[i][n][0], sl2, -u0));
          s[i][n][1] = ex2(fmaf(s[i][n][1], sl2, -u0));
          s[i][n][2] = ex2(fmaf(s[i][n][2], sl2, -u1));
          s[i][n][3] = ex2(fmaf(s[i][n][3], sl2, -u1));
          s0 += s[i][n][0] + s[i][n][1];
          s1 += s[i][n][2] + s[i][n][3];
        }
        l[i][0] = l[i][0] * c0 + s0;
        l[i][1] = l[i][1] * c1 + s1;
#pragma unroll
        for (int d = 0; d < ND; ++d) {
          o[i][d][0] *= c0;
          o[i][d][1] *= c0;
          o[i][d][2] *= c1;
          o[i][d][3] *= c1;
        }
      }
      // O += P V: the score accumulators of key columns 16kk..+7 and +8..+15 are one A fragment.
#pragma unroll
      for (int kk = 0; kk < kTk / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          pa[i][0] = pack_bf16(s[i][2 * kk][0], s[i][2 * kk][1]);
          pa[i][1] = pack_bf16(s[i][2 * kk][2], s[i][2 * kk][3]);
          pa[i][2] = pack_bf16(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
          pa[i][3] = pack_bf16(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < HD / 16; ++dp) {
          uint32_t b[4];
          ldsm4_t(vs + v_a + static_cast<uint32_t>((kk * 16 * LD + dp * 16) * 2), b);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            mma16816(o[i][2 * dp], pa[i], b[0], b[1]);
            mma16816(o[i][2 * dp + 1], pa[i], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's copy
  }

  const int h = h0 + wh;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float sum = l[i][e];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0 ? 1.0f / sum : 0.0f;
      const int row = wr + 16 * i + 8 * e + g;
      if (row < cnt) {
        uint32_t* dst = reinterpret_cast<uint32_t*>(out + (static_cast<int64_t>(r0 + row) * heads + h) * HD + t2);
#pragma unroll
        for (int d = 0; d < ND; ++d) dst[d * 4] = pack_bf16(o[i][d][2 * e] * inv, o[i][d][2 * e + 1] * inv);
      }
    }
}

template <int HD, int G, int MT>
bool launch(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, const bf16_t* kc, const bf16_t* vc,
            const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, cudaStream_t st) {
  constexpr size_t smem = v2_smem<HD, G>();
  if (static_cast<int64_t>(smem) > smem_optin_limit()) return false;
  // Per launch (a cheap driver call; prefill steps only): the attribute belongs to the current device.
  HMOE_CUDA_CHECK(cudaFuncSetAttribute(attention_tiles_v2_kernel<HD, G, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int64_t blocks = ntiles * (heads / G);
  attention_tiles_v2_kernel<HD, G, MT><<<static_cast<unsigned>(blocks), v2_threads<G, MT>(), smem, st>>>(
      q, ldq, static_cast<int>(ntiles), tiles, static_cast<int>(heads), static_cast<int>(kv_heads), reinterpret_cast<const __nv_bfloat16*>(kc),
      reinterpret_cast<const __nv_bfloat16*>(vc), slot_lists, offsets, lens, scale, out);
  HMOE_CUDA_LAUNCHED();
  return true;
}

// Two heads a block where the group size is even, else one; 32 rows a warp (MT 2) only with two heads below hd 256.
template <int HD>
bool launch_hd(bool wide, const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, const bf16_t* kc,
               const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale, bf16_t* out, cudaStream_t st) {
  if ((heads / kv_heads) % 2 != 0) return launch<HD, 1, 1>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  if constexpr (HD <= 128)
    if (wide) return launch<HD, 2, 2>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  return launch<HD, 2, 1>(q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
}

}  // namespace

bool attention_tiles_v2(int rows_per_warp, const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads,
                        int64_t hd, const bf16_t* kc, const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens,
                        float scale, bf16_t* out, cudaStream_t st) {
  if (ntiles * heads > INT32_MAX) return false;
  const bool wide = rows_per_warp == 32;
  if (hd == 64) return launch_hd<64>(wide, q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  if (hd == 128) return launch_hd<128>(wide, q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  if (hd == 256) return launch_hd<256>(wide, q, ldq, ntiles, tiles, heads, kv_heads, kc, vc, slot_lists, offsets, lens, scale, out, st);
  return false;
}

}  // namespace hmoe::gpu::detail
