// GGUF blocks as stored on the GPU (gpu/quant.h: gguf_gemv, gguf_moe_experts,
// gguf_dequant) against the device's measured read bandwidth (gpu::read_probe,
// 16-byte loads over 2 GiB). GB/s = the file's bytes of the matrix (or of the
// experts a layer touches) per second; the L2 is flushed (256 MiB memset)
// before every timed call; time between events around the call, the median
// of the repetitions.
//
// Rows (Qwen3-30B-A3B shapes, hidden 2048, 32 q heads of 128, 128 experts of
// 768, top-8):
//  - gemv lm_head [151936, 2048], q_proj [4096, 2048], o_proj [2048, 4096],
//    all experts' gate/up stacked [128 * 1536, 2048], at 1, 4 and 8 tokens;
//  - moe layer: gguf_moe_experts with top-8 random routing, 1 and 8 tokens
//    (bytes: the distinct experts touched), beside the repacked-format kernel
//    it replaces (gpu::quant_moe_experts after moe_route; Q5_K/Q6_K as int8
//    groups) on the same routing;
//  - moe prefill (512, 4096 and 8192 tokens, top-8 random): gguf_moe_gemm
//    (grouped tensor-core product dequantizing in shared memory; route,
//    gate/up, SwiGLU, down, weighted sum), a row per kernel
//    (gpu::GgufPrefillKernel: simple, pipelined, pipelined64, pipelined128;
//    issue 27) with the layer's time and TFLOP/s (the three products) and
//    then the gate/up and down products timed alone with their own TFLOP/s;
//    against the bf16 path it replaced (gguf_dequant of every expert,
//    offsets to the host, one cuBLAS product per expert); MB: all experts'
//    bytes;
//  - dequant: gguf_dequant of every expert's gate/up to bf16 (bytes read +
//    written).
// One matrix per type is quantized on the host and replicated on the device.
//
// Decode kernels side by side (issue 26, k29g): every decode row is timed
// with the staged kernels (gpu::GgufDecodeKernel::staged, each warp copies
// its rows into shared memory) and the direct ones (lanes load their units
// into registers; the default) in the same process, one after the other on
// the same bytes: time, GB/s and % of the read probe for each, and the ratio.
// Shapes: lm_head [151936, 2048], q_proj [4096, 2048], k_proj [512, 2048],
// o_proj [2048, 4096], one expert's gate/up [1536, 2048] and down [2048,
// 768], and the MoE layer at decode (gate/up + down of the top-8).
//
// Usage: bench_gpu_gguf [--reps N] [--decode | --prefill] [--types Q4_K,Q6_K] [--tokens 1,8]
//                       [--prefill-tokens 512,4096,8192] [--prefill-kernels simple,pipelined,...]
//   --decode: only the decode rows (no prefill or dequant rows).
//   --prefill: only the prefill and dequant rows.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/layers/gpu_experts.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/moe_stream.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"
#include "tests/quant_tools/quantizers.h"
#include "bench/gguf_gpu_bench.h"

using namespace hmoe;

namespace {

std::vector<float> random_w(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& x : v) x = nd(rng);
  return v;
}

// `copies` copies of one [rows, cols] matrix of type t (random weights) stacked on the device.
struct Stack : bench::GgufStack {
  std::vector<uint8_t> host;  // one copy
};
Stack stack(cpu::ExtType t, int64_t rows, int64_t cols, int64_t copies, gpu::Stream& s) {
  auto w = random_w(rows * cols, 17 + static_cast<uint64_t>(t));
  std::vector<uint8_t> host = qtools::quant_rows(t, w.data(), rows, cols);
  Stack st{bench::gguf_stack(t, host, rows, cols, copies, s), std::move(host)};
  return st;
}
using Timer = bench::GpuTimer;
constexpr auto tname = bench::gguf_type_name;

}  // namespace

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) v.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return v;
}

