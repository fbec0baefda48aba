// Every weight type and ISA path of numa/kernels against the scalar
// double-accumulation reference, on random data; quantizers against their
// own definition; bad views rejected.
#include <doctest/doctest.h>

#include <cmath>

#include "configs/error.h"
#include "numa/kernels.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

struct IsaGuard {
  cpu::Isa old;
  explicit IsaGuard(cpu::Isa isa) : old(cpu::set_isa_for_testing(isa)) {}
  ~IsaGuard() { cpu::set_isa_for_testing(old); }
};

void check_close(const std::vector<float>& got, const std::vector<float>& ref, float rel, const std::string& what) {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    REQUIRE_MESSAGE(std::fabs(got[i] - ref[i]) <= rel * (1.0f + std::fabs(ref[i])), what << " i=" << i << ": " << got[i] << " vs " << ref[i]);
}

}  // namespace

TEST_CASE("int8 and int4 quantizers follow the documented layout") {
  const int64_t rows = 3, cols = 128;
  auto w = test::random_floats(static_cast<size_t>(rows * cols), 7, 0.1f);
  auto q8 = cpu::quantize_int8(w.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      const float deq = static_cast<float>(static_cast<int8_t>(q8.data[static_cast<size_t>(r * cols + k)])) * q8.scales[static_cast<size_t>(r)];
      CHECK(std::fabs(deq - w[static_cast<size_t>(r * cols + k)]) <= 0.51f * q8.scales[static_cast<size_t>(r)]);
    }
  for (int group : {32, 64, 128})
    for (bool asym : {false, true}) {
      auto q4 = cpu::quantize_int4(w.data(), rows, cols, group, asym);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        cpu::row_to_f32(q4.view, r, row.data());
        for (int64_t k = 0; k < cols; ++k) {
          // Unpack by hand from the documented byte order.
          const uint8_t byte = q4.data[static_cast<size_t>(r * cols / 2 + (k / 32) * 16 + (k % 32) % 16)];
          const int q = (k % 32) < 16 ? (byte & 15) : (byte >> 4);
          const size_t g = static_cast<size_t>(r * (cols / group) + k / group);
          const float z = asym ? q4.zeros[g] : 8.0f;
          CHECK(row[static_cast<size_t>(k)] == doctest::Approx((static_cast<float>(q) - z) * q4.scales[g]));
          // Round to nearest: within half a step (plus clamping slack for asym).
          CHECK(std::fabs(row[static_cast<size_t>(k)] - w[static_cast<size_t>(r * cols + k)]) <= 0.51f * q4.scales[g] + 1e-6f);
        }
      }
    }
}

TEST_CASE("gemm_rows: every ISA and weight type against the scalar reference") {
  numa::ThreadPool pool(2);
  struct Shape { int64_t n, rows, cols; };
  for (Shape sh : {Shape{1, 37, 128}, Shape{3, 64, 64}, Shape{5, 21, 256}, Shape{9, 130, 384}, Shape{17, 16, 2048}}) {
    auto x = test::random_floats(static_cast<size_t>(sh.n * sh.cols), 1 + static_cast<uint64_t>(sh.n));
    auto wf = test::random_floats(static_cast<size_t>(sh.rows * sh.cols), 2 + static_cast<uint64_t>(sh.rows), 0.05f);
    std::vector<uint16_t> wb(wf.size()), wh(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) {
      wb[i] = f32_to_bf16(wf[i]);
      wh[i] = f32_to_f16(wf[i]);
    }
    std::vector<cpu::QuantMat> owned;
    owned.push_back(cpu::quantize_int8(wf.data(), sh.rows, sh.cols));
    for (int g : {32, 64, 128})
      if (sh.cols % g == 0)
        for (bool asym : {false, true}) owned.push_back(cpu::quantize_int4(wf.data(), sh.rows, sh.cols, g, asym));
    std::vector<cpu::Mat> mats = {cpu::Mat{DType::f32, wf.data(), sh.rows, sh.cols}, cpu::Mat{DType::bf16, wb.data(), sh.rows, sh.cols},
                                  cpu::Mat{DType::f16, wh.data(), sh.rows, sh.cols}};
    for (auto& q : owned) mats.push_back(q.view);
    for (const cpu::Mat& w : mats) {
      cpu::check_mat(w, "test");
      std::vector<float> ref(static_cast<size_t>(sh.n * sh.rows)), got(ref.size());
      cpu::gemm_reference(x.data(), sh.n, w, ref.data());
      for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
        IsaGuard guard(isa);
        std::fill(got.begin(), got.end(), NAN);
        cpu::gemm(x.data(), sh.n, w, got.data(), &pool);
        check_close(got, ref, 1e-4f, std::string(cpu::isa_name(cpu::best_isa())) + " " + cpu::mat_type_name(w) + " n=" + std::to_string(sh.n) +
                                         " rows=" + std::to_string(sh.rows) + " cols=" + std::to_string(sh.cols));
        // A sub-range of rows with a wider output stride leaves the rest alone.
        const int64_t r0 = 1, r1 = sh.rows - 1, ldy = sh.rows + 3;
        std::vector<float> part(static_cast<size_t>(sh.n * ldy), -7.0f);
        cpu::gemm_rows(x.data(), sh.cols, sh.n, w, r0, r1, part.data(), ldy);
        for (int64_t t = 0; t < sh.n; ++t)
          for (int64_t r = 0; r < ldy; ++r) {
            const float v = part[static_cast<size_t>(t * ldy + r)];
            if (r >= r0 && r < r1) REQUIRE(std::fabs(v - ref[static_cast<size_t>(t * sh.rows + r)]) <= 1e-4f * (1 + std::fabs(v)));
            else REQUIRE(v == -7.0f);
          }
      }
    }
  }
}

