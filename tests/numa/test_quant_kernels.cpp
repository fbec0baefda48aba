// GGUF block / FP8 / int8-group kernels against a scalar
// dequantize-then-multiply reference, on random data with rows of 2048 and
// 7168 weights, on every ISA this CPU has.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "configs/error.h"
#include "numa/kernels.h"
#include "numa/quant_gguf.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;
using cpu::ExtType;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// y = x W^T with W dequantized row by row, double accumulation.
std::vector<double> reference(const std::vector<float>& x, int64_t n, const cpu::Mat& w, std::vector<double>* absdot) {
  std::vector<double> y(static_cast<size_t>(n * w.rows));
  if (absdot) absdot->assign(y.size(), 0.0);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    cpu::row_to_f32(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        s += static_cast<double>(x[static_cast<size_t>(t * w.cols + k)]) * row[static_cast<size_t>(k)];
        a += std::fabs(static_cast<double>(x[static_cast<size_t>(t * w.cols + k)]) * row[static_cast<size_t>(k)]);
      }
      y[static_cast<size_t>(t * w.rows + r)] = s;
      if (absdot) (*absdot)[static_cast<size_t>(t * w.rows + r)] = a;
    }
  }
  return y;
}

void check_all_isas(const cpu::Mat& w, uint32_t seed) {
  for (int64_t n : {1, 3, 6}) {
    const auto x = randn(static_cast<size_t>(n * w.cols), seed + static_cast<uint32_t>(n));
    std::vector<double> absdot;
    const auto ref = reference(x, n, w, &absdot);
    for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
      const cpu::Isa old = cpu::set_isa_for_testing(isa);
      std::vector<float> y(static_cast<size_t>(n * w.rows), NAN);
      cpu::gemm_rows(x.data(), w.cols, n, w, 0, w.rows, y.data(), w.rows);
      cpu::set_isa_for_testing(old);
      double worst = 0;
      for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]) / (absdot[i] + 1e-30));
      INFO(cpu::mat_type_name(w) << " cols " << w.cols << " n " << n << " isa " << cpu::isa_name(isa));
      CHECK(worst < 2e-6);
    }
  }
}

}  // namespace

TEST_CASE("ggml block types: quantize, dequantize and every ISA's kernel agree with the scalar reference") {
  const ExtType types[] = {ExtType::q4_0, ExtType::q4_1, ExtType::q5_0, ExtType::q5_1, ExtType::q8_0,
                           ExtType::q4_k, ExtType::q5_k, ExtType::q6_k};
  // Round-trip error bounds (RMS relative to the data's RMS) that RTN at the
  // type's bit width meets; a wrong layout gives errors of order 1.
  const double bound[] = {0.12, 0.09, 0.06, 0.045, 0.01, 0.1, 0.05, 0.03};
  for (int64_t cols : {2048, 7168}) {
    const int64_t rows = 5;
    const auto w = randn(static_cast<size_t>(rows * cols), static_cast<uint32_t>(cols), 0.02f);
    for (size_t ti = 0; ti < std::size(types); ++ti) {
      const auto bytes = qtools::quant_rows(types[ti], w.data(), rows, cols);
      const cpu::Mat m = cpu::ext_view(types[ti], bytes.data(), rows, cols, "test");
      CHECK_NOTHROW(cpu::check_mat(m, "test"));
      CHECK(m.row_bytes() * rows == bytes.size());
      std::vector<float> row(static_cast<size_t>(cols));
      double err = 0, ss = 0;
      for (int64_t r = 0; r < rows; ++r) {
        cpu::row_to_f32(m, r, row.data());
        for (int64_t k = 0; k < cols; ++k) {
          const double d = row[static_cast<size_t>(k)] - w[static_cast<size_t>(r * cols + k)];
          err += d * d;
          ss += static_cast<double>(w[static_cast<size_t>(r * cols + k)]) * w[static_cast<size_t>(r * cols + k)];
          if (k % 997 == 0) CHECK(cpu::ext_weight_at(m, r, k) == row[static_cast<size_t>(k)]);
        }
      }
      INFO(cpu::mat_type_name(m) << " cols " << cols);
      CHECK(std::sqrt(err / ss) < bound[ti]);
      check_all_isas(m, static_cast<uint32_t>(ti * 100 + cols));
    }
  }
}

