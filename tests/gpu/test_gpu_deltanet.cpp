// Qwen3-Next's kernels on the GPU (gpu/deltanet.h) against plain scalar
// references on random data: the Gated DeltaNet conv + norm + gates, the
// delta rule in its chunked and recurrent kernels (against
// ops::delta_rule_reference in double), the conv window and state updates,
// the gated output norm; the gated attention's q/k preparation, output gate
// and the sigmoid-scaled shared expert. Skips without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "configs/error.h"
#include "configs/settings.h"
#include "engine/ops/cpu_ops.h"
#include "engine/ops/delta_rule.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/deltanet.h"
#include "tests/delta_rule_heads.h"
#include "tests/gpu/deltanet_layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

int kernel_number(gpu::DeltaNetKernel k) {
  return k == gpu::DeltaNetKernel::v5 ? 5 : k == gpu::DeltaNetKernel::v4 ? 4 : k == gpu::DeltaNetKernel::v3 ? 3 : k == gpu::DeltaNetKernel::v2 ? 2 : 1;
}
// The chunked kernels under test. v3 (gpu/deltanet_v3.cu) is withdrawn: on its first GPU run (2026-12-07, H100) its
// delta-rule outputs were off by up to 1.54 against v1 (bench/README.md); back here with k35a's fix (phase 3 never
// waited for its asynchronous copies, commit fac982e), not yet run on a GPU. v4 (gpu/deltanet_v4.cu, k35a) is the
// default; v5 (gpu/deltanet_v5.cu, k37a: v4's algebra in WY form) is new, not yet run on a GPU.
constexpr gpu::DeltaNetKernel kKernels[] = {gpu::DeltaNetKernel::v1, gpu::DeltaNetKernel::v2, gpu::DeltaNetKernel::v3, gpu::DeltaNetKernel::v4,
                                            gpu::DeltaNetKernel::v5};
float sigm(float x) { return 1.0f / (1.0f + std::exp(-x)); }

using test::deltanet::Groups;
using test::deltanet::interleaved;
using test::deltanet::Layout;
using test::deltanet::silu;

struct Reference {
  std::vector<float> conv, gate, beta, core, y, state;  // state: per group, the layer's part after the step
};

Reference reference(const Layout& L, const Groups& gr, const std::vector<float>& proj, const std::vector<float>& conv_w,
                    const std::vector<float>& a_neg, const std::vector<float>& dt_bias, const std::vector<float>& norm_w, float eps,
                    const std::vector<float>& state0, int64_t layer_floats) {
  const gpu::DeltaNetShape& sh = L.sh;
  const int64_t n = static_cast<int64_t>(gr.order.size()), cd = sh.conv_dim(), P = sh.proj_cols(), V = sh.value_dim();
  const int64_t W = sh.conv_k - 1;
  Reference R;
  R.conv.assign(static_cast<size_t>(n * cd), 0);
  R.gate.assign(static_cast<size_t>(n * sh.nv), 0);
  R.beta.assign(static_cast<size_t>(n * sh.nv), 0);
  R.core.assign(static_cast<size_t>(n * V), 0);
  R.state = state0;
  for (size_t g = 0; g < gr.start.size(); ++g) {
    const int64_t st = gr.start[g], cnt = gr.count[g];
    float* state = R.state.data() + static_cast<int64_t>(g) * layer_floats;
    if (gr.fresh[g]) std::fill(state, state + layer_floats, 0.0f);
    std::vector<float> ext(static_cast<size_t>((W + cnt) * cd));
    for (int64_t e = 0; e < W + cnt; ++e)
      for (int64_t c = 0; c < cd; ++c)
        ext[static_cast<size_t>(e * cd + c)] = e < W ? state[e * cd + c] : proj[static_cast<size_t>(gr.order[static_cast<size_t>(st + e - W)] * P + L.conv_col(c))];
    for (int64_t t = 0; t < cnt; ++t) {
      float* o = R.conv.data() + (st + t) * cd;
      for (int64_t c = 0; c < cd; ++c) {
        float s = 0;
        for (int64_t j = 0; j < sh.conv_k; ++j) s += conv_w[static_cast<size_t>(c * sh.conv_k + j)] * ext[static_cast<size_t>((t + j) * cd + c)];
        o[c] = silu(s);
      }
      test::normalize_qk(o, sh.nk, sh.dk);
      const float* prow = proj.data() + gr.order[static_cast<size_t>(st + t)] * P;
      for (int64_t hv = 0; hv < sh.nv; ++hv) {
        const double a = prow[L.a_col(hv)] + dt_bias[static_cast<size_t>(hv)];
        const double sp = a > 20 ? a : std::log1p(std::exp(a));
        R.beta[static_cast<size_t>((st + t) * sh.nv + hv)] = sigm(prow[L.b_col(hv)]);
        R.gate[static_cast<size_t>((st + t) * sh.nv + hv)] = static_cast<float>(a_neg[static_cast<size_t>(hv)] * sp);
      }
    }
    for (int64_t j = 0; j < W; ++j)
      for (int64_t c = 0; c < cd; ++c) state[j * cd + c] = ext[static_cast<size_t>((cnt + j) * cd + c)];
    test::delta_rule_heads(sh.nk, sh.nv, sh.dk, sh.dv, R.conv.data(), R.gate.data(), R.beta.data(), st, cnt, R.core.data(), state + W * cd);
  }
  R.y = test::deltanet::gated_norm_reference(L, gr, R.core.data(), proj, norm_w, eps);
  return R;
}

}  // namespace

