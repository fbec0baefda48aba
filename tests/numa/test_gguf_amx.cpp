// The AMX-BF16 prefill path for ggml block weights (numa/quant_gguf_amx.h):
// the activation packing, the bf16 weight tiles against the scalar dequant,
// the strip kernel (emulated tiles everywhere; the hardware tiles where the
// CPU and kernel have AMX, else skipped with a message) against the plain
// reference on random data with row/token tails and offsets, the bound
// against the exact fp32 product, the threaded product, and the expert
// engine taking the path for experts with many tokens.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "configs/error.h"
#include "io/dtype.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "numa/quant_gguf_amx.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;
using cpu::ExtType;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
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

// Restores the process-wide mode at scope exit.
struct ModeGuard {
  cpu::AmxMode old = cpu::amx_mode();
  explicit ModeGuard(cpu::AmxMode m) { cpu::set_amx_mode(m); }
  ~ModeGuard() { cpu::set_amx_mode(old); }
};

std::vector<cpu::AmxMode> modes() {
  std::vector<cpu::AmxMode> v{cpu::AmxMode::emulate};
  if (cpu::amx_hardware()) v.push_back(cpu::AmxMode::hardware);
  else MESSAGE("AMX-BF16 tiles not available here (cpuid or kernel permission): hardware tile kernels skipped, emulated tiles tested");
  return v;
}

}  // namespace

TEST_CASE("AmxActs: every value lands once, rounded to bf16, padding tokens are zero") {
  const int64_t cols = 96, n = 21;
  const auto x = randn(static_cast<size_t>(n * cols), 3);
  cpu::AmxActs a;
  a.reset(3, cols);
  std::fill(a.p.begin(), a.p.end(), uint16_t{0x7fc0});  // NaN everywhere first
  a.pack(1, x.data(), cols, n);
  for (int64_t t = 0; t < 32; ++t)
    for (int64_t k = 0; k < cols; ++k) {
      const float v = a.value(1 + t / 16, static_cast<int>(t % 16), k);
      if (t < n) CHECK(v == bf16_to_f32(f32_to_bf16(x[static_cast<size_t>(t * cols + k)])));
      else CHECK(v == 0.0f);
    }
}

TEST_CASE("bf16 weight tiles equal the scalar dequantization rounded to bf16") {
  for (ExtType t : kTypes) {
    const int64_t cols = unit(t) * 2, rows = 20;
    QW q = make(t, rows, cols, 5);
    std::vector<uint16_t> tiles(static_cast<size_t>(cols / 32 * 1024), 0xffff);
    cpu::detail::ext_rows_to_bf16_tiles(q.w, 3, 17, tiles.data());
    std::vector<float> row(static_cast<size_t>(cols));
    double worst = 0;
    for (int64_t i = 0; i < 17; ++i) {
      cpu::ext_row_to_f32(q.w, 3 + i, row.data());
      for (int64_t k = 0; k < cols; ++k) {
        const float want = row[static_cast<size_t>(k)];
        const float got = bf16_to_f32(tiles[static_cast<size_t>(((k / 32) * 32 + i) * 32 + k % 32)]);
        worst = std::max(worst, static_cast<double>(std::fabs(got - want) / (std::fabs(want) + 1e-12f)));
      }
    }
    INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " worst rel " << worst);
    CHECK(worst <= 1.0 / 256);  // bf16 rounding (2^-9) of a value the fp32 dequant may differ from by an ulp
  }
}

TEST_CASE("gemm_rows_amx: emulated (and hardware) tiles equal the reference; within bf16 rounding of the exact product") {
  for (cpu::AmxMode mode : modes()) {
    ModeGuard g(mode);
    for (ExtType t : kTypes) {
      const int64_t cols = t == ExtType::q8_0 ? 320 : unit(t) * 2;
      for (int64_t rows : {int64_t{16}, int64_t{45}, int64_t{161}}) {  // one A tile; a half strip; past a 4-strip group
        QW q = make(t, rows, cols, static_cast<uint32_t>(rows + static_cast<int64_t>(t)));
        for (int64_t n : {1, 7, 16, 33, 50}) {
          const int64_t b0 = 1;  // token block offset
          const auto x = randn(static_cast<size_t>(n * cols), static_cast<uint32_t>(n * 13 + cols));
          cpu::AmxActs a;
          a.reset(b0 + (n + 15) / 16, cols);
          a.pack(b0, x.data(), cols, n);
          const int64_t r0 = 1, r1 = rows;
          std::vector<float> ref(static_cast<size_t>(n * rows), 0.0f), y(ref.size(), -7.0f);
          cpu::gemm_rows_amx_reference(a, b0, n, q.w, r0, r1, ref.data(), rows);
          cpu::gemm_rows_amx(a, b0, n, q.w, r0, r1, y.data(), rows);
          std::vector<float> row(static_cast<size_t>(cols));
          double worst = 0, worst_exact = 0;
          bool untouched = true;
          for (int64_t r = r0; r < r1; ++r) {
            cpu::ext_row_to_f32(q.w, r, row.data());
            for (int64_t j = 0; j < n; ++j) {
              double absdot = 0, exact = 0;
              for (int64_t k = 0; k < cols; ++k) {
                absdot += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(j * cols + k)]);
                exact += static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(j * cols + k)];
              }
              const size_t i = static_cast<size_t>(j * rows + r);
              worst = std::max(worst, std::fabs(y[i] - ref[i]) / (absdot + 1e-30));
              worst_exact = std::max(worst_exact, std::fabs(ref[i] - exact) / (absdot + 1e-30));
            }
          }
          for (int64_t j = 0; j < n; ++j) untouched = untouched && y[static_cast<size_t>(j * rows)] == -7.0f;  // row 0 is outside [r0, r1)
          INFO(cpu::ext_type_info(static_cast<uint32_t>(t))->name << " rows " << rows << " n " << n << " mode " << static_cast<int>(mode)
                                                                  << " worst rel " << worst << " vs exact " << worst_exact);
          CHECK(untouched);
          CHECK(worst < 1e-5);         // fp32 sums of exact bf16 products, another order
          CHECK(worst_exact < 8e-3);   // two bf16 roundings, 2^-9 each, bound on sum |w x|
        }
      }
    }
  }
}