TEST_CASE("bf16 dot path equals the fp32 kernel on bf16-rounded activations") {
  const int64_t n = 6, rows = 20, cols = 200;  // cols not a multiple of 32: tail
  auto x = test::random_floats(static_cast<size_t>(n * cols), 31);
  auto wf = test::random_floats(static_cast<size_t>(rows * cols), 32, 0.05f);
  std::vector<uint16_t> wb(wf.size()), xb(x.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = f32_to_bf16(x[i]);
    xr[i] = bf16_to_f32(xb[i]);
  }
  cpu::Mat w{DType::bf16, wb.data(), rows, cols};
  std::vector<float> ref(static_cast<size_t>(n * rows)), got(ref.size());
  cpu::gemm_reference(xr.data(), n, w, ref.data());
  cpu::gemm_rows_bf16dot(xb.data(), cols, n, w, 0, rows, got.data(), rows);
  check_close(got, ref, 1e-4f, std::string("bf16dot (cpu has it: ") + (cpu::has_bf16_dot() ? "yes)" : "no, fallback)"));
}

TEST_CASE("gemm with GemmOptions::round_bf16 is gemm_exact on bf16-rounded inputs; off, it is exact") {
  const int64_t n = 5, rows = 40, cols = 96;
  const auto x = test::random_floats(static_cast<size_t>(n * cols), 41);
  const auto wf = test::random_floats(static_cast<size_t>(rows * cols), 42, 0.05f);
  cpu::Mat w{DType::f32, wf.data(), rows, cols};
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) xr[i] = cpu::round_bf16(x[i]);
  CHECK(cpu::round_bf16(1.0f + 1.0f / 256) == 1.0f);              // tie: to even
  CHECK(cpu::round_bf16(1.0f + 3.0f / 256) == 1.0f + 4.0f / 256);  // tie: to even (up)
  CHECK(std::isnan(cpu::round_bf16(NAN)));
  CHECK(std::isinf(cpu::round_bf16(INFINITY)));
  std::vector<float> exact(static_cast<size_t>(n * rows)), rounded(exact.size()), want(exact.size()), off(exact.size());
  cpu::gemm_exact(x.data(), n, w, exact.data(), nullptr);
  cpu::gemm_exact(xr.data(), n, w, want.data(), nullptr);
  cpu::GemmOptions round;
  round.round_bf16 = true;
  cpu::gemm(x.data(), n, w, rounded.data(), nullptr, round);
  cpu::gemm(x.data(), n, w, off.data(), nullptr, cpu::GemmOptions{});
  CHECK(rounded == want);
  CHECK(off == exact);
  CHECK(rounded != exact);
}

TEST_CASE("weight views that the kernels cannot use are rejected with a message") {
  std::vector<uint8_t> data(64 * 96);
  std::vector<float> scales(64 * 3);
  cpu::Mat bad_group{DType::u8, data.data(), 4, 96, cpu::Quant::int4_group, scales.data(), nullptr, 48};
  CHECK_THROWS_WITH_AS(cpu::check_mat(bad_group, "w"), doctest::Contains("group size 48"), Error);
  cpu::Mat ragged{DType::u8, data.data(), 4, 96, cpu::Quant::int4_group, scales.data(), nullptr, 64};
  CHECK_THROWS_WITH_AS(cpu::check_mat(ragged, "w"), doctest::Contains("not a multiple"), Error);
  cpu::Mat no_scales{DType::i8, data.data(), 4, 96, cpu::Quant::int8_channel, nullptr, nullptr, 0};
  CHECK_THROWS_AS(cpu::check_mat(no_scales, "w"), Error);
  cpu::Mat int_plain{DType::i32, data.data(), 4, 8};
  CHECK_THROWS_WITH_AS(cpu::check_mat(int_plain, "w"), doctest::Contains("dtype"), Error);
  cpu::Mat empty{DType::f32, nullptr, 4, 0};
  CHECK_THROWS_AS(cpu::check_mat(empty, "w"), Error);
  std::vector<float> w(100, 1.0f);
  CHECK_THROWS_AS(cpu::quantize_int4(w.data(), 1, 100, 32, false), Error);
}
