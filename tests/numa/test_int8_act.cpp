// The integer-dot path for int8 / int4 weights (numa/kernels.h): activation
// quantizer against its definition, the VNNI kernel against the scalar
// reference doing the same quantization (tight), and both against the fp32
// reference on dequantized weights (loose: the activation rounding), on
// random data and the real expert shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "configs/error.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

// max |got - ref| over max |ref|, and the same per element against scale.
double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, static_cast<double>(std::fabs(got[i] - ref[i])));
    den = std::max(den, static_cast<double>(std::fabs(ref[i])));
  }
  return num / (den > 0 ? den : 1.0);
}

std::vector<cpu::QuantMat> quantized(const std::vector<float>& wf, int64_t rows, int64_t cols) {
  std::vector<cpu::QuantMat> owned;
  owned.push_back(cpu::quantize_int8(wf.data(), rows, cols));
  for (int g : {32, 64, 128})
    for (bool asym : {false, true}) owned.push_back(cpu::quantize_int4(wf.data(), rows, cols, g, asym));
  return owned;
}

}  // namespace

TEST_CASE("activation quantizer: per-group scale, round to nearest, int4 column order") {
  const int64_t cols = 256;
  auto x = test::random_floats(static_cast<size_t>(2 * cols), 11, 3.0f);
  x[5] = 0;  // a zero among them
  auto w8 = cpu::quantize_int8(test::random_floats(static_cast<size_t>(cols), 3).data(), 1, cols);
  auto w4 = cpu::quantize_int4(test::random_floats(static_cast<size_t>(cols), 3).data(), 1, cols, 32, true);
  for (const cpu::Mat* w : {&w8.view, &w4.view}) {
    cpu::QActs a;
    a.reset(2, *w);
    for (int64_t t = 0; t < 2; ++t) a.quantize(t, x.data() + t * cols);
    const int64_t gs = w->quant == cpu::Quant::int4_group ? 32 : 128;
    CHECK(a.group == gs);
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t g = 0; g < cols / gs; ++g) {
        float amax = 0;
        int sum = 0;
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * cols + k)]));
        const float s = a.scale[static_cast<size_t>(t * a.groups + g)];
        CHECK(s == doctest::Approx(amax / 127.0f));
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
          const int q = a.at(t, k);
          sum += q;
          CHECK(std::abs(q) <= 127);
          CHECK(std::fabs(static_cast<float>(q) * s - x[static_cast<size_t>(t * cols + k)]) <= 0.5001f * s);
        }
        CHECK(a.zsum[static_cast<size_t>(t * a.groups + g)] == doctest::Approx(s * static_cast<float>(sum)));
      }
  }
  // int4 order: the low nibble partner of column 32c+i (i < 16) sits at 16c+i, the high one at 64+16c+i.
  cpu::QActs a;
  a.reset(1, w4.view);
  a.quantize(0, x.data());
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t i = 0; i < 16; ++i) {
      CHECK(a.q[static_cast<size_t>(16 * c + i)] == a.at(0, 32 * c + i));
      CHECK(a.q[static_cast<size_t>(64 + 16 * c + i)] == a.at(0, 32 * c + 16 + i));
    }
}

