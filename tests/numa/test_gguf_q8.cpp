// The 8-bit-activation integer path for ggml block weights
// (numa/quant_gguf_q8.h): the activation quantizer, every SIMD kernel this
// CPU has against the plain reference (random weights and activations, odd
// row counts, token and row offsets), the bound against the exact fp32
// product, threading, the expert engine, and wrong-layout errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "configs/error.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "numa/quant_gguf_amx.h"
#include "numa/quant_gguf_q8.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;
using cpu::ExtType;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  // a few outliers, as real activations have
  for (size_t i = 0; i < n; i += 97) v[i] *= 8.0f;
  return v;
}

struct QW {
  std::vector<uint8_t> bytes;
  cpu::Mat w;
};
QW make(ExtType t, int64_t rows, int64_t cols, uint32_t seed) {
  QW q;
  const auto f = randn(static_cast<size_t>(rows * cols), seed, 0.05f);
  q.bytes = qtools::quant_rows(t, f.data(), rows, cols);
  q.w = cpu::ext_view(t, q.bytes.data(), rows, cols, "test");
  return q;
}

const ExtType kTypes[] = {ExtType::q4_k, ExtType::q5_k, ExtType::q6_k, ExtType::q8_0, ExtType::q4_0, ExtType::q5_0};
int64_t unit(ExtType t) { return t == ExtType::q4_k || t == ExtType::q5_k || t == ExtType::q6_k ? 256 : 64; }

std::vector<cpu::Isa> simd_isas() {
  std::vector<cpu::Isa> v;
  const cpu::Isa best = cpu::best_isa();
  if (best == cpu::Isa::avx512 && cpu::detail::q8_has_vnni()) v.push_back(cpu::Isa::avx512);
  if (best != cpu::Isa::scalar) v.push_back(cpu::Isa::avx2);
  return v;
}

}  // namespace

TEST_CASE("Q8Acts: codes within 127, values within half a step of x, block sums exact") {
  for (ExtType t : kTypes) {
    const int64_t cols = unit(t) * 3, n = 3;
    QW q = make(t, 1, cols, 1);
    const auto x = randn(static_cast<size_t>(n * cols), 2);
    cpu::Q8Acts a;
    a.reset(n, q.w);
    for (int64_t i = 0; i < n; ++i) a.quantize(i, x.data() + i * cols);
    INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name);
    std::vector<bool> seen(static_cast<size_t>(cols), false);
    for (int64_t k = 0; k < cols; ++k) {
      const int64_t p = a.pos(k);
      REQUIRE(p >= 0);
      REQUIRE(p < cols);
      CHECK_FALSE(seen[static_cast<size_t>(p)]);
      seen[static_cast<size_t>(p)] = true;
    }
    double worst = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < cols; ++k) {
        const float d = a.d[static_cast<size_t>(i * (cols / a.block) + k / a.block)];
        CHECK(std::abs(a.q[static_cast<size_t>(i * cols + k)]) <= 127);
        worst = std::max(worst, static_cast<double>(std::fabs(a.value(i, k) - x[static_cast<size_t>(i * cols + k)]) / d));
      }
    CHECK(worst <= 0.5 + 1e-4);
    if (a.block == 256) {
      const int run = t == ExtType::q6_k ? 16 : 32;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t b = 0; b < cols / 256; ++b)
          for (int r = 0; r < 256 / run; ++r) {
            int s = 0;
            for (int e = 0; e < run; ++e) s += a.q[static_cast<size_t>(i * cols + a.pos(b * 256 + r * run + e))];
            CHECK(a.bsum[static_cast<size_t>((i * (cols / 256) + b) * 16 + r)] == s);
          }
    }
  }
}

