// The Gated DeltaNet's memory-bound ends (gpu/deltanet.h): conv + gates
// (deltanet_prepare) and the gated norm, in the plain kernels and the
// vectorised ones (gpu/deltanet_io.h: prepare's vec1 and vec2, the latter at
// several tile lengths), each against a scalar reference on random data and
// against the plain kernels: Qwen3-Next-80B-A3B's shape (16 / 32 heads of
// 128) and small ones, sequences fresh and continued, interleaved in the
// batch, a step cut in two token ranges (micro-batches), the norm's split
// output and its row offset; shapes the vectorised kernels refuse fall back
// to the plain ones. Skips without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "gpu/deltanet.h"
#include "tests/delta_rule_heads.h"
#include "tests/gpu/deltanet_layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

using test::deltanet::Groups;
using test::deltanet::interleaved;
using test::deltanet::Layout;
using test::deltanet::silu;

struct Inputs {
  std::vector<float> proj, conv_w, a_neg, dt_bias, norm_w, core;
  std::vector<std::vector<float>> windows;  // per group: [conv_k - 1][conv_dim]
};

// deltanet_prepare's outputs for every ordered token, in double where it sums.
void prepare_reference(const Layout& L, const Groups& gr, const Inputs& in, std::vector<float>& conv, std::vector<float>& gate,
                       std::vector<float>& beta) {
  const gpu::DeltaNetShape& sh = L.sh;
  const int64_t n = static_cast<int64_t>(gr.order.size()), cd = sh.conv_dim(), P = sh.proj_cols(), W = sh.conv_k - 1;
  conv.assign(static_cast<size_t>(n * cd), 0);
  gate.assign(static_cast<size_t>(n * sh.nv), 0);
  beta.assign(static_cast<size_t>(n * sh.nv), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t g = gr.tok_group[static_cast<size_t>(i)];
    const int64_t st = gr.start[static_cast<size_t>(g)], t = i - st;
    float* o = conv.data() + i * cd;
    for (int64_t c = 0; c < cd; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < sh.conv_k; ++j) {
        const int64_t p = t - W + j;  // the input's position in the sequence's step; < 0: the window
        const float x = p >= 0 ? in.proj[static_cast<size_t>(gr.order[static_cast<size_t>(st + p)] * P + L.conv_col(c))]
                        : gr.fresh[static_cast<size_t>(g)] ? 0.0f
                                                           : in.windows[static_cast<size_t>(g)][static_cast<size_t>((W + p) * cd + c)];
        acc += static_cast<double>(in.conv_w[static_cast<size_t>(c * sh.conv_k + j)]) * x;
      }
      o[c] = silu(static_cast<float>(acc));
    }
    test::normalize_qk(o, sh.nk, sh.dk);
    const float* prow = in.proj.data() + gr.order[static_cast<size_t>(i)] * P;
    for (int64_t hv = 0; hv < sh.nv; ++hv) {
      const double a = static_cast<double>(prow[L.a_col(hv)]) + in.dt_bias[static_cast<size_t>(hv)];
      const double sp = a > 20 ? a : std::log1p(std::exp(a));
      beta[static_cast<size_t>(i * sh.nv + hv)] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(prow[L.b_col(hv)]))));
      gate[static_cast<size_t>(i * sh.nv + hv)] = static_cast<float>(in.a_neg[static_cast<size_t>(hv)] * sp);
    }
  }
}

struct Mode {
  const char* name;
  gpu::DeltaNetIo io;
  int64_t tile;
};
// The plain kernels first (the others are compared with them); vec2 at its own tiles and at set ones.
constexpr Mode kModes[] = {{"plain", gpu::DeltaNetIo::plain, 0},          {"vec1", gpu::DeltaNetIo::vec1, 0},
                           {"vec2", gpu::DeltaNetIo::vec2, 0},            {"vec2 tile 1", gpu::DeltaNetIo::vec2, 1},
                           {"vec2 tile 5", gpu::DeltaNetIo::vec2, 5},     {"vec2 tile 40", gpu::DeltaNetIo::vec2, 40},
                           {"vec2 tile 100", gpu::DeltaNetIo::vec2, 100}};

