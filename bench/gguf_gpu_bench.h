// Shared by the GGUF GPU benchmarks (bench_gpu_gguf, bench_gpu_gguf_lowbit):
// a matrix's blocks stacked `copies` times on the device, so that timed
// launches read distinct bytes, a CUDA-event timer that flushes L2
// before each repetition and reports the median, random top-K routing and
// the prefill MoE layer both benchmarks time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/layers/gpu_experts.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/moe_stream.h"
#include "gpu/quant.h"
#include "io/dtype.h"
#include "numa/quant_gguf.h"

namespace hmoe::bench {

// `copies` copies of one [rows, cols] matrix of type t (its blocks `host`)
// stacked on the device, with 16 readable bytes past the end (gguf_moe_gemm
// reads up to 16 bytes past the last row).
struct GgufStack {
  gpu::DeviceBuffer data;
  gpu::GgufWeight w;
};
inline GgufStack gguf_stack(cpu::ExtType t, const std::vector<uint8_t>& host, int64_t rows, int64_t cols, int64_t copies, gpu::Stream& s) {
  GgufStack st;
  const cpu::Mat v = cpu::ext_view(t, host.data(), rows, cols, "bench");
  st.w.type = gpu::gguf_type_of(v, "bench");
  st.w.rows = rows * copies;
  st.w.cols = cols;
  const size_t one = host.size();
  st.data = gpu::DeviceBuffer(one * static_cast<size_t>(copies) + 16);
  gpu::copy_to_device(st.data.data(), host.data(), one, s);
  for (int64_t c = 1; c < copies; ++c) gpu::copy_on_device(st.data.as<uint8_t>() + one * c, st.data.data(), one, s);
  gpu::memset_device(st.data.as<uint8_t>() + one * static_cast<size_t>(copies), 0, 16, s);
  s.synchronize();
  st.w.data = st.data.data();
  return st;
}

// Median microseconds of fn() over `reps` launches after one warm-up, L2
// flushed (256 MiB written) before each.
struct GpuTimer {
  gpu::Stream& s;
  gpu::DeviceBuffer flush{size_t{256} << 20};
  gpu::Event a, b;
  int reps;
  GpuTimer(gpu::Stream& st, int r) : s(st), reps(r) {}
  template <class Fn>
  double us(Fn&& fn) {
    fn();  // warm-up
    s.synchronize();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      gpu::memset_device(flush.data(), r & 0xFF, flush.bytes(), s);
      a.record(s);
      fn();
      b.record(s);
      b.synchronize();
      t.push_back(b.elapsed_ms(a) * 1e3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

inline const char* gguf_type_name(cpu::ExtType t) { return cpu::ext_type_info(static_cast<uint32_t>(t))->name; }

// Random top-K routing of n tokens over E experts: each token's K distinct experts, the first K of a shuffle.
inline std::vector<int32_t> random_ids(int64_t n, int64_t E, int64_t K, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n * K)), perm(static_cast<size_t>(E));
  for (int64_t tk = 0; tk < n; ++tk) {
    for (int32_t e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < K; ++j) ids[static_cast<size_t>(tk * K + j)] = perm[static_cast<size_t>(j)];
  }
  return ids;
}

// A prefill MoE layer of n tokens on the blocks (hidden H, experts of I, E of them, top-K by ids, weights 1 / K):
// random bf16 activations drawn from rng, the routing, the outputs and gguf_moe_gemm's scratch for the n K pairs.
struct GgufMoePrefill {
  int64_t n, H, I, E, K, P;
  gpu::DeviceBuffer dx, di, dw, off, pl, out;
  MoeGemmScratch g;
  GgufMoePrefill(const std::vector<int32_t>& ids, int64_t n_, int64_t H_, int64_t I_, int64_t E_, int64_t K_, std::mt19937& rng, gpu::Stream& s)
      : n(n_), H(H_), I(I_), E(E_), K(K_), P(n_ * K_) {
    std::vector<uint16_t> xp(static_cast<size_t>(n * H));
    for (auto& v : xp) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
    std::vector<float> wts(ids.size(), 1.0f / K);
    dx = gpu::DeviceBuffer(xp.size() * 2);
    di = gpu::DeviceBuffer(ids.size() * 4);
    dw = gpu::DeviceBuffer(ids.size() * 4);
    off = gpu::DeviceBuffer(static_cast<size_t>(E + 1) * 4);
    pl = gpu::DeviceBuffer(ids.size() * 4);
    out = gpu::DeviceBuffer(static_cast<size_t>(n * H) * 4);
    gpu::copy_to_device(dx.data(), xp.data(), xp.size() * 2, s);
    gpu::copy_to_device(di.data(), ids.data(), ids.size() * 4, s);
    gpu::copy_to_device(dw.data(), wts.data(), wts.size() * 4, s);
    g.gu.reserve(static_cast<size_t>(P * 2 * I) * 4);
    g.act.reserve(static_cast<size_t>(P * I) * 2);
    g.ys.reserve(static_cast<size_t>(P * H) * 4);
    g.inv.reserve(static_cast<size_t>(P) * 4);
  }
  void route(gpu::Stream& s) { gpu::moe_route(di.as<int32_t>(), P, E, off.as<int32_t>(), pl.as<int32_t>(), s); }
  void gate_up(const gpu::GgufWeight& gu, gpu::Stream& s) {
    gpu::gguf_moe_gemm(dx.as<uint16_t>(), pl.as<int32_t>(), K, P, off.as<int32_t>(), E, gu, 2 * I, g.gu.as<float>(), s);
  }
  void down(const gpu::GgufWeight& dn, gpu::Stream& s) {
    gpu::gguf_moe_gemm(g.act.as<uint16_t>(), nullptr, 1, P, off.as<int32_t>(), E, dn, H, g.ys.as<float>(), s);
  }
  // Route, gate/up, SwiGLU, down, weighted sum.
  void run(const gpu::GgufWeight& gu, const gpu::GgufWeight& dn, gpu::Stream& s) {
    route(s);
    gate_up(gu, s);
    gpu::silu_mul(g.gu.as<float>(), P, I, g.act.as<uint16_t>(), nullptr, s);
    down(dn, s);
    gpu::moe_combine_sorted(g.ys.as<float>(), pl.as<int32_t>(), dw.as<float>(), n, K, H, g.inv.as<int32_t>(), out.as<float>(), s);
  }
};

}  // namespace hmoe::bench