TEST_CASE("integer dot kernel equals its scalar reference and stays near fp32 activations") {
  INFO("cpu has AVX512-VNNI: " << (cpu::has_vnni() ? "yes (kernel tested)" : "no (scalar path only)"));
  struct Shape { int64_t n, rows, cols; };
  // Small odd shapes, then the expert shapes (Qwen3-30B-A3B gate and down, DeepSeek-V3 gate) on a row subset.
  for (Shape sh : {Shape{1, 5, 128}, Shape{3, 9, 256}, Shape{6, 13, 384}, Shape{19, 8, 128}, Shape{1, 24, 2048}, Shape{4, 20, 768},
                   Shape{1, 12, 7168}, Shape{9, 8, 2048}}) {
    auto x = test::random_floats(static_cast<size_t>(sh.n * sh.cols), 21 + static_cast<uint64_t>(sh.cols));
    auto wf = test::random_floats(static_cast<size_t>(sh.rows * sh.cols), 5 + static_cast<uint64_t>(sh.rows), 0.05f);
    for (auto& q : quantized(wf, sh.rows, sh.cols)) {
      const cpu::Mat& w = q.view;
      INFO(cpu::mat_type_name(w) << " n=" << sh.n << " rows=" << sh.rows << " cols=" << sh.cols);
      CHECK(cpu::int8_act_applies(w) == cpu::has_vnni());
      cpu::QActs a;
      a.reset(sh.n + 2, w);  // two rows before ours: t0 offsets are honoured
      for (int64_t t = 0; t < sh.n; ++t) a.quantize(t + 2, x.data() + t * sh.cols);
      std::vector<float> ref(static_cast<size_t>(sh.n * sh.rows)), got(ref.size(), -1.0f), fp(ref.size());
      cpu::gemm_rows_q_reference(a, 2, sh.n, w, 0, sh.rows, ref.data(), sh.rows);
      cpu::gemm_rows_q(a, 2, sh.n, w, 0, sh.rows, got.data(), sh.rows);
      cpu::gemm_reference(x.data(), sh.n, w, fp.data());
      CHECK(rel_err(got, ref) < 2e-6);
      CHECK(rel_err(ref, fp) < 2e-2);
      CHECK(rel_err(got, fp) < 2e-2);
      // Row sub-ranges write only their rows.
      std::vector<float> part(ref.size(), 7.0f);
      cpu::gemm_rows_q(a, 2, sh.n, w, 1, sh.rows - 1, part.data(), sh.rows);
      for (int64_t t = 0; t < sh.n; ++t) {
        CHECK(part[static_cast<size_t>(t * sh.rows)] == 7.0f);
        CHECK(part[static_cast<size_t>(t * sh.rows + 1)] == doctest::Approx(got[static_cast<size_t>(t * sh.rows + 1)]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("integer dot path rejects views it cannot serve") {
  auto wf = test::random_floats(96 * 2, 3);
  auto q = cpu::quantize_int4(wf.data(), 2, 96, 32, false);
  cpu::QActs a;
  CHECK_THROWS_AS(a.reset(1, q.view), Error);  // 96 columns: not a multiple of 128
  CHECK_FALSE(cpu::int8_act_applies(q.view));
  std::vector<uint16_t> wb(256 * 2, 0x3f80);
  CHECK_THROWS_AS(a.reset(1, cpu::Mat{DType::bf16, wb.data(), 2, 256}), Error);
  auto q8 = cpu::quantize_int8(test::random_floats(256 * 2, 4).data(), 2, 256);
  auto q4 = cpu::quantize_int4(test::random_floats(256 * 2, 4).data(), 2, 256, 64, true);
  a.reset(1, q8.view);
  std::vector<float> y(2);
  CHECK_THROWS_AS(cpu::gemm_rows_q(a, 0, 1, q4.view, 0, 2, y.data(), 2), Error);
}

TEST_CASE("ExpertEngine with int8 activations: near the fp32 path, same on 1, 2 and 4 nodes") {
  const int64_t E = 6, H = 256, I = 384, K = 2, n = 7;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<std::vector<float>> f32;
    std::vector<cpu::QuantMat> owned;
    std::vector<numa::ExpertWeights> views;
    for (int64_t e = 0; e < E; ++e) {
      f32.push_back(test::random_floats(static_cast<size_t>(3 * H * I), 60 + static_cast<uint64_t>(e), 0.08f));
      const float* g = f32.back().data();
      auto q = [&](const float* w, int64_t rows, int64_t cols) {
        return kind == 0 ? cpu::quantize_int8(w, rows, cols) : cpu::quantize_int4(w, rows, cols, kind == 1 ? 128 : 32, kind == 1);
      };
      owned.push_back(q(g, I, H));
      owned.push_back(q(g + H * I, I, H));
      owned.push_back(q(g + 2 * H * I, H, I));
    }
    for (int64_t e = 0; e < E; ++e)
      views.push_back({owned[static_cast<size_t>(3 * e)].view, owned[static_cast<size_t>(3 * e + 1)].view, owned[static_cast<size_t>(3 * e + 2)].view});
    INFO(cpu::mat_type_name(views[0].gate));
    auto x = test::random_floats(static_cast<size_t>(n * H), 70);
    std::mt19937_64 rng(71);
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    std::vector<float> wts(ids.size());
    for (int64_t t = 0; t < n; ++t) {
      ids[static_cast<size_t>(t * K)] = static_cast<int32_t>(rng() % E);
      ids[static_cast<size_t>(t * K + 1)] = static_cast<int32_t>((ids[static_cast<size_t>(t * K)] + 1 + rng() % (E - 1)) % E);
      wts[static_cast<size_t>(t * K)] = 0.7f;
      wts[static_cast<size_t>(t * K + 1)] = 0.3f;
    }
    std::vector<std::vector<float>> outs;
    std::vector<float> exact;
    for (const char* topo : {"", "numa:2 core:1 pu:1", "numa:4 core:1 pu:1"}) {
      numa::PoolOptions po;
      po.topology = topo;
      po.threads = 2;
      po.quiet = true;
      numa::NodePools pools(po);
      numa::EngineOptions eo;
      eo.print_memory = false;
      numa::ExpertEngine engine(views, pools, eo);
      outs.emplace_back(static_cast<size_t>(n * H), 0.0f);
      engine.forward(x.data(), n, ids.data(), wts.data(), K, outs.back().data());
      if (exact.empty()) {
        eo.int8_act = false;
        numa::ExpertEngine fp(views, pools, eo);
        exact.assign(static_cast<size_t>(n * H), 0.0f);
        fp.forward(x.data(), n, ids.data(), wts.data(), K, exact.data());
      }
    }
    CHECK(outs[0] == outs[1]);  // per-row sums and the quantization do not depend on the split
    CHECK(outs[0] == outs[2]);
    const double err = rel_err(outs[0], exact);
    MESSAGE(cpu::mat_type_name(views[0].gate) << ": int8-activation engine vs fp32 activations, max |diff| / max |y| = " << err
                                              << std::string(cpu::has_vnni() ? " (VNNI)" : " (no VNNI: fp32 path both times)"));
    CHECK(err < 3e-2);
    if (cpu::has_vnni()) CHECK(err > 0);  // the integer path did run
  }
}
