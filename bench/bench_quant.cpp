// Routed-expert GEMV/GEMM on quantized weights: bytes/s of one SwiGLU
// expert pass (gate, up, down through numa::mlp_forward) per weight format,
// against this machine's measured read bandwidth (the roofline: decode on
// routed experts is bound by streaming their weights once per token).
//
// Formats: bf16 (baseline), GGUF Q8_0 and Q4_K (numa/quant_gguf.h),
// GPTQ-int4 (repacked at load to the int4 group-128 asymmetric view, so it
// runs the NUMA engine's int4 kernel), FP8 e4m3 with 128-column block scales.
// Experts are Qwen3-235B-A22B sized (hidden 4096, moe_intermediate 1536) by
// default; 16 copies are cycled so the working set exceeds the L3.
//
// Usage: bench_quant [--hidden H] [--inter I] [--experts E] [--threads T] [--tokens N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "numa/quant_gguf.h"
#include "numa/thread_pool.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;

namespace {

using clk = std::chrono::steady_clock;

double read_bandwidth(numa::ThreadPool& pool, size_t bytes) {
  std::vector<uint64_t> buf(bytes / 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  std::vector<uint64_t> sums(64);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = clk::now();
    pool.parallel_for(static_cast<int64_t>(pool.size()), [&](int64_t b, int64_t e, int) {
      for (int64_t c = b; c < e; ++c) {
        const size_t lo = buf.size() * static_cast<size_t>(c) / static_cast<size_t>(pool.size());
        const size_t hi = buf.size() * static_cast<size_t>(c + 1) / static_cast<size_t>(pool.size());
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = lo; i + 4 <= hi; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
        sums[static_cast<size_t>(c)] = s0 + s1 + s2 + s3;
      }
    });
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s);
  }
  uint64_t x = 0;
  for (auto v : sums) x ^= v;
  if (x == 42) std::printf(" ");
  return best;
}

struct Format {
  std::string name;
  std::vector<std::vector<uint8_t>> data;  // gate, up, down
  std::vector<std::vector<float>> scales, zeros;
  numa::ExpertWeights w;
};

