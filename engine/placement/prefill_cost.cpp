// Prefill streaming cost model and settings (see prefill_cost.h).
#include "engine/placement/prefill_cost.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "configs/error.h"
#include "io/dtype.h"
#include "numa/expert_engine.h"

namespace hmoe {

namespace {
double flops_per_token(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.hidden_size) * static_cast<double>(c.moe_intermediate_size) * static_cast<double>(c.num_experts_per_tok);
}
double layer_bytes(const ModelConfig& c) {
  return 6.0 * static_cast<double>(c.num_experts) * static_cast<double>(c.hidden_size) * static_cast<double>(c.moe_intermediate_size);
}
}  // namespace

double cpu_expert_seconds(const ModelConfig& c, const PrefillCost& m, int64_t n) {
  const double E = static_cast<double>(std::max<int64_t>(c.num_experts, 1)), k = static_cast<double>(c.num_experts_per_tok);
  const double covered = 1.0 - std::pow(std::max(0.0, 1.0 - k / E), static_cast<double>(n));
  return std::max(covered * layer_bytes(c) / m.cpu_bandwidth, static_cast<double>(n) * flops_per_token(c) / m.cpu_expert_flops);
}

double streamed_expert_seconds(const ModelConfig& c, const PrefillCost& m, int64_t n) {
  return std::max(layer_bytes(c) / m.pcie_bandwidth, static_cast<double>(n) * flops_per_token(c) / m.gpu_expert_flops) + kStreamLayerOverheadSeconds;
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
  const size_t words = (256u << 20) / 8, chunk = 1u << 16;
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  const int64_t chunks = static_cast<int64_t>(words / chunk);
  std::vector<uint64_t> sums(static_cast<size_t>(chunks));
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t ch = b; ch < e; ++ch) {
      uint64_t acc = 0;
      for (size_t i = static_cast<size_t>(ch) * chunk; i < static_cast<size_t>(ch + 1) * chunk; ++i) acc += buf[i];
      sums[static_cast<size_t>(ch)] = acc;
    }
  };
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pool) pool->parallel_for(chunks, body);
    else body(0, chunks, 0);
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

int64_t parse_prefill_min_batch(const Settings& s) {
  const std::string& v = s.gpu_prefill_min_batch_size;
  if (v == "auto") return -1;
  const std::string what = s.origin("gpu_prefill_min_batch_size");
  bool digits = !v.empty() && v.size() <= 12;
  for (char ch : v) digits = digits && ch >= '0' && ch <= '9';
  if (!digits)
    fail(ErrorKind::invalid_argument, what + "='" + v + "': expected a token count (0 = never) or auto");
  return std::stoll(v);
}

int parse_prefetch_window(const Settings& s) {
  const int64_t w = s.gpu_prefetch_window;
  if (w < 1 || w > 8)
    fail(ErrorKind::invalid_argument, s.origin("gpu_prefetch_window") + "=" + std::to_string(w) + ": expected 1 to 8 layers in flight");
  return static_cast<int>(w);
}

}  // namespace hmoe
