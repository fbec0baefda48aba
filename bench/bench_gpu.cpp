// GPU benchmark, two parts.
// 1. Kernels against the H200 roofline (measured device copy bandwidth and
//    the 990 TFLOP/s dense bf16 datasheet figure): grouped experts at decode
//    shapes (GB/s of expert weights), paged attention decode (GB/s of K/V)
//    and prefill (TFLOP/s) at head_dim 128 (32/4 heads) and 256 (16/2,
//    Qwen3-Next), cuBLAS prefill products (TFLOP/s).
// 2. A Qwen3-30B-A3B-shaped model (48 layers, 128 experts of 768, top-8,
//    hidden 2048, 32/4 heads of 128; random bf16 weights made in place) run
//    through GpuRuntime with 0/25/50/100% of MoE layers resident: decode tok/s
//    at batch 1 and 8, the time split (GPU, CPU experts, transfers) and the
//    bounds: cold expert bytes per step / measured host DRAM bandwidth plus
//    (serial) or overlapped with (max) the step's GPU time; plain launches,
//    CUDA graphs, and graphs with the GPU/CPU overlap of two micro-batches.
// 3. With --experts TYPE (q8_0, q4_k, q4_0, q5_k, q6_k): the same model
//    with every MoE layer resident and its experts kept in that GGUF type on
//    the GPU (engine/layers/gpu_experts.h), beside the bf16 run: decode tok/s and
//    GPU bytes. One quantized copy of each expert matrix is made on the host
//    and uploaded per expert (the GPU holds distinct copies), so only 100%
//    resident is measured for these.
// Usage: bench_gpu [--quick] [--skip-model] [--skip-kernels] [--attention-only]
//   (the device copy and the attention tables only: head_dim 128 and 256)
//   [--moe-only] (the device copy and the grouped-expert tables only, at
//   Qwen3-30B-A3B and Qwen3-Next-80B-A3B shapes, each with and without the
//   activation pair act_lo) [--steps N]
//   [--resident 0,25,50,100] [--batches 1,8] [--experts TYPE]
//   [--prefill 2048,8192] (one prompt of N tokens in one step per placement,
//   tiled attention with tile kernels 1, 2 and 3, and per-token attention)
//   [--defer-experts N] (the hybrid step's expert deferral) [--gpu-memory 24GiB] (every GPU allocation capped, as
//   on a card of that size; gpu/memory_cap.h). Never pass/fail on time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "configs/error.h"
#include "configs/settings.h"
#include "bench/synthetic_model.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/memory_cap.h"
#include "io/dtype.h"
#include "numa/node_pools.h"
#include "numa/quant_gguf.h"
#include "numa/thread_pool.h"
#include "tests/quant_tools/quantizers.h"

using namespace hmoe;
using gpu::bf16_t;

