#include "numa/expert_engine.h"

#include <cmath>

namespace hmoe::numa {

namespace {
inline float silu(float g) { return g / (1.0f + std::exp(-g)); }
}  // namespace

void mlp_forward(const float* x, int64_t n, const ExpertWeights& w, float* out, ThreadPool* pool) {
  const int64_t inter = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(n * inter)), u(static_cast<size_t>(n * inter));
  cpu::gemm(x, n, w.gate, g.data(), pool);
  cpu::gemm(x, n, w.up, u.data(), pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  cpu::gemm(g.data(), n, w.down, out, pool);
}

void moe_forward(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t k,
                 const std::vector<ExpertWeights>& experts, float* out, ThreadPool* pool) {
  const int64_t E = static_cast<int64_t>(experts.size());
  // Group (token, slot) pairs by expert.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) by_expert[static_cast<size_t>(ids[t * k + j])].push_back(t * k + j);
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[static_cast<size_t>(e)].empty()) active.push_back(e);
  // Each active expert computes its tokens into a private buffer; the sum
  // into `out` happens afterwards in a fixed order, so results do not depend
  // on thread timing.
  std::vector<std::vector<float>> results(active.size());
  auto body = [&](int64_t b, int64_t e_end, int) {
    for (int64_t a = b; a < e_end; ++a) {
      const auto& w = experts[static_cast<size_t>(active[static_cast<size_t>(a)])];
      const auto& pairs = by_expert[static_cast<size_t>(active[static_cast<size_t>(a)])];
      const int64_t m = static_cast<int64_t>(pairs.size()), inter = w.gate.rows;
      std::vector<float> xs(static_cast<size_t>(m * hidden)), g(static_cast<size_t>(m * inter)), u(static_cast<size_t>(m * inter));
      for (int64_t i = 0; i < m; ++i) {
        const float* src = x + (pairs[static_cast<size_t>(i)] / k) * hidden;
        std::copy(src, src + hidden, xs.begin() + i * hidden);
      }
      cpu::gemm_rows(xs.data(), hidden, m, w.gate, 0, inter, g.data(), inter);
      cpu::gemm_rows(xs.data(), hidden, m, w.up, 0, inter, u.data(), inter);
      for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
      auto& r = results[static_cast<size_t>(a)];
      r.resize(static_cast<size_t>(m * hidden));
      cpu::gemm_rows(g.data(), inter, m, w.down, 0, hidden, r.data(), hidden);
    }
  };
  if (pool) pool->parallel_for(static_cast<int64_t>(active.size()), body);
  else body(0, static_cast<int64_t>(active.size()), 0);
  for (size_t a = 0; a < active.size(); ++a) {
    const auto& pairs = by_expert[static_cast<size_t>(active[a])];
    for (size_t i = 0; i < pairs.size(); ++i) {
      const int64_t t = pairs[i] / k;
      const float wt = weights[pairs[i]];
      const float* r = results[a].data() + static_cast<int64_t>(i) * hidden;
      float* o = out + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += wt * r[h];
    }
  }
}

}  // namespace hmoe::numa