namespace {

// The whole linear-attention path (conv + gates, conv window, chunked and
// recurrent delta rule, gated norm and its split) against reference() for
// each chunked kernel, with the setting gpu_deltanet_kernel at that kernel,
// in the modes (max_recurrent, chunk); conv + gates and the norm in their
// plain kernels and in the vectorised ones the layers take where the shape
// allows (tests/gpu/test_gpu_deltanet_io.cpp checks those on their own).
void check_path(const Layout& L, const Groups& gr, const std::vector<std::pair<int64_t, int64_t>>& modes) {
  const gpu::DeltaNetShape& sh = L.sh;
  const int64_t n = static_cast<int64_t>(gr.order.size()), G = static_cast<int64_t>(gr.start.size()), P = sh.proj_cols(), cd = sh.conv_dim(),
                V = sh.value_dim();
  const float eps = 1e-6f;
  const std::vector<float> proj = test::random_floats(static_cast<size_t>(n * P), 11, 1.0f);
  const std::vector<float> conv_w = test::random_floats(static_cast<size_t>(cd * sh.conv_k), 12, 0.5f);
  std::vector<float> a_neg = test::random_floats(static_cast<size_t>(sh.nv), 13, 0.5f), dt_bias = test::random_floats(static_cast<size_t>(sh.nv), 14, 0.5f);
  for (float& x : a_neg) x = -std::exp(x);
  std::vector<float> norm_w = test::random_floats(static_cast<size_t>(sh.dv), 15, 0.2f);
  for (float& x : norm_w) x += 1.0f;
  // Each group's buffer holds two layers; the kernels work on the second.
  const int64_t layer_bytes = gpu::deltanet_layer_state_bytes(sh), layer_floats = layer_bytes / 4;
  const int64_t used = (sh.conv_k - 1) * cd + sh.nv * sh.dk * sh.dv;
  std::vector<float> state0 = test::random_floats(static_cast<size_t>(G * layer_floats), 16, 0.3f);
  for (int64_t g = 0; g < G; ++g)
    std::fill(state0.begin() + g * layer_floats + used, state0.begin() + (g + 1) * layer_floats, 0.0f);
  const Reference R = reference(L, gr, proj, conv_w, a_neg, dt_bias, norm_w, eps, state0, layer_floats);

  gpu::Stream s;
  auto d_proj = test::to_device(proj, s), d_conv_w = test::to_device(conv_w, s), d_a = test::to_device(a_neg, s), d_dt = test::to_device(dt_bias, s),
       d_norm = test::to_device(norm_w, s);
  auto d_order = test::to_device(gr.order, s), d_tg = test::to_device(gr.tok_group, s), d_start = test::to_device(gr.start, s),
       d_count = test::to_device(gr.count, s), d_fresh = test::to_device(gr.fresh, s);
  gpu::DeviceBuffer conv(static_cast<size_t>(n * cd * 4)), gate(static_cast<size_t>(n * sh.nv * 4)), beta(static_cast<size_t>(n * sh.nv * 4)),
      core(static_cast<size_t>(n * V * 4)), y(static_cast<size_t>(n * V * 2));
  // (max_recurrent, chunk): both kernels by token count, everything chunked, everything recurrent; with
  // each chunked kernel (v1, v2, v3).
  for (const auto io : {gpu::DeltaNetIo::automatic, gpu::DeltaNetIo::plain})
  for (const auto kernel : kKernels)
  for (const auto& mode : modes) {
    const int64_t max_rec = mode.first, chunk = mode.second;
    const int kv = kernel_number(kernel);
    gpu::set_deltanet_kernel(kernel);
    gpu::set_deltanet_io(io);
    const bool plain_io = io == gpu::DeltaNetIo::plain;
    CAPTURE(plain_io);
    CAPTURE(sh.dk);
    CAPTURE(kv);
    CAPTURE(max_rec);
    CAPTURE(chunk);
    if (kv == 2) REQUIRE(gpu::deltanet_v2_chunk(sh, chunk) == (chunk > 0 ? chunk : 64));
    if (kv == 3) REQUIRE(gpu::deltanet_v3_chunk(sh, chunk) == (chunk > 0 ? chunk : 64));
    if (kv == 4) REQUIRE(gpu::deltanet_v4_chunk(sh, chunk) == (chunk > 0 ? chunk : 64));
    if (kv == 5) REQUIRE(gpu::deltanet_v5_chunk(sh, chunk) == (chunk > 0 ? chunk : 64));
    gpu::DeviceBuffer v2s(static_cast<size_t>(std::max<int64_t>(16, gpu::deltanet_chunked_scratch_bytes(sh, kernel, chunk, n, G))));
    std::vector<gpu::DeviceBuffer> states;
    std::vector<uint64_t> ptrs;
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> buf(static_cast<size_t>(2 * layer_floats), 7.0f);  // layer 0: untouched filler
      std::copy(state0.begin() + g * layer_floats, state0.begin() + (g + 1) * layer_floats, buf.begin() + layer_floats);
      if (gr.fresh[static_cast<size_t>(g)]) std::fill(buf.begin() + layer_floats, buf.end(), 1e3f);  // garbage a fresh sequence must ignore
      states.push_back(test::to_device(buf, s));
      ptrs.push_back(reinterpret_cast<uint64_t>(states.back().data()));
    }
    auto d_ptrs = test::to_device(ptrs, s);
    const gpu::DeltaNetGroups dg = test::deltanet::device_groups(d_order, d_tg, d_start, d_count, d_fresh, d_ptrs);
    gpu::deltanet_prepare(d_proj.as<float>(), P, dg, 0, n, sh, d_conv_w.as<float>(), d_a.as<float>(), d_dt.as<float>(), layer_bytes, conv.as<float>(),
                          gate.as<float>(), beta.as<float>(), s);
    gpu::deltanet_conv_window(d_proj.as<float>(), P, dg, 0, G, sh, layer_bytes, s);
    gpu::deltanet_chunked(conv.as<float>(), gate.as<float>(), beta.as<float>(), dg, 0, G, sh, layer_bytes, max_rec, chunk, core.as<float>(), s, kernel, n,
                          v2s.data());
    gpu::deltanet_recurrent(conv.as<float>(), gate.as<float>(), beta.as<float>(), dg, 0, G, sh, layer_bytes, max_rec, core.as<float>(), s);
    gpu::deltanet_gated_norm(core.as<float>(), d_proj.as<float>(), P, dg, 0, n, sh, d_norm.as<float>(), eps, y.as<uint16_t>(), s);
    const auto c_gpu = test::to_host<float>(conv, static_cast<size_t>(n * cd), s);
    const auto g_gpu = test::to_host<float>(gate, static_cast<size_t>(n * sh.nv), s);
    const auto b_gpu = test::to_host<float>(beta, static_cast<size_t>(n * sh.nv), s);
    const auto o_gpu = test::to_host<float>(core, static_cast<size_t>(n * V), s);
    const auto y_gpu = test::f32_of(test::to_host<uint16_t>(y, static_cast<size_t>(n * V), s));
    CHECK(test::tol_ratio(c_gpu, R.conv, 1e-5, 1e-4) <= 1);
    CHECK(test::tol_ratio(g_gpu, R.gate, 1e-6, 1e-5) <= 1);
    CHECK(test::tol_ratio(b_gpu, R.beta, 1e-6, 1e-5) <= 1);
    const double core_ratio = test::tol_ratio(o_gpu, R.core, 1e-4, 1e-3);
    MESSAGE("kernel v" << kv << ", max_recurrent " << max_rec << ", chunk " << chunk << ": delta-rule output within " << core_ratio << " of the tolerance");
    CHECK(core_ratio <= 1);
    CHECK(test::tol_ratio(y_gpu, R.y, 1e-3, 1.0 / 64) <= 1);
    // The split output (hi + lo, gpu_hybrid_precise): hi the bf16 output above, hi + lo to about 16 bits.
    const int64_t row0 = 0;
    gpu::DeviceBuffer yh(static_cast<size_t>(n * V * 2)), yl(static_cast<size_t>(n * V * 2));
    gpu::deltanet_gated_norm(core.as<float>(), d_proj.as<float>(), P, dg, 0, n, sh, d_norm.as<float>(), eps, yh.as<uint16_t>(), s, yl.as<uint16_t>(), row0);
    const auto h_gpu = test::f32_of(test::to_host<uint16_t>(yh, static_cast<size_t>((n - row0) * V), s));
    const auto l_gpu = test::f32_of(test::to_host<uint16_t>(yl, static_cast<size_t>((n - row0) * V), s));
    std::vector<float> sum(h_gpu.size()), want(h_gpu.size()), hi_want(h_gpu.size());
    for (size_t i = 0; i < sum.size(); ++i) {
      sum[i] = h_gpu[i] + l_gpu[i];
      want[i] = R.y[static_cast<size_t>(row0 * V) + i];
      hi_want[i] = y_gpu[static_cast<size_t>(row0 * V) + i];
    }
    CHECK(h_gpu == hi_want);
    CHECK(test::tol_ratio(sum, want, 1e-4, 1e-4) <= 1);
    for (int64_t g = 0; g < G; ++g) {
      const auto buf = test::to_host<float>(states[static_cast<size_t>(g)], static_cast<size_t>(2 * layer_floats), s);
      CHECK(std::all_of(buf.begin(), buf.begin() + layer_floats, [](float x) { return x == 7.0f; }));
      const std::vector<float> mine(buf.begin() + layer_floats, buf.begin() + layer_floats + used);
      const std::vector<float> ref(R.state.begin() + g * layer_floats, R.state.begin() + g * layer_floats + used);
      CHECK_MESSAGE(test::tol_ratio(mine, ref, 1e-4, 1e-3) <= 1, "state of group " << g);
    }
  }
  gpu::set_deltanet_kernel(gpu::DeltaNetKernel::v1);
  gpu::set_deltanet_io(gpu::DeltaNetIo::automatic);
}

}  // namespace

