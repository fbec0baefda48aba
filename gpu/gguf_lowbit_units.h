// Decoders of the low-bit GGUF block types (Q2_K, Q3_K, IQ1_S, IQ1_M,
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS, IQ4_NL, MXFP4;
// io/tensor/quant_blocks_lowbit.h) into the "units" the GGUF GPU kernels
// compute on (gpu/gguf_units.cuh: 64 weights as 4 runs of 16 int8 codes q,
// a scale a and an offset c, w = a * q - c). Private to gpu/ and its tests.
//
// Why a header compiled for the host too: every decoder here is the code the
// kernels run (gpu/gguf_gemv.cu, gpu/gguf_moe_gemm.cu) and also builds in a
// CPU-only build, where tests/gpu/test_gpu_gguf_lowbit.cpp checks it against
// cpu::lowbit_block_codes on random blocks without a GPU. The device reads
// use device intrinsics (funnel shifts, __byte_perm, __ldg, __half2float)
// only through small functions with host twins of the same semantics.
//
// The runs equal the CPU decomposition exactly: codes are the CPU's codes
// (IQ1's deltas folded in as 8 * grid +- 1), a its per-16 scale, computed by
// the same fp32 operations in the same order, and c = -offset (Q2_K's
// dmin * m; -0.0f elsewhere, so that a * q - c == a * q + 0.0f bit for bit,
// signed zeros included). run_value() is the dequantized weight, the same
// fp32 value as cpu::lowbit_dequant_block (no fused multiply-add).
//
// Reads: unit(s, off, q, r, t) reads the group at byte offset off of s (any
// offset; s 4-byte aligned on the device) through aligned words, up to 8
// bytes past the group (read and ignored, as gguf_units.cuh's). t holds the
// codebooks (host arrays, or their device copy from device_lowbit_tables()).
#pragma once
#include <cstdint>
#include <cstring>

#include "io/dtype.h"
#include "io/tensor/gguf_iq_grids.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define HMOE_GG_HD __host__ __device__ __forceinline__
#define HMOE_GG_UNROLL _Pragma("unroll")
#else
#define HMOE_GG_HD inline
#define HMOE_GG_UNROLL
#endif

namespace hmoe::gpu::detail::gguf {

struct Run {
  uint32_t w[4];  // 16 int8 codes
  float a, c;     // w = a * q - c
  int e;          // first element of the run within the group
};

// The IQ codebooks (io/tensor/gguf_iq_grids.h), wherever the decoder runs.
struct LowbitTables {
  const uint64_t* iq2xxs = nullptr;  // 256
  const uint64_t* iq2xs = nullptr;   // 512
  const uint64_t* iq2s = nullptr;    // 1024
  const uint32_t* iq3xxs = nullptr;  // 256
  const uint32_t* iq3s = nullptr;    // 512
  const uint64_t* iq1s = nullptr;    // 2048 (value + 1 per byte)
};
// The host arrays (io/tensor/gguf_iq_grids.h).
inline LowbitTables host_lowbit_tables() {
  LowbitTables t;
  t.iq2xxs = cpu::detail::kIq2xxsGrid;
  t.iq2xs = cpu::detail::kIq2xsGrid;
  t.iq2s = cpu::detail::kIq2sGrid;
  t.iq3xxs = cpu::detail::kIq3xxsGrid;
  t.iq3s = cpu::detail::kIq3sGrid;
  t.iq1s = cpu::detail::kIq1sGrid;
  return t;
}
// The tables on the current device: uploaded on the first call per device
// (synchronous; GgufDeviceMat's constructor calls it, so it is done before
// any graph is captured), then a cached copy. Thread-safe. The copy lives as
// long as the process (33 KB per device). Error(unsupported) without CUDA.
LowbitTables device_lowbit_tables();

// ---- byte access -----------------------------------------------------------------
// The device intrinsics the decoders use, with host twins of the same
// semantics, so that the host build runs the device's algorithm.

// (hi:lo) >> sh, low word (sh < 32).
HMOE_GG_HD uint32_t funnel_r(uint32_t lo, uint32_t hi, int sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, sh);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31));
#endif
}
// Byte j of the result: byte (sel >> 4j) & 7 of y:x (selectors 0..7 only).
HMOE_GG_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, sel);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int j = 0; j < 4; ++j) r |= static_cast<uint32_t>((v >> (8 * ((sel >> (4 * j)) & 7u))) & 0xFFu) << (8 * j);
  return r;