cpu::Mat with(cpu::Mat m, const std::vector<uint8_t>& d) {
  m.data = d.data();
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t H = 4096, I = 1536, E = 16, tokens = 1;
  int threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::stoll(argv[i + 1]);
    if (a == "--hidden") H = v;
    else if (a == "--inter") I = v;
    else if (a == "--experts") E = v;
    else if (a == "--threads") threads = static_cast<int>(v);
    else if (a == "--tokens") tokens = v;
  }
  numa::ThreadPool pool(threads);
  const double bw = read_bandwidth(pool, size_t{256} << 20);
  std::printf("bench_quant: expert hidden %ld, intermediate %ld, %ld experts cycled, %ld token(s), %d threads, ISA %s\n", H, I, E, tokens,
              pool.size(), cpu::isa_name(cpu::best_isa()));
  std::printf("measured read bandwidth (256 MiB, %d threads): %.2f GB/s\n\n", pool.size(), bw / 1e9);
  std::printf("%-22s %12s %12s %10s %10s %12s\n", "format", "MB/expert", "us/expert", "GB/s", "% of bw", "Gweights/s");

  // One expert's float weights, quantized once per format and replicated E times.
  std::vector<std::vector<float>> fw;
  for (int m = 0; m < 3; ++m) {
    const int64_t rows = m == 2 ? H : I, cols = m == 2 ? I : H;
    std::vector<float> v(static_cast<size_t>(rows * cols));
    uint64_t s = 88172645463325252ull + static_cast<uint64_t>(m);
    for (auto& x : v) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      x = (static_cast<float>(s % 20001) / 10000.0f - 1.0f) * 0.05f;
    }
    fw.push_back(std::move(v));
  }
  std::vector<float> x(static_cast<size_t>(tokens * H)), out(static_cast<size_t>(tokens * H));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i) * 0.37f);

  const char* names[] = {"bf16", "GGUF Q8_0", "GGUF Q4_K", "GPTQ-int4 (g128 asym)", "FP8 e4m3 (128 blocks)"};
  for (int f = 0; f < 5; ++f) {
    std::vector<numa::ExpertWeights> experts;
    std::vector<std::vector<uint8_t>> store;
    std::vector<cpu::QuantMat> qm;  // scales/zeros of int4 and fp8 (shared by the copies)
    cpu::Mat proto[3];
    std::vector<uint8_t> base[3];
    for (int m = 0; m < 3; ++m) {
      const int64_t rows = m == 2 ? H : I, cols = m == 2 ? I : H;
      const float* src = fw[static_cast<size_t>(m)].data();
      if (f == 0) {
        base[m].resize(static_cast<size_t>(rows * cols * 2));
        auto* p = reinterpret_cast<uint16_t*>(base[m].data());
        for (int64_t i = 0; i < rows * cols; ++i) p[i] = f32_to_bf16(src[i]);
        proto[m] = cpu::Mat{DType::bf16, nullptr, rows, cols};
      } else if (f == 1 || f == 2) {
        const auto t = f == 1 ? cpu::ExtType::q8_0 : cpu::ExtType::q4_k;
        base[m] = qtools::quant_rows(t, src, rows, cols);
        proto[m] = cpu::ext_view(t, base[m].data(), rows, cols, "bench");
      } else if (f == 3) {
        qm.push_back(cpu::quantize_int4(src, rows, cols, 128, true));
        base[m] = qm.back().data;
        proto[m] = qm.back().view;
      } else {
        cpu::QuantMat q;
        q.data.resize(static_cast<size_t>(rows * cols));
        const int64_t G = (cols + 127) / 128;
        q.scales.assign(static_cast<size_t>(rows * G), 1.0f / 448.0f);
        for (int64_t i = 0; i < rows * cols; ++i) q.data[static_cast<size_t>(i)] = qtools::f32_to_fp8_e4m3(src[i] * 448.0f * 10.0f);
        base[m] = q.data;
        q.view = cpu::Mat{DType::u8, nullptr, rows, cols, cpu::Quant::ext, q.scales.data(), nullptr, 128};
        q.view.ext = static_cast<uint32_t>(cpu::ExtType::fp8_e4m3);
        qm.push_back(std::move(q));
        proto[m] = qm.back().view;
      }
    }
    store.reserve(static_cast<size_t>(3 * E));
    for (int64_t e = 0; e < E; ++e) {
      numa::ExpertWeights ew;
      for (int m = 0; m < 3; ++m) {
        store.push_back(base[m]);
        const cpu::Mat v = with(proto[m], store.back());
        (m == 0 ? ew.gate : m == 1 ? ew.up : ew.down) = v;
      }
      experts.push_back(ew);
    }
    const double bytes_per = static_cast<double>(experts[0].gate.bytes() + experts[0].up.bytes() + experts[0].down.bytes());
    for (int64_t e = 0; e < E; ++e) numa::mlp_forward(x.data(), tokens, experts[static_cast<size_t>(e)], out.data(), &pool);  // warm-up
    const int passes = std::max<int>(3, static_cast<int>(4e9 / (bytes_per * static_cast<double>(E))));
    auto t0 = clk::now();
    for (int p = 0; p < passes; ++p)
      for (int64_t e = 0; e < E; ++e) numa::mlp_forward(x.data(), tokens, experts[static_cast<size_t>(e)], out.data(), &pool);
    const double s = std::chrono::duration<double>(clk::now() - t0).count() / (passes * static_cast<double>(E));
    const double gbs = bytes_per / s / 1e9;
    std::printf("%-22s %12.2f %12.1f %10.2f %9.0f%% %12.2f\n", names[f], bytes_per / 1e6, s * 1e6, gbs, 100.0 * gbs * 1e9 / bw,
                3.0 * static_cast<double>(H * I) / s / 1e9);
  }
  std::printf("\n(GB/s = the expert's stored bytes, scales included, per pass; the roofline is the read bandwidth above.)\n");
  return 0;
}