TEST_CASE("gemm_rows_q8: every SIMD kernel equals the reference; the product is within the activation rounding of fp32") {
  const auto isas = simd_isas();
  REQUIRE_FALSE(isas.empty());
  for (ExtType t : kTypes) {
    for (int64_t cols : {unit(t), unit(t) * 5, int64_t{2048}}) {
      const int64_t rows = 37;  // odd: 4-row tiles plus single-row tails
      QW q = make(t, rows, cols, static_cast<uint32_t>(cols + static_cast<int64_t>(t)));
      for (int64_t n : {1, 2, 5, 9, 79}) {
        const int64_t t0 = 1;  // token offset into the activation rows
        const auto x = randn(static_cast<size_t>((n + t0) * cols), static_cast<uint32_t>(n * 7 + cols));
        cpu::Q8Acts a;
        a.reset(n + t0, q.w);
        for (int64_t i = 0; i < n + t0; ++i) a.quantize(i, x.data() + i * cols);
        const int64_t r0 = 1, r1 = rows;
        std::vector<float> ref(static_cast<size_t>(n * rows), 0.0f);
        cpu::gemm_rows_q8_reference(a, t0, n, q.w, r0, r1, ref.data(), rows);
        // bounds: sum |w x_q| (kernel rounding) and sum |w| d / 2 (activation rounding)
        std::vector<float> row(static_cast<size_t>(cols));
        std::vector<double> absdot(ref.size()), round(ref.size()), exact(ref.size());
        for (int64_t r = r0; r < r1; ++r) {
          cpu::row_to_f32(q.w, r, row.data());
          for (int64_t j = 0; j < n; ++j) {
            double ad = 0, rb = 0, ex = 0;
            for (int64_t k = 0; k < cols; ++k) {
              const double wv = row[static_cast<size_t>(k)];
              ad += std::fabs(wv * a.value(t0 + j, k));
              rb += std::fabs(wv) * a.d[static_cast<size_t>((t0 + j) * (cols / a.block) + k / a.block)] / 2;
              ex += wv * x[static_cast<size_t>((t0 + j) * cols + k)];
            }
            absdot[static_cast<size_t>(j * rows + r)] = ad;
            round[static_cast<size_t>(j * rows + r)] = rb;
            exact[static_cast<size_t>(j * rows + r)] = ex;
          }
        }
        for (int64_t j = 0; j < n; ++j)
          for (int64_t r = r0; r < r1; ++r) {
            const size_t i = static_cast<size_t>(j * rows + r);
            CHECK(std::fabs(ref[i] - exact[i]) <= round[i] * 1.001 + 1e-6);
          }
        for (cpu::Isa isa : isas) {
          const cpu::Isa old = cpu::set_isa_for_testing(isa);
          std::vector<float> y(static_cast<size_t>(n * rows), -7.0f);
          cpu::gemm_rows_q8(a, t0, n, q.w, r0, r1, y.data(), rows);
          cpu::set_isa_for_testing(old);
          double worst = 0;
          bool untouched = true;
          for (int64_t j = 0; j < n; ++j) {
            untouched = untouched && y[static_cast<size_t>(j * rows)] == -7.0f;  // row 0 is outside [r0, r1)
            for (int64_t r = r0; r < r1; ++r) {
              const size_t i = static_cast<size_t>(j * rows + r);
              worst = std::max(worst, std::fabs(y[i] - ref[i]) / (absdot[i] + 1e-30));
            }
          }
          // batch invariance: each token's products have the same bits when it is multiplied alone
          int64_t differ = 0;
          for (int64_t j = 0; j < n; ++j) {
            std::vector<float> y1(static_cast<size_t>(rows), -7.0f);
            cpu::set_isa_for_testing(isa);
            cpu::gemm_rows_q8(a, t0 + j, 1, q.w, r0, r1, y1.data(), rows);
            cpu::set_isa_for_testing(old);
            differ += std::memcmp(y1.data() + r0, y.data() + j * rows + r0, static_cast<size_t>(r1 - r0) * sizeof(float)) != 0;
          }
          INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " cols " << cols << " n " << n << " isa " << cpu::isa_name(isa)
                                                                  << " worst rel " << worst);
          CHECK(untouched);
          CHECK(worst < 2e-6);
          CHECK(differ == 0);
        }
      }
    }
  }
}

