// The Engram kernels (gpu/engram.h) against plain scalar references on
// random data. Skips with a message where no GPU is present.
#include <doctest/doctest.h>

#include <cmath>

#include "gpu/engram.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

// rms_norm of one row in double, weight w.
std::vector<double> rms(const std::vector<double>& x, const float* w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t c = 0; c < x.size(); ++c) y[c] = w[c] * (x[c] * inv);
  return y;
}

}  // namespace

TEST_CASE("gpu engram_gate matches a scalar reference (with and without the pending residual delta)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (auto [n, H] : {std::pair<int64_t, int64_t>{1, 64}, {7, 320}, {5, 1000}})
    for (bool with_d : {false, true}) {
      CAPTURE(n);
      CAPTURE(H);
      CAPTURE(with_d);
      const float eps = 1.1920929e-07f, conv_eps = 1e-5f;
      auto x = test::random_floats(static_cast<size_t>(n * H), 100 + n);
      auto d = test::random_floats(static_cast<size_t>(n * H), 200 + n, 0.5f);
      auto proj = test::random_floats(static_cast<size_t>(n * 2 * H), 300 + n);
      auto vecs = test::random_floats(static_cast<size_t>(5 * H), 400 + n, 0.3f);
      for (int64_t c = 2 * H; c < 5 * H; ++c) vecs[static_cast<size_t>(c)] += 1.0f;  // norm weights around 1
      std::vector<float> ref_x(x), ref_v(static_cast<size_t>(n * H)), ref_vn(static_cast<size_t>(n * H));
      const float *kb = vecs.data(), *vb = kb + H, *kn = vb + H, *qn = kn + H, *cn = qn + H;
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> xr(static_cast<size_t>(H)), kr(static_cast<size_t>(H)), vr(static_cast<size_t>(H));
        for (int64_t c = 0; c < H; ++c) {
          float xv = x[static_cast<size_t>(i * H + c)];
          if (with_d) xv += d[static_cast<size_t>(i * H + c)];
          ref_x[static_cast<size_t>(i * H + c)] = xv;
          xr[static_cast<size_t>(c)] = xv;
          kr[static_cast<size_t>(c)] = static_cast<double>(proj[static_cast<size_t>(i * 2 * H + c)]) + kb[c];
          vr[static_cast<size_t>(c)] = static_cast<double>(proj[static_cast<size_t>(i * 2 * H + H + c)]) + vb[c];
        }
        const auto k = rms(kr, kn, eps), q = rms(xr, qn, eps);
        double sc = 0;
        for (int64_t c = 0; c < H; ++c) sc += k[static_cast<size_t>(c)] * q[static_cast<size_t>(c)];
        sc /= std::sqrt(static_cast<double>(H));
        const double z = (sc > 0 ? 1.0 : sc < 0 ? -1.0 : 0.0) * std::sqrt(std::max(std::fabs(sc), 1e-6));
        const double g = 1.0 / (1.0 + std::exp(-z));
        for (auto& v : vr) v *= g;
        const auto vn = rms(vr, cn, conv_eps);
        for (int64_t c = 0; c < H; ++c) {
          ref_v[static_cast<size_t>(i * H + c)] = static_cast<float>(vr[static_cast<size_t>(c)]);
          ref_vn[static_cast<size_t>(i * H + c)] = static_cast<float>(vn[static_cast<size_t>(c)]);
        }
      }
      auto dx = test::to_device(x, s), dd = test::to_device(d, s), dp = test::to_device(proj, s), dvecs = test::to_device(vecs, s);
      gpu::DeviceBuffer dv(static_cast<size_t>(n * H) * 4), dvn(static_cast<size_t>(n * H) * 4);
      const float* vp = dvecs.as<float>();
      gpu::engram_gate(dx.as<float>(), with_d ? dd.as<float>() : nullptr, dp.as<float>(), n, H, vp, vp + H, vp + 2 * H, vp + 3 * H, vp + 4 * H,
                       eps, conv_eps, dv.as<float>(), dvn.as<float>(), s);
      const auto gx = test::to_host<float>(dx, x.size(), s), gv = test::to_host<float>(dv, ref_v.size(), s),
                 gvn = test::to_host<float>(dvn, ref_vn.size(), s);
      CHECK(test::tol_ratio(gx, ref_x, 1e-6, 1e-6) <= 1);
      CHECK(test::tol_ratio(gv, ref_v, 1e-4, 1e-4) <= 1);
      CHECK(test::tol_ratio(gvn, ref_vn, 1e-4, 1e-4) <= 1);
    }
}

