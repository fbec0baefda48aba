// The low-bit GGUF types on the GPU as stored (gpu/quant.h: gguf_gemv,
// gguf_moe_experts, gguf_moe_gemm, gguf_dequant; decoders
// gpu/gguf_lowbit_units.h), one row set per type, with Q4_K as the baseline
// of the older kernels, against the device's measured read bandwidth
// (gpu::read_probe, 16-byte loads over 2 GiB). GB/s = the file's bytes of
// the matrix (or of the experts a pass touches) per second; the L2 is
// flushed (256 MiB memset) before every timed call; time between events
// around the call, the median of the repetitions.
//
// Shapes: DeepSeek-V3 / Kimi-K2 (hidden 7168, 256 routed experts of 2048,
// top-8, o_proj [7168, 16384]); every type's blocks random with realistic
// scales (tests/quant_tools/lowbit_blocks.h), one expert (and an eighth of
// o_proj) made on the host and replicated on the device:
//  - gemv experts gate/up [256 * 4096, 7168] at 1 and 8 tokens (the dense
//    decode GEMV over 1.4-4 GB: the bandwidth figure), gemv o_proj at 1;
//  - moe layer (gguf_moe_experts, the decode experts: gate/up per pair,
//    down with SwiGLU and the weighted sum), top-8 random routing, 1 and 8
//    tokens; bytes: the distinct experts touched;
//  - moe prefill 512 tokens (route, grouped tensor-core gate/up, SwiGLU,
//    down, weighted sum; gguf_moe_gemm): MB all experts' bytes and TFLOP/s
//    of the three products;
//  - dequant (gguf_dequant, what the dense prefill feeds cuBLAS) of 16
//    experts' gate/up: bytes read + bf16 bytes written.
//
// Usage: bench_gpu_gguf_lowbit [--reps N] [--types NAME,NAME...]
#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/layers/gpu_experts.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/moe_stream.h"
#include "gpu/quant.h"
#include "io/tensor/quant_blocks_lowbit.h"
#include "tests/quant_tools/lowbit_blocks.h"
#include "tests/quant_tools/quantizers.h"
#include "bench/gguf_gpu_bench.h"

using namespace hmoe;

