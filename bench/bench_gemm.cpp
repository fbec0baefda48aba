// bench_gemm: the CPU matrix kernels of numa/kernels.h, one version per ISA
// and weight type, each checked against the scalar reference first, then
// timed. Two questions:
//  1. Single-thread kernel speed (thread CPU time, robust to a busy machine):
//     weight GB/s with the matrix in cache (compute bound: is decode limited
//     by unpacking?) and out of cache (against one thread's STREAM triad).
//  2. Prefill shapes: our kernels on all pool threads against oneDNN's
//     dnnl_sgemm (fp32 weights, its own OpenMP threads) at 16..512 tokens,
//     per expert shape: the data for choosing oneDNN where it wins.
//  3. (part 1) int8 / int4 through the int8-activation VNNI path
//     (cpu::gemm_rows_q), and (part 2) oneDNN's bf16 matmul on the plain
//     weights in place (what the engine's prefill path runs) beside the
//     pre-reordered copy.
// Usage: bench_gemm [--quick] [--part 1|2] [--tokens 16,32,...] (part 2 token counts)
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "numa/expert_bench.h"
#include "numa/kernels.h"
#include "numa/node_pools.h"
#include "numa/onednn_matmul.h"

using namespace hmoe;

namespace {

double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double wall() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> bf16, f16;
  std::vector<cpu::QuantMat> q;
  std::vector<std::pair<std::string, cpu::Mat>> mats;
  Weights(int64_t rows, int64_t cols, uint64_t seed) {
    f32.resize(static_cast<size_t>(rows * cols));
    uint64_t s = seed;
    for (auto& v : f32) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      v = (static_cast<float>((s >> 40) % 2001) - 1000.0f) * 2e-5f;
    }
    bf16.resize(f32.size());
    f16.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) {
      bf16[i] = f32_to_bf16(f32[i]);
      f16[i] = f32_to_f16(f32[i]);
    }
    q.push_back(cpu::quantize_int8(f32.data(), rows, cols));
    q.push_back(cpu::quantize_int4(f32.data(), rows, cols, 32, false));
    q.push_back(cpu::quantize_int4(f32.data(), rows, cols, 128, true));
    mats = {{"f32", cpu::Mat{DType::f32, f32.data(), rows, cols}},
            {"bf16", cpu::Mat{DType::bf16, bf16.data(), rows, cols}},
            {"f16", cpu::Mat{DType::f16, f16.data(), rows, cols}},
            {"int8", q[0].view},
            {"int4-g32-sym", q[1].view},
            {"int4-g128-asym", q[2].view}};
  }
};

double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]) / (1e-3 + std::fabs(static_cast<double>(b[i]))));
  return m;
}

// oneDNN bf16 matmul y[m, rows] = x[m, cols] W^T with W reordered once into
// the layout oneDNN picks (AMX / AVX512_BF16 blocking where present), the way
// an engine would store it. Activations rounded to bf16, fp32 output.
struct DnnlBf16 {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  DnnlBf16(int64_t m, int64_t rows, int64_t cols, uint16_t* xb, uint16_t* wb, float* y) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    dnnl::memory::desc a_md({m, cols}, dt::bf16, tag::ab), w_user({cols, rows}, dt::bf16, tag::ba), w_any({cols, rows}, dt::bf16, tag::any),
        c_md({m, rows}, dt::f32, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_any, c_md), eng);
    prim = dnnl::matmul(pd);
    a = dnnl::memory(a_md, eng, xb);
    c = dnnl::memory(c_md, eng, y);
    dnnl::memory user(w_user, eng, wb);
    b = dnnl::memory(pd.weights_desc(), eng);
    dnnl::reorder(user, b).execute(strm, user, b);
    strm.wait();
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
  }
};

