// Device decoders of the GGUF block types (Q4_K, Q5_K, Q6_K, Q8_0; the
// low-bit types are gpu/gguf_lowbit_units.h's) shared by gpu/gguf_gemv.cu
// and gpu/gguf_moe_gemm.cu. Private to gpu/*.cu.
//
// A "unit" is 64 weights of one row, as 4 runs of 16: each run 4 words of
// int8 codes q with a scale a and an offset c (w = a * q - c) and the first
// element of the run within its group (super-block of 256, or for Q8_0 a
// pair of 34-byte blocks, 64 elements). unit(s, off, q, run, tables) reads the
// group at byte offset `off` (even) of s (4-byte aligned; words up to 8 bytes
// past the group are read and ignored) and decodes its unit q (< UPB).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/gguf_lowbit_units.h"  // Run, and the low-bit types' units

namespace hmoe::gpu::detail::gguf {

// 4 bytes at an even offset of shared memory (reads the next word too).
__device__ __forceinline__ uint32_t ldw(const uint8_t* s, int off) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(s + (off & ~3));
  return __funnelshift_r(p[0], p[1], (off & 3) * 8);
}
__device__ __forceinline__ void ld16(const uint8_t* s, int off, uint32_t* o) {
  const uint32_t* p = reinterpret_cast<const uint32_t*>(s + (off & ~3));
  const int sh = (off & 3) * 8;
  uint32_t a[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) a[i] = p[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = __funnelshift_r(a[i], a[i + 1], sh);
}
__device__ __forceinline__ float h2f(uint32_t bits) { return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu))); }

// ---- formats: group bytes BB, group elements EB, units per group UPB -------

// Q4_K / Q5_K 6-bit scale and min of sub-block j (0..7) from the 12 bytes in s0..s2.
__device__ __forceinline__ void k_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, int& sc, int& m) {
  auto byte = [&](int i) { return static_cast<int>(((i < 4 ? s0 : (i < 8 ? s1 : s2)) >> (8 * (i & 3))) & 0xFFu); };
  if (j < 4) {
    sc = byte(j) & 63;
    m = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4);
    m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

struct Q4K {
  static constexpr int BB = 144, EB = 256, UPB = 4;
  // Unit q: sub-blocks 2q (low nibbles of qs[32q..32q+31]) and 2q+1 (high nibbles).
  __device__ __forceinline__ static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables&) {
    const uint32_t hdr = ldw(s, off);
    const float d = h2f(hdr), dmin = h2f(hdr >> 16);
    const uint32_t s0 = ldw(s, off + 4), s1 = ldw(s, off + 8), s2 = ldw(s, off + 12);
    int sc0, m0, sc1, m1;
    k_scale_min(s0, s1, s2, 2 * q, sc0, m0);
    k_scale_min(s0, s1, s2, 2 * q + 1, sc1, m1);
    uint32_t w[8];
    ld16(s, off + 16 + 32 * q, w);
    ld16(s, off + 32 + 32 * q, w + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r[0].w[i] = w[i] & 0x0F0F0F0Fu;
      r[1].w[i] = w[4 + i] & 0x0F0F0F0Fu;
      r[2].w[i] = (w[i] >> 4) & 0x0F0F0F0Fu;
      r[3].w[i] = (w[4 + i] >> 4) & 0x0F0F0F0Fu;
    }
    const float a0 = d * static_cast<float>(sc0), c0 = dmin * static_cast<float>(m0);
    const float a1 = d * static_cast<float>(sc1), c1 = dmin * static_cast<float>(m1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r[k].a = k < 2 ? a0 : a1;
      r[k].c = k < 2 ? c0 : c1;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct Q5K {
  static constexpr int BB = 176, EB = 256, UPB = 4;
  // As Q4_K, with the fifth bit of element l of chunk q at bit 2q (low) / 2q+1 (high) of qh[l].
  __device__ __forceinline__ static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables&) {
    const uint32_t hdr = ldw(s, off);
    const float d = h2f(hdr), dmin = h2f(hdr >> 16);
    const uint32_t s0 = ldw(s, off + 4), s1 = ldw(s, off + 8), s2 = ldw(s, off + 12);
    int sc0, m0, sc1, m1;
    k_scale_min(s0, s1, s2, 2 * q, sc0, m0);
    k_scale_min(s0, s1, s2, 2 * q + 1, sc1, m1);
    uint32_t w[8], h[8];
    ld16(s, off + 16, h);
    ld16(s, off + 32, h + 4);
    ld16(s, off + 48 + 32 * q, w);
    ld16(s, off + 64 + 32 * q, w + 4);
    const int b0 = 2 * q, b1 = 2 * q + 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r[0].w[i] = (w[i] & 0x0F0F0F0Fu) | (((h[i] >> b0) & 0x01010101u) << 4);
      r[1].w[i] = (w[4 + i] & 0x0F0F0F0Fu) | (((h[4 + i] >> b0) & 0x01010101u) << 4);
      r[2].w[i] = ((w[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> b1) & 0x01010101u) << 4);
      r[3].w[i] = ((w[4 + i] >> 4) & 0x0F0F0F0Fu) | (((h[4 + i] >> b1) & 0x01010101u) << 4);
    }
    const float a0 = d * static_cast<float>(sc0), c0 = dmin * static_cast<float>(m0);
    const float a1 = d * static_cast<float>(sc1), c1 = dmin * static_cast<float>(m1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r[k].a = k < 2 ? a0 : a1;
      r[k].c = k < 2 ? c0 : c1;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct Q6K {
  static constexpr int BB = 210, EB = 256, UPB = 4;
  // Unit q = (half h, group g): l = 16g..16g+15 of half h; runs k = 0..3 are
  // elements 128h + 32k + l with scale sc[8h + g + 2k]; codes from ql[64h + l],
  // ql[64h + 32 + l] (low / high nibbles) and two bits of qh[32h + l].
  __device__ __forceinline__ static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables&) {
    const int h = q >> 1, g = q & 1;
    uint32_t A[4], B[4], C[4];
    ld16(s, off + 64 * h + 16 * g, A);
    ld16(s, off + 64 * h + 32 + 16 * g, B);
    ld16(s, off + 128 + 32 * h + 16 * g, C);
    const uint32_t slo = ldw(s, off + 192 + 8 * h), shi = ldw(s, off + 196 + 8 * h);
    const float d = h2f(ldw(s, off + 208));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r[0].w[i] = (A[i] & 0x0F0F0F0Fu) | ((C[i] & 0x03030303u) << 4);
      r[1].w[i] = (B[i] & 0x0F0F0F0Fu) | (((C[i] >> 2) & 0x03030303u) << 4);
      r[2].w[i] = ((A[i] >> 4) & 0x0F0F0F0Fu) | (((C[i] >> 4) & 0x03030303u) << 4);
      r[3].w[i] = ((B[i] >> 4) & 0x0F0F0F0Fu) | (((C[i] >> 6) & 0x03030303u) << 4);
    }
    const int sc[4] = {static_cast<int8_t>(slo >> (8 * g)), static_cast<int8_t>(slo >> (8 * g + 16)), static_cast<int8_t>(shi >> (8 * g)),
                       static_cast<int8_t>(shi >> (8 * g + 16))};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      r[k].a = d * static_cast<float>(sc[k]);
      r[k].c = 32.0f * r[k].a;
      r[k].e = 128 * h + 32 * k + 16 * g;
    }
  }
};

struct Q80 {
  static constexpr int BB = 68, EB = 64, UPB = 1;  // a group is two 34-byte blocks
  __device__ __forceinline__ static void unit(const uint8_t* s, int off, int, Run* r, const LowbitTables&) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const float d = h2f(ldw(s, off + 34 * b));
      ld16(s, off + 34 * b + 2, r[2 * b].w);
      ld16(s, off + 34 * b + 18, r[2 * b + 1].w);
      r[2 * b].a = r[2 * b + 1].a = d;
      r[2 * b].c = r[2 * b + 1].c = 0.0f;
      r[2 * b].e = 32 * b;
      r[2 * b + 1].e = 32 * b + 16;
    }
  }
};

