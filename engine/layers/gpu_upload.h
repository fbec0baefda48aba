// Host weights to the GPU, for the CUDA layer implementations
// (engine/layers/*_gpu.cpp).
//
// Contract: append_bf16 and mat_f32 take any weight view the CPU kernels
// take - bf16/f16/f32, int8/int4 and the GGUF/FP8 block formats - and
// dequantize it (numa/kernels.h row_to_f32), so a quantized checkpoint's
// weights reach the GPU as bf16. upload() and upload_bf16() copy
// synchronously on `s` into a new device buffer (at least 16 bytes); in a
// build without CUDA they throw Error(unsupported).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/layers/weights.h"
#include "gpu/kernels.h"
#include "gpu/memory.h"
#include "gpu/quant.h"
#include "numa/kernels.h"

namespace hmoe {

// Writes m's rows * cols values to dst as bf16 bits.
void write_bf16(const cpu::Mat& m, uint16_t* dst);
// Appends them to dst.
void append_bf16(std::vector<uint16_t>& dst, const cpu::Mat& m);
// m's rows * cols values as fp32, row-major.
std::vector<float> mat_f32(const cpu::Mat& m);

gpu::DeviceBuffer upload(const void* src, size_t bytes, gpu::Stream& s);
// The parts, each converted by append_bf16, one after another in one buffer.
gpu::DeviceBuffer upload_bf16(const std::vector<cpu::Mat>& parts, gpu::Stream& s);

// A dense weight [rows, cols] on the GPU: bf16, or, for GGUF Q4_K/Q5_K/Q6_K/
// Q8_0 and low-bit (Q2_K, Q3_K, IQ1-IQ4, MXFP4) views when the uploader keeps
// them (setting gpu_quantized_dense), the file's blocks (gpu/quant.h),
// multiplied by gpu::gguf_gemv for up to
// kGemvMaxTokens rows of x and, for more, dequantized to bf16 a chunk of rows
// at a time into a scratch buffer for cuBLAS.
class GpuDense {
 public:
  static constexpr int64_t kGemvMaxTokens = 32;
  GpuDense() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool quantized() const { return quant_.has_value(); }
  uint64_t bytes() const;
  // Scratch bytes gemm() needs for n rows of x (0 for bf16 or GEMV-sized n).
  size_t scratch_bytes(int64_t n) const;
  // y[t, r] (row stride ldy) = sum_k x[t, k] W[r, k] for t < n; x bf16 [n, cols];
  // scratch: at least scratch_bytes(n) bytes of device memory (16-byte aligned).
  void gemm(gpu::Blas& blas, const uint16_t* x, int64_t n, float* y, int64_t ldy, void* scratch, gpu::Stream& s) const;
  // Whether gemm_normed() takes n rows: GGUF blocks and one row (decode at
  // batch 1; gpu::norm_gemv_fits).
  bool normed_fits(int64_t n) const;
  // gpu::add_rms_norm (x += delta, hb = the normed row) and gemm() of hb in
  // one launch (gpu::add_rms_norm_gguf_gemv; counter: 0 before and after).
  void gemm_normed(float* x, const float* delta, int64_t n, const uint16_t* norm_w, float eps, uint16_t* hb, float* y, int64_t ldy, int32_t* counter,
                   gpu::Stream& s) const;
  // The bf16 weights (null when quantized).
  const uint16_t* bf16() const { return bf16_.as<uint16_t>(); }

 private:
  friend class GpuUploader;
  int64_t rows_ = 0, cols_ = 0;
  gpu::DeviceBuffer bf16_;
  std::optional<gpu::GgufDeviceMat> quant_;
};

// What a GPU layer uploads, counted, with the host pages of each uploaded
// view released afterwards (WeightBinder::release): the GPU layers' uploads.
class GpuUploader {
 public:
  GpuUploader(WeightBinder& bind, gpu::Stream& s) : bind_(bind), s_(s) {}
  WeightBinder& bind() { return bind_; }
  gpu::Stream& stream() { return s_; }
  // The parts as bf16, one after another.
  gpu::DeviceBuffer bf16(const std::vector<cpu::Mat>& parts);
  // As fp32 (routers that must not round).
  gpu::DeviceBuffer f32(const cpu::Mat& m);
  gpu::DeviceBuffer raw(const void* src, size_t bytes);
  // A dense weight: GGUF blocks kept as stored when keep_gguf() and the
  // kernels take the view, else bf16.
  GpuDense dense(const cpu::Mat& m);
  // Parts stacked by rows into one weight (one product for all): kept as
  // stored only when every part is the same GGUF type the kernels take.
  GpuDense dense(const std::vector<cpu::Mat>& parts);
  void set_keep_gguf(bool on) { keep_gguf_ = on; }
  bool keep_gguf() const { return keep_gguf_; }
  uint64_t bytes() const { return bytes_; }

 private:
  WeightBinder& bind_;
  gpu::Stream& s_;
  uint64_t bytes_ = 0;
  bool keep_gguf_ = true;
};

}  // namespace hmoe
