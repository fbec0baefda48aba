// Prefill streaming cost model and settings (see prefill_cost.h).
#include "engine/placement/prefill_cost.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "configs/error.h"
#include "io/dtype.h"
#include "numa/expert_engine.h"

namespace hmoe {

namespace {
double flops_per_token(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.hidden_size) * static_cast<double>(c.moe_intermediate_size) * static_cast<double>(c.num_experts_per_tok);
}
double layer_weights(const ModelConfig& c) {
  return 3.0 * static_cast<double>(c.num_experts) * static_cast<double>(c.hidden_size) * static_cast<double>(c.moe_intermediate_size);
}
}  // namespace

double expert_cpu_bytes_per_weight(const ModelConfig& c) { return c.expert_bytes_per_weight > 0 ? c.expert_bytes_per_weight : 2.0; }
double expert_stream_bytes_per_weight(const ModelConfig& c, bool quantized) {
  return quantized && c.gpu_expert_bytes_per_weight > 0 ? c.gpu_expert_bytes_per_weight : 2.0;
}
double stream_layer_bytes(const ModelConfig& c, const PrefillCost& m) { return layer_weights(c) * m.stream_bytes_per_weight; }

double cpu_expert_seconds(const ModelConfig& c, const PrefillCost& m, int64_t n) {
  const double E = static_cast<double>(std::max<int64_t>(c.num_experts, 1)), k = static_cast<double>(c.num_experts_per_tok);
  const double covered = 1.0 - std::pow(std::max(0.0, 1.0 - k / E), static_cast<double>(n));
  return std::max(covered * layer_weights(c) * m.cpu_bytes_per_weight / m.cpu_bandwidth, static_cast<double>(n) * flops_per_token(c) / m.cpu_expert_flops);
}

double streamed_expert_seconds(const ModelConfig& c, const PrefillCost& m, int64_t n) {
  return std::max(stream_layer_bytes(c, m) / m.pcie_bandwidth, static_cast<double>(n) * flops_per_token(c) / m.gpu_expert_flops) + kStreamLayerOverheadSeconds;
}

int64_t prefill_break_even(const ModelConfig& c, const PrefillCost& m) {
  if (!(m.cpu_expert_flops > 0 && m.cpu_bandwidth > 0 && m.pcie_bandwidth > 0 && m.gpu_expert_flops > 0) || c.num_experts <= 0) return 0;
  const int64_t top = int64_t{1} << 20;
  if (streamed_expert_seconds(c, m, top) >= cpu_expert_seconds(c, m, top)) return 0;
  // Both sides grow with n; the CPU side grows faster once compute bound. Bisect on the sign.
  int64_t lo = 0, hi = top;  // invariant: streamed(hi) < cpu(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (streamed_expert_seconds(c, m, mid) < cpu_expert_seconds(c, m, mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

double measure_host_read_bandwidth(numa::ThreadPool* pool) {
  // 512 MiB written by the pool's own threads (pages placed as the readers'
  // first touch puts them), a warm-up pass (threads awake), then 3 timed
  // passes of 4 independent sums per thread (one dependent add chain per
  // 8 bytes capped a core below its share of the bus). The earlier probe (256
  // MiB, one thread's pages, one chain) read 72 GB/s on the device's Xeon
  // where 16 threads stream 143-146 GB/s (bench_gpu, 2026-12-06).
  const size_t words = (512ull << 20) / 8, chunk = 1u << 16;
  // Default-initialised (no zero fill here): the pool's first touch below
  // places the pages, not the calling thread.
  std::unique_ptr<uint64_t[]> owner(new uint64_t[words]);
  uint64_t* const buf = owner.get();
  const int64_t chunks = static_cast<int64_t>(words / chunk);
  auto run = [&](const numa::ThreadPool::Fn& fn) {
    if (pool) pool->parallel_for(chunks, fn, 4);
    else fn(0, chunks, 0);
  };
  run([&](int64_t b, int64_t e, int) {
    for (int64_t ch = b; ch < e; ++ch)
      for (size_t i = static_cast<size_t>(ch) * chunk; i < static_cast<size_t>(ch + 1) * chunk; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  });
  std::vector<uint64_t> sums(static_cast<size_t>(chunks));
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t ch = b; ch < e; ++ch) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      const uint64_t* p = buf + static_cast<size_t>(ch) * chunk;
      for (size_t i = 0; i < chunk; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
      }
      sums[static_cast<size_t>(ch)] = a0 + a1 + a2 + a3;
    }
  };
  run(body);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    run(body);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(words * 8) / sec);
  }
  volatile uint64_t sink = 0;
  for (auto v : sums) sink = sink + v;
  return best;
}

double measure_cpu_expert_flops(const ModelConfig& c, numa::ThreadPool* pool, int64_t tokens) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  if (H <= 0 || I <= 0 || tokens <= 0) return 0;
  std::vector<uint16_t> w(static_cast<size_t>(3 * I * H));
  uint64_t s = 88172645463325252ull;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(static_cast<int32_t>(s >> 32)) * (1.0f / 2147483648.0f);
  };
  for (auto& v : w) v = f32_to_bf16(0.05f * next());
  std::vector<float> x(static_cast<size_t>(tokens * H)), out(x.size());
  for (auto& v : x) v = next();
  numa::ExpertWeights e{cpu::Mat{DType::bf16, w.data(), I, H}, cpu::Mat{DType::bf16, w.data() + I * H, I, H},
                        cpu::Mat{DType::bf16, w.data() + 2 * I * H, H, I}};
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    numa::mlp_forward(x.data(), tokens, e, out.data(), pool);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 6.0 * static_cast<double>(H) * static_cast<double>(I) * static_cast<double>(tokens) / best;
}

double measure_cpu_expert_flops(const numa::ExpertWeights& sample, numa::NodePools& pools, const numa::EngineOptions& eo, int64_t tokens) {
  const int64_t H = sample.gate.cols, I = sample.gate.rows;
  if (H <= 0 || I <= 0 || tokens <= 0) return 0;
  numa::EngineOptions o = eo;
  o.copy_to_nodes = 0;  // views: nothing copied for a probe
  o.print_memory = false;
  o.name = "CPU expert FLOP/s probe";
  numa::ExpertEngine engine({sample}, pools, o);
  uint64_t s = 0x2545F4914F6CDD1Dull;
  std::vector<float> x(static_cast<size_t>(tokens * H)), out(x.size()), w(static_cast<size_t>(tokens), 1.0f);
  for (auto& v : x) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v = static_cast<float>(static_cast<int32_t>(s >> 32)) * (1.0f / 2147483648.0f);
  }
  std::vector<int32_t> ids(static_cast<size_t>(tokens), 0);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    engine.forward(x.data(), tokens, ids.data(), w.data(), 1, out.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 6.0 * static_cast<double>(H) * static_cast<double>(I) * static_cast<double>(tokens) / best;
}

int64_t parse_prefill_min_batch(const Settings& s) {
  const std::string& v = s.gpu_prefill_min_batch_size;  // "auto" or digits (Settings::validate)
  if (v == "auto") return -1;
  if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
    fail(ErrorKind::internal, "gpu_prefill_min_batch_size='" + v + "' was not validated (Settings::validate)");
  return std::stoll(v);
}

int parse_prefetch_window(const Settings& s) { return static_cast<int>(s.gpu_prefetch_window); }  // 1..8 (Settings::validate)

}  // namespace hmoe
