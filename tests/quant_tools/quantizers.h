// Round-to-nearest quantizers written from each format's published layout,
// used by the tests to make quantized data (random matrices, the tiny
// fixture) that the loaders and kernels must read back. Header-only so the
// test areas that need it include it. Not tuned for accuracy (no
// importance search): the tests compare against the dequantized values, so
// only the layout has to be right.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/dtype.h"
#include "numa/quant_gguf.h"

namespace hmoe::qtools {

inline void put_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
inline float get_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
inline int rnd(float v) { return static_cast<int>(std::nearbyint(v)); }

// ---- ggml blocks (one block of block_elems values) ---------------------------
inline void quant_block(cpu::ExtType t, const float* x, uint8_t* b) {
  using cpu::ExtType;
  switch (t) {
    case ExtType::q8_0: {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      put_half(b, amax / 127.0f);
      const float d = get_half(b), id = d > 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(rnd(x[i] * id), -127, 127)));
      return;
    }
    case ExtType::q4_0:
    case ExtType::q5_0: {
      const bool five = t == ExtType::q5_0;
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      put_half(b, amax / (five ? 15.0f : 7.0f));
      const float d = get_half(b), id = d > 0 ? 1.0f / d : 0.0f;
      const int off = five ? 16 : 8, top = five ? 31 : 15;
      uint32_t qh = 0;
      uint8_t* qs = b + (five ? 6 : 2);
      for (int j = 0; j < 16; ++j) {
        const int lo = std::clamp(rnd(x[j] * id) + off, 0, top), hi = std::clamp(rnd(x[j + 16] * id) + off, 0, top);
        qs[j] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
        qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + 16);
      }
      if (five) std::memcpy(b + 2, &qh, 4);
      return;
    }
    case ExtType::q4_1:
    case ExtType::q5_1: {
      const bool five = t == ExtType::q5_1;
      float lo = x[0], hi = x[0];
      for (int i = 0; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
      put_half(b, (hi - lo) / (five ? 31.0f : 15.0f));
      put_half(b + 2, lo);
      const float d = get_half(b), m = get_half(b + 2), id = d > 0 ? 1.0f / d : 0.0f;
      const int top = five ? 31 : 15;
      uint32_t qh = 0;
      uint8_t* qs = b + (five ? 8 : 4);
      for (int j = 0; j < 16; ++j) {
        const int a = std::clamp(rnd((x[j] - m) * id), 0, top), c = std::clamp(rnd((x[j + 16] - m) * id), 0, top);
        qs[j] = static_cast<uint8_t>((a & 15) | ((c & 15) << 4));
        qh |= static_cast<uint32_t>((a >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((c >> 4) & 1) << (j + 16);
      }
      if (five) std::memcpy(b + 4, &qh, 4);
      return;
    }
    case ExtType::q4_k:
    case ExtType::q5_k: {
      const bool five = t == ExtType::q5_k;
      const int top = five ? 31 : 15;
      float scale[8], mn[8], maxs = 0, maxm = 0;
      for (int s = 0; s < 8; ++s) {
        float lo = 0, hi = x[32 * s];
        for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * s + i]), hi = std::max(hi, x[32 * s + i]);
        scale[s] = (hi - lo) / static_cast<float>(top);
        mn[s] = -lo;
        maxs = std::max(maxs, scale[s]);
        maxm = std::max(maxm, mn[s]);
      }
      put_half(b, maxs / 63.0f);
      put_half(b + 2, maxm / 63.0f);
      const float d = get_half(b), dmin = get_half(b + 2);
      int sc[8], m[8];
      for (int s = 0; s < 8; ++s) {
        sc[s] = d > 0 ? std::clamp(rnd(scale[s] / d), 0, 63) : 0;
        m[s] = dmin > 0 ? std::clamp(rnd(mn[s] / dmin), 0, 63) : 0;
      }
      uint8_t* S = b + 4;
      for (int j = 0; j < 4; ++j) {
        S[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        S[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        S[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
      }
      uint8_t* qh = b + 16;
      uint8_t* qs = b + (five ? 48 : 16);
      if (five) std::memset(qh, 0, 32);
      for (int s = 0; s < 8; ++s) {
        const float ds = d * static_cast<float>(sc[s]), ms = dmin * static_cast<float>(m[s]);
        for (int l = 0; l < 32; ++l) {
          const int q = ds > 0 ? std::clamp(rnd((x[32 * s + l] + ms) / ds), 0, top) : 0;
          uint8_t& byte = qs[32 * (s / 2) + l];
          if (s % 2 == 0) byte = static_cast<uint8_t>((byte & 0xF0) | (q & 15));
          else byte = static_cast<uint8_t>((byte & 0x0F) | ((q & 15) << 4));
          if (five && (q & 16)) qh[l] = static_cast<uint8_t>(qh[l] | (1 << s));
        }
      }
      return;
    }
    case ExtType::q6_k: {
      float scale[16], maxs = 0;
      for (int s = 0; s < 16; ++s) {
        float amax = 0, v = 0;
        for (int i = 0; i < 16; ++i)
          if (std::fabs(x[16 * s + i]) > amax) amax = std::fabs(x[16 * s + i]), v = x[16 * s + i];
        scale[s] = v / -32.0f;  // the extreme value maps to -32
        maxs = std::max(maxs, std::fabs(scale[s]));
      }
      put_half(b + 208, maxs / 127.0f);
      const float d = get_half(b + 208);
      auto* sc = reinterpret_cast<int8_t*>(b + 192);
      uint8_t* ql = b;
      uint8_t* qh = b + 128;
      std::memset(b, 0, 192);
      for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(d > 0 ? std::clamp(rnd(scale[s] / d), -127, 127) : 0);
      for (int e = 0; e < 256; ++e) {
        const float ds = d * static_cast<float>(sc[e / 16]);
        const int q = (ds != 0 ? std::clamp(rnd(x[e] / ds), -32, 31) : 0) + 32;
        const int h = e / 128, w = e % 128, qq = w / 32, l = w % 32;
        uint8_t& lb = ql[h * 64 + (qq & 1) * 32 + l];
        lb = static_cast<uint8_t>(qq >= 2 ? (lb | ((q & 15) << 4)) : (lb | (q & 15)));
        qh[h * 32 + l] = static_cast<uint8_t>(qh[h * 32 + l] | (((q >> 4) & 3) << (2 * qq)));
      }
      return;
    }
    default: return;
  }
}

// Rows [rows, cols] of floats into ggml blocks (cols % block_elems == 0).
inline std::vector<uint8_t> quant_rows(cpu::ExtType t, const float* x, int64_t rows, int64_t cols) {
  const cpu::ExtTypeInfo* ti = cpu::ext_type_info(static_cast<uint32_t>(t));
  const int64_t nb = cols / ti->block_elems;
  std::vector<uint8_t> out(static_cast<size_t>(rows * nb * ti->block_bytes), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) quant_block(t, x + r * cols + b * ti->block_elems, out.data() + (r * nb + b) * ti->block_bytes);
  return out;
}

// fp8 e4m3 round-to-nearest-even of a finite value (saturating at 448).
inline uint8_t f32_to_fp8_e4m3(float v) {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = cpu::fp8_e4m3_to_f32(static_cast<uint8_t>(b));
    return t;
  }();
  uint8_t best = 0;
  float bd = INFINITY;
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    const float f = table[static_cast<size_t>(b)];
    const float dd = std::fabs(f - v);
    if (dd < bd || (dd == bd && (b & 1) == 0 && (best & 1) == 1)) bd = dd, best = static_cast<uint8_t>(b);
  }
  return best;
}

}  // namespace hmoe::qtools