TEST_CASE("Q4_K, Q5_K, Q6_K, Q8_0 on AVX-512: the tile kernels, the per-row kernels and gemm_rows_q8 equal the scalar model bit for bit") {
  if (cpu::best_isa() != cpu::Isa::avx512 || !cpu::detail::q8_has_vnni()) {
    MESSAGE("no AVX-512 VNNI here: the tile kernels do not run");
    return;
  }
  for (ExtType t : {ExtType::q4_k, ExtType::q5_k, ExtType::q6_k, ExtType::q8_0}) {
    REQUIRE(cpu::detail::q8_tiles_serve(t));
    for (int64_t cols : {unit(t), unit(t) * 3, int64_t{2048}}) {
      for (int64_t rows : {int64_t{5}, int64_t{16}, int64_t{37}, int64_t{70}}) {
        QW q = make(t, rows, cols, static_cast<uint32_t>(rows * 31 + cols));
        const int64_t N = 19, t0 = 2;
        auto x = randn(static_cast<size_t>((N + t0) * cols), static_cast<uint32_t>(cols + rows));
        for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>((t0 + 3) * cols + k)] *= 40.0f;  // a token with large codes everywhere
        cpu::Q8Acts a;
        a.reset(N + t0, q.w);
        for (int64_t i = 0; i < N + t0; ++i) a.quantize(i, x.data() + i * cols);
        for (int64_t n : {1, 2, 3, 4, 5, 7, 9, 17}) {
          for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, std::pair<int64_t, int64_t>{1, rows}, std::pair<int64_t, int64_t>{rows / 2, rows}}) {
            std::vector<float> y(static_cast<size_t>(n * rows), -7.0f), m(y.size(), -7.0f), pr(y.size(), -7.0f), g(y.size(), -7.0f);
            cpu::detail::q8_tiles_avx512(a, t0, n, q.w, r0, r1, y.data(), rows);
            cpu::detail::q8_tiles_model(a, t0, n, q.w, r0, r1, m.data(), rows);
            cpu::detail::q8_rows_avx512_rowwise(a, t0, n, q.w, r0, r1, pr.data(), rows);
            cpu::gemm_rows_q8(a, t0, n, q.w, r0, r1, g.data(), rows);
            INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " cols " << cols << " rows " << rows << " n " << n << " r0 " << r0);
            CHECK(std::memcmp(y.data(), m.data(), y.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(pr.data(), m.data(), y.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(g.data(), m.data(), y.size() * sizeof(float)) == 0);
            bool touched_outside = false;
            for (int64_t j = 0; j < n; ++j)
              for (int64_t r = 0; r < r0; ++r) touched_outside = touched_outside || y[static_cast<size_t>(j * rows + r)] != -7.0f;
            CHECK_FALSE(touched_outside);
          }
        }
      }
    }
  }
}

TEST_CASE("Q4_K, Q5_K, Q6_K, Q8_0 on AVX2: every kernel (one row, the 8-token panels, their tails) equals the scalar model bit for bit") {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    MESSAGE("no AVX2 here: the AVX2 kernels do not run");
    return;
  }
  for (ExtType t : {ExtType::q4_k, ExtType::q5_k, ExtType::q6_k, ExtType::q8_0}) {
    // K types: 9 super-blocks give row1_k's groups of 8 and a tail. Q8_0: 64 and 192 columns take the one-row
    // kernel at every token count (no whole 256-column group), 256 * 9 its panels and a group tail of row1.
    const std::vector<int64_t> widths = t == ExtType::q8_0 ? std::vector<int64_t>{64, 192, 256 * 9} : std::vector<int64_t>{unit(t), unit(t) * 3, unit(t) * 9};
    for (int64_t cols : widths) {
      for (int64_t rows : {int64_t{3}, int64_t{13}, int64_t{37}}) {
        QW q = make(t, rows, cols, static_cast<uint32_t>(rows * 17 + cols));
        if (t == ExtType::q8_0)  // codes -128 (|w| = 128 as u8) and 127 next to each other: the pairs' largest sums
          for (int64_t r = 0; r < rows; r += 2)
            for (int64_t k = 0; k < cols; k += 3) {
              uint8_t* code = q.bytes.data() + r * (cols / 32) * 34 + (k / 32) * 34 + 2 + k % 32;
              *code = k % 2 ? 0x80 : 0x7F;
            }
        const int64_t N = 45, t0 = 2;
        auto x = randn(static_cast<size_t>((N + t0) * cols), static_cast<uint32_t>(cols + rows + 5));
        for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>((t0 + 3) * cols + k)] *= 40.0f;  // a token with large codes everywhere
        for (int64_t k = 0; k < cols; k += 2) x[static_cast<size_t>((t0 + 9) * cols + k)] = k % 4 ? 3.0f : -3.0f;  // extreme codes, both signs
        cpu::Q8Acts a;
        a.reset(N + t0, q.w);
        for (int64_t i = 0; i < N + t0; ++i) a.quantize(i, x.data() + i * cols);
        for (int64_t n : {1, 2, 4, 5, 7, 8, 9, 31, 33, 45}) {  // K types: one row below 8 tokens; Q8_0: rows8 below 4 and at 5; panels of 32 (+ padding) above
          for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, std::pair<int64_t, int64_t>{1, rows}, std::pair<int64_t, int64_t>{rows / 2, rows}}) {
            std::vector<float> y(static_cast<size_t>(n * rows), -7.0f), m(y.size(), -7.0f);
            cpu::detail::q8_rows_avx2(a, t0, n, q.w, r0, r1, y.data(), rows);
            cpu::detail::q8_tiles_model(a, t0, n, q.w, r0, r1, m.data(), rows);
            INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " cols " << cols << " rows " << rows << " n " << n << " r0 " << r0);
            CHECK(std::memcmp(y.data(), m.data(), y.size() * sizeof(float)) == 0);  // rows before r0 stay -7 in both
          }
        }
      }
    }
  }
}