int main(int argc, char** argv) {
  int reps = 20;
  bool decode_only = false;
  std::vector<std::string> types = {"Q4_K", "Q5_K", "Q6_K", "Q8_0"};
  std::vector<int64_t> tokens = {1, 8};
  bool prefill_only = false;
  std::vector<int64_t> prefill_tokens = {512, 4096, 8192};
  std::vector<gpu::GgufPrefillKernel> prefill_kernels = {gpu::GgufPrefillKernel::simple, gpu::GgufPrefillKernel::pipelined,
                                                         gpu::GgufPrefillKernel::pipelined64, gpu::GgufPrefillKernel::pipelined128};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--decode") decode_only = true;
    else if (a == "--prefill") prefill_only = true;
    else if (a == "--types" && i + 1 < argc) types = split(argv[++i]);
    else if (a == "--prefill-tokens" && i + 1 < argc) {
      prefill_tokens.clear();
      for (const std::string& t : split(argv[++i])) prefill_tokens.push_back(std::stoll(t));
    } else if (a == "--prefill-kernels" && i + 1 < argc) {
      prefill_kernels.clear();
      for (const std::string& k : split(argv[++i])) {
        if (k == "simple") prefill_kernels.push_back(gpu::GgufPrefillKernel::simple);
        else if (k == "pipelined") prefill_kernels.push_back(gpu::GgufPrefillKernel::pipelined);
        else if (k == "pipelined64") prefill_kernels.push_back(gpu::GgufPrefillKernel::pipelined64);
        else if (k == "pipelined128") prefill_kernels.push_back(gpu::GgufPrefillKernel::pipelined128);
        else {
          std::fprintf(stderr, "bench_gpu_gguf: unknown prefill kernel %s (simple, pipelined, pipelined64, pipelined128)\n", k.c_str());
          return 2;
        }
      }
    }
    else if (a == "--tokens" && i + 1 < argc) {
      tokens.clear();
      for (const std::string& t : split(argv[++i])) tokens.push_back(std::stoll(t));
    } else {
      std::fprintf(stderr, "usage: bench_gpu_gguf [--reps N] [--decode | --prefill] [--types Q4_K,Q5_K,Q6_K,Q8_0] [--tokens 1,8] "
                           "[--prefill-tokens 512,4096,8192] [--prefill-kernels simple,pipelined,pipelined64,pipelined128]\n");
      return 2;
    }
  }
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_gguf: no GPU (%s)\n", gpu::describe().c_str());
    return 0;
  }
  gpu::Stream s;
  Timer timer(s, reps);
  std::printf("bench_gpu_gguf: %s\n", gpu::describe().c_str());
  double read_bw = 0;
  {
    const size_t bytes = size_t{2} << 30;
    gpu::DeviceBuffer a(bytes), sink(64);
    gpu::memset_device(a.data(), 1, bytes, s);
    read_bw = static_cast<double>(bytes) / timer.us([&] { gpu::read_probe(a.data(), bytes, sink.as<uint32_t>(), s); }) / 1e3;
    std::printf("device read bandwidth (gpu::read_probe, 2 GiB): %.0f GB/s\n\n", read_bw);
  }
  double copy_bw = 0;
  {
    const size_t bytes = size_t{1} << 30;
    gpu::DeviceBuffer a(bytes), b(bytes);
    gpu::memset_device(a.data(), 1, bytes, s);
    copy_bw = 2.0 * static_cast<double>(bytes) / timer.us([&] { gpu::copy_on_device(b.data(), a.data(), bytes, s); }) / 1e3;
    std::printf("device copy bandwidth (cudaMemcpy device to device, 1 GiB, read + written): %.0f GB/s\n\n", copy_bw);
  }
  // Decode rows: staged and direct kernels on the same call.
  std::printf("%-6s %-34s %6s %10s %10s %9s %14s %14s %8s\n", "type", "op", "tokens", "staged us", "direct us", "MB", "staged GB/s", "direct GB/s",
              "speedup");
  auto side = [&](cpu::ExtType t, const std::string& op, int64_t n, double bytes, auto&& fn) {
    gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::staged);
    const double us_s = timer.us(fn);
    gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::direct);
    const double us_d = timer.us(fn);
    const double gs = bytes / us_s / 1e3, gd = bytes / us_d / 1e3;
    std::printf("%-6s %-34s %6ld %10.1f %10.1f %9.2f %7.0f (%3.0f%%) %7.0f (%3.0f%%) %7.2fx\n", tname(t), op.c_str(), static_cast<long>(n), us_s, us_d,
                bytes / 1e6, gs, 100.0 * gs / read_bw, gd, 100.0 * gd / read_bw, us_s / us_d);
    std::fflush(stdout);
  };
  auto row = [&](cpu::ExtType t, const std::string& op, int64_t n, double us, double bytes) {
    std::printf("%-6s %-34s %6ld %10.1f %10.2f %8.0f %6.0f%%\n", tname(t), op.c_str(), static_cast<long>(n), us, bytes / 1e6, bytes / us / 1e3,
                100.0 * bytes / us / 1e3 / read_bw);
  };
  const int64_t H = 2048, I = 768, E = 128, K = 8;
  std::mt19937 rng(5);
  for (const std::string& tn : types) {
    cpu::ExtType t{};
    if (tn == "Q4_K") t = cpu::ExtType::q4_k;
    else if (tn == "Q5_K") t = cpu::ExtType::q5_k;
    else if (tn == "Q6_K") t = cpu::ExtType::q6_k;
    else if (tn == "Q8_0") t = cpu::ExtType::q8_0;
    else {
      std::fprintf(stderr, "bench_gpu_gguf: unknown type %s (Q4_K, Q5_K, Q6_K, Q8_0)\n", tn.c_str());
      return 2;
    }
    struct Mat {
      const char* name;
      int64_t rows, cols, copies;
    };
    int64_t max_n = 8;
    for (int64_t n : tokens) max_n = std::max(max_n, n);
    std::vector<uint16_t> xh(static_cast<size_t>(max_n * 4096));
    for (auto& v : xh) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
    gpu::DeviceBuffer x(xh.size() * 2);
    gpu::copy_to_device(x.data(), xh.data(), xh.size() * 2, s);
    if (!prefill_only) {
    for (Mat m : {Mat{"lm_head", 4748, H, 32}, Mat{"q_proj", 4096, H, 1}, Mat{"k_proj", 512, H, 1}, Mat{"o_proj", H, 4096, 1}}) {
      Stack st = stack(t, m.rows, m.cols, m.copies, s);
      gpu::DeviceBuffer y(static_cast<size_t>(max_n * st.w.rows) * 4);
      for (int64_t n : tokens)
        side(t, std::string(m.name) + " [" + std::to_string(st.w.rows) + "x" + std::to_string(m.cols) + "]", n, static_cast<double>(st.w.bytes()),
             [&] { gpu::gguf_gemv(st.w, x.as<uint16_t>(), n, y.as<float>(), st.w.rows, s); });
    }
    }
    // One MoE layer: the native pair kernels and the repacked-format kernel on the same routing.
    Stack gu = stack(t, 2 * I, H, E, s), dn = stack(t, H, I, E, s);
    if (!prefill_only) {
    {
      gpu::GgufWeight g1 = gu.w, d1 = dn.w;  // one expert of each stack
      g1.rows = 2 * I;
      d1.rows = H;
      gpu::DeviceBuffer y(static_cast<size_t>(max_n * H) * 4);
      for (int64_t n : tokens) {
        side(t, "expert gate/up [1536x2048]", n, static_cast<double>(g1.bytes()), [&] { gpu::gguf_gemv(g1, x.as<uint16_t>(), n, y.as<float>(), g1.rows, s); });
        side(t, "expert down [2048x768]", n, static_cast<double>(d1.bytes()), [&] { gpu::gguf_gemv(d1, x.as<uint16_t>(), n, y.as<float>(), d1.rows, s); });
      }
    }
    }
    const std::vector<uint8_t> gu1 = gu.host, dn1 = dn.host;
    const double expert_bytes = static_cast<double>(gu1.size() + dn1.size());
    if (!prefill_only) {
    for (int64_t n : tokens) {
      const std::vector<int32_t> ids = bench::random_ids(n, E, K, rng);
      std::vector<float> wts(ids.size(), 1.0f / K);
      std::vector<int> seen(static_cast<size_t>(E), 0);
      int distinct = 0;
      for (int32_t e : ids) distinct += seen[static_cast<size_t>(e)]++ == 0;
      gpu::DeviceBuffer di(ids.size() * 4), dw(ids.size() * 4), gub(ids.size() * 2 * I * 4), out(static_cast<size_t>(n * H) * 4);
      gpu::copy_to_device(di.data(), ids.data(), ids.size() * 4, s);
      gpu::copy_to_device(dw.data(), wts.data(), wts.size() * 4, s);
      side(t, "moe layer top-8 (gate/up + down)", n, distinct * expert_bytes, [&] {
        gpu::gguf_moe_experts(x.as<uint16_t>(), n, K, di.as<int32_t>(), dw.as<float>(), gu.w, dn.w, I, gub.as<float>(), out.as<float>(), s);
      });
    }
    }
    if (decode_only) continue;
    if (!prefill_only) {
    std::vector<cpu::Mat> guv(static_cast<size_t>(E), cpu::ext_view(t, gu1.data(), 2 * I, H, "bench")),
        dnv(static_cast<size_t>(E), cpu::ext_view(t, dn1.data(), H, I, "bench"));
    gpu::QDeviceMat qgu(guv, s, "bench gate/up"), qdn(dnv, s, "bench down");
    for (int64_t n : {1, 8}) {
      const std::vector<int32_t> ids = bench::random_ids(n, E, K, rng);
      std::vector<float> wts(ids.size(), 1.0f / K);
      std::vector<int> seen(static_cast<size_t>(E), 0);
      int distinct = 0;
      for (int32_t e : ids) distinct += seen[static_cast<size_t>(e)]++ == 0;
      gpu::DeviceBuffer di(ids.size() * 4), dw(ids.size() * 4), out(static_cast<size_t>(n * H) * 4), off(static_cast<size_t>(E + 1) * 4),
          pl(ids.size() * 4), act(ids.size() * I * 2), part(ids.size() * H * 4);
      gpu::copy_to_device(di.data(), ids.data(), ids.size() * 4, s);
      gpu::copy_to_device(dw.data(), wts.data(), wts.size() * 4, s);
      const double us_old = timer.us([&] {
        gpu::moe_route(di.as<int32_t>(), n * K, E, off.as<int32_t>(), pl.as<int32_t>(), s);
        gpu::quant_moe_experts(x.as<uint16_t>(), n, H, I, E, K, dw.as<float>(), off.as<int32_t>(), pl.as<int32_t>(), qgu.weight(), qdn.weight(),
                               act.as<uint16_t>(), part.as<float>(), out.as<float>(), s);
      });
      row(t, std::string("moe layer (repacked, ") + gpu::qformat_name(qgu.weight().format) + ")", n, us_old, distinct * expert_bytes);
    }
    }
    // Prefill chunks: the grouped tensor-core product on the blocks (route, gate/up, SwiGLU, down,
    // weighted sum), once per gguf_moe_gemm kernel, and each product alone (TFLOP/s of the GEMM
    // itself); then dequantizing every expert to bf16 and one cuBLAS product per expert.
    for (int64_t n : prefill_tokens) {
      const int64_t P = n * K;
      bench::GgufMoePrefill layer(bench::random_ids(n, E, K, rng), n, H, I, E, K, rng, s);
      const double flop_gu = 2.0 * static_cast<double>(P) * static_cast<double>(2 * I * H), flop_dn = 2.0 * static_cast<double>(P) * static_cast<double>(H * I);
      const double flop = flop_gu + flop_dn;
      for (gpu::GgufPrefillKernel kern : prefill_kernels) {
        gpu::set_gguf_prefill_kernel(kern);
        const std::string kn = gpu::gguf_prefill_kernel_name(kern);
        const double us = timer.us([&] { layer.run(gu.w, dn.w, s); });
        // The routing and the down product's input stay from the layer's last run.
        const double us_gu = timer.us([&] { layer.gate_up(gu.w, s); });
        const double us_dn = timer.us([&] { layer.down(dn.w, s); });
        std::printf("%-6s %-26s %6ld %10.1f %10.2f %8.0f  %.0f TFLOP/s   gate/up %8.1f us %4.0f TFLOP/s   down %8.1f us %4.0f TFLOP/s\n", tname(t),
                    ("moe prefill " + kn).c_str(), static_cast<long>(n), us, expert_bytes * E / 1e6, expert_bytes * E / us / 1e3, flop / us / 1e6, us_gu,
                    flop_gu / us_gu / 1e6, us_dn, flop_dn / us_dn / 1e6);
        std::fflush(stdout);
      }
      gpu::set_gguf_prefill_kernel(gpu::GgufPrefillKernel::simple);
      // Old path: dequantize all experts (bf16), offsets to the host, per-expert cuBLAS.
      gpu::DeviceBuffer dgu(static_cast<size_t>(gu.w.rows * H) * 2), ddn(static_cast<size_t>(dn.w.rows * I) * 2);
      gpu::PinnedBuffer offs_h;
      offs_h.reserve(static_cast<size_t>(E + 1) * 4);
      gpu::Blas blas(s);
      const double us_old = timer.us([&] {
        layer.route(s);
        gpu::copy_to_host(offs_h.as<void>(), layer.off.data(), static_cast<size_t>(E + 1) * 4, s);
        gpu::gguf_dequant(gu.w, 0, gu.w.rows, dgu.as<uint16_t>(), s);
        gpu::gguf_dequant(dn.w, 0, dn.w.rows, ddn.as<uint16_t>(), s);
        s.synchronize();
        moe_experts_gemm(blas, layer.dx.as<uint16_t>(), n, H, I, E, K, offs_h.as<int32_t>(), layer.pl.as<int32_t>(), layer.dw.as<float>(),
                         [&](int64_t e, bool down) { return down ? ddn.as<uint16_t>() + e * H * I : dgu.as<uint16_t>() + e * 2 * I * H; }, layer.g,
                         layer.out.as<float>(), s);
      });
      std::printf("%-6s %-26s %6ld %10.1f %10.2f %8.0f  %.0f TFLOP/s\n", tname(t), "moe prefill (old: bf16+cuBLAS)", static_cast<long>(n), us_old,
                  expert_bytes * E / 1e6, expert_bytes * E / us_old / 1e3, flop / us_old / 1e6);
    }
    gpu::DeviceBuffer deq(static_cast<size_t>(gu.w.rows * H) * 2);
    const double dus = timer.us([&] { gpu::gguf_dequant(gu.w, 0, gu.w.rows, deq.as<uint16_t>(), s); });
    row(t, "dequant experts gate/up", 0, dus, static_cast<double>(gu.w.bytes()) + static_cast<double>(gu.w.rows * H) * 2);
  }
  std::printf("\nGB/s: the file's bytes moved per second (dequant: bytes read + bf16 bytes written); %%: of the read bandwidth above; speedup: "
              "staged us / direct us.\n");
  return 0;
}
