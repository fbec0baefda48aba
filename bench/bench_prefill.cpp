// Prefill with streamed experts (issue 7): a Qwen3-30B-A3B-shaped synthetic
// model (bench/synthetic_model.h) with no resident MoE layers, one prompt of
// 512 / 2k / 8k tokens per pass, through GpuRuntime with
//   (a) CPU experts (numa::ExpertEngine; the hybrid path),
//   (b) serial upload then compute (each layer's copy starts when the step reaches it),
//   (c) the prefetch window (engine/layers/expert_stream.h) with W = 1, 2, 3,
//   and a compute-only pass (no copies; slots zeroed) for the GPU time.
// Per layer: the PCIe copy time (from (b)), the expert products' time and the
// whole step's GPU time (compute-only pass). Bound: a pass cannot beat the
// slower of its two resources, so bound = max(sum of copy times, GPU time of
// the pass); (c) / bound is printed. Two side tables: window fill (all experts
// vs routed ones) and expert products (per-expert cuBLAS vs moe_experts).
// Usage: bench_prefill [--layers 24] [--tokens 512,2048,8192] [--reps 2] [--skip-cpu]
// Never passes or fails on time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/synthetic_model.h"
#include "configs/error.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/layers/expert_stream.h"
#include "gpu/device.h"
#include "gpu/moe_stream.h"
#include "numa/node_pools.h"

using namespace hmoe;

