// Shared by the GGUF GPU tests: a host copy of a quantized matrix with its
// CPU dequantization, the int8-activation dot reference, and the decode
// experts check (gpu::gguf_moe_experts against a scalar SwiGLU reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu/quant.h"
#include "io/tensor/mat.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace hmoe::test {

struct GgufHostW {
  std::vector<uint8_t> bytes;
  cpu::Mat view;
  std::vector<float> deq;  // [rows, cols] as the CPU dequantizer gives them
};

// ref = sum_k x_k w_k and the int8-activation bound, per output.
inline void ref_dot(const float* w, const float* x, int64_t cols, double& ref, double& bound) {
  ref = 0;
  bound = 0;
  double mag = 0;
  for (int64_t b = 0; b < cols / 32; ++b) {
    double amax = 0, wabs = 0;
    for (int64_t k = b * 32; k < b * 32 + 32; ++k) {
      amax = std::max(amax, std::fabs(static_cast<double>(x[k])));
      wabs += std::fabs(static_cast<double>(w[k]));
      ref += static_cast<double>(x[k]) * w[k];
      mag += std::fabs(static_cast<double>(x[k]) * w[k]);
    }
    bound += amax / 254.0 * wabs;
  }
  bound = 1.02 * bound + 1e-5 * mag + 1e-7;
}

// gpu::gguf_moe_experts on experts gu[e] ([2I, H], gate rows then up rows)
// and dn[e] ([H, I]) for n tokens routed to K experts each (expert of token
// t, slot j: (t * id_step + 2 j + 1) % E), against the scalar SwiGLU sum of
// the dequantized weights. Returns the worst |error| / bound, the bound
// being 3e-2 of sum |w x| (two int8 roundings of activations).
inline double gguf_moe_experts_worst(const std::vector<GgufHostW>& gu, const std::vector<GgufHostW>& dn, int64_t H, int64_t I, int64_t K,
                                     int64_t n, int64_t id_step, gpu::Stream& s) {
  const int64_t E = static_cast<int64_t>(gu.size());
  std::vector<cpu::Mat> gu_views, dn_views;
  for (int64_t e = 0; e < E; ++e) {  // gate and up as two views, as the loader hands them
    gu_views.push_back(gu[static_cast<size_t>(e)].view.slice_rows(0, I));
    gu_views.push_back(gu[static_cast<size_t>(e)].view.slice_rows(I, 2 * I));
    dn_views.push_back(dn[static_cast<size_t>(e)].view);
  }
  gpu::GgufDeviceMat dgu(gu_views, s, "gate_up"), ddn(dn_views, s, "down");
  auto x = bf16_round(random_floats(static_cast<size_t>(n * H), 31 + static_cast<uint64_t>(n)));
  std::vector<int32_t> ids(static_cast<size_t>(n * K));
  std::vector<float> rw(ids.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < K; ++j) {
      ids[static_cast<size_t>(t * K + j)] = static_cast<int32_t>((t * id_step + 2 * j + 1) % E);
      rw[static_cast<size_t>(t * K + j)] = 0.5f - 0.1f * static_cast<float>(j) + 0.01f * static_cast<float>(t);
    }
  std::vector<double> out(static_cast<size_t>(n * H), 0.0), mag(out.size(), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const GgufHostW& g = gu[static_cast<size_t>(ids[static_cast<size_t>(t * K + j)])];
      const GgufHostW& d = dn[static_cast<size_t>(ids[static_cast<size_t>(t * K + j)])];
      std::vector<float> act(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double gv, uv, b;
        ref_dot(g.deq.data() + i * H, x.data() + t * H, H, gv, b);
        ref_dot(g.deq.data() + (I + i) * H, x.data() + t * H, H, uv, b);
        act[static_cast<size_t>(i)] = static_cast<float>(gv / (1.0 + std::exp(-gv)) * uv);
      }
      for (int64_t r = 0; r < H; ++r) {
        double v = 0, m = 0;
        for (int64_t i = 0; i < I; ++i) {
          v += static_cast<double>(d.deq[static_cast<size_t>(r * I + i)]) * act[static_cast<size_t>(i)];
          m += std::fabs(static_cast<double>(d.deq[static_cast<size_t>(r * I + i)]) * act[static_cast<size_t>(i)]);
        }
        out[static_cast<size_t>(t * H + r)] += rw[static_cast<size_t>(t * K + j)] * v;
        mag[static_cast<size_t>(t * H + r)] += std::fabs(rw[static_cast<size_t>(t * K + j)]) * m;
      }
    }
  auto dx = to_device(bf16_of(x), s);
  auto di = to_device(ids, s), dwt = to_device(rw, s);
  std::vector<float> poison(out.size(), std::nanf(""));
  auto dout = to_device(poison, s);
  gpu::DeviceBuffer gub(ids.size() * static_cast<size_t>(2 * I) * 4);
  gpu::gguf_moe_experts(dx.as<uint16_t>(), n, K, di.as<int32_t>(), dwt.as<float>(), dgu.weight(), ddn.weight(), I, gub.as<float>(),
                        dout.as<float>(), s);
  auto y = to_host<float>(dout, out.size(), s);
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double e = std::fabs(y[i] - out[i]) / (3e-2 * mag[i] + 1e-9);
    if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : e;
  }
  return worst;
}

}  // namespace hmoe::test
