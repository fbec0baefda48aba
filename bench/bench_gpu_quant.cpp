// GPU GEMV and routed-expert bandwidth on quantized weights (gpu/quant.h):
// stored weight bytes (scales included) streamed per second, against the
// device's measured read bandwidth (a 16-byte-load read kernel over 2 GiB)
// and device-to-device copy bandwidth.
//
// Shapes: Qwen3-30B-A3B experts (hidden 2048, moe_intermediate 768, 128
// experts, top-8) and DeepSeek-V3 experts (hidden 7168, moe_intermediate
// 2048, top-8; 32 of its 256 experts held, routed over at random). One
// expert per format is quantized on the host and replicated on the device.
//  - gemv gate_up / down: quant_gemv over the stack of every held expert as
//    one matrix ([E*2I, H] and [E*H, I]), 1/4/8 tokens: the kernel's
//    streaming rate on many rows.
//  - moe layer: quant_moe_experts (gate/up, down, combine) for 1/4/8 tokens
//    (decode) and 64/512 (prefill chunks) with top-8 random routing; bytes =
//    the distinct active experts.
// Formats: bf16, GGUF Q8_0/Q4_K (as stored), GPTQ int4 g128, FP8 b128, GGUF
// Q4_0 (as int4 groups) and Q5_K/Q6_K (as int8 groups; gpu::qrepack).
// Baseline bf16: cuBLAS (gemv rows) and gpu::moe_experts (layer).
// The L2 is flushed (256 MiB memset) before every timed call; the time is
// between events around the call, averaged over the repetitions.
//
// Usage: bench_gpu_quant [--reps N] [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;

namespace {

struct HostMat {  // one expert matrix in a format, host side
  std::vector<uint8_t> bytes;
  cpu::QuantMat qm;
  cpu::Mat view;
};

enum class Fmt { bf16, q8_0, q4_k, gptq, fp8, q4_0, q5_k, q6_k };
const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::bf16: return "bf16";
    case Fmt::q8_0: return "GGUF Q8_0";
    case Fmt::q4_k: return "GGUF Q4_K";
    case Fmt::gptq: return "GPTQ-int4 g128";
    case Fmt::fp8: return "FP8 e4m3 b128";
    case Fmt::q4_0: return "GGUF Q4_0";
    case Fmt::q5_k: return "GGUF Q5_K";
    case Fmt::q6_k: return "GGUF Q6_K";
  }
  return "?";
}

std::vector<float> random_w(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = (static_cast<float>(s % 20001) / 10000.0f - 1.0f) * 0.05f;
  }
  return v;
}

HostMat make(Fmt f, int64_t rows, int64_t cols, uint64_t seed) {
  HostMat h;
  auto w = random_w(rows * cols, seed);
  switch (f) {
    case Fmt::bf16: {
      h.bytes.resize(static_cast<size_t>(rows * cols * 2));
      auto* p = reinterpret_cast<uint16_t*>(h.bytes.data());
      for (int64_t i = 0; i < rows * cols; ++i) p[i] = f32_to_bf16(w[static_cast<size_t>(i)]);
      h.view = cpu::Mat{DType::bf16, h.bytes.data(), rows, cols};
      break;
    }
    case Fmt::q8_0:
    case Fmt::q4_k:
    case Fmt::q4_0:
    case Fmt::q5_k:
    case Fmt::q6_k: {
      const auto t = f == Fmt::q8_0   ? cpu::ExtType::q8_0
                     : f == Fmt::q4_k ? cpu::ExtType::q4_k
                     : f == Fmt::q4_0 ? cpu::ExtType::q4_0
                     : f == Fmt::q5_k ? cpu::ExtType::q5_k
                                      : cpu::ExtType::q6_k;
      h.bytes = qtools::quant_rows(t, w.data(), rows, cols);
      h.view = cpu::ext_view(t, h.bytes.data(), rows, cols, "bench");
      break;
    }
    case Fmt::gptq: h.qm = cpu::quantize_int4(w.data(), rows, cols, 128, true); h.view = h.qm.view; break;
    case Fmt::fp8: {
      h.qm.data.resize(static_cast<size_t>(rows * cols));
      const int64_t G = (cols + 127) / 128;
      h.qm.scales.assign(static_cast<size_t>(rows * G), 1.0f / 4480.0f);
      std::unordered_map<float, uint8_t> memo;  // the rounding search is slow; the weights take 20001 values
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float v = w[static_cast<size_t>(i)] * 4480.0f;
        auto it = memo.find(v);
        if (it == memo.end()) it = memo.emplace(v, qtools::f32_to_fp8_e4m3(v)).first;
        h.qm.data[static_cast<size_t>(i)] = it->second;
      }
      h.qm.view = cpu::Mat{DType::u8, h.qm.data.data(), rows, cols, cpu::Quant::ext, h.qm.scales.data(), nullptr, 128};
      h.qm.view.ext = static_cast<uint32_t>(cpu::ExtType::fp8_e4m3);
      h.view = h.qm.view;
      break;
    }
  }
  return h;
}