TEST_CASE("gated deltanet kernels match a scalar reference: conv, gates, chunked and recurrent delta rule, state, gated norm") {
  if (!test::have_gpu()) return;
  Layout L;
  L.sh.nk = 2;
  L.sh.nv = 4;
  L.sh.dk = 32;
  L.sh.dv = 48;  // a full 32-column slice and a partial one
  L.sh.conv_k = 4;
  // Three sequences interleaved in the batch: 70 tokens (several chunks of 16), 1 token (decode) and 5 tokens; the
  // second starts fresh with garbage in its buffer, the others continue a random state.
  check_path(L, interleaved({70, 1, 5}, {0, 1, 0}), {{1, 16}, {0, 16}, {1000, 0}, {1, 0}});
}

TEST_CASE("gated deltanet whole path at head dims 128 (plain and vectorised conv + gates and gated norm): lengths 1 to 300, fresh and continued") {
  if (!test::have_gpu()) return;
  Layout L;
  L.sh.nk = 2;
  L.sh.nv = 4;
  L.sh.dk = 128;
  L.sh.dv = 128;
  L.sh.conv_k = 4;
  // Lengths 1, 63, 64, 65, 300 and 2 (the 2-token one continuing a state: its conv window and delta-rule state are random).
  check_path(L, interleaved({1, 63, 64, 65, 300, 2}, {0, 1, 0, 1, 1, 0}), {{1, 0}, {0, 32}});
}

