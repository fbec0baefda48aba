// Shared by the GGUF GPU tests: a host copy of a quantized matrix with its
// CPU dequantization, the int8-activation dot reference, and the decode
// experts check (gpu::gguf_moe_experts against a scalar SwiGLU reference)
// and the grouped prefill product checks (gpu::gguf_moe_gemm, on a fixed
// routing and on ragged expert row counts, over every prefill kernel), with
// the two cases the native and low-bit tests run per weight type.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/kernels.h"
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

// gpu::gguf_moe_gemm (the grouped tensor-core prefill product) on dw, the
// device copy of experts ex ([N, C] each), for 90 tokens routed top-2 (expert
// 0 gets none, expert 1 every token: more than one 64-row tile), against the
// scalar product of the dequantized weights. Returns the worst |error| /
// (2^-8 sum |w x|).
inline double gguf_moe_gemm_worst(const std::vector<GgufHostW>& ex, const gpu::GgufDeviceMat& dw, int64_t N, int64_t C, gpu::Stream& s) {
  const int64_t E = static_cast<int64_t>(ex.size()), K = 2, n = 90, P = n * K;
  std::vector<int32_t> ids(static_cast<size_t>(P));
  for (int64_t tk = 0; tk < n; ++tk) {
    ids[static_cast<size_t>(tk * K)] = 1;
    ids[static_cast<size_t>(tk * K + 1)] = static_cast<int32_t>(2 + tk % 3);
  }
  auto x = bf16_round(random_floats(static_cast<size_t>(n * C), 41));
  auto dx = to_device(bf16_of(x), s);
  auto di = to_device(ids, s);
  gpu::DeviceBuffer off(static_cast<size_t>(E + 1) * 4), pl(static_cast<size_t>(P) * 4);
  gpu::moe_route(di.as<int32_t>(), P, E, off.as<int32_t>(), pl.as<int32_t>(), s);
  std::vector<float> poison(static_cast<size_t>(P * N), std::nanf(""));
  auto dc = to_device(poison, s);
  gpu::gguf_moe_gemm(dx.as<uint16_t>(), pl.as<int32_t>(), K, P, off.as<int32_t>(), E, dw.weight(), N, dc.as<float>(), s);
  auto c = to_host<float>(dc, poison.size(), s);
  auto pairs = to_host<int32_t>(pl, static_cast<size_t>(P), s);
  double worst = 0;
  for (int64_t i = 0; i < P; ++i) {
    const int32_t p = pairs[static_cast<size_t>(i)];
    const int64_t tk = p / K;
    const GgufHostW& w = ex[static_cast<size_t>(ids[static_cast<size_t>(p)])];
    for (int64_t r = 0; r < N; ++r) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < C; ++k) {
        const double v = static_cast<double>(w.deq[static_cast<size_t>(r * C + k)]) * x[static_cast<size_t>(tk * C + k)];
        ref += v;
        mag += std::fabs(v);
      }
      const double e = std::fabs(c[static_cast<size_t>(i * N + r)] - ref) / (0x1p-8 * mag + 1e-6);
      if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : e;
    }
  }
  return worst;
}

// Every gguf_moe_gemm kernel (gpu::set_gguf_prefill_kernel): the simple
// one, the pipelined one with its own tile choice and with each tile forced.
inline const gpu::GgufPrefillKernel kPrefillKernels[] = {gpu::GgufPrefillKernel::simple, gpu::GgufPrefillKernel::pipelined,
                                                         gpu::GgufPrefillKernel::pipelined64, gpu::GgufPrefillKernel::pipelined128};
// Restores the kernel set before the case when it ends, however it ends.
struct PrefillKernelScope {
  gpu::GgufPrefillKernel before = gpu::gguf_prefill_kernel();
  ~PrefillKernelScope() { gpu::set_gguf_prefill_kernel(before); }
};

