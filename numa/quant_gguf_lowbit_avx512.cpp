// AVX-512 kernels of the low-bit ggml types (numa/quant_gguf_lowbit.h).
//
// Decode (v1): a group of 256 weights (one K/IQ block, or 8 blocks of the
// 32-types) becomes 256 code magnitudes (u8), 256 sign bits (4 x 64-bit
// masks) and 16 scales and offsets, with vector code per type: grid rows
// fetched by gathers (IQ1/IQ2: 8-byte rows, IQ3: 4-byte rows) from indices
// assembled in registers, signs straight from the block's sign bytes or
// from the 7-bit sign indices (bit 7 = parity, pdep), 2/4-bit codes by
// variable shifts and byte shuffles (the IQ4 / MXFP4 tables).
// Integer product: the signs go onto the int8 activations (masked
// subtract), vpdpbusd multiplies magnitudes and activations into 16 int32
// lanes per 64 weights (4 lanes per run of 16), the lanes are scaled by
// their run's scale and summed in fp32; the activation's per-block scale
// and the Q2_K mins (offset x sum of the run's activations) come last.
// Exact path: the same decode, codes to fp32 (scale * code, then + offset:
// the scalar reference's rounding) and FMAs with fp32 activations.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "configs/error.h"
#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_L512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,bmi2,f16c,fma")))

namespace hmoe::cpu::detail {

namespace {

struct Group {
  alignas(64) uint8_t mag[256];
  uint64_t neg[4];
  alignas(64) float scale[16];
  alignas(64) float offset[16];
  bool has_offset;
};

using namespace lowbit_bytes;

// 4 x 7-bit sign indices of a u32 -> 32 sign bits (bit 7 of each byte: parity).
HMOE_L512 inline uint32_t signs4x7(uint32_t aux) {
  uint32_t x = _pdep_u32(aux, 0x7F7F7F7Fu);
  uint32_t p = x ^ (x >> 4);
  p ^= p >> 2;
  p ^= p >> 1;
  return x | ((p & 0x01010101u) << 7);
}

HMOE_L512 inline void store_signed(Group& g, int c, __m512i code) {
  g.neg[c] = _mm512_movepi8_mask(code);
  _mm512_store_si512(g.mag + 64 * c, _mm512_abs_epi8(code));
}

HMOE_L512 void dec_q2_k(const uint8_t* b, Group& g) {
  const float d = half(b + 80), dmin = half(b + 82);
  for (int i = 0; i < 16; ++i) {
    g.scale[i] = d * static_cast<float>(b[i] & 0xF);
    g.offset[i] = -(dmin * static_cast<float>(b[i] >> 4));
  }
  g.has_offset = true;
  const __m512i three = _mm512_set1_epi8(3);
  for (int c = 0; c < 4; ++c) {
    // chunk c: weights 64c.. = half h = c / 2, shifts 2j for j = 2(c%2), 2(c%2)+1
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * (c / 2))));
    const int s0 = 4 * (c % 2);
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s0)), _mm256_set1_epi16(static_cast<short>(s0 + 2)), 1);
    _mm512_store_si512(g.mag + 64 * c, _mm512_and_si512(_mm512_srlv_epi16(q, sh), three));
    g.neg[c] = 0;
  }
}

HMOE_L512 void dec_q3_k(const uint8_t* b, Group& g) {
  const uint8_t* sc = b + 96;
  const float d = half(b + 108);
  for (int j = 0; j < 16; ++j) {
    const int lo = (j < 8 ? sc[j] : sc[j - 8] >> 4) & 0xF;
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    g.scale[j] = d * static_cast<float>((lo | (hi << 4)) - 32);
  }
  g.has_offset = false;
  const __m512i three = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), four = _mm512_set1_epi8(4);
  const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  for (int c = 0; c < 4; ++c) {
    const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 + 32 * (c / 2))));
    const int s0 = 4 * (c % 2);
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s0)), _mm256_set1_epi16(static_cast<short>(s0 + 2)), 1);
    const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(q, sh), three);
    const __m512i hsh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(2 * c)), _mm256_set1_epi16(static_cast<short>(2 * c + 1)), 1);
    const __mmask64 h = _mm512_test_epi8_mask(_mm512_srlv_epi16(hm, hsh), one);
    // code = lo - 4 where the high bit is clear: magnitude 4 - lo, negative
    _mm512_store_si512(g.mag + 64 * c, _mm512_mask_blend_epi8(h, _mm512_sub_epi8(four, lo), lo));
    g.neg[c] = ~h;
  }
}