namespace {

struct Run {
  double s = 0;  // best wall seconds of one pass
  ExpertStreamStats st;  // of the last pass
};

std::vector<int64_t> parse_list(const std::string& v) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < v.size()) {
    size_t j = v.find(',', i);
    if (j == std::string::npos) j = v.size();
    out.push_back(std::stoll(v.substr(i, j - i)));
    i = j + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 24;
  int reps = 2;
  bool skip_cpu = false;
  std::vector<int64_t> token_list = {512, 2048, 8192};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) token_list = parse_list(argv[++i]);
    else if (!std::strcmp(argv[i], "--skip-cpu")) skip_cpu = true;
  }
  std::printf("%s\n", gpu::describe().c_str());
  if (gpu::device_count() == 0) {
    std::printf("SKIP: no CUDA device; nothing to measure\n");
    return 0;
  }
  try {
    numa::PoolOptions popt;
    numa::NodePools pools(popt);
    numa::ThreadPool& pool = pools.pool(0);
    auto model = bench::make_qwen3_30b_a3b(layers, pool);
    const ModelConfig& c = model->config();
    const int64_t V = c.vocab_size, E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
    const double layer_bytes = 3.0 * E * I * H * 2;
    std::printf("synthetic Qwen3-30B-A3B: %lld layers (the real model has 48), %.1f GB of random bf16 weights made in %.1f s; %.2f GB of experts per layer\n",
                static_cast<long long>(layers), static_cast<double>(model->bytes()) / 1e9, model->build_seconds(), layer_bytes / 1e9);
    // Pin the expert blocks once (the streams find them pinned: no copy, no re-pinning per variant).
    double t0 = bench::now_seconds();
    std::vector<gpu::HostRegistration> pins;
    for (int64_t l = 0; l < layers; ++l) {
      auto [p, bytes] = model->expert_block(l);
      std::string why;
      pins.push_back(gpu::HostRegistration::try_pin(p, bytes, &why));
      if (!pins.back().ok()) std::printf("warning: layer %lld experts not pinned in place: %s\n", static_cast<long long>(l), why.c_str());
    }
    std::printf("pinned %lld expert blocks in place in %.1f s\n", static_cast<long long>(layers), bench::now_seconds() - t0);
    const double pcie = measure_pinned_h2d_bandwidth(256u << 20);
    std::printf("pinned host->device bandwidth: %.1f GB/s (256 MiB, best of 3) -> %.1f ms per layer of experts\n", pcie / 1e9, layer_bytes / pcie * 1e3);

    GpuRuntimeOptions ro;
    ro.resident.assign(static_cast<size_t>(layers), false);
    const auto runtime = GpuRuntime::from_lookup(c, model->get(), pools, ro);
    GpuRuntime& stack = *runtime;
    using O = ExpertStreamOptions;
    auto opt = [](int window, bool serial, bool skip, O::Fill fill = O::Fill::automatic, O::Compute comp = O::Compute::automatic) {
      O o;
      o.min_batch = 1;
      o.window = window;
      o.serial = serial;
      o.skip_copies = skip;
      o.fill = fill;
      o.compute = comp;
      o.quiet = true;
      return o;
    };
    // One pass of `tokens` prompt tokens; returns the best of `r` after a warm-up (none for the CPU).
    auto run = [&](int64_t tokens, const O* o, int r) {
      if (o) stack.enable_expert_streaming(*o);
      else stack.enable_expert_streaming(O{});  // min_batch 0: off, CPU experts
      KvCache kv(KvLayout{layers, c.num_key_value_heads, c.head_dim}, tokens / 16 + 2, 16);
      const int seq = kv.add_sequence();
      kv.reserve(seq, tokens);
      Batch b;
      for (int64_t i = 0; i < tokens; ++i) b.add(static_cast<int32_t>((i * 104729 + 7919) % V), seq, i, i + 1 == tokens);
      if (stack.expert_stream() && stack.expert_stream()->pinned_copy_bytes() > 0)
        std::printf("warning: the stream made a pinned copy of %.1f GB (the in-place pinning failed)\n",
                    static_cast<double>(stack.expert_stream()->pinned_copy_bytes()) / 1e9);
      std::vector<float> logits;
      Run out;
      out.s = 1e30;
      for (int k = o ? -1 : 0; k < r; ++k) {
        if (stack.expert_stream()) stack.expert_stream()->reset_stats();
        const double a = bench::now_seconds();
        stack.forward(b, kv, logits);
        const double t = bench::now_seconds() - a;
        if (k >= 0) out.s = std::min(out.s, t);
        if (stack.expert_stream()) out.st = stack.expert_stream()->stats();
      }
      return out;
    };

    std::printf("\n| tokens | variant | ms/pass | tok/s | x (a) | copy ms/layer | products ms/layer | stall ms/layer | copy hidden | H2D GB/s (of %.1f) | x bound |\n", pcie / 1e9);
    std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    std::vector<std::string> bound_lines;
    for (int64_t T : token_list) {
      const double L = static_cast<double>(layers);
      double cpu_s = 0;
      if (!skip_cpu) {
        const Run a = run(T, nullptr, 1);
        cpu_s = a.s;
        std::printf("| %lld | (a) CPU experts | %.1f | %.0f | 1.00 | - | - | - | - | - | - |\n", (long long)T, a.s * 1e3, T / a.s);
        std::fflush(stdout);
      }
      const O ob = opt(1, true, false), oc = opt(1, false, true);
      const Run b = run(T, &ob, reps);
      const Run g = run(T, &oc, reps);  // compute only
      const double copy_total = b.st.copy_s, bound = std::max(copy_total, g.s);
      auto row = [&](const char* name, const Run& r, bool has_copy) {
        const ExpertStreamStats& st = r.st;
        std::printf("| %lld | %s | %.1f | %.0f | %s | %s | %.2f | %s | %s | %s | %.2f |\n", (long long)T, name, r.s * 1e3, T / r.s,
                    cpu_s > 0 ? (std::to_string(cpu_s / r.s).substr(0, 5)).c_str() : "-",
                    has_copy ? std::to_string(st.copy_s / L * 1e3).substr(0, 5).c_str() : "-", st.compute_s / L * 1e3,
                    has_copy ? std::to_string(st.stall_s / L * 1e3).substr(0, 5).c_str() : "-",
                    has_copy ? (std::to_string(100 * st.hidden_fraction()).substr(0, 4) + "%").c_str() : "-",
                    has_copy ? std::to_string(st.achieved_bandwidth() / 1e9).substr(0, 4).c_str() : "-", r.s / bound);
        std::fflush(stdout);
      };
      row("(b) serial upload", b, true);
      for (int w : {1, 2, 3}) {
        const O ow = opt(w, false, false);
        const Run r = run(T, &ow, reps);
        row((std::string("(c) window W=") + std::to_string(w)).c_str(), r, true);
      }
      row("GPU only (no copies)", g, false);
      char line[400];
      std::snprintf(line, sizeof line,
                    "- %lld tokens: copy %.1f ms/layer (%.0f ms/pass), GPU %.1f ms/layer (%.0f ms/pass; expert products %.1f ms/layer) -> bound "
                    "max(copy, GPU) = %.0f ms/pass = %.0f tok/s (%s-bound)",
                    (long long)T, copy_total / L * 1e3, copy_total * 1e3, g.s / L * 1e3, g.s * 1e3, g.st.compute_s / L * 1e3, bound * 1e3, T / bound,
                    copy_total > g.s ? "copy" : "compute");
      bound_lines.push_back(line);
    }
    std::printf("\nbound per pass = max(sum of layer copy times from (b), GPU time of the compute-only pass):\n");
    for (const auto& l : bound_lines) std::printf("%s\n", l.c_str());

    std::printf("\nwindow fill, W=1: all experts of the next layer ahead of the router vs only the routed experts after it\n");
    std::printf("| tokens | fill | ms/pass | MB copied/layer | stall ms/layer |\n|---:|---|---:|---:|---:|\n");
    for (int64_t T : {16, 64, 512}) {
      for (O::Fill f : {O::Fill::all, O::Fill::routed}) {
        const O o = opt(1, false, false, f);
        const Run r = run(T, &o, reps);
        std::printf("| %lld | %s | %.1f | %.0f | %.2f |\n", (long long)T, f == O::Fill::all ? "all" : "routed", r.s * 1e3,
                    static_cast<double>(r.st.bytes) / layers / 1e6, r.st.stall_s / layers * 1e3);
        std::fflush(stdout);
      }
    }
    std::printf("\nexpert products (compute-only passes): per-expert cuBLAS vs moe_experts, ms/layer\n");
    std::printf("| tokens | gemm | kernel |\n|---:|---:|---:|\n");
    for (int64_t T : {64, 512, 2048, 8192}) {
      const O og = opt(1, false, true, O::Fill::all, O::Compute::gemm), ok = opt(1, false, true, O::Fill::all, O::Compute::kernel);
      const Run rg = run(T, &og, 1), rk = run(T, &ok, 1);
      std::printf("| %lld | %.2f | %.2f |\n", (long long)T, rg.st.compute_s / layers * 1e3, rk.st.compute_s / layers * 1e3);
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_prefill: %s\n", e.what());
    return 1;
  }
  return 0;
}