void check_io(const Layout& L, const Groups& gr) {
  const gpu::DeltaNetShape& sh = L.sh;
  const int64_t n = static_cast<int64_t>(gr.order.size()), G = static_cast<int64_t>(gr.start.size()), P = sh.proj_cols(), cd = sh.conv_dim(),
                V = sh.value_dim(), W = sh.conv_k - 1;
  const float eps = 1e-6f;
  Inputs in;
  in.proj = test::random_floats(static_cast<size_t>(n * P), 41, 1.0f);
  in.conv_w = test::random_floats(static_cast<size_t>(cd * sh.conv_k), 42, 0.5f);
  in.a_neg = test::random_floats(static_cast<size_t>(sh.nv), 43, 0.5f);
  for (float& x : in.a_neg) x = -std::exp(x);
  in.dt_bias = test::random_floats(static_cast<size_t>(sh.nv), 44, 0.5f);
  in.norm_w = test::random_floats(static_cast<size_t>(sh.dv), 45, 0.2f);
  for (float& x : in.norm_w) x += 1.0f;
  in.core = test::random_floats(static_cast<size_t>(n * V), 46, 0.7f);
  for (int64_t g = 0; g < G; ++g) in.windows.push_back(test::random_floats(static_cast<size_t>(W * cd), 47 + static_cast<uint64_t>(g), 1.0f));
  std::vector<float> conv_ref, gate_ref, beta_ref;
  prepare_reference(L, gr, in, conv_ref, gate_ref, beta_ref);
  const std::vector<float> y_ref = test::deltanet::gated_norm_reference(L, gr, in.core.data(), in.proj, in.norm_w, eps);

  gpu::Stream s;
  // Each group's buffer: two layers' states, the kernels on the second (state_off); a fresh group's holds garbage.
  const int64_t layer_bytes = gpu::deltanet_layer_state_bytes(sh), layer_floats = layer_bytes / 4;
  std::vector<gpu::DeviceBuffer> states;
  std::vector<std::vector<float>> state_host;
  std::vector<uint64_t> ptrs;
  for (int64_t g = 0; g < G; ++g) {
    std::vector<float> buf(static_cast<size_t>(2 * layer_floats), 7.0f);
    if (gr.fresh[static_cast<size_t>(g)]) std::fill(buf.begin() + layer_floats, buf.end(), 1e3f);
    else std::copy(in.windows[static_cast<size_t>(g)].begin(), in.windows[static_cast<size_t>(g)].end(), buf.begin() + layer_floats);
    states.push_back(test::to_device(buf, s));
    state_host.push_back(buf);
    ptrs.push_back(reinterpret_cast<uint64_t>(states.back().data()));
  }
  auto d_proj = test::to_device(in.proj, s), d_conv_w = test::to_device(in.conv_w, s), d_a = test::to_device(in.a_neg, s),
       d_dt = test::to_device(in.dt_bias, s), d_norm = test::to_device(in.norm_w, s), d_core = test::to_device(in.core, s);
  auto d_order = test::to_device(gr.order, s), d_tg = test::to_device(gr.tok_group, s), d_start = test::to_device(gr.start, s),
       d_count = test::to_device(gr.count, s), d_fresh = test::to_device(gr.fresh, s), d_ptrs = test::to_device(ptrs, s);
  const gpu::DeltaNetGroups dg = test::deltanet::device_groups(d_order, d_tg, d_start, d_count, d_fresh, d_ptrs);
  const float sentinel = -123.0f;
  gpu::DeviceBuffer conv(static_cast<size_t>(n * cd * 4)), gate(static_cast<size_t>(n * sh.nv * 4)), beta(static_cast<size_t>(n * sh.nv * 4));
  gpu::DeviceBuffer y(static_cast<size_t>(n * V * 2)), y_lo(static_cast<size_t>(n * V * 2));
  std::vector<float> conv_plain, gate_plain, beta_plain, y_plain;
  const int64_t cut = n / 3 + 1;  // a micro-batch boundary inside the sequences
  for (const Mode& m : kModes) {
    CAPTURE(m.name);
    gpu::set_deltanet_io(m.io, m.tile);
    // Conv + gates: the whole step in one call, then as two token ranges; rows outside a range stay as they were.
    for (const bool two : {false, true}) {
      CAPTURE(two);
      const std::vector<float> fill(static_cast<size_t>(n * cd), sentinel);
      gpu::copy_to_device(conv.data(), fill.data(), fill.size() * 4, s);
      if (!two) {
        gpu::deltanet_prepare(d_proj.as<float>(), P, dg, 0, n, sh, d_conv_w.as<float>(), d_a.as<float>(), d_dt.as<float>(), layer_bytes, conv.as<float>(),
                              gate.as<float>(), beta.as<float>(), s);
      } else {
        gpu::deltanet_prepare(d_proj.as<float>(), P, dg, cut, n - cut, sh, d_conv_w.as<float>(), d_a.as<float>(), d_dt.as<float>(), layer_bytes,
                              conv.as<float>(), gate.as<float>(), beta.as<float>(), s);
        const auto part = test::to_host<float>(conv, static_cast<size_t>(n * cd), s);
        CHECK(std::all_of(part.begin(), part.begin() + cut * cd, [&](float x) { return x == sentinel; }));
        gpu::deltanet_prepare(d_proj.as<float>(), P, dg, 0, cut, sh, d_conv_w.as<float>(), d_a.as<float>(), d_dt.as<float>(), layer_bytes,
                              conv.as<float>(), gate.as<float>(), beta.as<float>(), s);
      }
      const auto c = test::to_host<float>(conv, static_cast<size_t>(n * cd), s);
      const auto ga = test::to_host<float>(gate, static_cast<size_t>(n * sh.nv), s);
      const auto be = test::to_host<float>(beta, static_cast<size_t>(n * sh.nv), s);
      CHECK(test::tol_ratio(c, conv_ref, 1e-5, 1e-4) <= 1);
      CHECK(test::tol_ratio(ga, gate_ref, 1e-6, 1e-5) <= 1);
      CHECK(test::tol_ratio(be, beta_ref, 1e-6, 1e-5) <= 1);
      if (m.io == gpu::DeltaNetIo::plain && !two) {
        conv_plain = c;
        gate_plain = ga;
        beta_plain = be;
      } else {
        CHECK(test::tol_ratio(c, conv_plain, 1e-6, 1e-5) <= 1);
        CHECK(test::tol_ratio(ga, gate_plain, 1e-7, 1e-6) <= 1);
        CHECK(test::tol_ratio(be, beta_plain, 1e-7, 1e-6) <= 1);
      }
    }
    // The states are read, never written.
    for (int64_t g = 0; g < G; ++g) {
      const auto buf = test::to_host<float>(states[static_cast<size_t>(g)], static_cast<size_t>(2 * layer_floats), s);
      CHECK(buf == state_host[static_cast<size_t>(g)]);
    }
    // Gated norm: bf16 alone, then with the rounding remainder (hi the same, hi + lo to about 16 bits).
    gpu::deltanet_gated_norm(d_core.as<float>(), d_proj.as<float>(), P, dg, 0, n, sh, d_norm.as<float>(), eps, y.as<uint16_t>(), s);
    const auto hi_only = test::to_host<uint16_t>(y, static_cast<size_t>(n * V), s);
    CHECK(test::tol_ratio(test::f32_of(hi_only), y_ref, 1e-3, 1.0 / 128) <= 1);
    gpu::deltanet_gated_norm(d_core.as<float>(), d_proj.as<float>(), P, dg, 0, n, sh, d_norm.as<float>(), eps, y.as<uint16_t>(), s,
                             y_lo.as<uint16_t>(), 0);
    const auto hi = test::to_host<uint16_t>(y, static_cast<size_t>(n * V), s);
    const auto lo = test::to_host<uint16_t>(y_lo, static_cast<size_t>(n * V), s);
    CHECK(hi == hi_only);
    const auto sum = test::bf16_pair_sum(hi, lo);
    CHECK(test::tol_ratio(sum, y_ref, 1e-5, 1e-4) <= 1);
    if (m.io == gpu::DeltaNetIo::plain) y_plain = sum;
    else CHECK(test::tol_ratio(sum, y_plain, 1e-6, 4e-5) <= 1);  // an ulp of v apart may move lo by one of its ulps (2^-15 v)
    // A micro-batch's tokens [cut, n): rows order[i] - row0 of y (row0 the smallest of them).
    int32_t row0 = static_cast<int32_t>(n);
    for (int64_t i = cut; i < n; ++i) row0 = std::min(row0, gr.order[static_cast<size_t>(i)]);
    gpu::memset_device(y.data(), 0, y.bytes(), s);
    gpu::deltanet_gated_norm(d_core.as<float>(), d_proj.as<float>(), P, dg, cut, n - cut, sh, d_norm.as<float>(), eps, y.as<uint16_t>(), s,
                             y_lo.as<uint16_t>(), row0);
    const auto hp = test::to_host<uint16_t>(y, static_cast<size_t>(n * V), s);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = gr.order[static_cast<size_t>(i)];
      if (i < cut) continue;
      for (int64_t j = 0; j < V; ++j) wrong += hp[static_cast<size_t>((row - row0) * V + j)] != hi[static_cast<size_t>(row * V + j)];
    }
    CHECK(wrong == 0);
  }
  gpu::set_deltanet_io(gpu::DeltaNetIo::automatic);
}

}  // namespace

