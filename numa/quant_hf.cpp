// Unpacking of GPTQ / AWQ / compressed-tensors / FP8 tensors into kernel
// views. Load-time code: clarity over speed (one pass, scalar).
#include "numa/quant_hf.h"

#include <algorithm>
#include <cstring>

#include "configs/error.h"
#include "numa/quant_gguf.h"

namespace hmoe::cpu {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& msg) { fail(ErrorKind::bad_model, what + ": " + msg); }

std::string dims(const RawTensor& t) { return "[" + std::to_string(t.rows) + ", " + std::to_string(t.cols) + "]"; }

void expect(const RawTensor& t, int64_t rows, int64_t cols, const std::string& what) {
  if (!t.data) bad(what, std::string("tensor '") + t.name + "' is missing");
  if (t.rows != rows || t.cols != cols)
    bad(what, std::string("tensor '") + t.name + "' has shape " + dims(t) + ", expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void set_nibble(std::vector<uint8_t>& d, int64_t row_bytes, int64_t r, int64_t k, int v) {
  uint8_t& byte = d[static_cast<size_t>(r * row_bytes + (k >> 5) * 16 + (k & 15))];
  byte = static_cast<uint8_t>((k & 16) ? ((byte & 0x0F) | (v << 4)) : ((byte & 0xF0) | v));
}

// Quantized values q(n, k) with per-(n, stored group) scale and zero, repacked.
template <class Q, class S, class Z>
QuantMat build(int bits, int64_t in, int64_t out, int group_s, Q q, S scale, Z zero, const std::string& what) {
  const int gk = effective_group(in, group_s, bits);
  if (gk <= 0) bad(what, std::to_string(in) + " input columns cannot be grouped for the kernels (group " + std::to_string(group_s) + ")");
  const int64_t G = ceil_div(in, gk);
  QuantMat m;
  m.scales.resize(static_cast<size_t>(out * G));
  m.zeros.resize(static_cast<size_t>(out * G));
  bool sym = true;
  const float mid = static_cast<float>(1 << (bits - 1));
  for (int64_t n = 0; n < out; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t gs = (g * gk) / group_s;
      m.scales[static_cast<size_t>(n * G + g)] = scale(n, gs);
      const float z = zero(n, gs);
      m.zeros[static_cast<size_t>(n * G + g)] = z;
      sym = sym && z == mid;
    }
  if (bits == 4) {
    const int64_t rb = in / 2;
    m.data.assign(static_cast<size_t>(out * rb), 0);
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k) set_nibble(m.data, rb, n, k, q(n, k));
    m.view = Mat{DType::u8, m.data.data(), out, in, Quant::int4_group, m.scales.data(), nullptr, gk};
  } else {
    m.data.resize(static_cast<size_t>(out * in));
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k) m.data[static_cast<size_t>(n * in + k)] = static_cast<uint8_t>(q(n, k));
    m.view = Mat{DType::u8, m.data.data(), out, in, Quant::ext, m.scales.data(), nullptr, gk};
    m.view.ext = static_cast<uint32_t>(ExtType::int8_group);
  }
  if (sym) m.zeros.clear();
  else m.view.zeros = m.zeros.data();
  check_mat(m.view, what);
  return m;
}

}  // namespace

float RawTensor::at_f32(int64_t r, int64_t c) const {
  const size_t i = static_cast<size_t>(r * cols + c);
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::f32: return static_cast<const float*>(data)[i];
    default: fail(ErrorKind::bad_model, std::string("tensor '") + name + "' has dtype " + dtype_name(dtype) + ", expected F16, BF16 or F32");
  }
}

int32_t RawTensor::at_i32(int64_t r, int64_t c) const {
  int32_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(data) + static_cast<size_t>(r * cols + c) * 4, 4);
  return v;
}

int effective_group(int64_t in, int group, int bits) {
  const int64_t gs = group > 0 ? group : in;
  const bool int4 = bits == 4;
  for (int g : {128, 64, 32}) {
    if (gs % g != 0) continue;
    if (int4 && in % g != 0) continue;
    if (!int4 && in % 32 != 0) continue;
    return g;
  }
  // int8 rows may use a stored group larger than 128 directly.
  if (!int4 && gs % 32 == 0 && in % 32 == 0) return static_cast<int>(std::min<int64_t>(gs, 1 << 30));
  return 0;
}