TEST_CASE("AVX2 panels: activations packed for one call are not reused after the rows change (Q8Acts::stamp)") {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    MESSAGE("no AVX2 here: the AVX2 kernels do not run");
    return;
  }
  for (ExtType t : {ExtType::q4_k, ExtType::q8_0}) {
    const int64_t cols = 512, rows = 24, n = 12;
    QW q = make(t, rows, cols, 91);
    cpu::Q8Acts a;  // one object, one address: only its stamp tells the two contents apart
    std::vector<float> first;
    for (uint32_t seed : {5u, 6u}) {
      const auto x = randn(static_cast<size_t>(n * cols), seed);
      a.reset(n, q.w);
      for (int64_t i = 0; i < n; ++i) a.quantize(i, x.data() + i * cols);
      std::vector<float> y(static_cast<size_t>(n * rows)), m(y.size());
      for (int64_t r = 0; r < rows; r += 8) cpu::detail::q8_rows_avx2(a, 0, n, q.w, r, r + 8, y.data(), rows);  // item by item: the packing is reused
      cpu::detail::q8_tiles_model(a, 0, n, q.w, 0, rows, m.data(), rows);
      INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " seed " << seed);
      CHECK(std::memcmp(y.data(), m.data(), y.size() * sizeof(float)) == 0);
      if (first.empty()) first = y;
      else CHECK(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) != 0);
    }
  }
}

TEST_CASE("AMX-INT8 tiles (emulated; and the hardware ones where this CPU has them) give the tile kernels' bits") {
  if (cpu::best_isa() != cpu::Isa::avx512 || !cpu::detail::q8_has_vnni()) {
    MESSAGE("no AVX-512 VNNI here: the tile kernels do not run");
    return;
  }
  const cpu::AmxMode old = cpu::amx_mode();
  std::vector<cpu::AmxMode> modes = {cpu::AmxMode::emulate};
  if (cpu::amx_hardware()) modes.push_back(cpu::AmxMode::hardware);
  for (cpu::AmxMode mode : modes)
    for (ExtType t : {ExtType::q4_k, ExtType::q5_k, ExtType::q6_k, ExtType::q8_0}) {
      const int64_t cols = unit(t) * 2, rows = 37, N = 35, t0 = 1;
      QW q = make(t, rows, cols, static_cast<uint32_t>(cols + 5));
      auto x = randn(static_cast<size_t>((N + t0) * cols), static_cast<uint32_t>(cols + 6));
      for (int64_t k = 0; k < cols; ++k) x[static_cast<size_t>((t0 + 20) * cols + k)] *= 40.0f;
      cpu::Q8Acts a;
      a.reset(N + t0, q.w);
      for (int64_t i = 0; i < N + t0; ++i) a.quantize(i, x.data() + i * cols);
      for (int64_t n : {16, 19, 32, 35}) {
        std::vector<float> y(static_cast<size_t>(n * rows), -7.0f), m(y.size(), -7.0f), v(y.size(), -7.0f);
        cpu::set_amx_mode(cpu::AmxMode::off);
        cpu::detail::q8_tiles_avx512(a, t0, n, q.w, 1, rows, v.data(), rows);  // VNNI tiles only
        cpu::set_amx_mode(mode);
        const bool ran = cpu::detail::q8_amx_mode() == mode;
        cpu::detail::q8_tiles_avx512(a, t0, n, q.w, 1, rows, y.data(), rows);
        cpu::set_amx_mode(old);
        cpu::detail::q8_tiles_model(a, t0, n, q.w, 1, rows, m.data(), rows);
        INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " n " << n << (mode == cpu::AmxMode::emulate ? " emulated" : " hardware")
                                                                 << (ran ? "" : " (no AMX-INT8: VNNI only)"));
        if (mode == cpu::AmxMode::emulate) CHECK(ran);
        CHECK(std::memcmp(y.data(), m.data(), y.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(v.data(), m.data(), y.size() * sizeof(float)) == 0);
      }
    }
  cpu::set_amx_mode(old);
}

