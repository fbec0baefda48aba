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
#include <vector>

#include "engine/layers/weights.h"
#include "gpu/memory.h"
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
  uint64_t bytes() const { return bytes_; }

 private:
  WeightBinder& bind_;
  gpu::Stream& s_;
  uint64_t bytes_ = 0;
};

}  // namespace hmoe