// Eight 8-byte grid rows at idx (64-bit lanes) -> 64 bytes. (v2 with
// scalar loads instead of the gathers measured 2x slower here.)
HMOE_L512 inline __m512i gather8(const uint64_t* grid, __m512i idx) {
  return _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(grid), 8);
}

HMOE_L512 void dec_iq2_xxs(const uint8_t* b, Group& g) {
  const float d = half(b);
  g.has_offset = false;
  const __m128i pick = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* p = b + 2 + 16 * c;
    const uint32_t a0 = u32(p + 4), a1 = u32(p + 12);
    const float d0 = d * (0.5f + static_cast<float>(a0 >> 28)) * 0.25f, d1 = d * (0.5f + static_cast<float>(a1 >> 28)) * 0.25f;
    g.scale[4 * c] = g.scale[4 * c + 1] = d0;
    g.scale[4 * c + 2] = g.scale[4 * c + 3] = d1;
    const __m512i idx = _mm512_cvtepu8_epi64(_mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), pick));
    _mm512_store_si512(g.mag + 64 * c, gather8(kIq2xxsGrid, idx));
    g.neg[c] = signs4x7(a0) | static_cast<uint64_t>(signs4x7(a1)) << 32;
  }
}

constexpr auto kSignTable = [] {
  struct T {
    uint8_t v[128];
  } t{};
  for (uint32_t i = 0; i < 128; ++i) t.v[i] = iq_sign_byte(i);
  return t;
}();

HMOE_L512 void dec_iq2_xs(const uint8_t* b, Group& g) {
  const float d = half(b);
  for (int j = 0; j < 16; ++j) g.scale[j] = d * (0.5f + static_cast<float>((b[66 + j / 2] >> (4 * (j % 2))) & 0xF)) * 0.25f;
  g.has_offset = false;
  const __m512i m9 = _mm512_set1_epi64(511);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* p = b + 2 + 16 * c;
    const __m512i idx = _mm512_and_si512(_mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), m9);
    _mm512_store_si512(g.mag + 64 * c, gather8(kIq2xsGrid, idx));
    uint64_t s = 0;
    for (int i = 0; i < 8; ++i) s |= static_cast<uint64_t>(kSignTable.v[u16(p + 2 * i) >> 9]) << (8 * i);
    g.neg[c] = s;
  }
}

HMOE_L512 void dec_iq2_s(const uint8_t* b, Group& g) {
  const float d = half(b);
  for (int j = 0; j < 16; ++j) g.scale[j] = d * (0.5f + static_cast<float>((b[74 + j / 2] >> (4 * (j % 2))) & 0xF)) * 0.25f;
  g.has_offset = false;
  const __m512i sh = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), m3 = _mm512_set1_epi64(3);
  for (int c = 0; c < 4; ++c) {
    const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * c)));
    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(u16(b + 66 + 2 * c)), sh), m3);
    _mm512_store_si512(g.mag + 64 * c, gather8(kIq2sGrid, _mm512_or_si512(lo, _mm512_slli_epi64(hi, 8))));
    g.neg[c] = u64(b + 34 + 8 * c);
  }
}

