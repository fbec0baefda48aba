// Host side of gpu/quant.h: formats, shape checks and the upload of CPU
// views. No CUDA calls of its own (copies go through gpu/memory.h), so the
// CPU-only build compiles it too (gpu/quant_nocuda.cpp includes this file).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

#include "configs/error.h"
#include "gpu/gguf_lowbit_units.h"
#include "gpu/quant.h"
#include "io/tensor/quant_blocks.h"
#include "io/tensor/quant_blocks_lowbit.h"

namespace hmoe::gpu {

namespace {

bool is_code_type(const cpu::Mat& m) { return m.quant == cpu::Quant::ext && cpu::ggml_code_run(static_cast<cpu::ExtType>(m.ext)) > 0; }
cpu::ExtType ext_of(const cpu::Mat& m) { return static_cast<cpu::ExtType>(m.ext); }

// Group of the GPU layout for a view of format f.
int32_t gpu_group(const cpu::Mat& m, QFormat f) {
  if (f == QFormat::q8_0 || f == QFormat::q4_k) return 0;
  if (is_code_type(m)) return ext_of(m) == cpu::ExtType::q6_k ? 16 : 32;
  if (m.quant == cpu::Quant::int8_channel) return static_cast<int32_t>(m.cols);
  return m.group;
}
bool gpu_zeros(const cpu::Mat& m) {
  if (is_code_type(m)) return ext_of(m) == cpu::ExtType::q4_1 || ext_of(m) == cpu::ExtType::q5_1 || ext_of(m) == cpu::ExtType::q5_k;
  return m.zeros != nullptr;
}

}  // namespace

const char* qformat_name(QFormat f) {
  switch (f) {
    case QFormat::q8_0: return "Q8_0";
    case QFormat::q4_k: return "Q4_K";
    case QFormat::int4_group: return "int4-group";
    case QFormat::int8_group: return "int8-group";
    case QFormat::fp8_e4m3: return "fp8-e4m3";
  }
  return "?";
}

size_t QWeight::row_bytes() const {
  switch (format) {
    case QFormat::q8_0: return static_cast<size_t>(cols / 32) * 34;
    case QFormat::q4_k: return static_cast<size_t>(cols / 256) * 144;
    case QFormat::int4_group: return static_cast<size_t>(cols / 2);
    case QFormat::int8_group:
    case QFormat::fp8_e4m3: return static_cast<size_t>(cols);
  }
  return 0;
}

int64_t QWeight::groups() const {
  if (format == QFormat::int4_group || format == QFormat::int8_group || format == QFormat::fp8_e4m3) return group > 0 ? (cols + group - 1) / group : 0;
  return 0;
}

size_t QWeight::bytes() const {
  size_t b = static_cast<size_t>(rows) * stride();
  if (scales) b += static_cast<size_t>(rows * groups()) * sizeof(float);
  if (zeros) b += static_cast<size_t>(rows * groups()) * sizeof(float);
  return b;
}

QFormat qformat_of(const cpu::Mat& m, const std::string& what) {
  if (m.quant == cpu::Quant::int4_group) return QFormat::int4_group;
  if (m.quant == cpu::Quant::int8_channel) return QFormat::int8_group;
  if (m.quant == cpu::Quant::ext) {
    switch (ext_of(m)) {
      case cpu::ExtType::q8_0: return QFormat::q8_0;
      case cpu::ExtType::q4_k: return QFormat::q4_k;
      case cpu::ExtType::q4_0:
      case cpu::ExtType::q4_1: return QFormat::int4_group;
      case cpu::ExtType::q5_0:
      case cpu::ExtType::q5_1:
      case cpu::ExtType::q5_k:
      case cpu::ExtType::q6_k:
      case cpu::ExtType::int8_group: return QFormat::int8_group;
      case cpu::ExtType::fp8_e4m3: return QFormat::fp8_e4m3;
    }
  }
  fail(ErrorKind::unsupported, what + ": no GPU kernel for weights of type " + cpu::mat_type_name(m) +
                                   " (GPU quantized formats: GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K, int4/int8 groups "
                                   "(GPTQ/AWQ/compressed-tensors), fp8-e4m3)");
}

bool qformat_supported(const cpu::Mat& m) {
  if (m.quant == cpu::Quant::none) return false;
  try {
    QWeight w;
    w.format = qformat_of(m, "");
    w.rows = m.rows;
    w.cols = m.cols;
    w.group = gpu_group(m, w.format);
    static const float dummy[4] = {};
    w.data = dummy;
    w.scales = w.groups() > 0 ? dummy : nullptr;
    check_qweight(w, "");
    return true;
  } catch (const Error&) {
    return false;
  }
}

double qformat_bytes_per_weight(const cpu::Mat& m) {
  QWeight w;
  w.format = qformat_of(m, "qformat_bytes_per_weight");
  w.cols = m.cols;
  w.group = gpu_group(m, w.format);
  const double per_row = static_cast<double>(w.stride()) + static_cast<double>(w.groups()) * 4.0 * (gpu_zeros(m) ? 2 : 1);
  return per_row / static_cast<double>(m.cols);
}

void check_qweight(const QWeight& w, const std::string& what) {
  const std::string fmt = std::string(qformat_name(w.format));
  auto bad = [&](const std::string& msg) { fail(ErrorKind::unsupported, what + " (" + fmt + "): " + msg); };
  if (w.rows < 0 || w.cols <= 0) bad("rows " + std::to_string(w.rows) + ", cols " + std::to_string(w.cols) + ": not a matrix");
  if (w.rows > 0 && !w.data) bad("no data");
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0) bad("data is not 16-byte aligned");
  switch (w.format) {
    case QFormat::q8_0:
      if (w.cols % 32 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 32");
      break;
    case QFormat::q4_k:
      if (w.cols % 256 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 256");
      break;
    case QFormat::int4_group:
      if (w.group < 32 || w.group % 32 != 0 || w.cols % w.group != 0)
        bad("group " + std::to_string(w.group) + " must be a multiple of 32 dividing cols " + std::to_string(w.cols));
      if (!w.scales) bad("no scales");
      break;
    case QFormat::int8_group:
      if (w.cols % 32 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 32");
      if (w.group < 16 || w.group % 16 != 0 || w.cols % w.group != 0)
        bad("group " + std::to_string(w.group) + " must be a multiple of 16 dividing cols " + std::to_string(w.cols));
      if (!w.scales) bad("no scales");
      break;
    case QFormat::fp8_e4m3:
      if (w.cols % 32 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 32");
      if (w.group < 16 || w.group % 16 != 0) bad("group " + std::to_string(w.group) + " is not a multiple of 16");
      if (!w.scales) bad("no scales");
      break;
  }
}

namespace {

// One row of m (GGUF code type) into the GPU layout: int4 nibbles (Q4_0/Q4_1)
// or int8 codes (Q5_*, Q6_K); scales/zeros per run.
void repack_code_row(const cpu::Mat& m, int64_t r, QFormat f, uint8_t* dst, float* sc, float* zr) {
  const cpu::ExtType t = ext_of(m);
  const cpu::ExtTypeInfo* info = cpu::ext_type_info(m.ext);
  const int run = cpu::ggml_code_run(t), nb = info->block_elems;
  const uint8_t* src = m.row(r);
  uint8_t code[256];
  float s[16], z[16];
  for (int64_t b = 0; b < m.cols / nb; ++b) {
    cpu::ggml_block_codes(t, src + b * info->block_bytes, code, s, z);
    const int64_t e0 = b * nb, g0 = e0 / run;
    for (int j = 0; j < nb / run; ++j) {
      sc[g0 + j] = s[j];
      if (zr) zr[g0 + j] = z[j];
    }
    if (f == QFormat::int4_group) {  // runs of 32 in 16 bytes: low nibble i, high nibble i + 16
      for (int i = 0; i < 16; ++i) dst[e0 / 2 + i] = static_cast<uint8_t>(code[i] | (code[i + 16] << 4));
    } else {  // u8 codes; integer zero points fold into the code (zero point 128, no zeros array)
      for (int k = 0; k < nb; ++k) dst[e0 + k] = static_cast<uint8_t>(zr ? code[k] : code[k] + 128 - static_cast<int>(z[k / run]));
    }
  }
}

}  // namespace

QHostMat qrepack(const std::vector<cpu::Mat>& parts, const std::string& what) {
  if (parts.empty()) fail(ErrorKind::invalid_argument, what + ": no matrices to upload");
  const cpu::Mat& p0 = parts[0];
  QHostMat h;
  QWeight& w = h.w;
  w.format = qformat_of(p0, what);
  w.cols = p0.cols;
  w.group = gpu_group(p0, w.format);
  const bool has_zeros = gpu_zeros(p0);
  for (const cpu::Mat& m : parts) {
    if (m.quant != p0.quant || m.ext != p0.ext || m.cols != p0.cols || m.group != p0.group || (m.zeros != nullptr) != (p0.zeros != nullptr))
      fail(ErrorKind::invalid_argument, what + ": stacked matrices differ in type, columns or group (" + cpu::mat_type_name(m) + " vs " +
                                            cpu::mat_type_name(p0) + ")");
    w.rows += m.rows;
  }
  const size_t rb = w.row_bytes(), st = w.stride();
  const int64_t G = w.groups();
  h.data.assign(static_cast<size_t>(w.rows) * st, 0);
  h.scales.assign(static_cast<size_t>(w.rows * G), 0.0f);
  h.zeros.assign(has_zeros ? h.scales.size() : 0, 0.0f);
  size_t r0 = 0;
  for (const cpu::Mat& m : parts) {
    const bool codes = is_code_type(m);
    if (!codes && m.quant != cpu::Quant::int8_channel && m.row_bytes() != rb)
      fail(ErrorKind::internal, what + ": row bytes of the CPU view and the GPU format disagree");
    if (!codes && G > 0 && !m.scales) fail(ErrorKind::bad_model, what + ": quantized weights without scales");
    for (int64_t r = 0; r < m.rows; ++r) {
      uint8_t* dst = h.data.data() + (r0 + static_cast<size_t>(r)) * st;
      float* sc = G > 0 ? h.scales.data() + (r0 + static_cast<size_t>(r)) * static_cast<size_t>(G) : nullptr;
      float* zr = has_zeros ? h.zeros.data() + (r0 + static_cast<size_t>(r)) * static_cast<size_t>(G) : nullptr;
      if (codes) {
        repack_code_row(m, r, w.format, dst, sc, zr);
      } else if (m.quant == cpu::Quant::int8_channel) {  // signed int8 -> u8 codes around 128
        const auto* q = reinterpret_cast<const int8_t*>(m.row(r));
        for (int64_t k = 0; k < m.cols; ++k) dst[k] = static_cast<uint8_t>(q[k] + 128);
        sc[0] = m.scales[r];
      } else {
        std::memcpy(dst, m.row(r), rb);
        if (G > 0) std::memcpy(sc, m.scales + r * G, static_cast<size_t>(G) * sizeof(float));
        if (zr) std::memcpy(zr, m.zeros + r * G, static_cast<size_t>(G) * sizeof(float));
      }
    }
    r0 += static_cast<size_t>(m.rows);
  }
  w.data = h.data.data();
  w.scales = G > 0 ? h.scales.data() : nullptr;
  w.zeros = has_zeros ? h.zeros.data() : nullptr;
  check_qweight(w, what);
  return h;
}

float qhost_weight_at(const QHostMat& h, int64_t r, int64_t k) {
  const QWeight& w = h.w;
  const uint8_t* row = h.data.data() + static_cast<size_t>(r) * w.stride();
  const int64_t g = w.group > 0 ? k / w.group : 0, G = w.groups();
  const float s = G > 0 ? h.scales[static_cast<size_t>(r * G + g)] : 0.0f;
  switch (w.format) {
    case QFormat::q8_0:
    case QFormat::q4_k: {
      const auto t = w.format == QFormat::q8_0 ? cpu::ExtType::q8_0 : cpu::ExtType::q4_k;
      const cpu::ExtTypeInfo* info = cpu::ext_type_info(static_cast<uint32_t>(t));
      float blk[256];
      cpu::dequant_block(t, row + (k / info->block_elems) * info->block_bytes, blk);
      return blk[k % info->block_elems];
    }
    case QFormat::int4_group: {
      const int64_t base = k / 32 * 16, i = k % 32;
      const int q = i < 16 ? row[base + i] & 0xF : row[base + i - 16] >> 4;
      const float z = w.zeros ? h.zeros[static_cast<size_t>(r * G + g)] : 8.0f;
      return s * (static_cast<float>(q) - z);
    }
    case QFormat::int8_group: {
      const float z = w.zeros ? h.zeros[static_cast<size_t>(r * G + g)] : 128.0f;
      return s * (static_cast<float>(row[k]) - z);
    }
    case QFormat::fp8_e4m3: return cpu::fp8_e4m3_to_f32(row[k]) * s;
  }
  return 0.0f;
}

QDeviceMat::QDeviceMat(const std::vector<cpu::Mat>& parts, Stream& s, const std::string& what) {
  QHostMat h = qrepack(parts, what);
  w_ = h.w;
  data_ = DeviceBuffer(h.data.size());
  copy_to_device(data_.data(), h.data.data(), h.data.size(), s);
  if (!h.scales.empty()) {
    scales_ = DeviceBuffer(h.scales.size() * sizeof(float));
    copy_to_device(scales_.data(), h.scales.data(), h.scales.size() * sizeof(float), s);
  }
  if (!h.zeros.empty()) {
    zeros_ = DeviceBuffer(h.zeros.size() * sizeof(float));
    copy_to_device(zeros_.data(), h.zeros.data(), h.zeros.size() * sizeof(float), s);
  }
  s.synchronize();  // the host vectors go out of scope
  w_.data = data_.data();
  w_.scales = h.scales.empty() ? nullptr : scales_.as<float>();
  w_.zeros = h.zeros.empty() ? nullptr : zeros_.as<float>();
  check_qweight(w_, what);
}

}  // namespace hmoe::gpu

namespace hmoe::gpu {

// ---- GGUF blocks as stored ----------------------------------------------------

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::q4_k: return "Q4_K";
    case GgufType::q5_k: return "Q5_K";
    case GgufType::q6_k: return "Q6_K";
    case GgufType::q8_0: return "Q8_0";
    case GgufType::q2_k: return "Q2_K";
    case GgufType::q3_k: return "Q3_K";
    case GgufType::iq1_s: return "IQ1_S";
    case GgufType::iq1_m: return "IQ1_M";
    case GgufType::iq2_xxs: return "IQ2_XXS";
    case GgufType::iq2_xs: return "IQ2_XS";
    case GgufType::iq2_s: return "IQ2_S";
    case GgufType::iq3_xxs: return "IQ3_XXS";
    case GgufType::iq3_s: return "IQ3_S";
    case GgufType::iq4_xs: return "IQ4_XS";
    case GgufType::iq4_nl: return "IQ4_NL";
    case GgufType::mxfp4: return "MXFP4";
  }
  return "?";
}

namespace {
// ggml type ids of the GgufType values, in enum order.
constexpr uint32_t kGgmlIds[] = {12, 13, 14, 8, 10, 11, 19, 29, 16, 17, 22, 18, 21, 23, 20, 39};
uint32_t ggml_id(GgufType t) { return kGgmlIds[static_cast<size_t>(t)]; }
}  // namespace

bool gguf_type_lowbit(GgufType t) { return cpu::lowbit_type(ggml_id(t)); }

bool gguf_type_from_ggml(uint32_t ggml_type, GgufType& t) {
  for (size_t i = 0; i < std::size(kGgmlIds); ++i)
    if (kGgmlIds[i] == ggml_type) {
      t = static_cast<GgufType>(i);
      return true;
    }
  return false;
}

size_t GgufWeight::row_bytes() const {
  const cpu::ExtTypeInfo* ti = cpu::ext_type_info(ggml_id(type));
  return ti ? static_cast<size_t>(cols / ti->block_elems) * static_cast<size_t>(ti->block_bytes) : 0;
}

namespace {
bool gguf_type_from(const cpu::Mat& m, GgufType& t) { return m.quant == cpu::Quant::ext && gguf_type_from_ggml(static_cast<uint32_t>(m.ext), t); }
}  // namespace

GgufType gguf_type_of(const cpu::Mat& m, const std::string& what) {
  GgufType t{};
  if (!gguf_type_from(m, t))
    fail(ErrorKind::unsupported, what + ": weights of type " + cpu::mat_type_name(m) +
                                     " are not GGUF blocks the GPU kernels read as stored (Q4_K/Q5_K/Q6_K/Q8_0 and Q2_K/Q3_K/IQ1-IQ4/MXFP4)");
  return t;
}

namespace {
std::atomic<GgufDecodeKernel> g_decode_kernel{GgufDecodeKernel::direct};
}  // namespace
void set_gguf_decode_kernel(GgufDecodeKernel k) { g_decode_kernel.store(k); }
GgufDecodeKernel gguf_decode_kernel() { return g_decode_kernel.load(); }

namespace {
std::atomic<GgufPrefillKernel> g_prefill_kernel{GgufPrefillKernel::pipelined};
}  // namespace
void set_gguf_prefill_kernel(GgufPrefillKernel k) { g_prefill_kernel.store(k); }
GgufPrefillKernel gguf_prefill_kernel() { return g_prefill_kernel.load(); }
const char* gguf_prefill_kernel_name(GgufPrefillKernel k) {
  switch (k) {
    case GgufPrefillKernel::simple: return "simple";
    case GgufPrefillKernel::pipelined: return "pipelined";
    case GgufPrefillKernel::pipelined64: return "pipelined64";
    case GgufPrefillKernel::pipelined128: return "pipelined128";
  }
  return "?";
}

void check_gguf_weight(const GgufWeight& w, const std::string& what) {
  auto bad = [&](const std::string& msg) { fail(ErrorKind::unsupported, what + " (" + gguf_type_name(w.type) + "): " + msg); };
  if (w.rows < 0 || w.cols <= 0) bad("rows " + std::to_string(w.rows) + ", cols " + std::to_string(w.cols) + ": not a matrix");
  if (w.rows > INT32_MAX / 2 || w.cols > (1 << 20)) bad("matrix too large");
  const int64_t unit = w.type == GgufType::q8_0 || w.type == GgufType::iq4_nl || w.type == GgufType::mxfp4 ? 64 : 256;
  if (w.cols % unit != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of " + std::to_string(unit));
  if (w.rows > 0 && !w.data) bad("no data");
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0) bad("data is not 16-byte aligned");
}

bool gguf_native_supported(const cpu::Mat& m) {
  GgufType t{};
  if (!gguf_type_from(m, t)) return false;
  GgufWeight w;
  w.type = t;
  w.rows = m.rows;
  w.cols = m.cols;
  alignas(16) static const uint8_t dummy[16] = {};
  w.data = dummy;
  try {
    check_gguf_weight(w, "");
    return true;
  } catch (const Error&) {
    return false;
  }
}

GgufDeviceMat::GgufDeviceMat(const std::vector<cpu::Mat>& parts, Stream& s, const std::string& what) {
  if (parts.empty()) fail(ErrorKind::invalid_argument, what + ": no matrices to upload");
  w_.type = gguf_type_of(parts[0], what);
  w_.cols = parts[0].cols;
  for (const cpu::Mat& m : parts) {
    if (m.quant != parts[0].quant || m.ext != parts[0].ext || m.cols != parts[0].cols)
      fail(ErrorKind::invalid_argument, what + ": stacked matrices differ in type or columns (" + cpu::mat_type_name(m) + " vs " +
                                            cpu::mat_type_name(parts[0]) + ")");
    w_.rows += m.rows;
  }
  w_.data = reinterpret_cast<const void*>(uintptr_t{16});  // checked for shape only; the real pointer follows
  check_gguf_weight(w_, what);
  const size_t rb = w_.row_bytes();
  data_ = DeviceBuffer(w_.bytes() + 16);  // gguf_moe_gemm reads words up to 16 bytes past the last row
  size_t at = 0;
  for (const cpu::Mat& m : parts) {
    if (m.row_bytes() != rb) fail(ErrorKind::internal, what + ": row bytes of the CPU view and the GPU format disagree");
    const size_t b = static_cast<size_t>(m.rows) * rb;
    copy_to_device(data_.as<uint8_t>() + at, m.data, b, s);
    at += b;
  }
  memset_device(data_.as<uint8_t>() + at, 0, 16, s);
  s.synchronize();
  w_.data = data_.data();
  if (gguf_type_lowbit(w_.type)) detail::gguf::device_lowbit_tables();  // uploaded now, before any graph capture
}

}  // namespace hmoe::gpu