TEST_CASE("FP8 e4m3: every code decodes as the format defines it") {
  for (int b = 0; b < 256; ++b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
    if (e == 15 && m == 7) v = 480;  // NaN code: documented as +-480
    CHECK(cpu::fp8_e4m3_to_f32(static_cast<uint8_t>(b)) == static_cast<float>(s ? -v : v));
  }
  CHECK(cpu::fp8_e4m3_to_f32(qtools::f32_to_fp8_e4m3(448.0f)) == 448.0f);
  CHECK(cpu::fp8_e4m3_to_f32(qtools::f32_to_fp8_e4m3(-0.3125f)) == -0.3125f);
}

TEST_CASE("FP8 block-scaled and int8-group views: every ISA against the reference") {
  for (int64_t cols : {2048, 7168}) {
    const int64_t rows = 5;
    const auto w = randn(static_cast<size_t>(rows * cols), 7u + static_cast<uint32_t>(cols), 0.05f);
    // FP8: group 128, scales per row and group.
    std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
    const int64_t G = cols / 128;
    auto sc = randn(static_cast<size_t>(rows * G), 3, 1.0f);
    for (auto& s : sc) s = 0.001f + std::fabs(s) * 0.01f;
    for (size_t i = 0; i < q.size(); ++i) q[i] = qtools::f32_to_fp8_e4m3(w[i] * 40.0f);
    cpu::Mat f8{DType::u8, q.data(), rows, cols, cpu::Quant::ext, sc.data(), nullptr, 128};
    f8.ext = static_cast<uint32_t>(ExtType::fp8_e4m3);
    CHECK_NOTHROW(cpu::check_mat(f8, "fp8"));
    check_all_isas(f8, 11);
    // int8 groups of 64, asymmetric and symmetric.
    std::vector<uint8_t> q8(static_cast<size_t>(rows * cols));
    std::mt19937 g(5);
    for (auto& v : q8) v = static_cast<uint8_t>(g() & 255);
    const int64_t G8 = cols / 64;
    auto s8 = randn(static_cast<size_t>(rows * G8), 4, 1.0f), z8 = s8;
    for (auto& s : s8) s = 0.0005f + std::fabs(s) * 0.001f;
    for (auto& z : z8) z = static_cast<float>(g() % 256);
    cpu::Mat i8{DType::u8, q8.data(), rows, cols, cpu::Quant::ext, s8.data(), z8.data(), 64};
    i8.ext = static_cast<uint32_t>(ExtType::int8_group);
    check_all_isas(i8, 12);
    i8.zeros = nullptr;
    check_all_isas(i8, 13);
  }
}

TEST_CASE("ext views: bad shapes and unknown types are clear errors") {
  std::vector<uint8_t> buf(4096);
  CHECK_THROWS_AS(cpu::ext_view(ExtType::q4_k, buf.data(), 2, 100, "t"), Error);
  cpu::Mat m{DType::u8, buf.data(), 2, 64, cpu::Quant::ext};
  m.ext = 999;
  CHECK_THROWS_WITH_AS(cpu::check_mat(m, "w"), doctest::Contains("unknown block type"), Error);
  m.ext = static_cast<uint32_t>(ExtType::fp8_e4m3);
  CHECK_THROWS_WITH_AS(cpu::check_mat(m, "w"), doctest::Contains("needs scales"), Error);
  CHECK(cpu::ggml_type_supported(8));
  CHECK(cpu::ggml_type_supported(10));         // Q2_K (numa/quant_gguf_lowbit.h)
  CHECK_FALSE(cpu::ggml_type_supported(34));  // TQ1_0: not computed on
}