namespace {

void fill_random(bf16_t* p, size_t n, uint64_t seed, float scale, numa::ThreadPool& pool) { bench::fill_random_bf16(p, n, seed, scale, pool); }
using bench::host_read_bandwidth;

// Times `fn` (launches on s) over reps after one warm-up; seconds per call.
template <class F>
double time_gpu(gpu::Stream& s, int reps, F&& fn) {
  fn();
  s.synchronize();
  gpu::Event a, b;
  a.record(s);
  for (int i = 0; i < reps; ++i) fn();
  b.record(s);
  b.synchronize();
  return b.elapsed_ms(a) * 1e-3 / reps;
}

void attention_benchmarks(gpu::Stream& s, double copy_bw);

// Grouped experts (gpu::moe_experts) at decode shapes: GB/s of the active
// experts' weights; beside it the same pass with the activation between
// gate/up and down kept as a bf16 hi + lo pair (act_lo: the precise mode of
// Qwen3-Next, setting gpu_hybrid_precise_act), whose extra bytes are
// 2 * pairs * I written and read again, and no extra launch.
void moe_benchmarks(gpu::Stream& s, double copy_bw, numa::ThreadPool& pool, int64_t H, int64_t I, int64_t E, int64_t K, const char* shape) {
  gpu::DeviceBuffer wgu(static_cast<size_t>(E * 2 * I * H) * 2), wdn(static_cast<size_t>(E * H * I) * 2);
  {
    std::vector<bf16_t> h(static_cast<size_t>(E * 2 * I * H));
    fill_random(h.data(), h.size(), 5, 0.05f, pool);
    gpu::copy_to_device(wgu.data(), h.data(), h.size() * 2, s);
    gpu::copy_to_device(wdn.data(), h.data(), static_cast<size_t>(E * H * I) * 2, s);
    s.synchronize();
  }
  std::printf("\nmoe_experts, %s (H=%lld I=%lld E=%lld k=%lld): bytes = active experts' weights; hi+lo = with the activation pair\n", shape,
              (long long)H, (long long)I, (long long)E, (long long)K);
  std::printf("%6s %8s %10s %10s %8s %12s %10s %12s\n", "tokens", "experts", "us", "GB/s", "of copy", "us hi+lo", "hi+lo +%", "pair bytes");
  for (int64_t n : {1, 8, 64, 512}) {
    std::vector<bf16_t> x(static_cast<size_t>(n * H));
    fill_random(x.data(), x.size(), 7 + static_cast<uint64_t>(n), 1.0f, pool);
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    std::vector<float> w(ids.size(), 1.0f / static_cast<float>(K));
    uint64_t r = 12345;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j) {
        int32_t e;
        bool dup;
        do {
          r = r * 6364136223846793005ull + 1442695040888963407ull;
          e = static_cast<int32_t>((r >> 33) % E);
          dup = false;
          for (int64_t q = 0; q < j; ++q) dup |= ids[static_cast<size_t>(t * K + q)] == e;
        } while (dup);
        ids[static_cast<size_t>(t * K + j)] = e;
      }
    std::vector<bool> used(static_cast<size_t>(E));
    for (auto e : ids) used[static_cast<size_t>(e)] = true;
    const int64_t active = std::count(used.begin(), used.end(), true);
    gpu::DeviceBuffer dx(x.size() * 2), di(ids.size() * 4), dw(w.size() * 4), off((E + 1) * 4), pl(ids.size() * 4), act(ids.size() * I * 2),
        act_lo(ids.size() * I * 2), part(ids.size() * H * 4), out(static_cast<size_t>(n * H) * 4);
    gpu::copy_to_device(dx.data(), x.data(), x.size() * 2, s);
    gpu::copy_to_device(di.data(), ids.data(), ids.size() * 4, s);
    gpu::copy_to_device(dw.data(), w.data(), w.size() * 4, s);
    double t[2];
    for (int split = 0; split < 2; ++split)
      t[split] = time_gpu(s, 20, [&] {
        gpu::moe_route(di.as<int32_t>(), n * K, E, off.as<int32_t>(), pl.as<int32_t>(), s);
        gpu::moe_experts(dx.as<bf16_t>(), n, H, I, E, K, di.as<int32_t>(), dw.as<float>(), off.as<int32_t>(), pl.as<int32_t>(), wgu.as<bf16_t>(),
                         wdn.as<bf16_t>(), act.as<bf16_t>(), part.as<float>(), out.as<float>(), s, split ? act_lo.as<bf16_t>() : nullptr);
      });
    const double bytes = static_cast<double>(active) * 3 * I * H * 2, pair_bytes = 2.0 * static_cast<double>(n * K * I) * 2;
    std::printf("%6lld %8lld %10.1f %10.0f %7.0f%% %12.1f %9.1f%% %12.0f\n", (long long)n, (long long)active, t[0] * 1e6, bytes / t[0] / 1e9,
                100 * bytes / t[0] / copy_bw, t[1] * 1e6, 100 * (t[1] / t[0] - 1), pair_bytes);
  }
}