TEST_CASE("gemm_q8 over 1, 2 and 3 threads equals one thread; cpu::gemm follows the switch") {
  for (ExtType t : {ExtType::q4_k, ExtType::q6_k, ExtType::q8_0}) {
    const int64_t rows = 203, cols = 1024, n = 6;
    QW q = make(t, rows, cols, 9);
    const auto x = randn(static_cast<size_t>(n * cols), 10);
    std::vector<float> one(static_cast<size_t>(n * rows));
    cpu::gemm_q8(x.data(), n, q.w, one.data(), nullptr);
    for (int threads : {1, 2, 3}) {
      numa::ThreadPool pool(threads, false);
      std::vector<float> y(one.size());
      cpu::gemm_q8(x.data(), n, q.w, y.data(), &pool);
      CHECK(y == one);  // same blocks, same order of sums: bit-equal
    }
    std::vector<float> g(one.size()), e(one.size());
    cpu::GemmOptions int8, exact;
    int8.gguf_int8 = true;
    exact.gguf_int8 = false;
    cpu::gemm(x.data(), n, q.w, g.data(), nullptr, int8);
    cpu::gemm(x.data(), n, q.w, e.data(), nullptr, exact);
    std::vector<float> ex(one.size());
    cpu::gemm_exact(x.data(), n, q.w, ex.data(), nullptr);
    CHECK(g == one);
    CHECK(e == ex);
    CHECK(g != e);
  }
}

TEST_CASE("Q8Acts: a block with inf or NaN gives NaN products, not garbage codes") {
  QW q = make(ExtType::q4_k, 4, 512, 3);
  auto x = randn(512, 4);
  x[300] = INFINITY;
  cpu::Q8Acts a;
  a.reset(1, q.w);
  a.quantize(0, x.data());
  for (int64_t k = 256; k < 512; ++k) CHECK(a.q[static_cast<size_t>(a.pos(k))] == 0);
  std::vector<float> y(4);
  cpu::gemm_rows_q8(a, 0, 1, q.w, 0, 4, y.data(), 4);
  for (float v : y) CHECK(std::isnan(v));
}

TEST_CASE("gemm_rows_q8 refuses activations quantized for another type or width") {
  QW a = make(ExtType::q4_k, 4, 512, 1), b = make(ExtType::q6_k, 4, 512, 2), c = make(ExtType::q4_k, 4, 256, 3);
  cpu::Q8Acts xa;
  xa.reset(1, a.w);
  const auto x = randn(512, 4);
  xa.quantize(0, x.data());
  std::vector<float> y(4);
  CHECK_THROWS_AS(cpu::gemm_rows_q8(xa, 0, 1, b.w, 0, 4, y.data(), 4), Error);
  CHECK_THROWS_AS(cpu::gemm_rows_q8(xa, 0, 1, c.w, 0, 4, y.data(), 4), Error);
  CHECK_FALSE(cpu::gguf_q8_applies(make(ExtType::q8_0, 2, 96, 5).w));   // 96 columns: not pairs of blocks
  CHECK_FALSE(cpu::gguf_q8_applies(make(ExtType::q4_1, 2, 256, 6).w));  // no integer kernel: exact path
}