namespace {

// One [rows, cols] matrix of type t on the host.
std::vector<uint8_t> host_matrix(cpu::ExtType t, int64_t rows, int64_t cols, uint64_t seed) {
  if (cpu::lowbit_type(static_cast<uint32_t>(t))) return qtools::lowbit_random_rows(t, rows, cols, seed, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& x : w) x = nd(rng);
  return qtools::quant_rows(t, w.data(), rows, cols);
}

using Stack = bench::GgufStack;
using Timer = bench::GpuTimer;
constexpr auto stack = bench::gguf_stack;
constexpr auto tname = bench::gguf_type_name;

using bench::random_ids;

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  std::vector<cpu::ExtType> types = {cpu::ExtType::q4_k};
  for (cpu::ExtType t : cpu::lowbit::kAll) types.push_back(t);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::stoi(argv[++i]);
    } else if (a == "--types" && i + 1 < argc) {
      types.clear();
      std::stringstream ss(argv[++i]);
      for (std::string nm; std::getline(ss, nm, ',');) {
        bool found = false;
        for (uint32_t id : {12u, 10u, 11u, 16u, 17u, 18u, 19u, 20u, 21u, 22u, 23u, 29u, 39u})
          if (nm == cpu::ext_type_info(id)->name) types.push_back(static_cast<cpu::ExtType>(id)), found = true;
        if (!found) {
          std::fprintf(stderr, "bench_gpu_gguf_lowbit: unknown type '%s' (Q4_K or a low-bit type name)\n", nm.c_str());
          return 2;
        }
      }
    } else {
      std::fprintf(stderr, "usage: bench_gpu_gguf_lowbit [--reps N] [--types NAME,NAME...]\n");
      return 2;
    }
  }
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_gguf_lowbit: no GPU (%s)\n", gpu::describe().c_str());
    return 0;
  }
  gpu::Stream s;
  Timer timer(s, reps);
  std::printf("bench_gpu_gguf_lowbit: %s\n", gpu::describe().c_str());
  double read_bw = 0;
  {
    const size_t bytes = size_t{2} << 30;
    gpu::DeviceBuffer a(bytes), sink(64);
    gpu::memset_device(a.data(), 1, bytes, s);
    read_bw = static_cast<double>(bytes) / timer.us([&] { gpu::read_probe(a.data(), bytes, sink.as<uint32_t>(), s); }) / 1e3;
    std::printf("device read bandwidth (gpu::read_probe, 2 GiB): %.0f GB/s\n\n", read_bw);
  }
  std::printf("%-8s %-34s %6s %10s %10s %8s %7s\n", "type", "op", "tokens", "us", "MB", "GB/s", "% read");
  auto row = [&](cpu::ExtType t, const std::string& op, int64_t n, double us, double bytes, const std::string& extra = "") {
    std::printf("%-8s %-34s %6ld %10.1f %10.2f %8.0f %6.0f%%%s\n", tname(t), op.c_str(), static_cast<long>(n), us, bytes / 1e6, bytes / us / 1e3,
                100.0 * bytes / us / 1e3 / read_bw, extra.c_str());
    std::fflush(stdout);
  };
  const int64_t H = 7168, I = 2048, E = 256, K = 8, O = 16384;
  std::mt19937 rng(5);
  std::vector<uint16_t> xh(static_cast<size_t>(8 * O));
  for (auto& v : xh) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
  gpu::DeviceBuffer x(xh.size() * 2);
  gpu::copy_to_device(x.data(), xh.data(), xh.size() * 2, s);
  for (cpu::ExtType t : types) {
    const auto gu_h = host_matrix(t, 2 * I, H, 11 + static_cast<uint64_t>(t)), dn_h = host_matrix(t, H, I, 13 + static_cast<uint64_t>(t));
    const auto o_h = host_matrix(t, H / 8, O, 17 + static_cast<uint64_t>(t));  // an eighth, replicated
    Stack gu = stack(t, gu_h, 2 * I, H, E, s), dn = stack(t, dn_h, H, I, E, s);
    {
      gpu::DeviceBuffer y(static_cast<size_t>(8 * gu.w.rows) * 4);
      for (int64_t n : {1, 8}) {
        const double us = timer.us([&] { gpu::gguf_gemv(gu.w, x.as<uint16_t>(), n, y.as<float>(), gu.w.rows, s); });
        row(t, "gemv experts gate/up [" + std::to_string(gu.w.rows) + "x" + std::to_string(H) + "]", n, us, static_cast<double>(gu.w.bytes()));
      }
      Stack o = stack(t, o_h, H / 8, O, 8, s);
      const double us = timer.us([&] { gpu::gguf_gemv(o.w, x.as<uint16_t>(), 1, y.as<float>(), o.w.rows, s); });
      row(t, "gemv o_proj [7168x16384]", 1, us, static_cast<double>(o.w.bytes()));
    }
    const double expert_bytes = static_cast<double>(gu_h.size() + dn_h.size());
    for (int64_t n : {1, 8}) {
      const auto ids = random_ids(n, E, K, rng);
      std::vector<float> wts(ids.size(), 1.0f / K);
      std::vector<int> seen(static_cast<size_t>(E), 0);
      int distinct = 0;
      for (int32_t e : ids) distinct += seen[static_cast<size_t>(e)]++ == 0;
      gpu::DeviceBuffer di(ids.size() * 4), dw(ids.size() * 4), gub(ids.size() * 2 * I * 4), out(static_cast<size_t>(n * H) * 4);
      gpu::copy_to_device(di.data(), ids.data(), ids.size() * 4, s);
      gpu::copy_to_device(dw.data(), wts.data(), wts.size() * 4, s);
      const double us = timer.us([&] {
        gpu::gguf_moe_experts(x.as<uint16_t>(), n, K, di.as<int32_t>(), dw.as<float>(), gu.w, dn.w, I, gub.as<float>(), out.as<float>(), s);
      });
      row(t, "moe layer (gguf_moe_experts)", n, us, distinct * expert_bytes);
    }
    {
      const int64_t n = 512, P = n * K;
      const auto ids = random_ids(n, E, K, rng);
      bench::GgufMoePrefill layer(ids, n, H, I, E, K, rng, s);
      const double flop = 2.0 * static_cast<double>(P) * 3.0 * static_cast<double>(H * I);
      const double us = timer.us([&] { layer.run(gu.w, dn.w, s); });
      char extra[64];
      std::snprintf(extra, sizeof extra, "  %.0f TFLOP/s", flop / us / 1e6);
      row(t, "moe prefill (gguf_moe_gemm)", n, us, expert_bytes * E, extra);
    }
    {
      const int64_t rows = 16 * 2 * I;
      gpu::DeviceBuffer deq(static_cast<size_t>(rows * H) * 2);
      const double us = timer.us([&] { gpu::gguf_dequant(gu.w, 0, rows, deq.as<uint16_t>(), s); });
      row(t, "dequant 16 experts' gate/up", 0, us, static_cast<double>(rows) * static_cast<double>(gu.w.row_bytes()) + static_cast<double>(rows * H) * 2);
    }
  }
  std::printf("\nGB/s: the file's bytes moved per second (dequant: bytes read + bf16 bytes written); %% read: of the read bandwidth above.\n");
  return 0;
}
