// Host weights to the GPU (see gpu_upload.h).
#include "engine/layers/gpu_upload.h"

#include <algorithm>
#include <cstring>

#include "configs/error.h"
#include "gpu/decode_fused.h"

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

GpuDense GpuUploader::dense(const cpu::Mat& m) { return dense(std::vector<cpu::Mat>{m}); }

GpuDense GpuUploader::dense(const std::vector<cpu::Mat>& parts) {
  GpuDense d;
  bool native = keep_gguf_ && !parts.empty();
  for (const cpu::Mat& m : parts) {
    d.rows_ += m.rows;
    d.cols_ = m.cols;
    native = native && gpu::gguf_native_supported(m) && m.ext == parts[0].ext && m.cols == parts[0].cols;
  }
  if (native) {
    d.quant_.emplace(parts, s_, "GPU weight");
    bytes_ += d.quant_->weight().bytes();
    for (const cpu::Mat& m : parts) bind_.release(m);
    return d;
  }
  d.bf16_ = bf16(parts);
  return d;
}

uint64_t GpuDense::bytes() const { return quant_ ? quant_->weight().bytes() : bf16_.bytes(); }

namespace {
constexpr size_t kDequantChunkBytes = size_t{64} << 20;  // bf16 rows per cuBLAS chunk of a big pass
int64_t chunk_rows(int64_t rows, int64_t cols) { return std::max<int64_t>(1, std::min<int64_t>(rows, static_cast<int64_t>(kDequantChunkBytes) / (cols * 2))); }
}  // namespace

size_t GpuDense::scratch_bytes(int64_t n) const {
  if (!quant_ || n <= kGemvMaxTokens) return 0;
  return static_cast<size_t>(chunk_rows(rows_, cols_) * cols_) * 2;
}

bool GpuDense::normed_fits(int64_t n) const { return quant_.has_value() && gpu::norm_gemv_fits(quant_->weight(), n); }

void GpuDense::gemm_normed(float* x, const float* delta, int64_t n, const uint16_t* norm_w, float eps, uint16_t* hb, float* y, int64_t ldy,
                           int32_t* counter, gpu::Stream& s) const {
  if (!normed_fits(n)) fail(ErrorKind::internal, "GpuDense::gemm_normed: not a GGUF weight, or more than one row");
  gpu::add_rms_norm_gguf_gemv(x, delta, n, norm_w, eps, hb, nullptr, quant_->weight(), y, ldy, counter, s);
}

void GpuDense::gemm(gpu::Blas& blas, const uint16_t* x, int64_t n, float* y, int64_t ldy, void* scratch, gpu::Stream& s) const {
  if (!quant_) return blas.gemm(x, n, bf16_.as<uint16_t>(), rows_, cols_, y, ldy);
  if (n <= kGemvMaxTokens) return gpu::gguf_gemv(quant_->weight(), x, n, y, ldy, s);
  const int64_t chunk = chunk_rows(rows_, cols_);
  auto* w = static_cast<uint16_t*>(scratch);
  for (int64_t r0 = 0; r0 < rows_; r0 += chunk) {
    const int64_t rn = std::min(chunk, rows_ - r0);
    gpu::gguf_dequant(quant_->weight(), r0, rn, w, s);
    blas.gemm(x, n, w, rn, cols_, y + r0, ldy);
  }
}

}  // namespace hmoe
