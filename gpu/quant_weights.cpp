// Host side of gpu/quant.h: formats, shape checks and the upload of CPU
// views. No CUDA calls of its own (copies go through gpu/memory.h), so the
// CPU-only build compiles it too (gpu/quant_nocuda.cpp includes this file).
#include <cstring>

#include "configs/error.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"

namespace hmoe::gpu {

const char* qformat_name(QFormat f) {
  switch (f) {
    case QFormat::q8_0: return "Q8_0";
    case QFormat::q4_k: return "Q4_K";
    case QFormat::int4_group: return "int4-group";
    case QFormat::fp8_e4m3: return "fp8-e4m3";
  }
  return "?";
}

size_t QWeight::row_bytes() const {
  switch (format) {
    case QFormat::q8_0: return static_cast<size_t>(cols / 32) * 34;
    case QFormat::q4_k: return static_cast<size_t>(cols / 256) * 144;
    case QFormat::int4_group: return static_cast<size_t>(cols / 2);
    case QFormat::fp8_e4m3: return static_cast<size_t>(cols);
  }
  return 0;
}

int64_t QWeight::groups() const {
  if (format == QFormat::int4_group || format == QFormat::fp8_e4m3) return group > 0 ? (cols + group - 1) / group : 0;
  return 0;
}

size_t QWeight::bytes() const {
  size_t b = static_cast<size_t>(rows) * row_bytes();
  if (scales) b += static_cast<size_t>(rows * groups()) * sizeof(float);
  if (zeros) b += static_cast<size_t>(rows * groups()) * sizeof(float);
  return b;
}

QFormat qformat_of(const cpu::Mat& m, const std::string& what) {
  if (m.quant == cpu::Quant::int4_group) return QFormat::int4_group;
  if (m.quant == cpu::Quant::ext) {
    switch (static_cast<cpu::ExtType>(m.ext)) {
      case cpu::ExtType::q8_0: return QFormat::q8_0;
      case cpu::ExtType::q4_k: return QFormat::q4_k;
      case cpu::ExtType::fp8_e4m3: return QFormat::fp8_e4m3;
      default: break;
    }
  }
  fail(ErrorKind::unsupported, what + ": no GPU kernel for weights of type " + cpu::mat_type_name(m) +
                                   " (GPU quantized formats: Q8_0, Q4_K, int4-group (GPTQ/AWQ/compressed-tensors), fp8-e4m3)");
}

void check_qweight(const QWeight& w, const std::string& what) {
  const std::string fmt = std::string(qformat_name(w.format));
  auto bad = [&](const std::string& msg) { fail(ErrorKind::unsupported, what + " (" + fmt + "): " + msg); };
  if (w.rows < 0 || w.cols <= 0) bad("rows " + std::to_string(w.rows) + ", cols " + std::to_string(w.cols) + ": not a matrix");
  if (w.rows > 0 && !w.data) bad("no data");
  if (reinterpret_cast<uintptr_t>(w.data) % 16 != 0) bad("data is not 16-byte aligned");
  switch (w.format) {
    case QFormat::q8_0:
      if (w.cols % 256 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 256");
      break;
    case QFormat::q4_k:
      if (w.cols % 256 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 256");
      break;
    case QFormat::int4_group:
      if (w.group < 32 || w.group % 32 != 0 || w.cols % w.group != 0)
        bad("group " + std::to_string(w.group) + " must be a multiple of 32 dividing cols " + std::to_string(w.cols));
      if (!w.scales) bad("no scales");
      break;
    case QFormat::fp8_e4m3:
      if (w.cols % 32 != 0) bad("cols " + std::to_string(w.cols) + " is not a multiple of 32");
      if (w.group < 16 || w.group % 16 != 0) bad("group " + std::to_string(w.group) + " is not a multiple of 16");
      if (!w.scales) bad("no scales");
      break;
  }
}

QDeviceMat::QDeviceMat(const std::vector<cpu::Mat>& parts, Stream& s, const std::string& what) {
  if (parts.empty()) fail(ErrorKind::invalid_argument, what + ": no matrices to upload");
  const cpu::Mat& p0 = parts[0];
  w_.format = qformat_of(p0, what);
  w_.cols = p0.cols;
  w_.group = (w_.format == QFormat::int4_group || w_.format == QFormat::fp8_e4m3) ? p0.group : 0;
  const bool has_zeros = p0.zeros != nullptr;
  for (const cpu::Mat& m : parts) {
    if (m.quant != p0.quant || m.ext != p0.ext || m.cols != p0.cols || m.group != p0.group || (m.zeros != nullptr) != has_zeros)
      fail(ErrorKind::invalid_argument, what + ": stacked matrices differ in type, columns or group (" + cpu::mat_type_name(m) + " vs " +
                                            cpu::mat_type_name(p0) + ")");
    w_.rows += m.rows;
  }
  const size_t rb = w_.row_bytes();
  const int64_t G = w_.groups();
  std::vector<uint8_t> data(static_cast<size_t>(w_.rows) * rb);
  std::vector<float> scales(static_cast<size_t>(w_.rows * G)), zeros(has_zeros ? scales.size() : 0);
  size_t r0 = 0;
  for (const cpu::Mat& m : parts) {
    if (m.row_bytes() != rb) fail(ErrorKind::internal, what + ": row bytes of the CPU view and the GPU format disagree");
    std::memcpy(data.data() + r0 * rb, m.data, static_cast<size_t>(m.rows) * rb);
    if (G > 0) {
      if (!m.scales) fail(ErrorKind::bad_model, what + ": quantized weights without scales");
      std::memcpy(scales.data() + r0 * static_cast<size_t>(G), m.scales, static_cast<size_t>(m.rows * G) * sizeof(float));
      if (has_zeros) std::memcpy(zeros.data() + r0 * static_cast<size_t>(G), m.zeros, static_cast<size_t>(m.rows * G) * sizeof(float));
    }
    r0 += static_cast<size_t>(m.rows);
  }
  data_ = DeviceBuffer(data.size());
  copy_to_device(data_.data(), data.data(), data.size(), s);
  if (G > 0) {
    scales_ = DeviceBuffer(scales.size() * sizeof(float));
    copy_to_device(scales_.data(), scales.data(), scales.size() * sizeof(float), s);
    if (has_zeros) {
      zeros_ = DeviceBuffer(zeros.size() * sizeof(float));
      copy_to_device(zeros_.data(), zeros.data(), zeros.size() * sizeof(float), s);
    }
  }
  s.synchronize();  // the host vectors go out of scope
  w_.data = data_.data();
  w_.scales = G > 0 ? scales_.as<float>() : nullptr;
  w_.zeros = has_zeros ? zeros_.as<float>() : nullptr;
  check_qweight(w_, what);
}

}  // namespace hmoe::gpu
