// Scalar reference of the block formats (written from the ggml block
// definitions: one function per type, block at a time) and the checks. The
// CPU matrix kernels on them are numa/quant_gguf_rows.cpp and
// numa/quant_gguf_simd.cpp.
#include "io/tensor/quant_blocks.h"

#include "io/tensor/gguf_block_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "configs/error.h"

namespace hmoe::cpu {

int ggml_code_run(ExtType t) {
  switch (t) {
    case ExtType::q4_0: case ExtType::q4_1: case ExtType::q5_0: case ExtType::q5_1: case ExtType::q5_k: return 32;
    case ExtType::q6_k: return 16;
    default: return 0;
  }
}

void ggml_block_codes(ExtType t, const uint8_t* b, uint8_t* code, float* scale, float* zero) {
  // Offset formats (w = d q + m): zero = -m / d; a run whose scale is 0 is
  // the constant m, written as codes 0, scale 1, zero -m.
  auto affine = [](float d, float m, uint8_t* q, int n, float& sc, float& z) {
    if (d != 0.0f) {
      sc = d;
      z = -m / d;
      return;
    }
    std::memset(q, 0, static_cast<size_t>(n));
    sc = 1.0f;
    z = -m;
  };
  switch (t) {
    case ExtType::q4_0:
    case ExtType::q4_1: {  // d [, m], qs[16]: element j low nibble, j + 16 high
      const uint8_t* qs = b + (t == ExtType::q4_0 ? 2 : 4);
      for (int j = 0; j < 16; ++j) {
        code[j] = qs[j] & 0xF;
        code[j + 16] = qs[j] >> 4;
      }
      if (t == ExtType::q4_0) scale[0] = detail::gguf_half(b), zero[0] = 8.0f;
      else affine(detail::gguf_half(b), detail::gguf_half(b + 2), code, 32, scale[0], zero[0]);
      return;
    }
    case ExtType::q5_0:
    case ExtType::q5_1: {  // d [, m], qh (32 high bits), qs[16]
      const int o = t == ExtType::q5_0 ? 2 : 4;
      uint32_t qh;
      std::memcpy(&qh, b + o, 4);
      for (int j = 0; j < 16; ++j) {
        code[j] = static_cast<uint8_t>((b[o + 4 + j] & 0xF) | (((qh >> j) & 1u) << 4));
        code[j + 16] = static_cast<uint8_t>((b[o + 4 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
      }
      if (t == ExtType::q5_0) scale[0] = detail::gguf_half(b), zero[0] = 16.0f;
      else affine(detail::gguf_half(b), detail::gguf_half(b + 2), code, 32, scale[0], zero[0]);
      return;
    }
    case ExtType::q5_k: {  // d, dmin, scales[12], qh[32], qs[128]; 8 runs of 32
      const float d = detail::gguf_half(b), dmin = detail::gguf_half(b + 2);
      const uint8_t *qh = b + 16, *ql = b + 48;
      for (int j = 0; j < 4; ++j, ql += 32) {
        for (int l = 0; l < 32; ++l) {
          code[64 * j + l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4));
          code[64 * j + 32 + l] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4));
        }
      }
      for (int r = 0; r < 8; ++r) {
        int sc, m;
        detail::gguf_scale_min_k4(r, b + 4, sc, m);
        affine(d * static_cast<float>(sc), -dmin * static_cast<float>(m), code + 32 * r, 32, scale[r], zero[r]);
      }
      return;
    }
    case ExtType::q6_k: {  // ql[128], qh[64], scales[16] (int8), d; 16 runs of 16
      const float d = detail::gguf_half(b + 208);
      const uint8_t *ql = b, *qh = b + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int n = 0; n < 2; ++n, ql += 64, qh += 32) {
        uint8_t* q = code + 128 * n;
        for (int l = 0; l < 32; ++l) {
          q[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
          q[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
          q[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
          q[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
      }
      for (int r = 0; r < 16; ++r) {
        scale[r] = d * static_cast<float>(sc[r]);
        zero[r] = 32.0f;
      }
      return;
    }
    default: fail(ErrorKind::internal, "ggml_block_codes: type " + std::to_string(static_cast<uint32_t>(t)) + " has no code decomposition");
  }
}

namespace {

// value k = scale[k / run] * (code[k] - zero[k / run]) from ggml_block_codes (exact: one rounding).
template <int N>
void deq_codes(ExtType t, const uint8_t* b, float* y) {
  uint8_t q[N];
  float sc[N / 16], z[N / 16];
  ggml_block_codes(t, b, q, sc, z);
  const int run = ggml_code_run(t);
  for (int k = 0; k < N; ++k) y[k] = sc[k / run] * (static_cast<float>(q[k]) - z[k / run]);
}
void deq_q4_0(const uint8_t* b, float* y) { deq_codes<32>(ExtType::q4_0, b, y); }
void deq_q4_1(const uint8_t* b, float* y) {
  const float d = detail::gguf_half(b), m = detail::gguf_half(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(b[4 + j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
  }
}
void deq_q5_0(const uint8_t* b, float* y) { deq_codes<32>(ExtType::q5_0, b, y); }
void deq_q5_1(const uint8_t* b, float* y) {
  const float d = detail::gguf_half(b), m = detail::gguf_half(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b[8 + j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (b[8 + j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}
void deq_q8_0(const uint8_t* b, float* y) {
  const float d = detail::gguf_half(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}
// block_q4_K: d, dmin (f16), scales[12], qs[128]
void deq_q4_k(const uint8_t* b, float* y) {
  const float d = detail::gguf_half(b), dmin = detail::gguf_half(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    int sc, m;
    detail::gguf_scale_min_k4(is, s, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    detail::gguf_scale_min_k4(is + 1, s, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}
// block_q5_K: d, dmin (f16), scales[12], qh[32], qs[128]
void deq_q5_k(const uint8_t* b, float* y) {
  const float d = detail::gguf_half(b), dmin = detail::gguf_half(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 = static_cast<uint8_t>(u1 << 2), u2 = static_cast<uint8_t>(u2 << 2)) {
    int sc, m;
    detail::gguf_scale_min_k4(is, s, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    detail::gguf_scale_min_k4(is + 1, s, sc, m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
  }
}
void deq_q6_k(const uint8_t* b, float* y) { deq_codes<256>(ExtType::q6_k, b, y); }

constexpr ExtTypeInfo kQ4_0{"Q4_0", 32, 18}, kQ4_1{"Q4_1", 32, 20}, kQ5_0{"Q5_0", 32, 22}, kQ5_1{"Q5_1", 32, 24},
    kQ8_0{"Q8_0", 32, 34}, kQ4_K{"Q4_K", 256, 144}, kQ5_K{"Q5_K", 256, 176}, kQ6_K{"Q6_K", 256, 210},
    kFp8{"FP8_E4M3", 1, 1}, kInt8g{"INT8_GROUP", 1, 1};

bool is_ggml(uint32_t t) { return t < 1000; }

}  // namespace

float fp8_e4m3_to_f32(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? static_cast<float>(m) * 0x1p-9f : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

const ExtTypeInfo* ext_type_info(uint32_t type) {
  switch (static_cast<ExtType>(type)) {
    case ExtType::q4_0: return &kQ4_0;
    case ExtType::q4_1: return &kQ4_1;
    case ExtType::q5_0: return &kQ5_0;
    case ExtType::q5_1: return &kQ5_1;
    case ExtType::q8_0: return &kQ8_0;
    case ExtType::q4_k: return &kQ4_K;
    case ExtType::q5_k: return &kQ5_K;
    case ExtType::q6_k: return &kQ6_K;
    case ExtType::fp8_e4m3: return &kFp8;
    case ExtType::int8_group: return &kInt8g;
  }
  return nullptr;
}

bool ggml_type_supported(uint32_t t) { return is_ggml(t) && ext_type_info(t) != nullptr; }

void dequant_block(ExtType type, const uint8_t* b, float* out) {
  switch (type) {
    case ExtType::q4_0: return deq_q4_0(b, out);
    case ExtType::q4_1: return deq_q4_1(b, out);
    case ExtType::q5_0: return deq_q5_0(b, out);
    case ExtType::q5_1: return deq_q5_1(b, out);
    case ExtType::q8_0: return deq_q8_0(b, out);
    case ExtType::q4_k: return deq_q4_k(b, out);
    case ExtType::q5_k: return deq_q5_k(b, out);
    case ExtType::q6_k: return deq_q6_k(b, out);
    default: fail(ErrorKind::internal, "dequant_block: not a ggml block type");
  }
}

Mat ext_view(ExtType type, const void* data, int64_t rows, int64_t cols, const std::string& what) {
  const ExtTypeInfo* ti = ext_type_info(static_cast<uint32_t>(type));
  if (!ti || !is_ggml(static_cast<uint32_t>(type))) fail(ErrorKind::internal, what + ": ext_view needs a ggml block type");
  if (cols % ti->block_elems != 0)
    fail(ErrorKind::bad_model, what + ": " + std::to_string(cols) + " columns are not a multiple of the " + ti->name + " block (" +
                                   std::to_string(ti->block_elems) + ")");
  Mat m;
  m.dtype = DType::u8;
  m.data = data;
  m.rows = rows;
  m.cols = cols;
  m.quant = Quant::ext;
  m.ext = static_cast<uint32_t>(type);
  return m;
}

size_t ext_row_bytes(uint32_t type, int64_t cols) {
  const ExtTypeInfo* ti = ext_type_info(type);
  if (!ti) return 0;
  return static_cast<size_t>(cols / ti->block_elems) * static_cast<size_t>(ti->block_bytes);
}

void ext_check(const Mat& w, const std::string& what) {
  const ExtTypeInfo* ti = ext_type_info(w.ext);
  if (!ti) fail(ErrorKind::unsupported, what + ": unknown block type id " + std::to_string(w.ext));
  if (w.cols % 32 != 0 || w.cols % ti->block_elems != 0)
    fail(ErrorKind::invalid_argument, what + ": " + std::to_string(w.cols) + " columns are not a multiple of the " + ti->name +
                                          " block (" + std::to_string(std::max(32, ti->block_elems)) + ")");
  if (is_ggml(w.ext)) {
    if (w.scales || w.zeros) fail(ErrorKind::invalid_argument, what + ": " + ti->name + " carries its scales inline");
    return;
  }
  if (!w.scales) fail(ErrorKind::invalid_argument, what + ": " + ti->name + " needs scales");
  if (w.group <= 0 || w.group % 32 != 0)
    fail(ErrorKind::invalid_argument, what + ": " + ti->name + " group " + std::to_string(w.group) + " is not a positive multiple of 32");
  if (w.ext == static_cast<uint32_t>(ExtType::fp8_e4m3) && w.zeros) fail(ErrorKind::invalid_argument, what + ": FP8 has no zero points");
}

std::string ext_type_name(const Mat& w) {
  const ExtTypeInfo* ti = ext_type_info(w.ext);
  if (!ti) return "ext?" + std::to_string(w.ext);
  if (is_ggml(w.ext)) return ti->name;
  return std::string(ti->name) + "-g" + std::to_string(w.group) + (w.zeros ? "-asym" : "");
}

void ext_row_to_f32(const Mat& w, int64_t r, float* dst) {
  const uint8_t* p = w.row(r);
  if (is_ggml(w.ext)) {
    const ExtTypeInfo* ti = ext_type_info(w.ext);
    const int64_t nb = w.cols / ti->block_elems;
    for (int64_t b = 0; b < nb; ++b) dequant_block(static_cast<ExtType>(w.ext), p + b * ti->block_bytes, dst + b * ti->block_elems);
    return;
  }
  for (int64_t k = 0; k < w.cols; ++k) dst[k] = ext_weight_at(w, r, k);
}

float ext_weight_at(const Mat& w, int64_t r, int64_t k) {
  const uint8_t* p = w.row(r);
  if (is_ggml(w.ext)) {
    const ExtTypeInfo* ti = ext_type_info(w.ext);
    float blk[256];
    dequant_block(static_cast<ExtType>(w.ext), p + (k / ti->block_elems) * ti->block_bytes, blk);
    return blk[k % ti->block_elems];
  }
  const int64_t g = r * w.groups() + k / w.group;
  if (w.ext == static_cast<uint32_t>(ExtType::fp8_e4m3)) return fp8_e4m3_to_f32(p[k]) * w.scales[g];
  const float z = w.zeros ? w.zeros[g] : 128.0f;
  return (static_cast<float>(p[k]) - z) * w.scales[g];
}

}  // namespace hmoe::cpu