TEST_CASE("ExpertEngine on GGUF experts: the 8-bit path is within the activation rounding of the exact one") {
  const int64_t E = 5, H = 512, I = 256, K = 2;
  for (auto [tu, td] : {std::pair{ExtType::q4_k, ExtType::q6_k}, std::pair{ExtType::q8_0, ExtType::q8_0}, std::pair{ExtType::q5_k, ExtType::q4_0}}) {
    std::vector<QW> store;
    std::vector<numa::ExpertWeights> ex;
    for (int64_t e = 0; e < E; ++e) {
      store.push_back(make(tu, I, H, static_cast<uint32_t>(10 * e + 1)));
      store.push_back(make(tu, I, H, static_cast<uint32_t>(10 * e + 2)));
      store.push_back(make(td, H, I, static_cast<uint32_t>(10 * e + 3)));
    }
    for (int64_t e = 0; e < E; ++e) ex.push_back({store[static_cast<size_t>(3 * e)].w, store[static_cast<size_t>(3 * e + 1)].w, store[static_cast<size_t>(3 * e + 2)].w});
    numa::PoolOptions po;
    po.threads = 2;
    po.quiet = true;
    numa::NodePools pools(po);
    numa::EngineOptions on, off;
    on.print_memory = off.print_memory = false;
    off.gguf_int8 = false;
    numa::ExpertEngine eq(ex, pools, on), ee(ex, pools, off);
    CHECK(eq.gguf_int8_used());
    CHECK_FALSE(ee.gguf_int8_used());
    for (int64_t n : {1, 4, 13}) {
      const auto x = randn(static_cast<size_t>(n * H), static_cast<uint32_t>(n));
      std::vector<int32_t> ids(static_cast<size_t>(n * K));
      std::vector<float> wts(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 3 + i / 2) % E), wts[i] = 0.3f + 0.1f * static_cast<float>(i % 3);
      std::vector<float> a(static_cast<size_t>(n * H), 0.0f), b = a;
      eq.forward(x.data(), n, ids.data(), wts.data(), K, a.data());
      ee.forward(x.data(), n, ids.data(), wts.data(), K, b.data());
      double diff = 0, scale = 0;
      for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i]))), scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
      INFO(cpu::ext_type_info(static_cast<uint32_t>(tu))->name << "/" << cpu::ext_type_info(static_cast<uint32_t>(td))->name << " n " << n
                                                              << " max diff " << diff << " of max " << scale);
      CHECK(scale > 0);
      CHECK(diff > 0);              // the 8-bit path really ran
      CHECK(diff < 0.03 * scale);   // 8-bit activations: ~1% of a SwiGLU expert's output
    }
  }
}

TEST_CASE("Q8Acts: the SIMD quantizers (AVX-512, AVX2) equal the scalar one bit for bit (codes, scales, sums, lanes)") {
  const auto isas = simd_isas();
  REQUIRE_FALSE(isas.empty());
  for (ExtType t : kTypes) {
    const int64_t cols = unit(t) * 4, n = 4;
    QW q = make(t, 1, cols, 3);
    auto x = randn(static_cast<size_t>(n * cols), 4);
    x[5] = 0.0f;
    std::fill(x.begin() + cols, x.begin() + cols + unit(t), 0.0f);  // an all-zero block
    x[static_cast<size_t>(2 * cols + 7)] = INFINITY;                   // a block the scalar path handles
    float* h = x.data() + 3 * cols;                                     // codes at exact halves: ties to even
    h[0] = 127.0f;
    for (int64_t k = 1; k < cols; ++k) h[k] = static_cast<float>(k % 9) - 4.5f;
    cpu::Q8Acts ref;
    ref.reset(n, q.w);
    const cpu::Isa old = cpu::set_isa_for_testing(cpu::Isa::scalar);
    for (int64_t i = 0; i < n; ++i) ref.quantize(i, x.data() + i * cols);
    cpu::set_isa_for_testing(old);
    for (cpu::Isa isa : isas) {
      cpu::Q8Acts b;
      b.reset(n, q.w);
      cpu::set_isa_for_testing(isa);
      for (int64_t i = 0; i < n; ++i) b.quantize(i, x.data() + i * cols);
      cpu::set_isa_for_testing(old);
      INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " isa " << cpu::isa_name(isa));
      CHECK(ref.q == b.q);
      CHECK(ref.bsum == b.bsum);
      CHECK(ref.init == b.init);
      CHECK(ref.seed == b.seed);
      CHECK(std::memcmp(ref.d.data(), b.d.data(), ref.d.size() * sizeof(float)) == 0);  // NaN scales compare equal bytewise
      CHECK(std::memcmp(ref.dv.data(), b.dv.data(), ref.dv.size() * sizeof(float)) == 0);
    }
  }
}