namespace {

// What deltanet_prepare would give the delta rule: per token [q | k | v], q
// and k l2-normalised per key head (q also / sqrt(dk)); decays g < 0 from
// slow (-0.007) to fast (-2.7); beta in (0, 1).
struct RuleInputs {
  std::vector<float> conv, gate, beta;
};
RuleInputs rule_inputs(const gpu::DeltaNetShape& sh, int64_t n, uint64_t seed) {
  const int64_t cd = sh.conv_dim();
  RuleInputs r;
  r.conv = test::random_floats(static_cast<size_t>(n * cd), seed, 1.0f);
  for (int64_t t = 0; t < n; ++t) test::normalize_qk(r.conv.data() + t * cd, sh.nk, sh.dk);
  r.gate = test::random_floats(static_cast<size_t>(n * sh.nv), seed + 1, 1.0f);
  for (float& g : r.gate) g = -std::exp(1.5f * g - 2.0f);
  r.beta = test::random_floats(static_cast<size_t>(n * sh.nv), seed + 2, 1.5f);
  for (float& b : r.beta) b = sigm(b);
  return r;
}

// The delta rule in double for groups (start, count) of ordered tokens; S:
// per group [nv][dk][dv], updated; out [token][nv * dv].
void rule_reference(const gpu::DeltaNetShape& sh, const RuleInputs& in, const std::vector<int32_t>& start, const std::vector<int32_t>& count,
                    std::vector<float>& S, std::vector<float>& out) {
  for (size_t g = 0; g < start.size(); ++g)
    test::delta_rule_heads(sh.nk, sh.nv, sh.dk, sh.dv, in.conv.data(), in.gate.data(), in.beta.data(), start[g], count[g], out.data(),
                           S.data() + static_cast<int64_t>(g) * sh.nv * sh.dk * sh.dv);
}

}  // namespace