TEST_CASE("gated deltanet conv + gates and gated norm: plain, vec1 and vec2 kernels match a scalar reference and each other") {
  if (!test::have_gpu()) return;
  // Lengths from 1 to 150 (a tile's first token inside a sequence, sequences starting inside tiles), fresh and continued.
  const Groups gr = interleaved({1, 2, 3, 4, 7, 40, 150, 64}, {0, 1, 0, 1, 0, 1, 0, 0});
  struct Case {
    const char* name;
    int64_t nk, nv, dk, dv, conv_k;
  };
  for (const Case& c : {Case{"Qwen3-Next-80B-A3B: 16 / 32 heads of 128", 16, 32, 128, 128, 4}, Case{"dk 32, dv 48", 2, 4, 32, 48, 4},
                        Case{"dk 64, 3 value heads per key head", 2, 6, 64, 64, 4},
                        Case{"dk 48 (prepare falls back to the plain kernel), dv 20", 2, 2, 48, 20, 4},
                        Case{"conv_k 3 (prepare falls back), dv 200 (the norm's lanes partly idle)", 1, 2, 16, 200, 3}}) {
    CAPTURE(c.name);
    Layout L;
    L.sh.nk = c.nk;
    L.sh.nv = c.nv;
    L.sh.dk = c.dk;
    L.sh.dv = c.dv;
    L.sh.conv_k = c.conv_k;
    check_io(L, gr);
  }
}