HMOE_L512 void dec_iq3_xxs(const uint8_t* b, Group& g) {
  const float d = half(b);
  g.has_offset = false;
  for (int c = 0; c < 4; ++c) {
    const uint32_t s0 = u32(b + 66 + 8 * c), s1 = u32(b + 70 + 8 * c);
    const float d0 = d * (0.5f + static_cast<float>(s0 >> 28)) * 0.5f, d1 = d * (0.5f + static_cast<float>(s1 >> 28)) * 0.5f;
    g.scale[4 * c] = g.scale[4 * c + 1] = d0;
    g.scale[4 * c + 2] = g.scale[4 * c + 3] = d1;
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * c)));
    _mm512_store_si512(g.mag + 64 * c, _mm512_i32gather_epi32(idx, reinterpret_cast<const int*>(kIq3xxsGrid), 4));
    g.neg[c] = signs4x7(s0) | static_cast<uint64_t>(signs4x7(s1)) << 32;
  }
}

HMOE_L512 void dec_iq3_s(const uint8_t* b, Group& g) {
  const float d = half(b);
  for (int j = 0; j < 16; ++j) g.scale[j] = d * static_cast<float>(1 + 2 * ((b[106 + j / 4] >> (4 * ((j / 2) % 2))) & 0xF));
  g.has_offset = false;
  const __m512i bit8 = _mm512_set1_epi32(256);
  for (int c = 0; c < 4; ++c) {
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * c)));
    idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(u16(b + 66 + 2 * c)), idx, bit8);
    _mm512_store_si512(g.mag + 64 * c, _mm512_i32gather_epi32(idx, reinterpret_cast<const int*>(kIq3sGrid), 4));
    g.neg[c] = u64(b + 74 + 8 * c);
  }
}

// IQ1: grid bytes t = value + 1 in {0, 1, 2}; code = 8 t - 8 + delta (+-1 per run of 8, lane of 64 bits).
HMOE_L512 inline __m512i iq1_code(__m512i t, __mmask8 delta_neg) {
  const __m512i add = _mm512_mask_blend_epi64(delta_neg, _mm512_set1_epi8(-7), _mm512_set1_epi8(-9));
  return _mm512_add_epi8(_mm512_slli_epi16(t, 3), add);
}

HMOE_L512 void dec_iq1_s(const uint8_t* b, Group& g) {
  const float d = half(b);
  g.has_offset = false;
  const __m512i sh = _mm512_setr_epi64(0, 3, 6, 9, 0, 3, 6, 9), m7 = _mm512_set1_epi64(7);
  for (int c = 0; c < 4; ++c) {
    const uint16_t q0 = u16(b + 34 + 4 * c), q1 = u16(b + 36 + 4 * c);
    const float d0 = d * static_cast<float>(2 * ((q0 >> 12) & 7) + 1), d1 = d * static_cast<float>(2 * ((q1 >> 12) & 7) + 1);
    g.scale[4 * c] = g.scale[4 * c + 1] = d0 * 0.125f;
    g.scale[4 * c + 2] = g.scale[4 * c + 3] = d1 * 0.125f;
    const __m512i qh = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi64(q0), _mm512_set1_epi64(q1));
    const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * c)));
    const __m512i idx = _mm512_or_si512(lo, _mm512_slli_epi64(_mm512_and_si512(_mm512_srlv_epi64(qh, sh), m7), 8));
    const __mmask8 dn = static_cast<__mmask8>(((q0 & 0x8000) ? 0x0F : 0) | ((q1 & 0x8000) ? 0xF0 : 0));
    store_signed(g, c, iq1_code(gather8(kIq1sGrid, idx), dn));
  }
}

HMOE_L512 void dec_iq1_m(const uint8_t* b, Group& g) {
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = u16(b + 48 + 2 * i);
  const float d = _cvtsh_ss(static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)));
  for (int j = 0; j < 16; ++j) g.scale[j] = d * static_cast<float>(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1) * 0.125f;
  g.has_offset = false;
  const __m512i sh = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28), m15 = _mm512_set1_epi64(15), m7 = _mm512_set1_epi64(7);
  for (int c = 0; c < 4; ++c) {
    const __m512i h = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(u32(b + 32 + 4 * c)), sh), m15);
    const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * c)));
    const __m512i idx = _mm512_or_si512(lo, _mm512_slli_epi64(_mm512_and_si512(h, m7), 8));
    store_signed(g, c, iq1_code(gather8(kIq1sGrid, idx), _mm512_test_epi64_mask(h, _mm512_set1_epi64(8))));
  }
}

