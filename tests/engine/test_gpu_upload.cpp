// engine/layers/gpu_upload.h's host side: every weight view the CPU kernels take,
// quantized ones included, becomes the bf16 / fp32 values of its
// dequantized rows (what a GGUF or quantized checkpoint sends to the GPU).
#include <doctest/doctest.h>

#include <vector>

#include "engine/layers/gpu_upload.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("append_bf16 and mat_f32: plain and quantized views give their dequantized rows") {
  const int64_t rows = 6, cols = 128;
  const auto w = test::random_floats(static_cast<size_t>(rows * cols), 71, 0.5f);
  std::vector<uint16_t> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  const cpu::QuantMat q8 = cpu::quantize_int8(w.data(), rows, cols), q4 = cpu::quantize_int4(w.data(), rows, cols, 32, true);
  const std::vector<std::pair<const char*, cpu::Mat>> views = {
      {"f32", cpu::Mat{DType::f32, w.data(), rows, cols}}, {"bf16", cpu::Mat{DType::bf16, wb.data(), rows, cols}}, {"int8", q8.view}, {"int4-g32-asym", q4.view}};
  for (const auto& [name, m] : views) {
    CAPTURE(name);
    std::vector<float> want(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) cpu::row_to_f32(m, r, want.data() + r * cols);
    CHECK(mat_f32(m) == want);
    std::vector<uint16_t> got = {7};  // appends after what is there
    append_bf16(got, m);
    REQUIRE(got.size() == want.size() + 1);
    CHECK(got[0] == 7);
    for (size_t i = 0; i < want.size(); ++i) REQUIRE(got[i + 1] == f32_to_bf16(want[i]));
    // The quantized views really are quantized: their rows are not w's.
    if (m.quant != cpu::Quant::none) CHECK(want != w);
  }
}
