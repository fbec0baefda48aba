// Gated DeltaNet kernels on the GPU (gpu/deltanet.h) on one
// Qwen3-Next-80B-A3B linear-attention layer (16 key heads, 32 value heads,
// head dims 128, conv kernel 4), random data:
//  - prefill of one sequence of T tokens (512, 4096, 32768): the conv +
//    norm + gates kernel, the chunked delta rule, the gated norm; tokens/s,
//    GB/s (bytes each kernel must move) and, for the delta rule, FLOP/s
//    (2 x multiply-adds of the chunked algorithm: 3 dk dv + C (dk + dv) per
//    token and value head, C = 64) against the measured bf16 tensor
//    throughput (one cuBLAS 8192^3 product) and read bandwidth;
//  - decode of B sequences x 1 token (1, 8, 64): the one-step recurrence;
//    GB/s of the states it reads and writes (read, scaled, written: 3 x
//    32 x 128 x 128 x 4 bytes per sequence) against the read bandwidth.
// Times are between events around each launch, averaged over --reps.
//
// Usage: bench_gpu_deltanet [--reps N] [--quick]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/deltanet.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/quant.h"

using namespace hmoe;

namespace {

struct Timer {
  gpu::Stream& s;
  gpu::Event a, b;
  template <class F>
  double us(F f, int reps) {
    f();  // warm-up
    a.record(s);
    for (int i = 0; i < reps; ++i) f();
    b.record(s);
    b.synchronize();
    return static_cast<double>(b.elapsed_ms(a)) * 1e3 / reps;
  }
};

// A device buffer of `count` floats filled with a pattern in [-0.5, 0.5).
gpu::DeviceBuffer random_device(size_t count, uint32_t seed, gpu::Stream& s) {
  std::vector<float> h(count);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : h) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  }
  gpu::DeviceBuffer d(std::max<size_t>(count * 4, 16));
  gpu::copy_to_device(d.data(), h.data(), count * 4, s);
  s.synchronize();
  return d;
}