// `copies` copies of one matrix stacked by rows on the device.
struct Stack {
  gpu::DeviceBuffer data, scales, zeros;
  gpu::QWeight w;        // quantized formats
  size_t one_bytes = 0;  // one copy: data + scales + zeros
};
Stack stack(Fmt f, const HostMat& h, int64_t copies, gpu::Stream& s) {
  Stack st;
  const cpu::Mat& v = h.view;
  // Quantized: the GPU layout (gpu::qrepack: Q4_0 -> int4 groups, Q5_K/Q6_K -> int8 groups, else as stored).
  gpu::QHostMat hm;
  if (f != Fmt::bf16) hm = gpu::qrepack({v}, "bench");
  const size_t db = f == Fmt::bf16 ? static_cast<size_t>(v.rows) * v.row_bytes() : hm.data.size();
  const size_t sb = hm.scales.size() * 4, zb = hm.zeros.size() * 4;
  st.one_bytes = db + sb + zb;
  auto rep = [&](gpu::DeviceBuffer& b, const void* src, size_t bytes) {
    if (!bytes) return;
    b = gpu::DeviceBuffer(bytes * static_cast<size_t>(copies));
    gpu::copy_to_device(b.data(), src, bytes, s);
    for (int64_t c = 1; c < copies; ++c) gpu::copy_on_device(b.as<uint8_t>() + bytes * c, b.data(), bytes, s);
  };
  rep(st.data, f == Fmt::bf16 ? v.data : static_cast<const void*>(hm.data.data()), db);
  rep(st.scales, hm.scales.data(), sb);
  rep(st.zeros, hm.zeros.data(), zb);
  s.synchronize();
  if (f != Fmt::bf16) {
    st.w = hm.w;
    st.w.data = st.data.data();
    st.w.scales = sb ? st.scales.as<float>() : nullptr;
    st.w.zeros = zb ? st.zeros.as<float>() : nullptr;
    st.w.rows = v.rows * copies;
    gpu::check_qweight(st.w, "bench");
  }
  return st;
}