void kernel_benchmarks(numa::ThreadPool& pool, double& copy_bw, bool attention_only, bool moe_only) {
  gpu::Stream s;
  {
    const size_t bytes = 2ull << 30;
    gpu::DeviceBuffer a(bytes), b(bytes);
    gpu::memset_device(a.data(), 1, bytes, s);
    const double t = time_gpu(s, 10, [&] { gpu::copy_on_device(b.data(), a.data(), bytes, s); });
    copy_bw = 2.0 * static_cast<double>(bytes) / t;
    std::printf("device copy: %.0f GB/s (read+write; the roofline below; H200 datasheet 4800)\n", copy_bw / 1e9);
  }
  if (attention_only) return attention_benchmarks(s, copy_bw);
  if (moe_only) {
    moe_benchmarks(s, copy_bw, pool, 2048, 768, 128, 8, "Qwen3-30B-A3B");
    moe_benchmarks(s, copy_bw, pool, 2048, 512, 512, 10, "Qwen3-Next-80B-A3B");
    return;
  }
  moe_benchmarks(s, copy_bw, pool, 2048, 768, 128, 8, "Qwen3-30B-A3B");
  attention_benchmarks(s, copy_bw);
  // cuBLAS products at prefill sizes.
  std::printf("\ncuBLAS bf16 gemm (y = x W^T, fp32 out): roofline 990 TFLOP/s dense bf16 (datasheet)\n");
  gpu::Blas blas(s);
  for (auto [n, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 5120, 2048}, {2048, 5120, 2048}, {2048, 151936, 2048}, {8192, 4096, 4096}}) {
    gpu::DeviceBuffer x(static_cast<size_t>(n * cols) * 2), w(static_cast<size_t>(rows * cols) * 2), y(static_cast<size_t>(n * rows) * 4);
    gpu::memset_device(x.data(), 0x3c, x.bytes(), s);
    gpu::memset_device(w.data(), 0x3c, w.bytes(), s);
    const double t = time_gpu(s, 10, [&] { blas.gemm(x.as<bf16_t>(), n, w.as<bf16_t>(), rows, cols, y.as<float>(), rows); });
    const double flops = 2.0 * n * rows * cols, bytes = 2.0 * rows * cols + 2.0 * n * cols + 4.0 * n * rows;
    std::printf("  n=%5lld %6lldx%-5lld %9.1f us %7.1f TFLOP/s (%4.1f%%) %6.0f GB/s\n", (long long)n, (long long)rows, (long long)cols, t * 1e6,
                flops / t / 1e12, 100 * flops / t / 990e12, bytes / t / 1e9);
  }
}