// 32 weights of 4-bit codes (low nibbles then high) at qs -> 32 nibbles.
HMOE_L512 inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m4 = _mm_set1_epi8(0x0F);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(q, m4)), _mm_and_si128(_mm_srli_epi16(q, 4), m4), 1);
}

// IQ4: |level| by table, negative for codes < 8. MXFP4: |e2m1 doubled| by table, negative for bit 3.
HMOE_L512 inline void put_nibbles(Group& g, int c, __m512i nib, bool mxfp4) {
  const __m512i mag_iq4 = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
  const __m512i mag_fp4 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12));
  _mm512_store_si512(g.mag + 64 * c, _mm512_shuffle_epi8(mxfp4 ? mag_fp4 : mag_iq4, nib));
  g.neg[c] = mxfp4 ? _mm512_test_epi8_mask(nib, _mm512_set1_epi8(8)) : _mm512_cmplt_epu8_mask(nib, _mm512_set1_epi8(8));
}

// 8 consecutive 32-blocks of `bytes` each (IQ4_NL: 18, MXFP4: 17).
HMOE_L512 void dec_32blocks(const uint8_t* b, Group& g, bool mxfp4) {
  const int bytes = mxfp4 ? 17 : 18;
  g.has_offset = false;
  for (int c = 0; c < 4; ++c) {
    const uint8_t* b0 = b + (2 * c) * bytes;
    const uint8_t* b1 = b0 + bytes;
    const float s0 = mxfp4 ? e8m0_half(b0[0]) : half(b0), s1 = mxfp4 ? e8m0_half(b1[0]) : half(b1);
    g.scale[4 * c] = g.scale[4 * c + 1] = s0;
    g.scale[4 * c + 2] = g.scale[4 * c + 3] = s1;
    const int o = mxfp4 ? 1 : 2;
    const __m512i nib = _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(b0 + o)), nibbles32(b1 + o), 1);
    put_nibbles(g, c, nib, mxfp4);
  }
}

HMOE_L512 void dec_iq4_xs(const uint8_t* b, Group& g) {
  const float d = half(b);
  const uint16_t sh = u16(b + 2);
  for (int j = 0; j < 8; ++j) {
    const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
    g.scale[2 * j] = g.scale[2 * j + 1] = d * static_cast<float>(ls - 32);
  }
  g.has_offset = false;
  for (int c = 0; c < 4; ++c) {
    const __m512i nib = _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(b + 8 + 32 * c)), nibbles32(b + 24 + 32 * c), 1);
    put_nibbles(g, c, nib, false);
  }
}

template <uint32_t T>
HMOE_L512 inline void decode_t(const uint8_t* p, Group& g) {
  if constexpr (T == 10) dec_q2_k(p, g);
  else if constexpr (T == 11) dec_q3_k(p, g);
  else if constexpr (T == 16) dec_iq2_xxs(p, g);
  else if constexpr (T == 17) dec_iq2_xs(p, g);
  else if constexpr (T == 18) dec_iq3_xxs(p, g);
  else if constexpr (T == 19) dec_iq1_s(p, g);
  else if constexpr (T == 20) dec_32blocks(p, g, false);
  else if constexpr (T == 21) dec_iq3_s(p, g);
  else if constexpr (T == 22) dec_iq2_s(p, g);
  else if constexpr (T == 23) dec_iq4_xs(p, g);
  else if constexpr (T == 29) dec_iq1_m(p, g);
  else dec_32blocks(p, g, true);
}