TEST_CASE("gated deltanet chunked kernels v1 to v5 at head dims 128: lengths 1 to 300, fresh and continued states, chunks of 16/32/64, v2 to v5 against v1") {
  if (!test::have_gpu()) return;
  gpu::DeltaNetShape sh;
  sh.nk = 2;
  sh.nv = 4;
  sh.dk = 128;
  sh.dv = 128;
  sh.conv_k = 4;
  // Six sequences: a decode-sized one, one chunk less one, one chunk, one chunk plus one, several chunks, two tokens;
  // half of them new (garbage in their state buffers), the others continuing a random state.
  const std::vector<int32_t> counts = {1, 63, 64, 65, 300, 2}, fresh = {0, 1, 0, 1, 0, 1};
  const int64_t G = static_cast<int64_t>(counts.size());
  std::vector<int32_t> starts;
  int64_t n = 0;
  for (int32_t c : counts) {
    starts.push_back(static_cast<int32_t>(n));
    n += c;
  }
  const int64_t V = sh.value_dim(), hs = sh.dk * sh.dv, hsz = sh.nv * hs;
  const int64_t layer_bytes = gpu::deltanet_layer_state_bytes(sh), layer_floats = layer_bytes / 4, soff = (sh.conv_k - 1) * sh.conv_dim();
  const RuleInputs in = rule_inputs(sh, n, 31);
  const std::vector<float> S0 = test::random_floats(static_cast<size_t>(G * hsz), 32, 0.3f);
  std::vector<float> S_ref = S0, out_ref(static_cast<size_t>(n * V), 0.0f);
  for (int64_t g = 0; g < G; ++g)
    if (fresh[static_cast<size_t>(g)]) std::fill(S_ref.begin() + g * hsz, S_ref.begin() + (g + 1) * hsz, 0.0f);
  rule_reference(sh, in, starts, counts, S_ref, out_ref);

  gpu::Stream s;
  auto d_conv = test::to_device(in.conv, s), d_gate = test::to_device(in.gate, s), d_beta = test::to_device(in.beta, s);
  std::vector<int32_t> order(static_cast<size_t>(n)), tok_group(static_cast<size_t>(n));
  for (int64_t g = 0; g < G; ++g)
    for (int32_t i = 0; i < counts[static_cast<size_t>(g)]; ++i) {
      order[static_cast<size_t>(starts[static_cast<size_t>(g)] + i)] = starts[static_cast<size_t>(g)] + i;
      tok_group[static_cast<size_t>(starts[static_cast<size_t>(g)] + i)] = static_cast<int32_t>(g);
    }
  auto d_order = test::to_device(order, s), d_tg = test::to_device(tok_group, s);
  gpu::DeviceBuffer out(static_cast<size_t>(n * V * 4));
  // One call on groups (start, count, fresh) with per-group states st ([nv][dk][dv] each, in and out); out rows downloaded into o.
  // decode: the one-step recurrence (deltanet_recurrent) instead of the chunked kernel.
  auto run = [&](gpu::DeltaNetKernel kernel, int64_t chunk, const std::vector<int32_t>& gs, const std::vector<int32_t>& gc,
                 const std::vector<int32_t>& gf, std::vector<float>& st, std::vector<float>& o, bool decode = false) {
    const int64_t gn = static_cast<int64_t>(gs.size());
    std::vector<gpu::DeviceBuffer> states;
    std::vector<uint64_t> ptrs;
    for (int64_t g = 0; g < gn; ++g) {
      std::vector<float> buf(static_cast<size_t>(layer_floats), 1e3f);  // a new sequence's buffer holds garbage
      if (!gf[static_cast<size_t>(g)]) std::copy(st.begin() + g * hsz, st.begin() + (g + 1) * hsz, buf.begin() + soff);
      states.push_back(test::to_device(buf, s));
      ptrs.push_back(reinterpret_cast<uint64_t>(states.back().data()));
    }
    auto d_ptrs = test::to_device(ptrs, s), d_s = test::to_device(gs, s), d_c = test::to_device(gc, s), d_f = test::to_device(gf, s);
    const gpu::DeltaNetGroups dg = test::deltanet::device_groups(d_order, d_tg, d_s, d_c, d_f, d_ptrs);
    if (kernel == gpu::DeltaNetKernel::v2) REQUIRE(gpu::deltanet_v2_chunk(sh, chunk) > 0);
    if (kernel == gpu::DeltaNetKernel::v3) REQUIRE(gpu::deltanet_v3_chunk(sh, chunk) > 0);
    if (kernel == gpu::DeltaNetKernel::v4) REQUIRE(gpu::deltanet_v4_chunk(sh, chunk) > 0);
    if (kernel == gpu::DeltaNetKernel::v5) REQUIRE(gpu::deltanet_v5_chunk(sh, chunk) > 0);
    gpu::DeviceBuffer scratch(static_cast<size_t>(std::max<int64_t>(16, gpu::deltanet_chunked_scratch_bytes(sh, kernel, chunk, n, gn))));
    if (decode)
      gpu::deltanet_recurrent(d_conv.as<float>(), d_gate.as<float>(), d_beta.as<float>(), dg, 0, gn, sh, 0, 1, out.as<float>(), s);
    else
      gpu::deltanet_chunked(d_conv.as<float>(), d_gate.as<float>(), d_beta.as<float>(), dg, 0, gn, sh, 0, 0, chunk, out.as<float>(), s, kernel, n,
                            scratch.data());
    const auto all = test::to_host<float>(out, static_cast<size_t>(n * V), s);
    for (int64_t g = 0; g < gn; ++g) {
      std::copy(all.begin() + gs[static_cast<size_t>(g)] * V, all.begin() + (gs[static_cast<size_t>(g)] + gc[static_cast<size_t>(g)]) * V,
                o.begin() + gs[static_cast<size_t>(g)] * V);
      const auto buf = test::to_host<float>(states[static_cast<size_t>(g)], static_cast<size_t>(layer_floats), s);
      std::copy(buf.begin() + soff, buf.begin() + soff + hsz, st.begin() + g * hsz);
    }
  };
  std::vector<float> out_v1;
  for (const auto kernel : kKernels)
    for (int64_t chunk : {0, 32, 16}) {
      const int kv = kernel_number(kernel);
      CAPTURE(kv);
      CAPTURE(chunk);
      std::vector<float> st = S0, o(static_cast<size_t>(n * V), 0.0f);
      run(kernel, chunk, starts, counts, fresh, st, o);
      const double ro = test::tol_ratio(o, out_ref, 1e-4, 1e-3), rs = test::tol_ratio(st, S_ref, 1e-4, 1e-3);
      MESSAGE("head dims 128, kernel v" << kv << ", chunk " << chunk << ": output within " << ro << ", state within " << rs << " of the tolerance");
      CHECK(ro <= 1);
      CHECK(rs <= 1);
      if (chunk == 0 && kv == 1) out_v1 = o;
      if (chunk == 0 && kv > 1) {
        const double r12 = test::tol_ratio(o, out_v1, 1e-5, 1e-4);
        MESSAGE("v" << kv << " against v1 (chunk 64): within " << r12 << " of (1e-5, 1e-4)");
        CHECK(r12 <= 1);
      }
    }
  {  // v4's other walk (set_deltanet_v4_walk: 8 or 16 warps): the same checks, then the default walk back
    struct WalkGuard {
      int w0 = gpu::deltanet_v4_walk();
      WalkGuard() { gpu::set_deltanet_v4_walk(3 - w0); }
      ~WalkGuard() { gpu::set_deltanet_v4_walk(w0); }
    } guard;
    for (int64_t chunk : {0, 32, 16}) {
      CAPTURE(chunk);
      std::vector<float> st = S0, o(static_cast<size_t>(n * V), 0.0f);
      run(gpu::DeltaNetKernel::v4, chunk, starts, counts, fresh, st, o);
      const double ro = test::tol_ratio(o, out_ref, 1e-4, 1e-3), rs = test::tol_ratio(st, S_ref, 1e-4, 1e-3);
      MESSAGE("head dims 128, v4's walk " << gpu::deltanet_v4_walk() << ", chunk " << chunk << ": output within " << ro << ", state within " << rs << " of the tolerance");
      CHECK(ro <= 1);
      CHECK(rs <= 1);
      if (chunk == 0) {
        const double r1 = test::tol_ratio(o, out_v1, 1e-5, 1e-4);
        MESSAGE("v4's walk " << gpu::deltanet_v4_walk() << " against v1 (chunk 64): within " << r1 << " of (1e-5, 1e-4)");
        CHECK(r1 <= 1);
      }
    }
  }
  // The 300-token sequence as two steps (130 + 170 tokens, the second continuing the first's state) gives the one-step result.
  for (const auto kernel : kKernels) {
    const int kv = kernel_number(kernel);
    CAPTURE(kv);
    const int32_t s4 = starts[4];
    std::vector<float> st(S0.begin() + 4 * hsz, S0.begin() + 5 * hsz), o(static_cast<size_t>(n * V), 0.0f);
    run(kernel, 0, {s4}, {130}, {0}, st, o);
    run(kernel, 0, {s4 + 130}, {170}, {0}, st, o);
    const std::vector<float> mine(o.begin() + s4 * V, o.begin() + (s4 + 300) * V), ref(out_ref.begin() + s4 * V, out_ref.begin() + (s4 + 300) * V);
    const std::vector<float> sref(S_ref.begin() + 4 * hsz, S_ref.begin() + 5 * hsz);
    const double ro = test::tol_ratio(mine, ref, 1e-4, 1e-3), rs = test::tol_ratio(st, sref, 1e-4, 1e-3);
    MESSAGE("kernel v" << kv << ", 300 tokens as 130 + 170: output within " << ro << ", state within " << rs << " of the tolerance");
    CHECK(ro <= 1);
    CHECK(rs <= 1);
    // Decode after the prefill: one more token (the row of the last sequence's first token) by the one-step recurrence from
    // the state the chunked steps left, against the recurrence in double from the reference state.
    const int32_t s5 = starts[5];
    std::vector<float> sdec = sref, odec_ref(static_cast<size_t>(n * V), 0.0f), odec(static_cast<size_t>(n * V), 0.0f);
    test::delta_rule_heads(sh.nk, sh.nv, sh.dk, sh.dv, in.conv.data(), in.gate.data(), in.beta.data(), s5, 1, odec_ref.data(), sdec.data());
    run(kernel, 0, {s5}, {1}, {0}, st, odec, true);
    const std::vector<float> dmine(odec.begin() + s5 * V, odec.begin() + (s5 + 1) * V), dref(odec_ref.begin() + s5 * V, odec_ref.begin() + (s5 + 1) * V);
    const double rdo = test::tol_ratio(dmine, dref, 1e-4, 1e-3), rds = test::tol_ratio(st, sdec, 1e-4, 1e-3);
    MESSAGE("kernel v" << kv << ", a decode step after the 300-token prefill: output within " << rdo << ", state within " << rds << " of the tolerance");
    CHECK(rdo <= 1);
    CHECK(rds <= 1);
  }
}