// Single thread, thread CPU time; returns seconds per call.
template <class F>
double time_single(F&& f, double min_s) {
  f();
  int reps = 0;
  const double t0 = thread_cpu();
  double t = 0;
  while (t < min_s || reps < 3) {
    f();
    ++reps;
    t = thread_cpu() - t0;
  }
  return t / reps;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int part = 0;
  std::vector<int64_t> tokens2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--part") == 0 && i + 1 < argc) part = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      for (const char* p = argv[++i]; *p;) {
        tokens2.push_back(std::strtoll(p, nullptr, 10));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: bench_gemm [--quick] [--part 1|2] [--tokens 16,32,...]\n");
      return 2;
    }
  }
  if (tokens2.empty()) tokens2 = quick ? std::vector<int64_t>{512} : std::vector<int64_t>{16, 64, 512};
  const double min_s = quick ? 0.05 : 0.3;
  numa::PoolOptions one;
  one.threads = 1;
  one.quiet = true;
  numa::NodePools single(one);
  const double stream1 = numa::stream_triad_gbps(single, 128 << 20);
  std::printf("# bench_gemm: one thread's STREAM triad %.1f GB/s; best ISA %s%s\n\n", stream1, cpu::isa_name(cpu::best_isa()),
              cpu::has_bf16_dot() ? " (+avx512_bf16)" : "");

  // 1. Single-thread kernels: 256 x 2048 rows in L2/L3 (1 MiB bf16), and 48 of them cycled (out of cache).
  const int64_t rows = 256, cols = 2048;
  if (part != 2) {
  std::printf("## 1. single thread, %lld x %lld weights, GB/s of weight bytes (thread CPU time)\n\n", static_cast<long long>(rows),
              static_cast<long long>(cols));
  std::printf("| weights | isa | tokens | in cache GB/s | out of cache GB/s | / 1-thread STREAM | GFLOP/s (in cache) | max rel err |\n|---|---|---|---|---|---|---|---|\n");
  constexpr int kCopies = 48;
  std::vector<Weights> sets;
  for (int c = 0; c < kCopies; ++c) sets.emplace_back(rows, cols, 1 + static_cast<uint64_t>(c));
  for (size_t m = 0; m < sets[0].mats.size(); ++m)
    for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
      if (isa > cpu::best_isa()) continue;
      const cpu::Isa old = cpu::set_isa_for_testing(isa);
      for (int64_t n : {1, 4, 16}) {
        if (isa == cpu::Isa::scalar && n > 1) continue;
        std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * rows)), ref(y.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.1f - 0.8f;
        const cpu::Mat& w0 = sets[0].mats[m].second;
        cpu::gemm_reference(x.data(), n, w0, ref.data());
        cpu::gemm_rows(x.data(), cols, n, w0, 0, rows, y.data(), rows);
        const double err = max_rel_err(y, ref);
        const double in = time_single([&] { cpu::gemm_rows(x.data(), cols, n, w0, 0, rows, y.data(), rows); }, min_s);
        int c = 0;
        const double out = time_single([&] {
          const cpu::Mat& w = sets[static_cast<size_t>(c)].mats[m].second;
          c = (c + 1) % kCopies;
          cpu::gemm_rows(x.data(), cols, n, w, 0, rows, y.data(), rows);
        }, min_s);
        const double bytes = static_cast<double>(w0.bytes());
        std::printf("| %s | %s | %lld | %.1f | %.1f | %.2f | %.1f | %.1e |\n", sets[0].mats[m].first.c_str(), cpu::isa_name(isa),
                    static_cast<long long>(n), bytes / in / 1e9, bytes / out / 1e9, bytes / out / 1e9 / stream1,
                    2.0 * static_cast<double>(n * rows * cols) / in / 1e9, err);
      }
      cpu::set_isa_for_testing(old);
    }
  // bf16 dot (activations rounded to bf16).
  if (cpu::has_bf16_dot())
    for (int64_t n : {1, 4, 16}) {
      std::vector<uint16_t> xb(static_cast<size_t>(n * cols));
      for (size_t i = 0; i < xb.size(); ++i) xb[i] = f32_to_bf16(static_cast<float>(i % 17) * 0.1f - 0.8f);
      std::vector<float> y(static_cast<size_t>(n * rows));
      const cpu::Mat& w0 = sets[0].mats[1].second;
      const double in = time_single([&] { cpu::gemm_rows_bf16dot(xb.data(), cols, n, w0, 0, rows, y.data(), rows); }, min_s);
      int c = 0;
      const double out = time_single([&] {
        cpu::gemm_rows_bf16dot(xb.data(), cols, n, sets[static_cast<size_t>(c)].mats[1].second, 0, rows, y.data(), rows);
        c = (c + 1) % kCopies;
      }, min_s);
      const double bytes = static_cast<double>(w0.bytes());
      std::printf("| bf16 (vdpbf16ps) | avx512_bf16 | %lld | %.1f | %.1f | %.2f | %.1f | - |\n", static_cast<long long>(n), bytes / in / 1e9,
                  bytes / out / 1e9, bytes / out / 1e9 / stream1, 2.0 * static_cast<double>(n * rows * cols) / in / 1e9);
    }
  // int8 activations (VNNI) for the int8 / int4 weights; error against the fp32-activation reference.
  for (size_t m = 3; m < sets[0].mats.size(); ++m) {
    const cpu::Mat& w0 = sets[0].mats[m].second;
    if (!cpu::int8_act_applies(w0)) continue;
    for (int64_t n : {1, 4, 16}) {
      std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * rows)), ref(y.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.1f - 0.8f;
      cpu::QActs xa;
      xa.reset(n, w0);
      for (int64_t t = 0; t < n; ++t) xa.quantize(t, x.data() + t * cols);
      cpu::gemm_reference(x.data(), n, w0, ref.data());
      cpu::gemm_rows_q(xa, 0, n, w0, 0, rows, y.data(), rows);
      const double err = max_rel_err(y, ref);
      const double in = time_single([&] { cpu::gemm_rows_q(xa, 0, n, w0, 0, rows, y.data(), rows); }, min_s);
      int c = 0;
      const double out = time_single([&] {
        cpu::gemm_rows_q(xa, 0, n, sets[static_cast<size_t>(c)].mats[m].second, 0, rows, y.data(), rows);
        c = (c + 1) % kCopies;
      }, min_s);
      const double bytes = static_cast<double>(w0.bytes());
      std::printf("| %s (int8 act, vpdpbusd) | avx512_vnni | %lld | %.1f | %.1f | %.2f | %.1f | %.1e |\n", sets[0].mats[m].first.c_str(),
                  static_cast<long long>(n), bytes / in / 1e9, bytes / out / 1e9, bytes / out / 1e9 / stream1,
                  2.0 * static_cast<double>(n * rows * cols) / in / 1e9, err);
    }
  }
  }  // part 1
  if (part == 1) return 0;

  // 2. Prefill shapes on all threads: our bf16 kernel vs oneDNN sgemm.
  numa::PoolOptions all;
  all.quiet = true;
  numa::NodePools pools(all);
  std::printf("\n## 2. prefill: y[m, rows] = x[m, cols] W^T on %d threads, GFLOP/s (wall time)\n\n", pools.threads());
  std::printf("| W shape | tokens | ours bf16 | ours bf16dot | oneDNN sgemm (f32 W) | oneDNN incl. bf16->f32 of W | oneDNN bf16 matmul (W pre-reordered) | oneDNN bf16 matmul (W in place) | winner (fp32 activations) |\n|---|---|---|---|---|---|---|---|---|\n");
  struct Shape { const char* name; int64_t rows, cols; };
  for (Shape sh : {Shape{"qwen3 gate/up 768x2048", 768, 2048}, Shape{"qwen3 down 2048x768", 2048, 768},
                   Shape{"dsv3 gate/up 2048x7168", 2048, 7168}, Shape{"dsv3 down 7168x2048", 7168, 2048}}) {
    Weights w(sh.rows, sh.cols, 99);
    const cpu::Mat& wb = w.mats[1].second;
    for (int64_t m : tokens2) {
      std::vector<float> x(static_cast<size_t>(m * sh.cols)), y(static_cast<size_t>(m * sh.rows)), wf(static_cast<size_t>(sh.rows * sh.cols));
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<float>(i % 13) * 0.1f - 0.6f;
        xb[i] = f32_to_bf16(x[i]);
      }
      const double flops = 2.0 * static_cast<double>(m * sh.rows * sh.cols);
      auto best_of = [&](auto&& f) {
        double best = 1e30;
        f();
        for (int r = 0; r < 3; ++r) {
          const double t0 = wall();
          f();
          best = std::min(best, wall() - t0);
        }
        return flops / best / 1e9;
      };
      const double ours = best_of([&] { cpu::gemm(x.data(), m, wb, y.data(), &pools.pool(0)); });
      double ours_dot = 0;
      if (cpu::has_bf16_dot())
        ours_dot = best_of([&] {
          pools.pool(0).parallel_for((sh.rows + 15) / 16, [&](int64_t b, int64_t e, int) {
            cpu::gemm_rows_bf16dot(xb.data(), sh.cols, m, wb, b * 16, std::min(sh.rows, e * 16), y.data(), sh.rows);
          });
        });
      cpu::to_f32(DType::bf16, w.bf16.data(), wf.data(), sh.rows * sh.cols);
      auto sgemm = [&] { dnnl_sgemm('N', 'T', m, sh.rows, sh.cols, 1.0f, x.data(), sh.cols, wf.data(), sh.cols, 0.0f, y.data(), sh.rows); };
      const double dnnl = best_of(sgemm);
      const double dnnl_conv = best_of([&] {
        pools.pool(0).parallel_for(sh.rows, [&](int64_t b, int64_t e, int) {
          cpu::to_f32(DType::bf16, w.bf16.data() + b * sh.cols, wf.data() + b * sh.cols, (e - b) * sh.cols);
        });
        sgemm();
      });
      double dnnl_bf16 = 0;
      try {
        DnnlBf16 mm(m, sh.rows, sh.cols, xb.data(), w.bf16.data(), y.data());
        dnnl_bf16 = best_of([&] { mm.run(); });
      } catch (const std::exception& e) {
        std::fprintf(stderr, "oneDNN bf16 matmul unavailable: %s\n", e.what());
      }
      double dnnl_inplace = 0;
      try {
        numa::OnednnBf16 mm;
        dnnl_inplace = best_of([&] { mm.matmul(xb.data(), m, sh.cols, wb, y.data(), sh.rows); });
      } catch (const std::exception& e) {
        std::fprintf(stderr, "oneDNN bf16 matmul (in place) unavailable: %s\n", e.what());
      }
      std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", sh.name, static_cast<long long>(m), ours, ours_dot, dnnl, dnnl_conv,
                  dnnl_bf16, dnnl_inplace, dnnl_conv > ours ? "oneDNN (with conversion)" : dnnl > ours ? "oneDNN only with f32 weights kept" : "ours");
    }
  }
  std::printf("\noneDNN sgemm 2048^3 on its own threads: %.1f GFLOP/s; oneDNN bf16 matmul 2048^3 (W reordered): %.1f GFLOP/s\n",
              numa::dnnl_sgemm_gflops(2048, 2048, 2048), numa::onednn_bf16_gflops(2048, 2048, 2048));
  return 0;
}