TEST_CASE("gemm_amx over 1 and 3 threads equals the reference; amx_wanted follows the minimum") {
  for (cpu::AmxMode mode : modes()) {
    ModeGuard g(mode);
    for (ExtType t : {ExtType::q4_k, ExtType::q6_k, ExtType::q8_0}) {
      const int64_t rows = 200, cols = 512, n = 37;
      QW q = make(t, rows, cols, 9);
      const auto x = randn(static_cast<size_t>(n * cols), 10);
      cpu::AmxActs a;
      a.reset((n + 15) / 16, cols);
      a.pack(0, x.data(), cols, n);
      std::vector<float> ref(static_cast<size_t>(n * rows));
      cpu::gemm_rows_amx_reference(a, 0, n, q.w, 0, rows, ref.data(), rows);
      numa::ThreadPool pool(3);
      for (numa::ThreadPool* p : {static_cast<numa::ThreadPool*>(nullptr), &pool}) {
        std::vector<float> y(ref.size(), NAN);
        cpu::gemm_amx(x.data(), n, q.w, y.data(), p);
        double worst = 0;
        for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(y[i] - ref[i])));
        CHECK(worst < 1e-4);
      }
    }
    const int64_t old = cpu::amx_min_tokens();
    QW q = make(ExtType::q4_k, 32, 256, 1);
    cpu::set_amx_min_tokens(8);
    CHECK(cpu::amx_wanted(q.w, 8));
    CHECK_FALSE(cpu::amx_wanted(q.w, 7));
    cpu::set_amx_min_tokens(0);
    CHECK_FALSE(cpu::amx_wanted(q.w, 1000));
    cpu::set_amx_min_tokens(old);
  }
  CHECK_THROWS_AS(cpu::set_amx_min_tokens(-1), Error);
}

TEST_CASE("ExpertEngine: experts with many tokens take the AMX path, within bf16 rounding of the exact one") {
  ModeGuard g(cpu::AmxMode::emulate);
  const int64_t old = cpu::amx_min_tokens();
  cpu::set_amx_min_tokens(6);
  const int64_t E = 4, H = 512, I = 256, K = 2;
  for (auto [tu, td] : {std::pair{ExtType::q4_k, ExtType::q6_k}, std::pair{ExtType::q8_0, ExtType::q8_0}}) {
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
    numa::ExpertEngine ea(ex, pools, on), ee(ex, pools, off);
    // n 24: expert 0 gets most tokens (AMX), expert 3 one or two (VNNI)
    const int64_t n = 24;
    const auto x = randn(static_cast<size_t>(n * H), 77);
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    std::vector<float> wts(ids.size());
    for (int64_t t = 0; t < n; ++t) {
      ids[static_cast<size_t>(t * K)] = t % 5 == 4 ? 3 : 0;
      ids[static_cast<size_t>(t * K + 1)] = t % 3 == 0 ? 1 : 2;
      wts[static_cast<size_t>(t * K)] = 0.6f, wts[static_cast<size_t>(t * K + 1)] = 0.4f;
    }
    std::vector<float> a(static_cast<size_t>(n * H), 0.0f), b = a;
    const int64_t before = ea.amx_steps();
    ea.forward(x.data(), n, ids.data(), wts.data(), K, a.data());
    ee.forward(x.data(), n, ids.data(), wts.data(), K, b.data());
    CHECK(ea.amx_steps() == before + 1);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i]))), scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    INFO(cpu::ext_type_info(static_cast<uint32_t>(tu))->name << " max diff " << diff << " of max " << scale);
    CHECK(scale > 0);
    CHECK(diff > 0);
    CHECK(diff < 0.02 * scale);
  }
  cpu::set_amx_min_tokens(old);
}

TEST_CASE("AMX self-check: a forked child runs the hardware tiles; where they fault the parent carries on") {
  const bool ok = cpu::detail::amx_self_check();
  if (cpu::amx_hardware()) CHECK(ok);
  else {
    MESSAGE("no AMX here: the child's first tile instruction faults, as it must, and the check says no");
    CHECK_FALSE(ok);
  }
}
