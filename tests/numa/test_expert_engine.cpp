// ExpertEngine against a plain per-token reference (scalar, double sums) for
// every weight type, 1/2/4 synthetic nodes, placed copies and in-place views,
// and one to many tokens; bad routing rejected.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>

#include "configs/error.h"
#include "numa/expert_engine.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

struct Experts {
  int64_t E, H, I;
  std::vector<std::vector<float>> f32;  // per expert: gate | up | down, fp32
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<cpu::QuantMat> quant;
  std::vector<numa::ExpertWeights> views;

  Experts(int64_t e, int64_t h, int64_t i, const std::string& type, uint64_t seed) : E(e), H(h), I(i) {
    for (int64_t x = 0; x < E; ++x) {
      f32.push_back(test::random_floats(static_cast<size_t>(3 * H * I), seed + static_cast<uint64_t>(x), 0.08f));
      const float* g = f32.back().data();
      const float* u = g + H * I;
      const float* d = u + H * I;
      if (type == "bf16") {
        bf16.emplace_back(f32.back().size());
        for (size_t k = 0; k < f32.back().size(); ++k) bf16.back()[k] = f32_to_bf16(f32.back()[k]);
        const uint16_t* b = bf16.back().data();
        views.push_back({cpu::Mat{DType::bf16, b, I, H}, cpu::Mat{DType::bf16, b + H * I, I, H}, cpu::Mat{DType::bf16, b + 2 * H * I, H, I}});
      } else if (type == "f32") {
        views.push_back({cpu::Mat{DType::f32, g, I, H}, cpu::Mat{DType::f32, u, I, H}, cpu::Mat{DType::f32, d, H, I}});
      } else if (type == "int8") {
        quant.push_back(cpu::quantize_int8(g, I, H));
        quant.push_back(cpu::quantize_int8(u, I, H));
        quant.push_back(cpu::quantize_int8(d, H, I));
      } else {  // int4-sym / int4-asym, group 32
        const bool asym = type == "int4-asym";
        quant.push_back(cpu::quantize_int4(g, I, H, 32, asym));
        quant.push_back(cpu::quantize_int4(u, I, H, 32, asym));
        quant.push_back(cpu::quantize_int4(d, H, I, 32, asym));
      }
    }
    for (size_t q = 0; q + 2 < quant.size(); q += 3) views.push_back({quant[q].view, quant[q + 1].view, quant[q + 2].view});
  }
};

// out[t] += sum_j w * down(silu(gate x) * up x), dequantized weights, double sums.
void reference(const Experts& ex, const std::vector<float>& x, int64_t n, const std::vector<int32_t>& ids, const std::vector<float>& wts,
               int64_t k, std::vector<float>& out) {
  const int64_t H = ex.H, I = ex.I;
  std::vector<float> row(static_cast<size_t>(std::max(H, I)));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const auto& w = ex.views[static_cast<size_t>(ids[static_cast<size_t>(t * k + j)])];
      std::vector<double> act(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        cpu::row_to_f32(w.gate, i, row.data());
        for (int64_t h = 0; h < H; ++h) g += static_cast<double>(row[static_cast<size_t>(h)]) * x[static_cast<size_t>(t * H + h)];
        cpu::row_to_f32(w.up, i, row.data());
        for (int64_t h = 0; h < H; ++h) u += static_cast<double>(row[static_cast<size_t>(h)]) * x[static_cast<size_t>(t * H + h)];
        act[static_cast<size_t>(i)] = g / (1.0 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < H; ++h) {
        cpu::row_to_f32(w.down, h, row.data());
        double s = 0;
        for (int64_t i = 0; i < I; ++i) s += static_cast<double>(row[static_cast<size_t>(i)]) * act[static_cast<size_t>(i)];
        out[static_cast<size_t>(t * H + h)] += static_cast<float>(wts[static_cast<size_t>(t * k + j)] * s);
      }
    }
}

void routing(int64_t n, int64_t k, int64_t E, uint64_t seed, std::vector<int32_t>& ids, std::vector<float>& wts) {
  std::mt19937_64 rng(seed);
  ids.resize(static_cast<size_t>(n * k));
  wts.resize(ids.size());
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      ids[static_cast<size_t>(t * k + j)] = perm[static_cast<size_t>(j)];
      wts[static_cast<size_t>(t * k + j)] = 0.1f + 0.8f * static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
}

}  // namespace