// Calls f.template operator()<T>() for the type id t.
template <class F>
HMOE_L512 inline void with_type(uint32_t t, F&& f) {
  switch (t) {
    case 10: return f.template operator()<10>();
    case 11: return f.template operator()<11>();
    case 16: return f.template operator()<16>();
    case 17: return f.template operator()<17>();
    case 18: return f.template operator()<18>();
    case 19: return f.template operator()<19>();
    case 20: return f.template operator()<20>();
    case 21: return f.template operator()<21>();
    case 22: return f.template operator()<22>();
    case 23: return f.template operator()<23>();
    case 29: return f.template operator()<29>();
    case 39: return f.template operator()<39>();
    default: fail(ErrorKind::internal, "lowbit decode: not a low-bit type");
  }
}

// Bytes of one 256-weight group of type t.
int64_t group_bytes(ExtType t) {
  const ExtTypeInfo* ti = lowbit_type_info(static_cast<uint32_t>(t));
  return static_cast<int64_t>(ti->block_bytes) * (256 / ti->block_elems);
}

// Lane l of chunk c belongs to run 4c + l / 4.
HMOE_L512 inline void lane_scales(const Group& g, __m512 (&sv)[4]) {
  const __m512 s = _mm512_load_ps(g.scale);
  for (int c = 0; c < 4; ++c) {
    const __m512i idx = _mm512_setr_epi32(4 * c, 4 * c, 4 * c, 4 * c, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 1, 4 * c + 2, 4 * c + 2, 4 * c + 2,
                                          4 * c + 2, 4 * c + 3, 4 * c + 3, 4 * c + 3, 4 * c + 3);
    sv[c] = _mm512_permutexvar_ps(idx, s);
  }
}

constexpr int kTok = 4;

// y for rows [r0, r1), tokens [t0, t0 + n) in blocks of up to kTok tokens.
template <uint32_t T, int NT>
HMOE_L512 void q8_tile(const Q8Acts& xa, int64_t t0, const Mat& w, int64_t r, float* y, int64_t ldy, int64_t tout) {
  const ExtType type = static_cast<ExtType>(T);
  const int64_t groups = w.cols / 256, gb = group_bytes(type);
  const uint8_t* row = w.row(r);
  __m512 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_ps();
  Group g;
  for (int64_t gi = 0; gi < groups; ++gi) {
    decode_t<T>(row + gi * gb, g);
    __m512 sv[4];
    lane_scales(g, sv);
    for (int j = 0; j < NT; ++j) {
      const int64_t t = t0 + j;
      const int8_t* xq = xa.q.data() + t * xa.cols + gi * 256;
      __m512 f = _mm512_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m512i x = _mm512_loadu_si512(xq + 64 * c);
        const __m512i xs = _mm512_mask_sub_epi8(x, g.neg[c], _mm512_setzero_si512(), x);
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(g.mag + 64 * c), xs);
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sv[c], f);
      }
      if (g.has_offset) {
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa.bsum.data() + (t * groups + gi) * 16));
        const __m512 bsf = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(bs));
        // offsets are per run; fold them in as 16 lanes (added to the same accumulator: the sum is what matters)
        f = _mm512_fmadd_ps(_mm512_load_ps(g.offset), bsf, f);
      }
      acc[j] = _mm512_fmadd_ps(f, _mm512_set1_ps(xa.d[static_cast<size_t>(t * groups + gi)]), acc[j]);
    }
  }
  for (int j = 0; j < NT; ++j) y[(tout + j) * ldy + r] = _mm512_reduce_add_ps(acc[j]);
}

// Exact path: a group's weights to fp32 (scale * code, then + offset).
HMOE_L512 inline void group_to_f32(const Group& g, int c, __m512 (&wv)[4]) {
  const __m512i code8 = _mm512_mask_sub_epi8(_mm512_load_si512(g.mag + 64 * c), g.neg[c], _mm512_setzero_si512(), _mm512_load_si512(g.mag + 64 * c));
  for (int q = 0; q < 4; ++q) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(code8, q)));
    const __m512 s = _mm512_set1_ps(g.scale[4 * c + q]);
    wv[q] = g.has_offset ? _mm512_add_ps(_mm512_mul_ps(s, v), _mm512_set1_ps(g.offset[4 * c + q])) : _mm512_mul_ps(s, v);
  }
}