QuantMat repack_gptq(const RawTensor& qw, const RawTensor& qz, const RawTensor& sc, const int32_t* g_idx, int64_t in, int64_t out,
                     const GptqParams& p, const std::string& what) {
  if (p.bits != 4 && p.bits != 8) fail(ErrorKind::unsupported, what + ": GPTQ " + std::to_string(p.bits) + "-bit (supported: 4, 8)");
  const int per = 32 / p.bits;
  const uint32_t mask = (1u << p.bits) - 1;
  if (in % per != 0 || out % per != 0) bad(what, "in/out features must be multiples of " + std::to_string(per));
  const int64_t group_s = p.group > 0 ? p.group : in;
  const int64_t G = sc.rows;
  expect(qw, in / per, out, what);
  if (qw.dtype != DType::i32) bad(what, std::string("tensor '") + qw.name + "' must be I32");
  if (!sc.data) bad(what, std::string("tensor '") + sc.name + "' is missing (scales)");
  if (sc.cols != out) expect(sc, G, out, what);
  if (qz.data) {
    expect(qz, G, out / per, what);
    if (qz.dtype != DType::i32) bad(what, std::string("tensor '") + qz.name + "' must be I32");
  }
  auto gidx = [&](int64_t k) -> int64_t { return g_idx ? g_idx[k] : k / group_s; };
  bool trivial = true;
  for (int64_t k = 0; k < in; ++k) {
    const int64_t g = gidx(k);
    if (g < 0 || g >= G) bad(what, "g_idx[" + std::to_string(k) + "] = " + std::to_string(g) + " is outside the " + std::to_string(G) + " groups");
    trivial = trivial && g == k / group_s;
  }
  if (trivial && G != ceil_div(in, group_s))
    bad(what, std::string("tensor '") + sc.name + "' has " + std::to_string(G) + " groups, expected " + std::to_string(ceil_div(in, group_s)) +
                  " for group " + std::to_string(p.group));
  auto q = [&](int64_t n, int64_t k) { return static_cast<int>((static_cast<uint32_t>(qw.at_i32(k / per, n)) >> (p.bits * (k % per))) & mask); };
  auto zero = [&](int64_t n, int64_t g) {
    if (!qz.data) return static_cast<float>(1 << (p.bits - 1));
    const uint32_t v = (static_cast<uint32_t>(qz.at_i32(g, n / per)) >> (p.bits * (n % per))) & mask;
    return static_cast<float>(v) + (p.zero_plus_one ? 1.0f : 0.0f);
  };
  auto scale = [&](int64_t n, int64_t g) { return sc.at_f32(g, n); };
  if (trivial) return build(p.bits, in, out, static_cast<int>(group_s), q, scale, zero, what);
  // desc_act: groups are not contiguous along k, so rows are dequantized (exactly) to f32.
  QuantMat m;
  m.data.resize(static_cast<size_t>(out * in) * sizeof(float));
  auto* w = reinterpret_cast<float*>(m.data.data());
  for (int64_t n = 0; n < out; ++n)
    for (int64_t k = 0; k < in; ++k) w[n * in + k] = (static_cast<float>(q(n, k)) - zero(n, gidx(k))) * scale(n, gidx(k));
  m.view = Mat{DType::f32, m.data.data(), out, in};
  return m;
}

QuantMat repack_awq(const RawTensor& qw, const RawTensor& qz, const RawTensor& sc, int64_t in, int64_t out, int group,
                    const std::string& what) {
  static constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column n%8 -> nibble (AWQ order 0,2,4,6,1,3,5,7)
  if (out % 8 != 0) bad(what, "out features must be a multiple of 8");
  const int64_t group_s = group > 0 ? group : in;
  const int64_t G = ceil_div(in, group_s);
  expect(qw, in, out / 8, what);
  expect(qz, G, out / 8, what);
  expect(sc, G, out, what);
  if (qw.dtype != DType::i32 || qz.dtype != DType::i32) bad(what, "qweight and qzeros must be I32");
  auto nib = [&](const RawTensor& t, int64_t r, int64_t n) {
    return static_cast<int>((static_cast<uint32_t>(t.at_i32(r, n / 8)) >> (4 * kNibble[n % 8])) & 15u);
  };
  return build(
      4, in, out, static_cast<int>(group_s), [&](int64_t n, int64_t k) { return nib(qw, k, n); },
      [&](int64_t n, int64_t g) { return sc.at_f32(g, n); }, [&](int64_t n, int64_t g) { return static_cast<float>(nib(qz, g, n)); }, what);
}

QuantMat repack_ct_packed(const RawTensor& pk, const RawTensor& sc, int64_t in, int64_t out, int bits, int group, const std::string& what) {
  if (bits != 4 && bits != 8) fail(ErrorKind::unsupported, what + ": compressed-tensors " + std::to_string(bits) + "-bit (supported: 4, 8)");
  const int per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const int64_t group_s = group > 0 ? group : in;
  expect(pk, out, ceil_div(in, per), what);
  if (pk.dtype != DType::i32) bad(what, std::string("tensor '") + pk.name + "' must be I32");
  if (!sc.data) bad(what, std::string("tensor '") + sc.name + "' is missing (scales)");
  expect(sc, out, ceil_div(in, group_s), what);
  return build(
      bits, in, out, static_cast<int>(group_s),
      [&](int64_t n, int64_t k) { return static_cast<int>((static_cast<uint32_t>(pk.at_i32(n, k / per)) >> (bits * (k % per))) & mask); },
      [&](int64_t n, int64_t g) { return sc.at_f32(n, g); }, [&](int64_t, int64_t) { return static_cast<float>(1 << (bits - 1)); }, what);
}

QuantMat fp8_block_view(const void* weight, const RawTensor& si, int64_t in, int64_t out, int bo, int bi, const std::string& what) {
  if (bo <= 0 || bi <= 0 || bi % 32 != 0) bad(what, "FP8 block size [" + std::to_string(bo) + ", " + std::to_string(bi) + "] is not supported (columns a multiple of 32)");
  if (!si.data) bad(what, std::string("tensor '") + si.name + "' is missing (scales)");
  expect(si, ceil_div(out, bo), ceil_div(in, bi), what);
  QuantMat m;
  const int64_t G = ceil_div(in, bi);
  m.scales.resize(static_cast<size_t>(out * G));
  for (int64_t n = 0; n < out; ++n)
    for (int64_t g = 0; g < G; ++g) m.scales[static_cast<size_t>(n * G + g)] = si.at_f32(n / bo, g);
  m.view = Mat{DType::u8, weight, out, in, Quant::ext, m.scales.data(), nullptr, bi};
  m.view.ext = static_cast<uint32_t>(ExtType::fp8_e4m3);
  check_mat(m.view, what);
  return m;
}

}  // namespace hmoe::cpu