// The down products' input: v[i] = silu(gate[i]) * up[i] for 32 columns,
// gate at g (16-byte aligned), up at g + cols (the gate/up rows' layout).
__device__ __forceinline__ void swiglu32(const float* g, int cols, float* v) {
  const float4* g4 = reinterpret_cast<const float4*>(g);
  const float4* u4 = reinterpret_cast<const float4*>(g + cols);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 a = g4[i], u = u4[i];
    v[4 * i] = a.x / (1.0f + expf(-a.x)) * u.x;
    v[4 * i + 1] = a.y / (1.0f + expf(-a.y)) * u.y;
    v[4 * i + 2] = a.z / (1.0f + expf(-a.z)) * u.z;
    v[4 * i + 3] = a.w / (1.0f + expf(-a.w)) * u.w;
  }
}

// The decode kernels' activations: 32 values as two int8 planes, x ~ d (q1 +
// q2 / 254) with d = amax / 127 (about 16 bits); s1/s2 hold each plane's sum
// per half of 16 (the runs' min terms). Returns d.
__device__ __forceinline__ uint32_t pack4(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) & 0xFFu) | ((static_cast<uint32_t>(b) & 0xFFu) << 8) | ((static_cast<uint32_t>(c) & 0xFFu) << 16) |
         (static_cast<uint32_t>(d) << 24);
}
__device__ __forceinline__ float quantize32_planes(const float* v, uint32_t* w1, uint32_t* w2, int* s1, int* s2) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  s1[0] = s1[1] = s2[0] = s2[1] = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int q1[4], q2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      q1[j] = __float2int_rn(v[4 * i + j] * inv);
      q2[j] = max(-127, min(127, __float2int_rn((v[4 * i + j] - static_cast<float>(q1[j]) * d) * inv * 254.0f)));
      s1[i / 4] += q1[j];
      s2[i / 4] += q2[j];
    }
    w1[i] = pack4(q1[0], q1[1], q1[2], q1[3]);
    w2[i] = pack4(q2[0], q2[1], q2[2], q2[3]);
  }
  return d;
}

}  // namespace hmoe::gpu::detail::gguf