// gpu::gguf_moe_gemm on dw (the device copy of experts ex, [N, C] each) with
// expert e given counts[e] sorted rows (ragged: empty experts, single rows,
// counts around and past a tile), routed top-2 over counts-sum / 2 tokens in
// a shuffled order (the sum must be even), read through the pair list
// (rowmap, k_div 2) and again from a sorted activation matrix (rowmap null,
// as the down product reads), with each kernel of kPrefillKernels (left set
// to the last); against the scalar product of the dequantized weights.
// Returns per kernel the worst |error| / (2^-8 sum |w x|) over both runs.
inline std::vector<double> gguf_moe_gemm_ragged_worst(const std::vector<GgufHostW>& ex, const gpu::GgufDeviceMat& dw, int64_t N, int64_t C,
                                                      const std::vector<int>& counts, gpu::Stream& s) {
  const int64_t E = static_cast<int64_t>(ex.size()), K = 2;
  std::vector<int32_t> ids;
  for (int64_t e = 0; e < E; ++e) ids.insert(ids.end(), static_cast<size_t>(counts[static_cast<size_t>(e)]), static_cast<int32_t>(e));
  const int64_t P = static_cast<int64_t>(ids.size()), n = P / K;
  uint64_t st = 0x9E3779B97F4A7C15ull;
  for (int64_t i = P - 1; i > 0; --i) {  // deterministic shuffle
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(ids[static_cast<size_t>(i)], ids[static_cast<size_t>((st >> 33) % static_cast<uint64_t>(i + 1))]);
  }
  auto x = bf16_round(random_floats(static_cast<size_t>(n * C), 43));
  auto xs = bf16_round(random_floats(static_cast<size_t>(P * C), 47));  // sorted rows for the rowmap-free run
  auto dx = to_device(bf16_of(x), s);
  auto dxs = to_device(bf16_of(xs), s);
  auto di = to_device(ids, s);
  gpu::DeviceBuffer off(static_cast<size_t>(E + 1) * 4), pl(static_cast<size_t>(P) * 4);
  gpu::moe_route(di.as<int32_t>(), P, E, off.as<int32_t>(), pl.as<int32_t>(), s);
  auto pairs = to_host<int32_t>(pl, static_cast<size_t>(P), s);
  auto offs = to_host<int32_t>(off, static_cast<size_t>(E + 1), s);
  // References of both runs: [mode][i * N + r], and sum |w x|.
  std::vector<double> ref[2], mag[2];
  for (int mode = 0; mode < 2; ++mode) {
    ref[mode].assign(static_cast<size_t>(P * N), 0.0);
    mag[mode].assign(static_cast<size_t>(P * N), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = offs[static_cast<size_t>(e)]; i < offs[static_cast<size_t>(e) + 1]; ++i) {
        const float* xr = mode == 0 ? x.data() + (pairs[static_cast<size_t>(i)] / K) * C : xs.data() + i * C;
        const GgufHostW& w = ex[static_cast<size_t>(e)];
        for (int64_t r = 0; r < N; ++r) {
          double v = 0, m = 0;
          for (int64_t k = 0; k < C; ++k) {
            const double t = static_cast<double>(w.deq[static_cast<size_t>(r * C + k)]) * xr[k];
            v += t;
            m += std::fabs(t);
          }
          ref[mode][static_cast<size_t>(i * N + r)] = v;
          mag[mode][static_cast<size_t>(i * N + r)] = m;
        }
      }
  }
  std::vector<double> worst;
  for (gpu::GgufPrefillKernel kern : kPrefillKernels) {
    gpu::set_gguf_prefill_kernel(kern);
    double wk = 0;
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<float> poison(static_cast<size_t>(P * N), std::nanf(""));
      auto dc = to_device(poison, s);
      if (mode == 0) gpu::gguf_moe_gemm(dx.as<uint16_t>(), pl.as<int32_t>(), K, P, off.as<int32_t>(), E, dw.weight(), N, dc.as<float>(), s);
      else gpu::gguf_moe_gemm(dxs.as<uint16_t>(), nullptr, 1, P, off.as<int32_t>(), E, dw.weight(), N, dc.as<float>(), s);
      auto c = to_host<float>(dc, poison.size(), s);
      for (size_t i = 0; i < c.size(); ++i) {
        const double err = std::fabs(c[i] - ref[mode][i]) / (0x1p-8 * mag[mode][i] + 1e-6);
        if (!(err <= wk)) wk = std::isnan(err) ? 1e30 : err;
      }
    }
    worst.push_back(wk);
  }
  return worst;
}