template <uint32_t T, int NT>
HMOE_L512 void f32_tile(const float* x, int64_t ldx, int64_t t0, const Mat& w, int64_t r, float* y, int64_t ldy) {
  const ExtType type = static_cast<ExtType>(T);
  const int64_t groups = w.cols / 256, gb = group_bytes(type);
  const uint8_t* row = w.row(r);
  __m512 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_ps();
  Group g;
  for (int64_t gi = 0; gi < groups; ++gi) {
    decode_t<T>(row + gi * gb, g);
    for (int c = 0; c < 4; ++c) {
      __m512 wv[4];
      group_to_f32(g, c, wv);
      for (int j = 0; j < NT; ++j) {
        const float* xt = x + (t0 + j) * ldx + gi * 256 + 64 * c;
        for (int q = 0; q < 4; ++q) acc[j] = _mm512_fmadd_ps(wv[q], _mm512_loadu_ps(xt + 16 * q), acc[j]);
      }
    }
  }
  // 32-types whose row is not a whole number of groups: the tail blocks by the scalar reference
  const int64_t done = groups * 256;
  if (done < w.cols) {
    const ExtTypeInfo* ti = lowbit_type_info(w.ext);
    alignas(64) float blk[32];
    for (int64_t k = done; k < w.cols; k += ti->block_elems) {
      lowbit_dequant_block(type, row + (k / ti->block_elems) * ti->block_bytes, blk);
      for (int j = 0; j < NT; ++j) {
        const float* xt = x + (t0 + j) * ldx + k;
        acc[j] = _mm512_fmadd_ps(_mm512_load_ps(blk), _mm512_loadu_ps(xt), acc[j]);
        acc[j] = _mm512_fmadd_ps(_mm512_load_ps(blk + 16), _mm512_loadu_ps(xt + 16), acc[j]);
      }
    }
  }
  for (int j = 0; j < NT; ++j) y[(t0 + j) * ldy + r] = _mm512_reduce_add_ps(acc[j]);
}

}  // namespace

bool lowbit_has_avx512_vnni() {
  static const bool v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("bmi2");
  }();
  return v;
}

HMOE_L512 void lowbit_decode256_avx512(ExtType type, const uint8_t* p, uint8_t* ucode, float* scale, float* offset_u) {
  Group g;
  with_type(static_cast<uint32_t>(type), [&]<uint32_t T>() { decode_t<T>(p, g); });
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 64; ++i) ucode[64 * c + i] = g.mag[64 * c + i];
  for (int j = 0; j < 16; ++j) {
    scale[j] = g.scale[j];
    offset_u[j] = g.has_offset ? g.offset[j] : 0.0f;
  }
  // the signs as the top bit of the code byte (magnitudes are < 128)
  for (int k = 0; k < 256; ++k)
    if ((g.neg[k / 64] >> (k % 64)) & 1) ucode[k] |= 0x80;
}

HMOE_L512 void lowbit_rows_q8_avx512(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  with_type(w.ext, [&]<uint32_t T>() {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t t = 0;
      for (; t + kTok <= n; t += kTok) q8_tile<T, kTok>(xa, t0 + t, w, r, y, ldy, t);
      for (; t < n; ++t) q8_tile<T, 1>(xa, t0 + t, w, r, y, ldy, t);
    }
  });
}

HMOE_L512 void lowbit_rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  with_type(w.ext, [&]<uint32_t T>() {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t t = 0;
      for (; t + kTok <= n; t += kTok) f32_tile<T, kTok>(x, ldx, t, w, r, y, ldy);
      for (; t < n; ++t) f32_tile<T, 1>(x, ldx, t, w, r, y, ldy);
    }
  });
}

}  // namespace hmoe::cpu::detail
