// Host weights to the GPU (see gpu_upload.h).
#include "engine/layers/gpu_upload.h"

#include <algorithm>
#include <cstring>

namespace hmoe {

void write_bf16(const cpu::Mat& m, uint16_t* dst) {
  if (m.dtype == DType::bf16 && m.quant == cpu::Quant::none) {
    std::memcpy(dst, m.data, static_cast<size_t>(m.rows * m.cols) * 2);
    return;
  }
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    cpu::row_to_f32(m, r, row.data());
    for (int64_t c = 0; c < m.cols; ++c) dst[static_cast<size_t>(r * m.cols + c)] = f32_to_bf16(row[static_cast<size_t>(c)]);
  }
}

void append_bf16(std::vector<uint16_t>& dst, const cpu::Mat& m) {
  const size_t at = dst.size();
  dst.resize(at + static_cast<size_t>(m.rows * m.cols));
  write_bf16(m, dst.data() + at);
}

std::vector<float> mat_f32(const cpu::Mat& m) {
  std::vector<float> v(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) cpu::row_to_f32(m, r, v.data() + r * m.cols);
  return v;
}

gpu::DeviceBuffer upload(const void* src, size_t bytes, gpu::Stream& s) {
  gpu::DeviceBuffer d(std::max<size_t>(bytes, 16));
  gpu::copy_to_device(d.data(), src, bytes, s);
  s.synchronize();
  return d;
}

gpu::DeviceBuffer upload_bf16(const std::vector<cpu::Mat>& parts, gpu::Stream& s) {
  std::vector<uint16_t> host;
  for (const cpu::Mat& m : parts) append_bf16(host, m);
  return upload(host.data(), host.size() * 2, s);
}

gpu::DeviceBuffer GpuUploader::bf16(const std::vector<cpu::Mat>& parts) {
  gpu::DeviceBuffer b = upload_bf16(parts, s_);
  bytes_ += b.bytes();
  for (const auto& m : parts) bind_.release(m);
  return b;
}

gpu::DeviceBuffer GpuUploader::f32(const cpu::Mat& m) {
  const std::vector<float> v = mat_f32(m);
  gpu::DeviceBuffer b = upload(v.data(), v.size() * sizeof(float), s_);
  bytes_ += b.bytes();
  bind_.release(m);
  return b;
}

gpu::DeviceBuffer GpuUploader::raw(const void* src, size_t bytes) {
  gpu::DeviceBuffer b = upload(src, bytes, s_);
  bytes_ += b.bytes();
  return b;
}

}  // namespace hmoe