TEST_CASE("ExpertEngine equals the per-token reference: types x nodes x batch") {
  const int64_t E = 6, H = 96, I = 64, K = 2;
  for (const std::string type : {"f32", "bf16", "int8", "int4-sym", "int4-asym"}) {
    Experts ex(E, H, I, type, 100);
    for (const char* topo : {"", "numa:2 core:1 pu:1", "numa:4 core:1 pu:1"})
      for (int copy : {-1, 1}) {
        numa::PoolOptions po;
        po.topology = topo;
        po.threads = 2;
        po.quiet = true;
        numa::NodePools pools(po);
        numa::EngineOptions eo;
        eo.copy_to_nodes = copy;
        eo.print_memory = false;
        numa::ExpertEngine engine(ex.views, pools, eo);
        CHECK(engine.copied() == (copy == 1 || pools.nodes() > 1));
        uint64_t total = 0;
        for (auto b : engine.bytes_per_node()) total += b;
        uint64_t want = 0;
        for (int64_t e = 0; e < E; ++e) want += engine.expert_bytes(e);
        CHECK(total == want);  // every byte lives on exactly one node
        for (int64_t n : {1, 3, 17}) {
          auto x = test::random_floats(static_cast<size_t>(n * H), 200 + static_cast<uint64_t>(n));
          std::vector<int32_t> ids;
          std::vector<float> wts;
          routing(n, K, E, 300 + static_cast<uint64_t>(n), ids, wts);
          auto base = test::random_floats(static_cast<size_t>(n * H), 400);  // forward adds to out
          std::vector<float> ref = base, got = base;
          reference(ex, x, n, ids, wts, K, ref);
          engine.forward(x.data(), n, ids.data(), wts.data(), K, got.data());
          for (size_t i = 0; i < ref.size(); ++i)
            REQUIRE_MESSAGE(std::fabs(got[i] - ref[i]) <= 2e-4f * (1 + std::fabs(ref[i])),
                            type << " topo '" << topo << "' copy " << copy << " n=" << n << " i=" << i << ": " << got[i] << " vs " << ref[i]);
        }
      }
  }
}

TEST_CASE("ExpertEngine results do not depend on the node count") {
  const int64_t E = 8, H = 128, I = 96, K = 3, n = 9;
  Experts ex(E, H, I, "bf16", 7);
  auto x = test::random_floats(static_cast<size_t>(n * H), 8);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  routing(n, K, E, 9, ids, wts);
  std::vector<std::vector<float>> outs;
  for (const char* topo : {"", "numa:2 core:1 pu:1", "numa:4 core:1 pu:1"}) {
    numa::PoolOptions po;
    po.topology = topo;
    po.quiet = true;
    numa::NodePools pools(po);
    numa::EngineOptions eo;
    eo.print_memory = false;
    numa::ExpertEngine engine(ex.views, pools, eo);
    outs.emplace_back(static_cast<size_t>(n * H), 0.0f);
    engine.forward(x.data(), n, ids.data(), wts.data(), K, outs.back().data());
  }
  // Each output is one dot product per row, summed over experts in the same
  // order; only the row split differs, so the results are bitwise equal.
  CHECK(outs[0] == outs[1]);
  CHECK(outs[0] == outs[2]);
}

TEST_CASE("bf16 dot option stays close to the fp32-activation path") {
  const int64_t E = 4, H = 256, I = 128, K = 2, n = 5;
  Experts ex(E, H, I, "bf16", 50);
  numa::PoolOptions po;
  po.quiet = true;
  numa::NodePools pools(po);
  numa::EngineOptions exact, fast;
  exact.print_memory = fast.print_memory = false;
  fast.bf16_dot = true;
  numa::ExpertEngine a(ex.views, pools, exact), b(ex.views, pools, fast);
  auto x = test::random_floats(static_cast<size_t>(n * H), 51);
  std::vector<int32_t> ids;
  std::vector<float> wts;
  routing(n, K, E, 52, ids, wts);
  std::vector<float> ya(static_cast<size_t>(n * H), 0.0f), yb = ya;
  a.forward(x.data(), n, ids.data(), wts.data(), K, ya.data());
  b.forward(x.data(), n, ids.data(), wts.data(), K, yb.data());
  double max_abs = 0, max_ref = 0;
  for (size_t i = 0; i < ya.size(); ++i) {
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(ya[i] - yb[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(ya[i])));
  }
  const std::string path = cpu::has_bf16_dot() ? "vdpbf16ps" : "no AVX512_BF16: fallback";
  MESSAGE("bf16 dot max |diff| " << max_abs << " of max |y| " << max_ref << " (" << path << ")");
  CHECK(max_abs <= 2e-2 * max_ref);  // activations rounded to 8 mantissa bits
}

TEST_CASE("ExpertEngine rejects bad routing and inconsistent experts") {
  Experts ex(3, 64, 32, "f32", 1);
  numa::PoolOptions po;
  po.quiet = true;
  po.threads = 2;
  numa::NodePools pools(po);
  numa::EngineOptions eo;
  eo.print_memory = false;
  numa::ExpertEngine engine(ex.views, pools, eo);
  std::vector<float> x(64, 1.0f), out(64, 0.0f);
  const float w = 1.0f;
  for (int32_t bad : {-1, 3, 1 << 30}) CHECK_THROWS_WITH_AS(engine.forward(x.data(), 1, &bad, &w, 1, out.data()), doctest::Contains("expert id"), Error);
  auto views = ex.views;
  views[2].down.rows = 63;
  CHECK_THROWS_WITH_AS(numa::ExpertEngine(views, pools, eo), doctest::Contains("expert 2"), Error);
  CHECK_THROWS_AS(numa::ExpertEngine(std::vector<numa::ExpertWeights>{}, pools, eo), Error);
  CHECK(engine.memory_report().find("node0") != std::string::npos);
}