#endif
}
// The word at p (4-byte aligned on the device).
HMOE_GG_HD uint32_t word_at(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// The 4 bytes at s + off (little-endian), from the two aligned words around them.
HMOE_GG_HD uint32_t lw(const uint8_t* s, int off) {
  const uint8_t* a = s + (off & ~3);
  return funnel_r(word_at(a), word_at(a + 4), (off & 3) * 8);
}
// 16 bytes at s + off as 4 words.
HMOE_GG_HD void l16(const uint8_t* s, int off, uint32_t* o) {
  const uint8_t* p = s + (off & ~3);
  const int sh = (off & 3) * 8;
  uint32_t a[5];
HMOE_GG_UNROLL
  for (int i = 0; i < 5; ++i) a[i] = word_at(p + 4 * i);
HMOE_GG_UNROLL
  for (int i = 0; i < 4; ++i) o[i] = funnel_r(a[i], a[i + 1], sh);
}
template <class T>
HMOE_GG_HD T ldt(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
// The f16 in the low 16 bits of bits, as fp32 (exact).
HMOE_GG_HD float half_f(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
#else
  return f16_to_f32(static_cast<uint16_t>(bits & 0xFFFFu));
#endif
}
HMOE_GG_HD float bits_f(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}
HMOE_GG_HD int popc(uint32_t v) {
#ifdef __CUDA_ARCH__
  return __popc(v);
#else
  return __builtin_popcount(v);
#endif
}

// ---- packed bytes (4 per word) ------------------------------------------------------

// Bytewise a + b mod 256 (no carry between bytes).
HMOE_GG_HD uint32_t vadd4(uint32_t a, uint32_t b) { return ((a & 0x7F7F7F7Fu) + (b & 0x7F7F7F7Fu)) ^ ((a ^ b) & 0x80808080u); }
// 0xFF in byte j where bit j of bits (j < 4) is set.
HMOE_GG_HD uint32_t bit_bytes(uint32_t bits) { return (((bits & 0xFu) * 0x00204081u) & 0x01010101u) * 0xFFu; }
// Bytes of v negated where bit j of signs is set.
HMOE_GG_HD uint32_t signed4(uint32_t v, uint32_t signs) {
  const uint32_t m = bit_bytes(signs);
  return vadd4(v ^ m, m & 0x01010101u);
}
// IQ2_XXS/IQ2_XS/IQ3_XXS: the 8 signs of a 7-bit index (bit 7: odd parity).
HMOE_GG_HD uint32_t sign_byte(uint32_t i) {
  const uint32_t v = i & 127u;
  return v | ((static_cast<uint32_t>(popc(v)) & 1u) << 7);
}
// Bytes of n (each 0..15) looked up in the 16-byte table t0..t3: the low 3
// bits of each select a byte of t1:t0 and of t3:t2, bit 3 which of the two.
HMOE_GG_HD uint32_t lut16(uint32_t n, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
  const uint32_t lo3 = n & 0x07070707u;
  const uint32_t x = lo3 | (lo3 >> 4);  // byte 0: sel0 | sel1 << 4; byte 2: sel2 | sel3 << 4
  const uint32_t sel = byte_perm(x, 0, 0x4420);
  const uint32_t lo = byte_perm(t0, t1, sel), hi = byte_perm(t2, t3, sel);
  const uint32_t m = ((n >> 3) & 0x01010101u) * 0xFFu;
  return (lo & ~m) | (hi & m);
}

// The 16-entry code tables packed 4 per word (IQ4's non-linear levels and
// MXFP4's doubled e2m1 values; the values of io/tensor/gguf_iq_grids.h,
// checked against it by the tests).
constexpr uint32_t pack_bytes(int a, int b, int c, int d) {
  return (static_cast<uint32_t>(a) & 0xFFu) | ((static_cast<uint32_t>(b) & 0xFFu) << 8) | ((static_cast<uint32_t>(c) & 0xFFu) << 16) |
         ((static_cast<uint32_t>(d) & 0xFFu) << 24);
}
constexpr uint32_t kIq4W0 = pack_bytes(-127, -104, -83, -65), kIq4W1 = pack_bytes(-49, -35, -22, -10), kIq4W2 = pack_bytes(1, 13, 25, 38),
                   kIq4W3 = pack_bytes(53, 69, 89, 113);
constexpr uint32_t kFp4W0 = pack_bytes(0, 1, 2, 3), kFp4W1 = pack_bytes(4, 6, 8, 12), kFp4W2 = pack_bytes(0, -1, -2, -3), kFp4W3 = pack_bytes(-4, -6, -8, -12);

// The dequantized weight of code q in run r: a * q - c in two roundings.
HMOE_GG_HD float run_value(float a, int q, float c) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(__fmul_rn(a, static_cast<float>(q)), c);
#else
  const float v = a * static_cast<float>(q);
  return v - c;
#endif
}

// ---- formats: group bytes BB, group elements EB, units per group UPB ------------
// Every 256-weight type: unit q is elements 64q..64q+63, run k of it is the
// block's run of 16 R = 4q + k (elements 16R.., scale R).

struct Q2K {
  static constexpr int BB = 84, EB = 256, UPB = 4;
  // scales[16] (low nibble scale, high nibble min), qs[64], d, dmin. Element 128h + 32j + l: (qs[32h + l] >> 2j) & 3.
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables&) {
    const uint32_t dd = lw(s, off + 80);
    const float d = half_f(dd), dmin = half_f(dd >> 16);
    const uint32_t sc = lw(s, off + 4 * q);
    const int h = q >> 1;
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * (q & 1) + (k >> 1);
      uint32_t w[4];
      l16(s, off + 16 + 32 * h + 16 * (k & 1), w);
HMOE_GG_UNROLL
      for (int i = 0; i < 4; ++i) r[k].w[i] = (w[i] >> (2 * j)) & 0x03030303u;
      const uint32_t b = (sc >> (8 * k)) & 0xFFu;
      r[k].a = d * static_cast<float>(b & 0xFu);
      r[k].c = dmin * static_cast<float>(b >> 4);
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct Q3K {
  static constexpr int BB = 110, EB = 256, UPB = 4;
  // hmask[32], qs[64], scales[12] (16 x 6 bits, offset 32), d. Code: the Q2_K bits, minus 4 unless
  // bit k/32 of hmask[k % 32] is set (element k).
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables&) {
    const float d = half_f(lw(s, off + 108));
    const uint32_t s0 = lw(s, off + 96), s1 = lw(s, off + 100), s2 = lw(s, off + 104);
    const int h = q >> 1;
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int j = 2 * (q & 1) + (k >> 1), R = 4 * q + k, hb = 2 * q + (k >> 1);
      uint32_t w[4], hm[4];
      l16(s, off + 32 + 32 * h + 16 * (k & 1), w);
      l16(s, off + 16 * (k & 1), hm);
HMOE_GG_UNROLL
      for (int i = 0; i < 4; ++i) r[k].w[i] = ((w[i] >> (2 * j)) & 0x03030303u) | ((~(hm[i] >> hb) & 0x01010101u) * 0xFCu);
      const uint32_t lo_byte = R < 8 ? ((R < 4 ? s0 : s1) >> (8 * (R & 3))) : (((R - 8) < 4 ? s0 : s1) >> (8 * ((R - 8) & 3) + 4));
      const int lo = static_cast<int>(lo_byte & 0xFu);
      const int hi = static_cast<int>((s2 >> (8 * (R & 3) + 2 * (R >> 2))) & 3u);
      r[k].a = d * static_cast<float>((lo | (hi << 4)) - 32);
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

// Two runs of 8 signed grid values (8 bytes each) as 4 code words.
HMOE_GG_HD void grid8(uint64_t g, uint32_t signs, uint32_t* w) {
  w[0] = signed4(static_cast<uint32_t>(g), signs);
  w[1] = signed4(static_cast<uint32_t>(g >> 32), signs >> 4);
}

struct IQ2XXS {
  static constexpr int BB = 66, EB = 256, UPB = 4;
  // d, then per 32 weights 4 grid index bytes and a u32 of 4 x 7-bit sign indices and a 4-bit scale.
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const float d = half_f(lw(s, off));
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int sb = 2 * q + (k >> 1), base = off + 2 + 8 * sb;
      const uint32_t idx = lw(s, base), aux = lw(s, base + 4);
HMOE_GG_UNROLL
      for (int gg = 0; gg < 2; ++gg) {
        const int g = 2 * (k & 1) + gg;
        grid8(ldt(t.iq2xxs + ((idx >> (8 * g)) & 0xFFu)), sign_byte(aux >> (7 * g)), r[k].w + 2 * gg);
      }
      r[k].a = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct IQ2XS {
  static constexpr int BB = 74, EB = 256, UPB = 4;
  // d, qs u16[32] (9-bit grid index, 7-bit sign index), scales[8] (4 bits per 16 weights).
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const float d = half_f(lw(s, off));
    const uint32_t sc = lw(s, off + 66 + 2 * q);
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int R = 4 * q + k;
      const uint32_t qq = lw(s, off + 2 + 4 * R);
HMOE_GG_UNROLL
      for (int gg = 0; gg < 2; ++gg) {
        const uint32_t v = (qq >> (16 * gg)) & 0xFFFFu;
        grid8(ldt(t.iq2xs + (v & 511u)), sign_byte(v >> 9), r[k].w + 2 * gg);
      }
      r[k].a = d * (0.5f + static_cast<float>((sc >> (8 * (k >> 1) + 4 * (k & 1))) & 0xFu)) * 0.25f;
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct IQ2S {
  static constexpr int BB = 82, EB = 256, UPB = 4;
  // d, qs[32] (grid index low bits), signs[32], qh[8] (2 high bits each), scales[8].
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const float d = half_f(lw(s, off));
    const uint32_t sc = lw(s, off + 74 + 2 * q), qh = lw(s, off + 66 + 2 * q);
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int R = 4 * q + k;
      const uint32_t qs = lw(s, off + 2 + 2 * R), sg = lw(s, off + 34 + 2 * R);
      const uint32_t hb = qh >> (8 * (k >> 1));
HMOE_GG_UNROLL
      for (int gg = 0; gg < 2; ++gg) {
        const uint32_t idx = ((qs >> (8 * gg)) & 0xFFu) | (((hb >> (2 * (2 * (k & 1) + gg))) & 3u) << 8);
        grid8(ldt(t.iq2s + idx), (sg >> (8 * gg)) & 0xFFu, r[k].w + 2 * gg);
      }
      r[k].a = d * (0.5f + static_cast<float>((sc >> (8 * (k >> 1) + 4 * (k & 1))) & 0xFu)) * 0.25f;
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct IQ3XXS {
  static constexpr int BB = 98, EB = 256, UPB = 4;
  // d, qs[64] (grid indices, 4 weights each), per 32 weights a u32 of 4 sign indices and a 4-bit scale.
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const float d = half_f(lw(s, off));
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int sb = 2 * q + (k >> 1);
      const uint32_t ss = lw(s, off + 66 + 4 * sb), qs = lw(s, off + 2 + 8 * sb + 4 * (k & 1));
HMOE_GG_UNROLL
      for (int gg = 0; gg < 2; ++gg) {
        const uint32_t sg = sign_byte(ss >> (7 * (2 * (k & 1) + gg)));
        r[k].w[2 * gg] = signed4(ldt(t.iq3xxs + ((qs >> (16 * gg)) & 0xFFu)), sg);
        r[k].w[2 * gg + 1] = signed4(ldt(t.iq3xxs + ((qs >> (16 * gg + 8)) & 0xFFu)), sg >> 4);
      }
      r[k].a = d * (0.5f + static_cast<float>(ss >> 28)) * 0.5f;
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct IQ3S {
  static constexpr int BB = 110, EB = 256, UPB = 4;
  // d, qs[64], qh[8] (9th index bit), signs[32], scales[4] (4 bits per 32 weights).
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const float d = half_f(lw(s, off));
    const uint32_t sc = lw(s, off + 106), qh = lw(s, off + 66 + 2 * q);
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int R = 4 * q + k;
      const uint32_t qs = lw(s, off + 2 + 4 * R), sg = lw(s, off + 74 + 2 * R);
      const uint32_t hb = (qh >> (8 * (k >> 1) + 4 * (k & 1))) & 0xFu;
HMOE_GG_UNROLL
      for (int m = 0; m < 4; ++m) {
        const uint32_t idx = ((qs >> (8 * m)) & 0xFFu) | (((hb >> m) & 1u) << 8);
        r[k].w[m] = signed4(ldt(t.iq3s + idx), (sg >> (4 * m)) & 0xFu);
      }
      const int sc4 = static_cast<int>((sc >> (8 * (R / 4) + 4 * ((R / 2) % 2))) & 0xFu);
      r[k].a = d * static_cast<float>(1 + 2 * sc4);
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

// IQ1: 8 codes 8 * (grid - 1) + delta from a grid entry holding grid + 1 per byte.
HMOE_GG_HD void iq1_8(uint64_t g, int delta, uint32_t* w) {
  const uint32_t add = static_cast<uint32_t>(static_cast<uint8_t>(delta - 8)) * 0x01010101u;
  w[0] = vadd4(static_cast<uint32_t>(g) * 8u, add);
  w[1] = vadd4(static_cast<uint32_t>(g >> 32) * 8u, add);
}

struct IQ1S {
  static constexpr int BB = 50, EB = 256, UPB = 4;
  // d, qs[32], qh u16[8]: per 32 weights 4 x 3 high index bits, a 3-bit scale, the delta's sign.
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const float d = half_f(lw(s, off));
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int sb = 2 * q + (k >> 1);
      const uint32_t qh = lw(s, off + 34 + 2 * sb) & 0xFFFFu, qs = lw(s, off + 2 + 4 * sb);
      const int delta = (qh & 0x8000u) ? -1 : 1;
HMOE_GG_UNROLL
      for (int gg = 0; gg < 2; ++gg) {
        const int g = 2 * (k & 1) + gg;
        const uint32_t idx = ((qs >> (8 * g)) & 0xFFu) | (((qh >> (3 * g)) & 7u) << 8);
        iq1_8(ldt(t.iq1s + idx), delta, r[k].w + 2 * gg);
      }
      const float dl = d * static_cast<float>(2 * static_cast<int>((qh >> 12) & 7u) + 1);
      r[k].a = dl * 0.125f;
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct IQ1M {
  static constexpr int BB = 56, EB = 256, UPB = 4;
  // qs[32], qh[16] (per 8 weights 3 high index bits and the delta's sign), scales u16[4]
  // (3 bits per 16 weights; the f16 d in the 4 top nibbles).
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables& t) {
    const uint32_t sa = lw(s, off + 48), sb = lw(s, off + 52);
    const uint32_t sc[4] = {sa & 0xFFFFu, sa >> 16, sb & 0xFFFFu, sb >> 16};
    const uint32_t dbits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0u) | ((sc[2] >> 4) & 0x0F00u) | (sc[3] & 0xF000u);
    const float d = half_f(dbits);
    const uint32_t qs = lw(s, off + 8 * q), qs2 = lw(s, off + 8 * q + 4), qh = lw(s, off + 32 + 4 * q);
HMOE_GG_UNROLL
    for (int k = 0; k < 4; ++k) {
      const int R = 4 * q + k;
      const uint32_t qw = k < 2 ? qs : qs2;
HMOE_GG_UNROLL
      for (int gg = 0; gg < 2; ++gg) {
        const uint32_t h = (qh >> (8 * k + 4 * gg)) & 0xFu;
        const uint32_t idx = ((qw >> (8 * (2 * (k & 1) + gg))) & 0xFFu) | ((h & 7u) << 8);
        iq1_8(ldt(t.iq1s + idx), (h & 8u) ? -1 : 1, r[k].w + 2 * gg);
      }
      const float dl = d * static_cast<float>(2 * static_cast<int>((sc[R / 4] >> (3 * (R % 4))) & 7u) + 1);
      r[k].a = dl * 0.125f;
      r[k].c = -0.0f;
      r[k].e = 64 * q + 16 * k;
    }
  }
};

struct IQ4XS {
  static constexpr int BB = 136, EB = 256, UPB = 4;
  // d, scales_h u16 (2 bits per 32), scales_l[4] (4 bits per 32), qs[128] (32 weights in 16 bytes, low nibbles first).
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int q, Run* r, const LowbitTables&) {
    const uint32_t h0 = lw(s, off);
    const float d = half_f(h0);
    const uint32_t sh = h0 >> 16, sl = lw(s, off + 4);
HMOE_GG_UNROLL
    for (int jj = 0; jj < 2; ++jj) {
      const int j = 2 * q + jj;
      uint32_t w[4];
      l16(s, off + 8 + 16 * j, w);
      const int ls = static_cast<int>(((sl >> (4 * j)) & 0xFu) | (((sh >> (2 * j)) & 3u) << 4));
      const float a = d * static_cast<float>(ls - 32);
HMOE_GG_UNROLL
      for (int i = 0; i < 4; ++i) {
        r[2 * jj].w[i] = lut16(w[i] & 0x0F0F0F0Fu, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
        r[2 * jj + 1].w[i] = lut16((w[i] >> 4) & 0x0F0F0F0Fu, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
      }
      r[2 * jj].a = r[2 * jj + 1].a = a;
      r[2 * jj].c = r[2 * jj + 1].c = -0.0f;
      r[2 * jj].e = 64 * q + 32 * jj;
      r[2 * jj + 1].e = 64 * q + 32 * jj + 16;
    }
  }
};

// IQ4_NL (18 bytes: d, qs[16]) and MXFP4 (17 bytes: E8M0 exponent, qs[16]): blocks of 32; a group is
// two blocks (64 elements, one unit).
template <bool kFp4>
struct Nib32 {
  static constexpr int BLK = kFp4 ? 17 : 18, BB = 2 * BLK, EB = 64, UPB = 1;
  HMOE_GG_HD static void unit(const uint8_t* s, int off, int, Run* r, const LowbitTables&) {
HMOE_GG_UNROLL
    for (int b = 0; b < 2; ++b) {
      const int at = off + BLK * b;
      float a;
      if (kFp4) {  // 2^(e - 128) with the e2m1 values doubled; e < 2: the subnormals
        const uint32_t e = lw(s, at) & 0xFFu;
        a = bits_f(e < 2 ? (0x00200000u << e) : ((e - 1u) << 23));
      } else {
        a = half_f(lw(s, at));
      }
      uint32_t w[4];
      l16(s, at + (kFp4 ? 1 : 2), w);
HMOE_GG_UNROLL
      for (int i = 0; i < 4; ++i) {
        if (kFp4) {
          r[2 * b].w[i] = lut16(w[i] & 0x0F0F0F0Fu, kFp4W0, kFp4W1, kFp4W2, kFp4W3);
          r[2 * b + 1].w[i] = lut16((w[i] >> 4) & 0x0F0F0F0Fu, kFp4W0, kFp4W1, kFp4W2, kFp4W3);
        } else {
          r[2 * b].w[i] = lut16(w[i] & 0x0F0F0F0Fu, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
          r[2 * b + 1].w[i] = lut16((w[i] >> 4) & 0x0F0F0F0Fu, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
        }
      }
      r[2 * b].a = r[2 * b + 1].a = a;
      r[2 * b].c = r[2 * b + 1].c = -0.0f;
      r[2 * b].e = 32 * b;
      r[2 * b + 1].e = 32 * b + 16;
    }
  }
};
using IQ4NL = Nib32<false>;
using MXFP4 = Nib32<true>;

}  // namespace hmoe::gpu::detail::gguf