// Paged attention decode (GB/s of K/V) and prefill (per-token kernel vs tensor-core tiles, TFLOP/s) at
// Qwen3-30B-A3B's shape (32 q / 4 kv heads of 128) and Qwen3-Next-80B-A3B's (16 q / 2 kv heads of 256).
void attention_benchmarks(gpu::Stream& s, double copy_bw) {
  for (auto [heads, kvh, hd] : {std::tuple<int64_t, int64_t, int64_t>{32, 4, 128}, {16, 2, 256}}) {
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    // Attention decode: one token per sequence.
    std::printf("\nattention decode (%lld q heads, %lld kv heads, hd %lld): bytes = K+V read\n", (long long)heads, (long long)kvh, (long long)hd);
    std::printf("%6s %8s %6s %10s %10s %8s\n", "seqs", "ctx", "splits", "us", "GB/s", "of copy");
    for (auto [seqs, ctx] : {std::pair<int64_t, int64_t>{1, 4096}, {1, 32768}, {8, 4096}, {32, 8192}}) {
      const int64_t kvw = kvh * hd;
      const int64_t slots = seqs * ctx;
      gpu::DeviceBuffer kc(static_cast<size_t>(slots * kvw) * 2), vc(static_cast<size_t>(slots * kvw) * 2);
      gpu::memset_device(kc.data(), 0x3c, kc.bytes(), s);
      gpu::memset_device(vc.data(), 0x3c, vc.bytes(), s);
      std::vector<int32_t> lists(static_cast<size_t>(slots)), offs(static_cast<size_t>(seqs)), lens(static_cast<size_t>(seqs), static_cast<int32_t>(ctx));
      for (int64_t i = 0; i < slots; ++i) lists[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % slots);  // scattered blocks
      for (int64_t q = 0; q < seqs; ++q) offs[static_cast<size_t>(q)] = static_cast<int32_t>(q * ctx);
      gpu::DeviceBuffer dl(lists.size() * 4), doff(offs.size() * 4), dlen(lens.size() * 4), dq(static_cast<size_t>(seqs * heads * hd) * 4),
          dout(static_cast<size_t>(seqs * heads * hd) * 2);
      gpu::copy_to_device(dl.data(), lists.data(), lists.size() * 4, s);
      gpu::copy_to_device(doff.data(), offs.data(), offs.size() * 4, s);
      gpu::copy_to_device(dlen.data(), lens.data(), lens.size() * 4, s);
      gpu::memset_device(dq.data(), 0, dq.bytes(), s);
      gpu::DeviceBuffer scratch(static_cast<size_t>(std::max<int64_t>(gpu::attention_scratch_floats(seqs, heads, hd, ctx), 4)) * 4);
      const double t = time_gpu(s, 20, [&] {
        gpu::attention(dq.as<float>(), heads * hd, seqs, heads, kvh, hd, kc.as<bf16_t>(), vc.as<bf16_t>(), dl.as<int32_t>(), doff.as<int32_t>(),
                       dlen.as<int32_t>(), ctx, scale, scratch.as<float>(), dout.as<bf16_t>(), s);
      });
      const double bytes = 2.0 * static_cast<double>(slots * kvw) * 2;
      std::printf("%6lld %8lld %6lld %10.1f %10.0f %7.0f%%\n", (long long)seqs, (long long)ctx, (long long)gpu::attention_splits(seqs, heads, ctx),
                  t * 1e6, bytes / t / 1e9, 100 * bytes / t / copy_bw);
    }
    // Attention prefill: one sequence of N tokens attending causally to itself (keys in scattered blocks),
    // per-token kernel (up to 8192 tokens) vs tensor-core query tiles, kernels 1, 2 and 3 (gpu::set_attention_tiles_kernel;
    // "v2 w32": kernel 3, 32 rows a warp at hd 64/128, as kernel 2 at hd 256);
    // FLOP = 2 products x 2 x heads x hd x N(N+1)/2.
    std::printf("\nattention prefill (one sequence, %lld q heads, %lld kv heads, hd %lld; causal): roofline 990 TFLOP/s dense bf16\n", (long long)heads,
                (long long)kvh, (long long)hd);
    std::printf("%8s %14s %10s %10s %10s\n", "tokens", "kernel", "ms", "TFLOP/s", "speedup");
    for (int64_t N : {512, 2048, 4096, 8192, 32768}) {
      const int64_t kvw = kvh * hd;
      gpu::DeviceBuffer kc(static_cast<size_t>(N * kvw) * 2), vc(static_cast<size_t>(N * kvw) * 2), dq(static_cast<size_t>(N * heads * hd) * 4),
          dout(static_cast<size_t>(N * heads * hd) * 2);
      std::vector<bf16_t> kh(static_cast<size_t>(N * kvw));
      for (size_t i = 0; i < kh.size(); ++i) kh[i] = f32_to_bf16(0.02f * static_cast<float>(static_cast<int>((i * 2654435761u) % 201) - 100));
      gpu::copy_to_device(kc.data(), kh.data(), kh.size() * 2, s);
      gpu::copy_to_device(vc.data(), kh.data(), kh.size() * 2, s);
      std::vector<float> qh(static_cast<size_t>(N * heads * hd));
      for (size_t i = 0; i < qh.size(); ++i) qh[i] = 0.01f * static_cast<float>(static_cast<int>((i * 40503u) % 201) - 100);
      gpu::copy_to_device(dq.data(), qh.data(), qh.size() * 4, s);
      std::vector<int32_t> lists(static_cast<size_t>(N)), offs(static_cast<size_t>(N), 0), lens(static_cast<size_t>(N));
      for (int64_t i = 0; i < N; ++i) {
        lists[static_cast<size_t>(i)] = static_cast<int32_t>((i / 16 * 7 % (N / 16)) * 16 + i % 16);  // 16-slot blocks, scattered
        lens[static_cast<size_t>(i)] = static_cast<int32_t>(i + 1);
      }
      const std::vector<int32_t> tiles = gpu::attention_tile_list(offs.data(), N);
      gpu::DeviceBuffer dl(lists.size() * 4), doff(offs.size() * 4), dlen(lens.size() * 4), dt(tiles.size() * 4);
      gpu::copy_to_device(dl.data(), lists.data(), lists.size() * 4, s);
      gpu::copy_to_device(doff.data(), offs.data(), offs.size() * 4, s);
      gpu::copy_to_device(dlen.data(), lens.data(), lens.size() * 4, s);
      gpu::copy_to_device(dt.data(), tiles.data(), tiles.size() * 4, s);
      const double flop = 4.0 * heads * hd * static_cast<double>(N) * static_cast<double>(N + 1) / 2;
      const int reps = N >= 8192 ? 3 : 10;
      const bool simt = N <= 8192;
      const double t_simt = !simt ? 0.0 : time_gpu(s, reps, [&] {
        gpu::attention(dq.as<float>(), heads * hd, N, heads, kvh, hd, kc.as<bf16_t>(), vc.as<bf16_t>(), dl.as<int32_t>(), doff.as<int32_t>(),
                       dlen.as<int32_t>(), N, scale, nullptr, dout.as<bf16_t>(), s);
      });
      // Each kernel's time, and up to 8192 tokens its largest output difference from kernel 1's (a check that the timed kernels agree).
      auto run_tiles = [&](gpu::DeviceBuffer& o) {
        gpu::attention_tiles(dq.as<float>(), heads * hd, static_cast<int64_t>(tiles.size() / 2), dt.as<int32_t>(), heads, kvh, hd, kc.as<bf16_t>(),
                             vc.as<bf16_t>(), dl.as<int32_t>(), doff.as<int32_t>(), dlen.as<int32_t>(), scale, o.as<bf16_t>(), s);
      };
      const int kernel0 = gpu::attention_tiles_kernel();
      double t_tile[4] = {};
      float diff[4] = {};
      std::vector<bf16_t> o1, ov;
      for (int v : {1, 2, 3}) {
        gpu::set_attention_tiles_kernel(v);
        t_tile[v] = time_gpu(s, reps, [&] { run_tiles(dout); });
        if (!simt) continue;
        ov.resize(dout.bytes() / 2);
        gpu::copy_to_host(ov.data(), dout.data(), dout.bytes(), s);
        s.synchronize();
        if (v == 1) o1 = ov;
        for (size_t i = 0; i < ov.size(); ++i) {
          const float d = std::fabs(bf16_to_f32(o1[i]) - bf16_to_f32(ov[i]));
          diff[v] = d == d ? std::max(diff[v], d) : INFINITY;
        }
      }
      gpu::set_attention_tiles_kernel(kernel0);
      if (simt) std::printf("%8lld %14s %10.2f %10.1f %10s\n", (long long)N, "per token", t_simt * 1e3, flop / t_simt / 1e12, "1.0x");
      if (simt)
        std::printf("%8lld %14s %10.2f %10.1f %9.1fx\n", (long long)N, "tiles v1", t_tile[1] * 1e3, flop / t_tile[1] / 1e12, t_simt / t_tile[1]);
      else
        std::printf("%8lld %14s %10.2f %10.1f %10s\n", (long long)N, "tiles v1", t_tile[1] * 1e3, flop / t_tile[1] / 1e12, "-");
      for (int v : {2, 3}) {
        std::printf("%8lld %14s %10.2f %10.1f %6.2fx v1", (long long)N, v == 2 ? "tiles v2" : "tiles v2 w32", t_tile[v] * 1e3,
                    flop / t_tile[v] / 1e12, t_tile[1] / t_tile[v]);
        if (simt) std::printf("  (max |out - v1's| %.3g)", diff[v]);
        std::printf("\n");
      }
    }
  }
}