// E experts of [N, C] made by make(rows, cols, seed) with seeds seed0 + e, and their device copy (a view per
// expert, as the loader hands them); requires gguf_moe_gemm to take them.
template <class Make>
std::vector<GgufHostW> gguf_gemm_experts(Make make, int64_t E, int64_t N, int64_t C, uint64_t seed0) {
  std::vector<GgufHostW> ex;
  for (int64_t e = 0; e < E; ++e) ex.push_back(make(N, C, seed0 + static_cast<uint64_t>(e)));
  return ex;
}
inline std::vector<cpu::Mat> gguf_views(const std::vector<GgufHostW>& ex) {
  std::vector<cpu::Mat> views;
  for (const GgufHostW& h : ex) views.push_back(h.view);
  return views;
}

// The grouped prefill product's two checks for each weight type t of types, on experts made by make(t, rows,
// cols, seed) (a GgufHostW) and named type_name(t), with every kernel of kPrefillKernels (the default restored
// after): 5 experts of [256, 512] (seeds seed0 + 10 t + e) by gguf_moe_gemm_worst, or 7 of [256, 768] (seeds
// seed0 + 10 t + e) with 0, 1, 63, 64, 65, 300 and 7 rows by gguf_moe_gemm_ragged_worst; each within
// 2^-8 sum |w x|.
template <class Types, class Make, class Name>
void check_gguf_moe_gemm(const Types& types, Make make, Name type_name, uint64_t seed0) {
  PrefillKernelScope restore;
  gpu::Stream s;
  const int64_t N = 256, C = 512;
  for (const auto t : types) {
    const std::vector<GgufHostW> ex = gguf_gemm_experts([&](int64_t rows, int64_t cols, uint64_t seed) { return make(t, rows, cols, seed); }, 5, N, C,
                                                        seed0 + 10 * static_cast<uint64_t>(t));
    gpu::GgufDeviceMat dw(gguf_views(ex), s, "experts");
    REQUIRE(gpu::gguf_moe_gemm_supported(dw.weight(), N));
    for (gpu::GgufPrefillKernel kern : kPrefillKernels) {
      gpu::set_gguf_prefill_kernel(kern);
      const double worst = gguf_moe_gemm_worst(ex, dw, N, C, s);
      CHECK_MESSAGE(worst <= 1.0, gpu::gguf_prefill_kernel_name(kern) << " " << type_name(t) << ": worst error / (2^-8 sum |w x|) " << worst);
    }
  }
}
template <class Types, class Make, class Name>
void check_gguf_moe_gemm_ragged(const Types& types, Make make, Name type_name, uint64_t seed0) {
  PrefillKernelScope restore;
  gpu::Stream s;
  const std::vector<int> counts = {0, 1, 63, 64, 65, 300, 7};
  const int64_t E = static_cast<int64_t>(counts.size()), N = 256, C = 768;
  for (const auto t : types) {
    const std::vector<GgufHostW> ex = gguf_gemm_experts([&](int64_t rows, int64_t cols, uint64_t seed) { return make(t, rows, cols, seed); }, E, N, C,
                                                        seed0 + 10 * static_cast<uint64_t>(t));
    gpu::GgufDeviceMat dw(gguf_views(ex), s, "experts");
    REQUIRE(gpu::gguf_moe_gemm_supported(dw.weight(), N));
    const std::vector<double> worst = gguf_moe_gemm_ragged_worst(ex, dw, N, C, counts, s);
    for (size_t i = 0; i < worst.size(); ++i)
      CHECK_MESSAGE(worst[i] <= 1.0, gpu::gguf_prefill_kernel_name(kPrefillKernels[i]) << " " << type_name(t) << ": worst error / (2^-8 sum |w x|) "
                                                                                       << worst[i]);
  }
}

}  // namespace hmoe::test