TEST_CASE("gated deltanet: the kernel setting takes v1, v2, v4 (the default) or v5, refuses the withdrawn v3 and a bad value by name, and v2's to v5's scratch follow their formulas") {
  Settings s = Settings::defaults();
  CHECK(s.gpu_deltanet_kernel == "v4");  // the default since its first GPU run (2026-12-07)
  CHECK(GpuRuntimeOptions::from_settings(s).deltanet_kernel == gpu::DeltaNetKernel::v4);
  s.gpu_deltanet_kernel = "v2";
  s.validate();
  CHECK(GpuRuntimeOptions::from_settings(s).deltanet_kernel == gpu::DeltaNetKernel::v2);
  s.gpu_deltanet_kernel = "V1";
  s.validate();  // choices are read in lower case
  CHECK(GpuRuntimeOptions::from_settings(s).deltanet_kernel == gpu::DeltaNetKernel::v1);
  s.gpu_deltanet_kernel = "v3";  // withdrawn: wrong outputs on its first GPU run
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("v2"), Error);
  CHECK_THROWS_WITH_AS(GpuRuntimeOptions::from_settings(s), doctest::Contains("withdrawn"), Error);
  s.gpu_deltanet_kernel = "v4";
  s.validate();
  CHECK(GpuRuntimeOptions::from_settings(s).deltanet_kernel == gpu::DeltaNetKernel::v4);
  s.gpu_deltanet_kernel = "v5";
  s.validate();
  CHECK(GpuRuntimeOptions::from_settings(s).deltanet_kernel == gpu::DeltaNetKernel::v5);
  s.gpu_deltanet_kernel = "v6";
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("v5"), Error);
  CHECK_THROWS_AS(GpuRuntimeOptions::from_settings(s), Error);
  gpu::set_deltanet_kernel(gpu::DeltaNetKernel::v2);
  CHECK(gpu::deltanet_kernel() == gpu::DeltaNetKernel::v2);
  gpu::set_deltanet_kernel(gpu::DeltaNetKernel::v1);
  // Qwen3-Next-80B-A3B, a 2048-token step of one sequence: 33 chunk slots of 32 value heads x (64 x 128 + 64^2 + 2 x 64 + 8) floats.
  gpu::DeltaNetShape sh;
  sh.nk = 16;
  sh.nv = 32;
  sh.dk = 128;
  sh.dv = 128;
  sh.conv_k = 4;
  CHECK(gpu::deltanet_v2_slots(2048, 1, 64) == 33);
  CHECK(gpu::deltanet_v2_scratch_bytes(sh, 64, 33) == int64_t{33} * 32 * 12424 * 4);
  CHECK(gpu::deltanet_v2_scratch_bytes(sh, 0, 33) == 0);
  // v3: (2 x 64 x 128 + 64^2 + 2 x 64 + 8 + 128 x 128) floats per slot and value head.
  CHECK(gpu::deltanet_v3_scratch_bytes(sh, 64, 33) == int64_t{33} * 32 * (12424 + 8192 + 16384) * 4);
  CHECK(gpu::deltanet_v3_scratch_bytes(sh, 0, 33) == 0);
  // v4: (2 x 64^2 + 2 x 64 + 8) floats per slot and value head.
  CHECK(gpu::deltanet_v4_scratch_bytes(sh, 64, 33) == int64_t{33} * 32 * 8328 * 4);
  CHECK(gpu::deltanet_v4_scratch_bytes(sh, 0, 33) == 0);
  // v5: v4's record, W and the entering state: (8328 + 64 x 128 + 128 x 128) floats per slot and value head (132.6 MiB).
  CHECK(gpu::deltanet_v5_scratch_bytes(sh, 64, 33) == int64_t{33} * 32 * (8328 + 8192 + 16384) * 4);
  CHECK(gpu::deltanet_v5_scratch_bytes(sh, 0, 33) == 0);
  CHECK(gpu::deltanet_chunked_scratch_bytes(sh, gpu::DeltaNetKernel::v1, 0, 2048, 1) == 0);
  if (!test::have_gpu()) return;
  CHECK(gpu::deltanet_chunked_scratch_bytes(sh, gpu::DeltaNetKernel::v2, 0, 2048, 1) == gpu::deltanet_v2_scratch_bytes(sh, 64, 33));
  CHECK(gpu::deltanet_chunked_scratch_bytes(sh, gpu::DeltaNetKernel::v3, 0, 2048, 1) == gpu::deltanet_v3_scratch_bytes(sh, 64, 33));
  CHECK(gpu::deltanet_chunked_scratch_bytes(sh, gpu::DeltaNetKernel::v4, 0, 2048, 1) == gpu::deltanet_v4_scratch_bytes(sh, 64, 33));
  CHECK(gpu::deltanet_chunked_scratch_bytes(sh, gpu::DeltaNetKernel::v5, 0, 2048, 1) == gpu::deltanet_v5_scratch_bytes(sh, 64, 33));
}