// ---- the synthetic Qwen3-30B-A3B (bench/synthetic_model.h) ----------------------
// A lookup that answers routed-expert names with one quantized copy per
// matrix kind (gate, up, down) of `type`, made from layer 0 expert 0.
struct QuantExperts {
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, cpu::Mat> views;
};
WeightLookup quantized_lookup(const WeightLookup& base, cpu::ExtType type, QuantExperts& q) {
  for (const char* kind : {"gate_proj", "up_proj", "down_proj"}) {
    const std::string name = std::string("model.layers.0.mlp.experts.0.") + kind + ".weight";
    cpu::Mat m = base(name, {});
    std::vector<float> w(static_cast<size_t>(m.rows * m.cols));
    for (int64_t r = 0; r < m.rows; ++r) cpu::row_to_f32(m, r, w.data() + r * m.cols);
    auto& b = q.bytes[kind];
    b = qtools::quant_rows(type, w.data(), m.rows, m.cols);
    q.views[kind] = cpu::ext_view(type, b.data(), m.rows, m.cols, name);
  }
  return [base, &q](const std::string& name, const std::vector<int64_t>& shape) -> cpu::Mat {
    if (name.find(".experts.") != std::string::npos)
      for (const char* kind : {"gate_proj", "up_proj", "down_proj"})
        if (name.find(kind) != std::string::npos) return q.views.at(kind);
    return base(name, shape);
  };
}