TEST_CASE("gpu engram_conv matches a scalar reference over batch rows, history rows and the start") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t n = 6, H = 96, K = 4, hist_rows = 10, modules = 2, stride = modules * H;
  auto v = test::random_floats(static_cast<size_t>(n * H), 1);
  auto vn = test::random_floats(static_cast<size_t>((n + 3) * H), 2);  // rows beyond n may be referenced too
  auto hist = test::random_floats(static_cast<size_t>(hist_rows * stride), 3);
  auto w = test::random_floats(static_cast<size_t>(H * K), 4, 0.5f);
  auto x = test::random_floats(static_cast<size_t>(n * H), 5);
  // Row i: a mix of sources; the module's history is the second half of each hist row.
  const std::vector<int32_t> src = {-1, -1, -1, 0,  -2 - 3, -1, 4, 1,  -2 - 9, -2 - 0, 2, 2,
                                    -1, 7,  8,  3,  -2 - 5, -2 - 5, -1, 4,  5, -2 - 1, -1, 5};
  REQUIRE(src.size() == static_cast<size_t>(n * K));
  std::vector<float> ref(x);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < H; ++c) {
      double a = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t where = src[static_cast<size_t>(i * K + j)];
        if (where == -1) continue;
        const double in = where >= 0 ? vn[static_cast<size_t>(where * H + c)] : hist[static_cast<size_t>((-2 - where) * stride + H + c)];
        a += w[static_cast<size_t>(c * K + j)] * in;
      }
      ref[static_cast<size_t>(i * H + c)] += static_cast<float>(v[static_cast<size_t>(i * H + c)] + a / (1.0 + std::exp(-a)));
    }
  auto dv = test::to_device(v, s), dvn = test::to_device(vn, s), dh = test::to_device(hist, s), dw = test::to_device(w, s),
       dx = test::to_device(x, s), dsrc = test::to_device(src, s);
  gpu::engram_conv(dv.as<float>(), dvn.as<float>(), dh.as<float>() + H, stride, dsrc.as<int32_t>(), dw.as<float>(), n, H, K, dx.as<float>(), s);
  const auto got = test::to_host<float>(dx, x.size(), s);
  CHECK(test::tol_ratio(got, ref, 1e-5, 1e-5) <= 1);
}

TEST_CASE("gpu engram_store writes every module's row to its history row and nothing else") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t n = 5, H = 72, modules = 3, hist_rows = 12, stride = modules * H + 8;  // padded rows
  auto vn = test::random_floats(static_cast<size_t>(modules * n * H), 7);
  auto hist = test::random_floats(static_cast<size_t>(hist_rows * stride), 8);
  const std::vector<int32_t> dst = {3, -1, 11, 0, 7};
  std::vector<float> ref(hist);
  for (int64_t m = 0; m < modules; ++m)
    for (int64_t i = 0; i < n; ++i) {
      if (dst[static_cast<size_t>(i)] < 0) continue;
      for (int64_t c = 0; c < H; ++c)
        ref[static_cast<size_t>(dst[static_cast<size_t>(i)] * stride + m * H + c)] = vn[static_cast<size_t>((m * n + i) * H + c)];
    }
  auto dvn = test::to_device(vn, s), dh = test::to_device(hist, s), dd = test::to_device(dst, s);
  gpu::engram_store(dvn.as<float>(), n, H, modules, dd.as<int32_t>(), dh.as<float>(), stride, s);
  const auto got = test::to_host<float>(dh, hist.size(), s);
  CHECK(got == ref);
}