TEST_CASE("gated attention kernels match a scalar reference: q/k norm with partial rotary, cache store, output gate, gated shared expert") {
  if (!test::have_gpu()) return;
  // A small shape, and Qwen3-Next-80B-A3B's (16 q / 2 kv heads of 256, 64 rotary dimensions).
  for (auto [heads, kvh, hd, rot] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 2, 64, 16}, {16, 2, 256, 64}}) {
    INFO("heads " << heads << "/" << kvh << " hd " << hd << " rotary " << rot);
    const int64_t n = 5, ld = (2 * heads + 2 * kvh) * hd, width = kvh * hd;
    const float eps = 1e-6f;
    const std::vector<float> x = test::random_floats(static_cast<size_t>(n * ld), 21, 1.0f);
    std::vector<float> wq = test::random_floats(static_cast<size_t>(hd), 22, 0.1f), wk = test::random_floats(static_cast<size_t>(hd), 23, 0.1f);
    for (float& v : wq) v += 1.0f;
    for (float& v : wk) v += 1.0f;
    const std::vector<int32_t> pos = {0, 3, 17, 250, 4000}, slots = {9, 2, 7, 0, 4};
    const ops::Rope rope(rot, 1e7);
    // Reference.
    std::vector<float> q_ref(static_cast<size_t>(n * heads * hd)), k_ref(static_cast<size_t>(10 * width), 0.0f), v_ref(static_cast<size_t>(10 * width), 0.0f);
    auto norm_rope = [&](const float* src, const std::vector<float>& w, int64_t p, float* dst) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += static_cast<double>(src[i]) * src[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hd) + eps));
      for (int64_t i = 0; i < hd; ++i) dst[i] = w[static_cast<size_t>(i)] * (src[i] * inv);
      rope.apply(dst, 1, p);  // the first `rot` values only
    };
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h) norm_rope(x.data() + t * ld + h * 2 * hd, wq, pos[static_cast<size_t>(t)], q_ref.data() + (t * heads + h) * hd);
      for (int64_t h = 0; h < kvh; ++h) {
        norm_rope(x.data() + t * ld + 2 * heads * hd + h * hd, wk, pos[static_cast<size_t>(t)], k_ref.data() + slots[static_cast<size_t>(t)] * width + h * hd);
        for (int64_t i = 0; i < hd; ++i)
          v_ref[static_cast<size_t>(slots[static_cast<size_t>(t)] * width + h * hd + i)] = x[static_cast<size_t>(t * ld + 2 * heads * hd + width + h * hd + i)];
      }
    }
    gpu::Stream s;
    auto dx = test::to_device(x, s), dwq = test::to_device(wq, s), dwk = test::to_device(wk, s), dpos = test::to_device(pos, s),
         dslots = test::to_device(slots, s), dfreq = test::to_device(rope.inv_freq, s);
    auto kc = test::to_device(std::vector<uint16_t>(static_cast<size_t>(10 * width), 0), s), vc = test::to_device(std::vector<uint16_t>(static_cast<size_t>(10 * width), 0), s);
    gpu::DeviceBuffer q(static_cast<size_t>(n * heads * hd * 4));
    gpu::gated_qkv_prepare(dx.as<float>(), n, ld, heads, kvh, hd, rot, dwq.as<float>(), dwk.as<float>(), eps, dpos.as<int32_t>(), dfreq.as<float>(),
                           dslots.as<int32_t>(), kc.as<uint16_t>(), vc.as<uint16_t>(), q.as<float>(), s);
    CHECK(test::tol_ratio(test::to_host<float>(q, q_ref.size(), s), q_ref, 1e-5, 1e-4) <= 1);
    CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(kc, k_ref.size(), s)), k_ref, 1e-6, 1.0 / 128) <= 1);
    CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(vc, v_ref.size(), s)), v_ref, 1e-6, 1.0 / 128) <= 1);

    // Output gate on bf16 attention rows.
    const std::vector<float> attn = test::bf16_round(test::random_floats(static_cast<size_t>(n * heads * hd), 24, 1.0f));
    std::vector<float> gated(attn.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < hd; ++i)
          gated[static_cast<size_t>((t * heads + h) * hd + i)] = attn[static_cast<size_t>((t * heads + h) * hd + i)] * sigm(x[static_cast<size_t>(t * ld + h * 2 * hd + hd + i)]);
    auto da = test::to_device(test::bf16_of(attn), s);
    // Split output first (attn left as it is): hi = bf16(value), hi + lo to about 16 bits.
    gpu::DeviceBuffer gh(attn.size() * 2), gl(attn.size() * 2);
    gpu::gated_attention_gate(da.as<uint16_t>(), dx.as<float>(), n, ld, heads, hd, s, gh.as<uint16_t>(), gl.as<uint16_t>());
    const auto gh_f = test::f32_of(test::to_host<uint16_t>(gh, attn.size(), s)), gl_f = test::f32_of(test::to_host<uint16_t>(gl, attn.size(), s));
    std::vector<float> gsum(attn.size());
    for (size_t i = 0; i < gsum.size(); ++i) gsum[i] = gh_f[i] + gl_f[i];
    CHECK(test::tol_ratio(gh_f, gated, 1e-6, 1.0 / 128) <= 1);
    CHECK(test::tol_ratio(gsum, gated, 1e-6, 1e-4) <= 1);
    CHECK(test::f32_of(test::to_host<uint16_t>(da, attn.size(), s)) == attn);
    gpu::gated_attention_gate(da.as<uint16_t>(), dx.as<float>(), n, ld, heads, hd, s);
    CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(da, attn.size(), s)), gated, 1e-6, 1.0 / 128) <= 1);
  }
  const int64_t n = 5;
  gpu::Stream s;

  // d += sigmoid(logit) * y.
  const int64_t H = 96;
  const std::vector<float> d0 = test::random_floats(static_cast<size_t>(n * H), 25), yv = test::random_floats(static_cast<size_t>(n * H), 26),
                           lg = test::random_floats(static_cast<size_t>(n), 27, 2.0f);
  std::vector<float> d_ref = d0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < H; ++i) d_ref[static_cast<size_t>(t * H + i)] += sigm(lg[static_cast<size_t>(t)]) * yv[static_cast<size_t>(t * H + i)];
  auto dd = test::to_device(d0, s), dy = test::to_device(yv, s), dl = test::to_device(lg, s);
  gpu::add_sigmoid_scaled(dd.as<float>(), dy.as<float>(), dl.as<float>(), n, H, s);
  CHECK(test::tol_ratio(test::to_host<float>(dd, d_ref.size(), s), d_ref, 1e-6, 1e-5) <= 1);
}