struct Timer {
  gpu::Stream& s;
  gpu::DeviceBuffer flush{size_t{256} << 20};
  gpu::Event a, b;
  explicit Timer(gpu::Stream& st) : s(st) {}
  template <class Fn>
  double us(Fn&& fn, int reps) {
    fn();  // warm-up (and first-launch attribute setup)
    s.synchronize();
    double total = 0;
    for (int r = 0; r < reps; ++r) {
      gpu::memset_device(flush.data(), r & 0xFF, flush.bytes(), s);
      a.record(s);
      fn();
      b.record(s);
      b.synchronize();
      total += b.elapsed_ms(a);
    }
    return total * 1e3 / reps;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--quick") quick = true;
  }
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_quant: no GPU (%s)\n", gpu::describe().c_str());
    return 0;
  }
  gpu::Stream s;
  Timer timer(s);
  std::printf("bench_gpu_quant: %s\n", gpu::describe().c_str());

  // Rooflines.
  double read_bw = 0, copy_bw = 0;
  {
    const size_t bytes = size_t{2} << 30;
    gpu::DeviceBuffer a(bytes), b(bytes), sink(64);
    gpu::memset_device(a.data(), 1, bytes, s);
    const double rus = timer.us([&] { gpu::read_probe(a.data(), bytes, sink.as<uint32_t>(), s); }, 10);
    const double cus = timer.us([&] { gpu::copy_on_device(b.data(), a.data(), bytes, s); }, 10);
    read_bw = static_cast<double>(bytes) / rus / 1e3;
    copy_bw = 2.0 * static_cast<double>(bytes) / cus / 1e3;
    std::printf("device read bandwidth (16-byte loads, 2 GiB): %.0f GB/s; device-to-device copy (read + write, 2 GiB): %.0f GB/s\n\n", read_bw,
                copy_bw);
  }

  struct Shape {
    const char* name;
    int64_t H, I, E_model, E_held, topk;
  };
  std::vector<Shape> shapes = {{"qwen3-30b-a3b", 2048, 768, 128, 128, 8}, {"deepseek-v3", 7168, 2048, 256, 32, 8}};
  if (quick) shapes[1].E_held = 16;
  std::printf("%-14s %-15s %-14s %6s %10s %10s %9s %8s\n", "shape", "format", "op", "tokens", "us", "MB", "GB/s", "% read");
  for (const Shape& sh : shapes) {
    for (Fmt f : {Fmt::bf16, Fmt::q8_0, Fmt::q4_k, Fmt::gptq, Fmt::fp8, Fmt::q4_0, Fmt::q5_k, Fmt::q6_k}) {
      const auto t0 = std::chrono::steady_clock::now();
      HostMat gu = make(f, 2 * sh.I, sh.H, 11), dn = make(f, sh.H, sh.I, 12);
      Stack sgu = stack(f, gu, sh.E_held, s), sdn = stack(f, dn, sh.E_held, s);
      const double prep_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double expert_bytes = static_cast<double>(sgu.one_bytes + sdn.one_bytes);
      auto row = [&](const char* op, int64_t n, double us, double bytes) {
        std::printf("%-14s %-15s %-14s %6ld %10.1f %10.2f %9.0f %7.0f%%\n", sh.name, fmt_name(f), op, static_cast<long>(n), us, bytes / 1e6,
                    bytes / us / 1e3, 100.0 * bytes / us / 1e3 / read_bw);
      };
      gpu::Blas blas(s);
      for (int64_t n : {1, 4, 8, 64, 512}) {
        const bool gemv = n <= 8;  // the GEMV rows at decode sizes; the layer also at prefill sizes
        std::vector<uint16_t> xh(static_cast<size_t>(n * sh.H));
        for (size_t i = 0; i < xh.size(); ++i) xh[i] = f32_to_bf16(0.01f * static_cast<float>(static_cast<int>(i % 201) - 100));
        gpu::DeviceBuffer x(xh.size() * 2), y(gemv ? static_cast<size_t>(n * sh.E_held * std::max(2 * sh.I, sh.H)) * 4 : 16);
        gpu::copy_to_device(x.data(), xh.data(), xh.size() * 2, s);
        std::vector<uint16_t> ah(static_cast<size_t>(n * sh.I));
        for (size_t i = 0; i < ah.size(); ++i) ah[i] = f32_to_bf16(0.01f * static_cast<float>(static_cast<int>(i % 97) - 48));
        gpu::DeviceBuffer xa(ah.size() * 2);
        gpu::copy_to_device(xa.data(), ah.data(), ah.size() * 2, s);
        const int64_t rows_gu = sh.E_held * 2 * sh.I, rows_dn = sh.E_held * sh.H;
        if (!gemv) {
        } else if (f == Fmt::bf16) {
          row("gemv gate_up", n, timer.us([&] { blas.gemm(x.as<uint16_t>(), n, sgu.data.as<uint16_t>(), rows_gu, sh.H, y.as<float>(), rows_gu); }, reps),
              static_cast<double>(sgu.one_bytes) * sh.E_held);
          row("gemv down", n, timer.us([&] { blas.gemm(xa.as<uint16_t>(), n, sdn.data.as<uint16_t>(), rows_dn, sh.I, y.as<float>(), rows_dn); }, reps),
              static_cast<double>(sdn.one_bytes) * sh.E_held);
        } else {
          row("gemv gate_up", n, timer.us([&] { gpu::quant_gemv(sgu.w, x.as<uint16_t>(), n, y.as<float>(), rows_gu, s); }, reps),
              static_cast<double>(sgu.w.bytes()));
          row("gemv down", n, timer.us([&] { gpu::quant_gemv(sdn.w, xa.as<uint16_t>(), n, y.as<float>(), rows_dn, s); }, reps),
              static_cast<double>(sdn.w.bytes()));
        }
        // MoE layer: top-k distinct random experts per token.
        std::mt19937 rng(static_cast<unsigned>(n * 1000 + sh.H));
        std::vector<int32_t> ids(static_cast<size_t>(n * sh.topk));
        std::vector<float> wts(ids.size(), 1.0f / static_cast<float>(sh.topk));
        std::vector<char> used(static_cast<size_t>(sh.E_held), 0);
        for (int64_t t = 0; t < n; ++t) {
          std::vector<int32_t> pick;
          while (static_cast<int64_t>(pick.size()) < sh.topk) {
            const int32_t e = static_cast<int32_t>(rng() % static_cast<unsigned>(sh.E_held));
            if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
          }
          for (int64_t j = 0; j < sh.topk; ++j) {
            ids[static_cast<size_t>(t * sh.topk + j)] = pick[static_cast<size_t>(j)];
            used[static_cast<size_t>(pick[static_cast<size_t>(j)])] = 1;
          }
        }
        int64_t distinct = 0;
        for (char u : used) distinct += u;
        gpu::DeviceBuffer di(ids.size() * 4), dw(ids.size() * 4), off(static_cast<size_t>(sh.E_held + 1) * 4), pl(ids.size() * 4),
            act(ids.size() * static_cast<size_t>(sh.I) * 2), part(ids.size() * static_cast<size_t>(sh.H) * 4), out(static_cast<size_t>(n * sh.H) * 4);
        gpu::copy_to_device(di.data(), ids.data(), ids.size() * 4, s);
        gpu::copy_to_device(dw.data(), wts.data(), wts.size() * 4, s);
        gpu::moe_route(di.as<int32_t>(), n * sh.topk, sh.E_held, off.as<int32_t>(), pl.as<int32_t>(), s);
        s.synchronize();
        double us;
        if (f == Fmt::bf16)
          us = timer.us([&] {
            gpu::moe_experts(x.as<uint16_t>(), n, sh.H, sh.I, sh.E_held, sh.topk, di.as<int32_t>(), dw.as<float>(), off.as<int32_t>(), pl.as<int32_t>(),
                             sgu.data.as<uint16_t>(), sdn.data.as<uint16_t>(), act.as<uint16_t>(), part.as<float>(), out.as<float>(), s);
          }, reps);
        else
          us = timer.us([&] {
            gpu::quant_moe_experts(x.as<uint16_t>(), n, sh.H, sh.I, sh.E_held, sh.topk, dw.as<float>(), off.as<int32_t>(), pl.as<int32_t>(), sgu.w,
                                   sdn.w, act.as<uint16_t>(), part.as<float>(), out.as<float>(), s);
          }, reps);
        const std::string label = n == 1 ? "moe layer (8)" : "moe layer (" + std::to_string(n) + "x8)";
        row(label.c_str(), n, us, expert_bytes * static_cast<double>(distinct));
      }
      std::printf("  (%s %s: %.2f MB per expert, %ld experts held, host prep %.1f s)\n", sh.name, fmt_name(f), expert_bytes / 1e6,
                  static_cast<long>(sh.E_held), prep_s);
    }
  }
  std::printf("\nGB/s = stored weight bytes (scales included) per second; %% read = of the measured read bandwidth above.\n");
  return 0;
}