void model_benchmark(numa::NodePools& pools, int layers, int steps, const std::vector<int>& pcts, const std::vector<int>& batches,
                     const std::string& experts, const std::vector<int>& prefill_tokens, int64_t defer_experts = 0) {
  numa::ThreadPool& pool = pools.pool(0);
  const std::unique_ptr<bench::SyntheticModel> model = bench::make_qwen3_30b_a3b(layers, pool);
  const ModelConfig& c = model->config();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts, K = c.num_experts_per_tok, V = c.vocab_size;
  std::printf("\nsynthetic Qwen3-30B-A3B: %d layers, %.1f GB of random bf16 weights made in %.1f s\n", layers,
              static_cast<double>(model->bytes()) / 1e9, model->build_seconds());
  const double dram = host_read_bandwidth(pool);
  std::printf("host DRAM read bandwidth (%d threads of node 0, 4 GiB, best of 3): %.1f GB/s\n", pool.size(), dram / 1e9);
  WeightLookup get = model->get();
  const double expert_bytes = 3.0 * I * H * 2;
  QuantExperts qe;
  std::vector<int> pct_list = pcts;
  if (!experts.empty() && experts != "bf16") {
    const std::map<std::string, cpu::ExtType> types = {{"q8_0", cpu::ExtType::q8_0}, {"q4_k", cpu::ExtType::q4_k}, {"q4_0", cpu::ExtType::q4_0},
                                                       {"q5_k", cpu::ExtType::q5_k}, {"q6_k", cpu::ExtType::q6_k}};
    if (!types.count(experts)) fail(ErrorKind::invalid_argument, "--experts " + experts + ": expected bf16, q8_0, q4_k, q4_0, q5_k or q6_k");
    get = quantized_lookup(model->get(), types.at(experts), qe);
    pct_list = {100};
    std::printf("routed experts: GGUF %s on the GPU (100%% resident only)\n", experts.c_str());
  }
  // Variants: plain launches, CUDA graphs (per segment between CPU hand-offs),
  // and graphs with the GPU/CPU overlap (two micro-batches: halves, or all
  // but one sequence and one). Bounds: serial = cold expert bytes / DRAM
  // bandwidth + GPU ms of the same graph setting without overlap; overlapped
  // = max of the two (what a perfect overlap could reach).
  struct Variant {
    const char* name;
    bool graphs, overlap;
    int64_t second;
  };
  const std::vector<Variant> variants = {{"plain", false, false, 0}, {"graphs", true, false, 0}, {"graphs+overlap halves", true, true, 0},
                                         {"graphs+overlap n-1|1", true, true, 1}, {"overlap halves (no graphs)", false, true, 0}};
  std::printf("\n| resident | batch | variant | tok/s | ms/step | GPU ms | CPU experts ms | transfers ms | cold GB/step | serial bound ms | x serial | overlap bound ms | x overlap |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int pct : pct_list) {
    std::vector<bool> resident(static_cast<size_t>(layers));
    int nres = 0;
    for (int l = 0; l < layers; ++l) {
      resident[static_cast<size_t>(l)] = (l + 1) * pct / 100 > l * pct / 100;  // spread evenly
      nres += resident[static_cast<size_t>(l)];
    }
    std::unique_ptr<GpuRuntime> stack;
    try {
      GpuRuntimeOptions o;
      o.resident = resident;
      o.defer_experts = defer_experts;
      stack = GpuRuntime::from_lookup(c, get, pools, o);
      std::printf("| %d%% | GPU weights %.2f GB |\n", pct, static_cast<double>(stack->weight_bytes()) / 1e9);
    } catch (const Error& e) {
      std::printf("| %d%% | - | could not build: %s |\n", pct, e.what());
      continue;
    }
    for (int64_t N : prefill_tokens) {  // one sequence's prompt in one step: tiled (kernels 1, 2, 3) vs per-token attention
      const int kernel0 = gpu::attention_tiles_kernel();
      for (int mode : {1, 2, 3, 0}) {
        const bool tiled = mode > 0;
        stack->set_tiled_attention(tiled);
        if (tiled) gpu::set_attention_tiles_kernel(mode);
        KvCache kv(KvLayout{layers, 4, 128}, (N + 15) / 16 + 1, 16);
        const int seq = kv.add_sequence();
        kv.reserve(seq, N);
        Batch b;
        for (int64_t i = 0; i < N; ++i) b.add(static_cast<int32_t>((i * 104729 + 7) % V), seq, i, i + 1 == N);
        std::vector<float> logits;
        stack->forward(b, kv, logits);  // warm-up (scratch, cuBLAS)
        const double t0 = bench::now_seconds();
        stack->forward(b, kv, logits);
        const double dt = bench::now_seconds() - t0;
        const std::string how = tiled ? "tiled (kernel " + std::to_string(mode) + ")" : "per-token";
        std::printf("| %d%% | prefill %lld tokens, %s attention | %.1f tok/s | %.1f ms |\n", pct, static_cast<long long>(N), how.c_str(),
                    static_cast<double>(N) / dt, dt * 1e3);
      }
      stack->set_tiled_attention(true);
      gpu::set_attention_tiles_kernel(kernel0);
    }
    for (int batch : batches) {
      double gpu_ref[2] = {0, 0};  // GPU ms without overlap, per graph setting
      for (const Variant& var : variants) {
        if (var.overlap && (batch < 2 || nres == layers)) continue;  // nothing to overlap
        if (var.overlap && var.second == 1 && batch == 2) continue;  // the same split as halves
        stack->set_cuda_graphs(var.graphs);
        stack->set_cpu_overlap(var.overlap, var.second);
        const int64_t prompt = 32, total = prompt + steps + 4;
        KvCache kv(KvLayout{layers, 4, 128}, batch * ((total + 15) / 16) + 1, 16);
        std::vector<int> seqs;
        Batch b;
        for (int q = 0; q < batch; ++q) {
          seqs.push_back(kv.add_sequence());
          kv.reserve(seqs.back(), total);
          for (int64_t i = 0; i < prompt; ++i) b.add(static_cast<int32_t>((q * 7919 + i * 104729) % V), seqs.back(), i, i + 1 == prompt);
        }
        std::vector<float> logits;
        stack->forward(b, kv, logits);  // prefill
        std::vector<int32_t> next(static_cast<size_t>(batch));
        auto decode = [&](int64_t pos) {
          for (int q = 0; q < batch; ++q)
            next[static_cast<size_t>(q)] =
                static_cast<int32_t>(std::max_element(logits.begin() + q * V, logits.begin() + (q + 1) * V) - (logits.begin() + q * V));
          b.clear();
          for (int q = 0; q < batch; ++q) b.add(next[static_cast<size_t>(q)], seqs[static_cast<size_t>(q)], pos, true);
          stack->forward(b, kv, logits);
        };
        for (int64_t i = 0; i < 2; ++i) decode(prompt + i);  // warm-up (graph capture)
        stack->reset_times();
        for (int64_t i = 0; i < steps; ++i) decode(prompt + 2 + i);
        const GpuStepTimes& t = stack->times();
        const double step = t.total_s / t.steps;
        // Distinct experts a layer touches for `batch` tokens of uniform routing.
        const double uniq = E * (1.0 - std::pow(1.0 - static_cast<double>(K) / E, batch));
        const double cold = static_cast<double>(layers - nres) * uniq * expert_bytes;
        const double gpu_s = t.gpu_s() / t.steps;  // with overlap: the GPU time left exposed
        if (!var.overlap) gpu_ref[var.graphs] = gpu_s;
        const double g = gpu_ref[var.graphs], serial = cold / dram + g, overlapped = std::max(cold / dram, g);
        std::printf("| %d%% (%d/%d) | %d | %s | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", pct, nres, layers, batch,
                    var.name, batch / step, step * 1e3, gpu_s * 1e3, t.cpu_experts_s / t.steps * 1e3, t.transfer_s / t.steps * 1e3, cold / 1e9,
                    serial * 1e3, step / serial, overlapped * 1e3, step / overlapped);
        std::fflush(stdout);
      }
    }
  }
  std::printf("\nserial bound = cold expert bytes per step / host DRAM bandwidth + GPU ms (the variant's graph setting, no overlap);\n"
              "overlap bound = the larger of the two; cold bytes assume uniform routing\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, skip_model = false, skip_kernels = false, attention_only = false, moe_only = false;
  std::string experts;
  std::vector<int> prefill;
  int steps = 16;
  std::vector<int> pcts = {0, 25, 50, 100}, batches = {1, 8};
  int64_t defer = 0;
  std::string gpu_memory;
  auto list = [](const char* a) {
    std::vector<int> v;
    for (const char* p = a; *p;) {
      v.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--skip-model")) skip_model = true;
    else if (!std::strcmp(argv[i], "--skip-kernels")) skip_kernels = true;
    else if (!std::strcmp(argv[i], "--attention-only")) attention_only = skip_model = true;
    else if (!std::strcmp(argv[i], "--moe-only")) moe_only = skip_model = true;
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--resident") && i + 1 < argc) pcts = list(argv[++i]);
    else if (!std::strcmp(argv[i], "--batches") && i + 1 < argc) batches = list(argv[++i]);
    else if (!std::strcmp(argv[i], "--experts") && i + 1 < argc) experts = argv[++i];
    else if (!std::strcmp(argv[i], "--prefill") && i + 1 < argc) prefill = list(argv[++i]);
    else if (!std::strcmp(argv[i], "--defer-experts") && i + 1 < argc) defer = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gpu-memory") && i + 1 < argc) gpu_memory = argv[++i];
  }
  // --gpu-memory SIZE: every GPU allocation of the run counts against SIZE (gpu/memory_cap.h), as on a card of that size.
  if (!gpu_memory.empty()) {
    try {
      gpu::memory_ledger().set_cap(parse_bytes("--gpu-memory", gpu_memory), "bench_gpu --gpu-memory " + gpu_memory);
    } catch (const Error& e) {
      std::fprintf(stderr, "bench_gpu: %s\n", e.what());
      return 1;
    }
    std::printf("GPU memory capped at %s (every allocation counts)\n", gpu_memory.c_str());
  }
  if (defer < 0 || defer > 64) {
    std::fprintf(stderr, "bench_gpu: --defer-experts must be in 0..64\n");
    return 1;
  }
  std::printf("%s\n", gpu::describe().c_str());
  if (gpu::device_count() == 0) {
    std::printf("SKIP: no CUDA device; nothing to measure\n");
    return 0;
  }
  try {
    numa::PoolOptions popt;
    numa::NodePools pools(popt);
    double copy_bw = 0;
    if (!skip_kernels) kernel_benchmarks(pools.pool(0), copy_bw, attention_only, moe_only);
    if (!skip_model) model_benchmark(pools, quick ? 4 : 48, steps, pcts, batches, experts, prefill, defer);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