struct Groups {
  gpu::DeviceBuffer buf;
  gpu::DeltaNetGroups g;
};
// B sequences of T tokens each, states at `states` (one buffer per sequence, `bytes` apart).
Groups make_groups(int64_t B, int64_t T, const gpu::DeviceBuffer& states, int64_t bytes, gpu::Stream& s) {
  const int64_t n = B * T;
  std::vector<uint64_t> ptr(static_cast<size_t>(B));
  std::vector<int32_t> ints;
  for (int64_t i = 0; i < n; ++i) ints.push_back(static_cast<int32_t>(i));      // order
  for (int64_t i = 0; i < n; ++i) ints.push_back(static_cast<int32_t>(i / T));  // tok_group
  for (int64_t g = 0; g < B; ++g) ints.push_back(static_cast<int32_t>(g * T));  // start
  for (int64_t g = 0; g < B; ++g) ints.push_back(static_cast<int32_t>(T));      // count
  for (int64_t g = 0; g < B; ++g) ints.push_back(0);                            // fresh: continue the (random) state
  for (int64_t g = 0; g < B; ++g) ptr[static_cast<size_t>(g)] = reinterpret_cast<uint64_t>(states.as<uint8_t>() + g * bytes);
  Groups r;
  r.buf = gpu::DeviceBuffer(static_cast<size_t>(B) * 8 + ints.size() * 4);
  gpu::copy_to_device(r.buf.data(), ptr.data(), ptr.size() * 8, s);
  gpu::copy_to_device(r.buf.as<uint8_t>() + B * 8, ints.data(), ints.size() * 4, s);
  s.synchronize();
  const auto* i32 = reinterpret_cast<const int32_t*>(r.buf.as<uint8_t>() + B * 8);
  r.g.state = r.buf.as<uint64_t>();
  r.g.order = i32;
  r.g.tok_group = i32 + n;
  r.g.start = i32 + 2 * n;
  r.g.count = i32 + 2 * n + B;
  r.g.fresh = i32 + 2 * n + 2 * B;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--quick") quick = true;
  }
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_deltanet: no GPU (%s)\n", gpu::describe().c_str());
    return 0;
  }
  gpu::Stream s;
  Timer timer{s, {}, {}};
  std::printf("bench_gpu_deltanet: %s\n", gpu::describe().c_str());
  double read_bw = 0, tensor = 0;
  {
    const size_t bytes = size_t{2} << 30;
    gpu::DeviceBuffer a(bytes), sink(64);
    gpu::memset_device(a.data(), 1, bytes, s);
    read_bw = static_cast<double>(bytes) / timer.us([&] { gpu::read_probe(a.data(), bytes, sink.as<uint32_t>(), s); }, 5) / 1e3;
    const int64_t m = 8192;
    gpu::DeviceBuffer x(static_cast<size_t>(m * m * 2)), w(static_cast<size_t>(m * m * 2)), y(static_cast<size_t>(m * m * 4));
    gpu::memset_device(x.data(), 0, x.bytes(), s);
    gpu::memset_device(w.data(), 0, w.bytes(), s);
    gpu::Blas blas(s);
    const double us = timer.us([&] { blas.gemm(x.as<uint16_t>(), m, w.as<uint16_t>(), m, m, y.as<float>(), m); }, 3);
    tensor = 2.0 * static_cast<double>(m * m * m) / us / 1e6;
    std::printf("device read bandwidth (2 GiB): %.0f GB/s; bf16 tensor throughput (cuBLAS 8192^3): %.0f TFLOP/s\n\n", read_bw, tensor);
  }
  gpu::DeltaNetShape sh;
  sh.nk = 16;
  sh.nv = 32;
  sh.dk = 128;
  sh.dv = 128;
  sh.conv_k = 4;
  gpu::deltanet_configure(sh);
  const int64_t P = sh.proj_cols(), cd = sh.conv_dim(), V = sh.value_dim(), layer_bytes = gpu::deltanet_layer_state_bytes(sh);
  const auto conv_w = random_device(static_cast<size_t>(cd * sh.conv_k), 1, s), dt = random_device(static_cast<size_t>(sh.nv), 2, s),
             norm = random_device(static_cast<size_t>(sh.dv), 3, s);
  std::vector<float> an(static_cast<size_t>(sh.nv), -0.5f);
  gpu::DeviceBuffer a_neg(an.size() * 4);
  gpu::copy_to_device(a_neg.data(), an.data(), an.size() * 4, s);

  std::printf("%-8s %7s %-12s %10s %12s %9s %7s %10s %8s\n", "case", "tokens", "kernel", "us", "tokens/s", "GB/s", "% read", "TFLOP/s", "% tensor");
  std::vector<int64_t> prompts = {512, 4096, 32768};
  if (quick) prompts = {512, 4096};
  for (int64_t T : prompts) {
    const auto proj = random_device(static_cast<size_t>(T * P), 4, s);
    const auto states = random_device(static_cast<size_t>(layer_bytes / 4), 5, s);
    gpu::DeviceBuffer conv(static_cast<size_t>(T * cd * 4)), gate(static_cast<size_t>(T * sh.nv * 4)), beta(static_cast<size_t>(T * sh.nv * 4)),
        core(static_cast<size_t>(T * V * 4)), y(static_cast<size_t>(T * V * 2));
    const Groups g = make_groups(1, T, states, layer_bytes, s);
    auto row = [&](const char* k, double us, double bytes, double flop) {
      std::printf("%-8s %7lld %-12s %10.1f %12.0f %9.0f %7.1f", "prefill", static_cast<long long>(T), k, us, static_cast<double>(T) / us * 1e6,
                  bytes / us / 1e3, 100.0 * bytes / us / 1e3 / read_bw);
      if (flop > 0) std::printf(" %10.2f %8.1f", flop / us / 1e6, 100.0 * flop / us / 1e6 / tensor);
      std::printf("\n");
    };
    const double tf = static_cast<double>(T);
    row("conv+norm", timer.us([&] {
          gpu::deltanet_prepare(proj.as<float>(), P, g.g, 0, T, sh, conv_w.as<float>(), a_neg.as<float>(), dt.as<float>(), 0, conv.as<float>(),
                                gate.as<float>(), beta.as<float>(), s);
        }, reps),
        tf * (static_cast<double>(cd + 2 * sh.nv) * 8), 0);  // proj columns read, conv rows written (fp32)
    const double flop = 2.0 * tf * static_cast<double>(sh.nv) * (3.0 * sh.dk * sh.dv + 64.0 * (sh.dk + sh.dv));
    row("delta rule", timer.us([&] {
          gpu::deltanet_chunked(conv.as<float>(), gate.as<float>(), beta.as<float>(), g.g, 0, 1, sh, 0, 1, 0, core.as<float>(), s);
        }, reps),
        tf * static_cast<double>(cd + V) * 4, flop);
    row("gated norm", timer.us([&] {
          gpu::deltanet_gated_norm(core.as<float>(), proj.as<float>(), P, g.g, 0, T, sh, norm.as<float>(), 1e-6f, y.as<uint16_t>(), s);
        }, reps),
        tf * static_cast<double>(V) * 10, 0);
  }
  for (int64_t B : {1, 8, 64}) {
    const auto proj = random_device(static_cast<size_t>(B * P), 6, s);
    const auto states = random_device(static_cast<size_t>(B * layer_bytes / 4), 7, s);
    gpu::DeviceBuffer conv(static_cast<size_t>(B * cd * 4)), gate(static_cast<size_t>(B * sh.nv * 4)), beta(static_cast<size_t>(B * sh.nv * 4)),
        core(static_cast<size_t>(B * V * 4));
    const Groups g = make_groups(B, 1, states, layer_bytes, s);
    gpu::deltanet_prepare(proj.as<float>(), P, g.g, 0, B, sh, conv_w.as<float>(), a_neg.as<float>(), dt.as<float>(), 0, conv.as<float>(),
                          gate.as<float>(), beta.as<float>(), s);
    const double us = timer.us([&] {
      gpu::deltanet_recurrent(conv.as<float>(), gate.as<float>(), beta.as<float>(), g.g, 0, B, sh, 0, 1, core.as<float>(), s);
    }, reps);
    const double bytes = static_cast<double>(B) * (3.0 * sh.nv * sh.dk * sh.dv * 4);
    std::printf("%-8s %7lld %-12s %10.1f %12.0f %9.0f %7.1f\n", "decode", static_cast<long long>(B), "recurrence", us, static_cast<double>(B) / us * 1e6,
                bytes / us / 1e3, 100.0 * bytes / us / 1e3 / read_bw);
  }
  std::printf("\nOne layer; Qwen3-Next-80B-A3B has 36 such layers. GB/s: bytes each kernel must move per call; %% read: of the measured read bandwidth.\n");
  return 0;
}
