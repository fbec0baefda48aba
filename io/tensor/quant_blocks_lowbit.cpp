// Scalar reference of the low-bit ggml blocks (io/tensor/quant_blocks_lowbit.h):
// one function per type turning a block into codes, per-16 scales and
// offsets, written from the block layouts (ggml's block_* structs; the
// arithmetic order as in gguf-py's dequantizer).
#include "io/tensor/quant_blocks_lowbit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "configs/error.h"
#include "io/tensor/lowbit_block_scale.h"
#include "io/tensor/gguf_block_util.h"
#include "io/tensor/gguf_iq_grids.h"

namespace hmoe::cpu {

namespace {

using detail::gguf_half;

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint8_t grid_byte(uint64_t entry, int j) { return static_cast<uint8_t>(entry >> (8 * j)); }

// Q2_K (84 bytes): scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
// Weight k = 128h + 32j + l: (qs[32h + l] >> 2j) & 3.
void codes_q2_k(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b + 80), dmin = gguf_half(b + 82);
  for (int i = 0; i < 16; ++i) {
    s[i] = d * static_cast<float>(b[i] & 0xF);
    o[i] = -(dmin * static_cast<float>(b[i] >> 4));
  }
  const uint8_t* qs = b + 16;
  for (int k = 0; k < 256; ++k) c[k] = static_cast<int8_t>((qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3);
}

// Q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 x 6 bits, offset 32), d.
// Weight k: low 2 bits as Q2_K, minus 4 unless bit k/32 of hmask[k % 32] is set.
void codes_q3_k(const uint8_t* b, int8_t* c, float* s, float* o) {
  const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
  const float d = gguf_half(b + 108);
  for (int j = 0; j < 16; ++j) {
    const int lo = (j < 8 ? sc[j] : sc[j - 8] >> 4) & 0xF;
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    s[j] = d * static_cast<float>((lo | (hi << 4)) - 32);
    o[j] = 0.0f;
  }
  for (int k = 0; k < 256; ++k) {
    const int q = (qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
    const int h = (hm[k % 32] >> (k / 32)) & 1;
    c[k] = static_cast<int8_t>(q - (h ? 0 : 4));
  }
}

// Runs of 8 weights from an 8-byte grid entry and 8 sign bits.
void put8(int8_t* c, uint64_t entry, uint32_t signs) {
  for (int j = 0; j < 8; ++j) {
    const int v = grid_byte(entry, j);
    c[j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
  }
}
void put4(int8_t* c, uint32_t entry, uint32_t signs) {
  for (int j = 0; j < 4; ++j) {
    const int v = static_cast<int>((entry >> (8 * j)) & 0xFF);
    c[j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
  }
}

// IQ2_XXS (66 bytes): d, then per 32 weights two u32: 4 grid indices
// (bytes), and 4 x 7-bit sign indices with a 4-bit scale on top.
void codes_iq2_xxs(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  for (int sb = 0; sb < 8; ++sb) {
    const uint8_t* p = b + 2 + 8 * sb;
    const uint32_t aux1 = u32(p + 4);
    const float db = d * (0.5f + static_cast<float>(aux1 >> 28)) * 0.25f;
    s[2 * sb] = s[2 * sb + 1] = db;
    o[2 * sb] = o[2 * sb + 1] = 0.0f;
    for (int g = 0; g < 4; ++g) put8(c + 32 * sb + 8 * g, detail::kIq2xxsGrid[p[g]], detail::iq_sign_byte(aux1 >> (7 * g)));
  }
}

// IQ2_XS (74 bytes): d, qs u16[32] (9-bit grid index, 7-bit sign index), scales[8] (4 bits per 16 weights).
void codes_iq2_xs(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  for (int j = 0; j < 16; ++j) {
    s[j] = d * (0.5f + static_cast<float>((b[66 + j / 2] >> (4 * (j % 2))) & 0xF)) * 0.25f;
    o[j] = 0.0f;
  }
  for (int i = 0; i < 32; ++i) {
    const uint16_t q = u16(b + 2 + 2 * i);
    put8(c + 8 * i, detail::kIq2xsGrid[q & 511], detail::iq_sign_byte(q >> 9));
  }
}

// IQ2_S (82 bytes): d, qs[32] (grid index low bits), signs[32], qh[8] (2 high bits each), scales[8].
void codes_iq2_s(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  for (int j = 0; j < 16; ++j) {
    s[j] = d * (0.5f + static_cast<float>((b[74 + j / 2] >> (4 * (j % 2))) & 0xF)) * 0.25f;
    o[j] = 0.0f;
  }
  for (int i = 0; i < 32; ++i) {
    const int idx = b[2 + i] | (((b[66 + i / 4] >> (2 * (i % 4))) & 3) << 8);
    put8(c + 8 * i, detail::kIq2sGrid[idx], b[34 + i]);
  }
}

// IQ3_XXS (98 bytes): d, qs[64] (grid indices, 4 weights each), per 32 weights a u32 of 4 sign indices and a scale.
void codes_iq3_xxs(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  for (int sb = 0; sb < 8; ++sb) {
    const uint32_t ss = u32(b + 66 + 4 * sb);
    const float db = d * (0.5f + static_cast<float>(ss >> 28)) * 0.5f;
    s[2 * sb] = s[2 * sb + 1] = db;
    o[2 * sb] = o[2 * sb + 1] = 0.0f;
    for (int g = 0; g < 4; ++g) {
      const uint8_t sg = detail::iq_sign_byte(ss >> (7 * g));
      put4(c + 32 * sb + 8 * g, detail::kIq3xxsGrid[b[2 + 8 * sb + 2 * g]], sg);
      put4(c + 32 * sb + 8 * g + 4, detail::kIq3xxsGrid[b[2 + 8 * sb + 2 * g + 1]], sg >> 4);
    }
  }
}

// IQ3_S (110 bytes): d, qs[64], qh[8] (9th index bit), signs[32], scales[4] (4 bits per 32 weights).
void codes_iq3_s(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  for (int j = 0; j < 16; ++j) {
    const int sc = (b[106 + j / 4] >> (4 * ((j / 2) % 2))) & 0xF;
    s[j] = d * static_cast<float>(1 + 2 * sc);
    o[j] = 0.0f;
  }
  for (int i = 0; i < 64; ++i) {
    const int idx = b[2 + i] | (((b[66 + i / 8] >> (i % 8)) & 1) << 8);
    put4(c + 4 * i, detail::kIq3sGrid[idx], b[74 + i / 2] >> (4 * (i % 2)));
  }
}

// IQ1_S (50 bytes): d, qs[32], qh u16[8]: per 32 weights 4 x 3 high index bits, a 3-bit scale, the delta's sign.
// w = dl * (grid + delta) = (dl / 8) * (8 grid +- 1).
void codes_iq1_s(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  for (int sb = 0; sb < 8; ++sb) {
    const uint16_t qh = u16(b + 34 + 2 * sb);
    const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
    s[2 * sb] = s[2 * sb + 1] = dl * 0.125f;
    o[2 * sb] = o[2 * sb + 1] = 0.0f;
    const int delta = (qh & 0x8000) ? -1 : 1;
    for (int g = 0; g < 4; ++g) {
      const int idx = b[2 + 4 * sb + g] | (((qh >> (3 * g)) & 7) << 8);
      const uint64_t e = detail::kIq1sGrid[idx];
      for (int j = 0; j < 8; ++j) c[32 * sb + 8 * g + j] = static_cast<int8_t>(8 * (grid_byte(e, j) - 1) + delta);
    }
  }
}

// IQ1_M (56 bytes): qs[32], qh[16] (per 8 weights: 3 high index bits and the delta's sign), scales u16[4]
// (a 3-bit scale per 16 weights in the low 12 bits of each, the f16 d spread over the 4 top nibbles).
void codes_iq1_m(const uint8_t* b, int8_t* c, float* s, float* o) {
  const uint8_t *qs = b, *qh = b + 32;
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = u16(b + 48 + 2 * i);
  const uint16_t dbits = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
  const float d = f16_to_f32(dbits);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(2 * ((sc[j / 4] >> (3 * (j % 4))) & 7) + 1);
    s[j] = dl * 0.125f;
    o[j] = 0.0f;
  }
  for (int i = 0; i < 32; ++i) {
    const int h = (qh[i / 2] >> (4 * (i % 2))) & 0xF;
    const int idx = qs[i] | ((h & 7) << 8);
    const int delta = (h & 8) ? -1 : 1;
    const uint64_t e = detail::kIq1sGrid[idx];
    for (int j = 0; j < 8; ++j) c[8 * i + j] = static_cast<int8_t>(8 * (grid_byte(e, j) - 1) + delta);
  }
}

// 32-weight blocks of 4-bit codes, low nibbles first (IQ4_NL, MXFP4 and IQ4_XS's runs).
void nibbles32(const uint8_t* qs, const int8_t* table, int8_t* c) {
  for (int i = 0; i < 16; ++i) {
    c[i] = table[qs[i] & 0xF];
    c[i + 16] = table[qs[i] >> 4];
  }
}

void codes_iq4_nl(const uint8_t* b, int8_t* c, float* s, float* o) {
  s[0] = s[1] = gguf_half(b);
  o[0] = o[1] = 0.0f;
  nibbles32(b + 2, detail::kIq4nlValues, c);
}

// IQ4_XS (136 bytes): d, scales_h u16 (2 bits per 32), scales_l[4] (4 bits per 32), qs[128].
void codes_iq4_xs(const uint8_t* b, int8_t* c, float* s, float* o) {
  const float d = gguf_half(b);
  const uint16_t sh = u16(b + 2);
  for (int j = 0; j < 8; ++j) {
    const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
    s[2 * j] = s[2 * j + 1] = d * static_cast<float>(ls - 32);
    o[2 * j] = o[2 * j + 1] = 0.0f;
    nibbles32(b + 8 + 16 * j, detail::kIq4nlValues, c + 32 * j);
  }
}

constexpr auto kMxfp4Values = [] {
  struct T {
    int8_t v[16];
  } t{};
  for (uint32_t i = 0; i < 16; ++i) t.v[i] = detail::mxfp4_value2(i);
  return t;
}();

void codes_mxfp4(const uint8_t* b, int8_t* c, float* s, float* o) {
  s[0] = s[1] = detail::e8m0_half(b[0]);
  o[0] = o[1] = 0.0f;
  nibbles32(b + 1, kMxfp4Values.v, c);
}

constexpr ExtTypeInfo kInfo[] = {{"Q2_K", 256, 84},   {"Q3_K", 256, 110},  {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74},
                                 {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},  {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110},
                                 {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136}, {"IQ1_M", 256, 56},   {"MXFP4", 32, 17}};

int index_of(uint32_t t) {
  for (int i = 0; i < 12; ++i)
    if (static_cast<uint32_t>(lowbit::kAll[i]) == t) return i;
  return -1;
}

}  // namespace

bool lowbit_type(uint32_t type) { return index_of(type) >= 0; }

const ExtTypeInfo* lowbit_type_info(uint32_t type) {
  const int i = index_of(type);
  return i < 0 ? nullptr : &kInfo[i];
}

void lowbit_block_codes(ExtType t, const uint8_t* b, int8_t* c, float* s, float* o) {
  switch (static_cast<uint32_t>(t)) {
    case 10: return codes_q2_k(b, c, s, o);
    case 11: return codes_q3_k(b, c, s, o);
    case 16: return codes_iq2_xxs(b, c, s, o);
    case 17: return codes_iq2_xs(b, c, s, o);
    case 18: return codes_iq3_xxs(b, c, s, o);
    case 19: return codes_iq1_s(b, c, s, o);
    case 20: return codes_iq4_nl(b, c, s, o);
    case 21: return codes_iq3_s(b, c, s, o);
    case 22: return codes_iq2_s(b, c, s, o);
    case 23: return codes_iq4_xs(b, c, s, o);
    case 29: return codes_iq1_m(b, c, s, o);
    case 39: return codes_mxfp4(b, c, s, o);
    default: fail(ErrorKind::internal, "lowbit_block_codes: type " + std::to_string(static_cast<uint32_t>(t)) + " is not a low-bit type");
  }
}

void lowbit_dequant_block(ExtType t, const uint8_t* b, float* out) {
  int8_t c[256];
  float s[16], o[16];
  lowbit_block_codes(t, b, c, s, o);
  const int n = lowbit_type_info(static_cast<uint32_t>(t))->block_elems;
  for (int k = 0; k < n; ++k) {
    const float v = s[k / 16] * static_cast<float>(c[k]);
    out[k] = v + o[k / 16];
  }
}

void lowbit_set_block_scale(ExtType t, uint8_t* p, float d) {
  auto put = [](uint8_t* q, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(q, &h, 2);
  };
  switch (static_cast<uint32_t>(t)) {
    case 10:  // Q2_K: d, dmin at the block's end
      put(p + 80, d);
      put(p + 82, 1.5f * d);
      return;
    case 11:  // Q3_K
      put(p + 108, d);
      return;
    case 29: {  // IQ1_M: the f16 d in the top nibbles of the four 16-bit scale words
      const uint16_t h = f32_to_f16(d);
      for (int k = 0; k < 4; ++k) {
        uint16_t s;
        std::memcpy(&s, p + 48 + 2 * k, 2);
        s = static_cast<uint16_t>((s & 0x0FFFu) | (((h >> (4 * k)) & 0xFu) << 12));
        std::memcpy(p + 48 + 2 * k, &s, 2);
      }
      return;
    }
    case 39: {  // MXFP4: e8m0
      const int e = 128 + static_cast<int>(std::lround(std::log2(std::fabs(d) + 1e-30f)));
      p[0] = static_cast<uint8_t>(std::min(254, std::max(2, e)));
      return;
    }
    default:
      put(p, d);
  }
}

}  // namespace hmoe::cpu
