// Shared by the Gated DeltaNet GPU tests (test_gpu_deltanet.cpp,
// test_gpu_deltanet_io.cpp): the tests' own reading of the checkpoint's
// grouped layout of the fused product (independent of the kernels),
// sequences interleaved in the batch, the gated norm's scalar reference and
// the device view of the groups a launch takes.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/deltanet.h"
#include "gpu/memory.h"

namespace hmoe::test::deltanet {

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// Per key head: q dk, k dk, v r dv, z r dv; then per key head b r, a r (r = nv / nk value heads per key head).
struct Layout {
  gpu::DeltaNetShape sh;
  int64_t r() const { return sh.nv / sh.nk; }
  int64_t group() const { return 2 * sh.dk + 2 * r() * sh.dv; }
  int64_t conv_col(int64_t c) const {
    const int64_t K = sh.key_dim();
    if (c < K) return (c / sh.dk) * group() + c % sh.dk;
    if (c < 2 * K) return ((c - K) / sh.dk) * group() + sh.dk + (c - K) % sh.dk;
    const int64_t v = c - 2 * K;
    return (v / (r() * sh.dv)) * group() + 2 * sh.dk + v % (r() * sh.dv);
  }
  int64_t z_col(int64_t j) const { return (j / (r() * sh.dv)) * group() + 2 * sh.dk + r() * sh.dv + j % (r() * sh.dv); }
  int64_t b_col(int64_t hv) const { return sh.nk * group() + (hv / r()) * 2 * r() + hv % r(); }
  int64_t a_col(int64_t hv) const { return b_col(hv) + r(); }
};

// Ordered tokens: order[i] the batch row of ordered token i, tok_group[i] its group; per group its first ordered
// token, token count and fresh flag.
struct Groups {
  std::vector<int32_t> order, tok_group, start, count, fresh;
};

// Sequences of the given lengths interleaved in the batch (round robin), with the given fresh flags.
inline Groups interleaved(const std::vector<int32_t>& counts, const std::vector<int32_t>& fresh) {
  Groups g;
  const size_t G = counts.size();
  std::vector<std::vector<int32_t>> rows(G);
  int32_t row = 0;
  const int32_t most = *std::max_element(counts.begin(), counts.end());
  for (int32_t i = 0; i < most; ++i)
    for (size_t q = 0; q < G; ++q)
      if (i < counts[q]) rows[q].push_back(row++);
  for (size_t q = 0; q < G; ++q) {
    g.start.push_back(static_cast<int32_t>(g.order.size()));
    g.count.push_back(counts[q]);
    g.fresh.push_back(fresh[q]);
    for (int32_t r : rows[q]) {
      g.order.push_back(r);
      g.tok_group.push_back(static_cast<int32_t>(q));
    }
  }
  return g;
}

// The gated norm's fp32 values laid out by batch row ([n][nv dv]): per value head of ordered token i's row of core
// ([n][nv dv]), x / sqrt(mean x^2 + eps) (in double) * norm_w * silu(z), z from batch row order[i] of proj.
inline std::vector<float> gated_norm_reference(const Layout& L, const Groups& gr, const float* core, const std::vector<float>& proj,
                                               const std::vector<float>& norm_w, float eps) {
  const gpu::DeltaNetShape& sh = L.sh;
  const int64_t n = static_cast<int64_t>(gr.order.size()), V = sh.value_dim(), P = sh.proj_cols();
  std::vector<float> y(static_cast<size_t>(n * V), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = gr.order[static_cast<size_t>(i)];
    for (int64_t hv = 0; hv < sh.nv; ++hv) {
      const float* o = core + i * V + hv * sh.dv;
      double ss = 0;
      for (int64_t j = 0; j < sh.dv; ++j) ss += static_cast<double>(o[j]) * o[j];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(sh.dv) + eps);
      for (int64_t j = 0; j < sh.dv; ++j)
        y[static_cast<size_t>(row * V + hv * sh.dv + j)] =
            static_cast<float>(norm_w[static_cast<size_t>(j)] * (o[j] * inv) * silu(proj[static_cast<size_t>(row * P + L.z_col(hv * sh.dv + j))]));
    }
  }
  return y;
}

// The kernels' view of groups whose arrays are on the device (int32 each; state: the groups' state pointers, uint64).
inline gpu::DeltaNetGroups device_groups(const gpu::DeviceBuffer& order, const gpu::DeviceBuffer& tok_group, const gpu::DeviceBuffer& start,
                                         const gpu::DeviceBuffer& count, const gpu::DeviceBuffer& fresh, const gpu::DeviceBuffer& state) {
  gpu::DeltaNetGroups dg;
  dg.order = order.as<int32_t>();
  dg.tok_group = tok_group.as<int32_t>();
  dg.start = start.as<int32_t>();
  dg.count = count.as<int32_t>();
  dg.fresh = fresh.as<int32_t>();
  dg.state = state.as<uint64_t>();
  return dg;
}

}  // namespace hmoe::test::deltanet
