// oneDNN prefill path of ExpertEngine (bf16 weights, experts with many
// tokens): against the fp32-activation engine (loose: activations and the
// SwiGLU output rounded to bf16), mixed with experts below the threshold,
// on 1 and 2 nodes; and the matmul wrapper against the scalar reference.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "numa/expert_engine.h"
#include "numa/onednn_matmul.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("oneDNN bf16 matmul on weights in place equals the reference on bf16-rounded activations") {
  if (!numa::onednn_bf16_available()) {
    MESSAGE("SKIP: this CPU's oneDNN has no bf16 matmul (no AVX-512); the engine keeps its own kernels");
    return;
  }
  const int64_t m = 37, n = 96, k = 256;
  auto wf = test::random_floats(static_cast<size_t>(n * k), 3, 0.05f);
  auto x = test::random_floats(static_cast<size_t>(m * k), 4);
  std::vector<uint16_t> wb(wf.size()), xb(x.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(xb[i]);
  }
  const cpu::Mat w{DType::bf16, wb.data(), n, k};
  std::vector<float> ref(static_cast<size_t>(m * n)), got(static_cast<size_t>(m * (n + 8)), -5.0f);
  cpu::gemm_reference(x.data(), m, w, ref.data());
  numa::OnednnBf16 mm;
  // A row slice of the weights, an output with a wider row stride.
  mm.matmul(xb.data(), m, k, w.slice_rows(16, n), got.data() + 16, n + 8);
  mm.matmul(xb.data(), m, k, w.slice_rows(0, 16), got.data(), n + 8);
  for (int64_t t = 0; t < m; ++t)
    for (int64_t r = 0; r < n; ++r)
      REQUIRE(std::fabs(got[static_cast<size_t>(t * (n + 8) + r)] - ref[static_cast<size_t>(t * n + r)]) <=
              1e-4f * (1 + std::fabs(ref[static_cast<size_t>(t * n + r)])));
  CHECK(got[static_cast<size_t>(n)] == -5.0f);  // the stride gap is not written
  // swiglu epilogue: bf16(silu(p) * u).
  std::vector<float> u(static_cast<size_t>(m * n));
  for (size_t i = 0; i < u.size(); ++i) u[i] = 0.5f + 0.01f * static_cast<float>(i % 37);
  std::vector<uint16_t> act(static_cast<size_t>(m * n));
  mm.matmul_swiglu(xb.data(), m, k, w, u.data(), n, act.data(), n);
  for (size_t i = 0; i < act.size(); ++i) {
    const float p = ref[i], want = p / (1 + std::exp(-p)) * u[i];
    REQUIRE(std::fabs(bf16_to_f32(act[i]) - want) <= 1e-2f * std::fabs(want) + 1e-4f);
  }
  CHECK(mm.primitives() == 3);
}

TEST_CASE("ExpertEngine oneDNN prefill path stays close to the fp32 path") {
  const bool have = numa::onednn_bf16_available();
  if (!have) MESSAGE("this CPU's oneDNN has no bf16 matmul: the engine must stay on its own kernels (checked)");
  const int64_t E = 4, H = 256, I = 128, K = 2, n = 24;
  std::vector<std::vector<uint16_t>> wb;
  std::vector<numa::ExpertWeights> views;
  for (int64_t e = 0; e < E; ++e) {
    auto f = test::random_floats(static_cast<size_t>(3 * H * I), 80 + static_cast<uint64_t>(e), 0.08f);
    wb.emplace_back(f.size());
    for (size_t i = 0; i < f.size(); ++i) wb.back()[i] = f32_to_bf16(f[i]);
    const uint16_t* b = wb.back().data();
    views.push_back({cpu::Mat{DType::bf16, b, I, H}, cpu::Mat{DType::bf16, b + H * I, I, H}, cpu::Mat{DType::bf16, b + 2 * H * I, H, I}});
  }
  auto x = test::random_floats(static_cast<size_t>(n * H), 90);
  // Expert 0 gets every token (above the threshold), the others a few each (below).
  std::mt19937_64 rng(91);
  std::vector<int32_t> ids(static_cast<size_t>(n * K));
  std::vector<float> wts(ids.size());
  for (int64_t t = 0; t < n; ++t) {
    ids[static_cast<size_t>(t * K)] = 0;
    ids[static_cast<size_t>(t * K + 1)] = static_cast<int32_t>(1 + rng() % (E - 1));
    wts[static_cast<size_t>(t * K)] = 0.6f;
    wts[static_cast<size_t>(t * K + 1)] = 0.4f;
  }
  std::vector<float> exact;
  for (const char* topo : {"", "numa:2 core:1 pu:1"}) {
    numa::PoolOptions po;
    po.topology = topo;
    po.threads = 2;
    po.quiet = true;
    numa::NodePools pools(po);
    numa::EngineOptions eo;
    eo.print_memory = false;
    if (exact.empty()) {
      numa::ExpertEngine fp(views, pools, eo);
      exact.assign(static_cast<size_t>(n * H), 0.0f);
      fp.forward(x.data(), n, ids.data(), wts.data(), K, exact.data());
    }
    eo.onednn_min_tokens = 16;
    numa::ExpertEngine engine(views, pools, eo);
    std::vector<float> got(static_cast<size_t>(n * H), 0.0f);
    engine.forward(x.data(), n, ids.data(), wts.data(), K, got.data());
    if (!have) {  // no oneDNN primitive was made: the step ran the fp32 kernels, bit for bit
      CHECK(engine.onednn_steps() == 0);
      CHECK(got == exact);
      continue;
    }
    CHECK(engine.onednn_steps() == 1);
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num = std::max(num, static_cast<double>(std::fabs(got[i] - exact[i])));
      den = std::max(den, static_cast<double>(std::fabs(exact[i])));
    }
    MESSAGE("oneDNN path on '" << std::string(topo) << "': max |diff| " << num << " of max |y| " << den);
    CHECK(num <= 2e-2 * den);  // bf16 activations
    CHECK(num > 0);            // it did take the bf16 path
    // A step where no expert reaches the threshold stays on the fp32 kernels: bitwise equal.
    std::vector<float> one(static_cast<size_t>(H), 0.0f), one_exact(one);
    engine.forward(x.data(), 1, ids.data(), wts.data(), K, one.data());
    numa::EngineOptions plain = eo;
    plain.onednn_min_tokens = 0;
    numa::ExpertEngine fp1(views, pools, plain);
    fp1.forward(x.data(), 1, ids.data(), wts.data(), K, one_exact.data());
    CHECK(one == one_exact);
    CHECK(engine.onednn_steps() == 1);
  }
}
