#include "numa/expert_bench.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include <time.h>

#include "configs/error.h"
#include "numa/expert_engine.h"

namespace hmoe::numa {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// Storage for one expert set: weights filled with random values of a sane
// magnitude straight in their storage format (quantizing gigabytes of floats
// would take longer than the benchmark).
struct BenchWeights {
  std::vector<NodeBuffer> bufs;  // one per matrix kind: data, scales, zeros
  std::vector<ExpertWeights> experts;
};

BenchWeights make_weights(const ExpertShape& s, const std::string& dtype, int64_t held, NodePools& pools) {
  const int64_t H = s.hidden, I = s.intermediate, per = 3 * H * I;
  BenchWeights w;
  cpu::Mat proto;
  size_t data_bytes;
  int64_t groups_per_mat = 0;  // scale entries per matrix
  if (dtype == "bf16") {
    proto.dtype = DType::bf16;
    data_bytes = static_cast<size_t>(per) * 2;
  } else if (dtype == "int8") {
    proto.dtype = DType::i8;
    proto.quant = cpu::Quant::int8_channel;
    data_bytes = static_cast<size_t>(per);
    groups_per_mat = std::max(H, I);
  } else if (dtype == "int4") {
    proto.dtype = DType::u8;
    proto.quant = cpu::Quant::int4_group;
    proto.group = 128;
    data_bytes = static_cast<size_t>(per) / 2;
    groups_per_mat = H * I / 128;
  } else {
    fail(ErrorKind::invalid_argument, "--dtype: '" + dtype + "' is not one of bf16, int8, int4");
  }
  const size_t scale_count = static_cast<size_t>(3 * groups_per_mat);
  w.bufs.emplace_back(data_bytes * static_cast<size_t>(held), 0, false);
  w.bufs.emplace_back(scale_count * sizeof(float) * static_cast<size_t>(held) + 64, 0, false);
  w.bufs.emplace_back(scale_count * sizeof(float) * static_cast<size_t>(held) + 64, 0, false);
  uint8_t* data = w.bufs[0].data();
  auto* scales = reinterpret_cast<float*>(w.bufs[1].data());
  auto* zeros = reinterpret_cast<float*>(w.bufs[2].data());
  // Fill in parallel, 1 MiB pieces.
  const size_t total = data_bytes * static_cast<size_t>(held), piece = 1 << 20;
  pools.pool(0).parallel_for(static_cast<int64_t>((total + piece - 1) / piece), [&](int64_t b, int64_t e, int) {
    for (int64_t p = b; p < e; ++p) {
      const size_t lo = static_cast<size_t>(p) * piece, hi = std::min(total, lo + piece);
      if (dtype == "bf16") {
        auto* h = reinterpret_cast<uint16_t*>(data);
        for (size_t i = lo / 2; i < hi / 2; ++i) {
          const uint64_t r = mix(i);
          // |w| in [2^-8, 2^-5), random sign and mantissa.
          h[i] = static_cast<uint16_t>(((r & 1) << 15) | ((119 + (r >> 1) % 3) << 7) | ((r >> 8) & 0x7f));
        }
      } else {
        for (size_t i = lo; i < hi; i += 8) {
          const uint64_t r = mix(i);
          std::memcpy(data + i, &r, std::min<size_t>(8, hi - i));
        }
      }
    }
  });
  for (size_t i = 0; i < scale_count * static_cast<size_t>(held); ++i) {
    scales[i] = 0.002f + 0.001f * static_cast<float>(mix(i) % 8);
    zeros[i] = static_cast<float>(mix(i + 7) % 16);
  }
  for (int64_t e = 0; e < held; ++e) {
    auto mat = [&](int m, int64_t rows, int64_t cols) {
      cpu::Mat x = proto;
      x.rows = rows;
      x.cols = cols;
      x.data = data + static_cast<size_t>(e) * data_bytes + static_cast<size_t>(m) * (data_bytes / 3);
      if (groups_per_mat) {
        const size_t off = static_cast<size_t>(e) * scale_count + static_cast<size_t>(m * groups_per_mat);
        x.scales = scales + off;
        if (dtype == "int4") x.zeros = zeros + off;
      }
      return x;
    };
    w.experts.push_back({mat(0, I, H), mat(1, I, H), mat(2, H, I)});
  }
  return w;
}

}  // namespace

ExpertShape expert_shape(const std::string& name) {
  if (name == "qwen3-30b-a3b") return {name, 2048, 768, 128, 8};
  if (name == "deepseek-v3") return {name, 7168, 2048, 256, 8};
  fail(ErrorKind::invalid_argument, "--shape: '" + name + "' is not one of qwen3-30b-a3b, deepseek-v3");
}

std::string ExpertBenchResult::json() const {
  nlohmann::json j = {{"shape", shape.name},
                      {"dtype", cfg.dtype},
                      {"tokens", cfg.tokens},
                      {"threads", threads},
                      {"nodes", nodes},
                      {"isa", isa},
                      {"bf16_dot", cfg.bf16_dot},
                      {"int8_act", cfg.int8_act},
                      {"onednn_min_tokens", cfg.onednn_min_tokens},
                      {"hidden", shape.hidden},
                      {"intermediate", shape.intermediate},
                      {"top_k", shape.top_k},
                      {"experts_total", shape.experts},
                      {"experts_held", experts_held},
                      {"steps", steps},
                      {"seconds_per_step", seconds_per_step},
                      {"weight_bytes_per_step", weight_bytes_per_step},
                      {"weight_gbps", weight_gbps},
                      {"stream_gbps", stream_gbps},
                      {"bandwidth_ratio", bandwidth_ratio},
                      {"gflops", gflops},
                      {"cpu_seconds_per_step", cpu_seconds_per_step},
                      {"weight_gbps_cpu", weight_gbps_cpu},
                      {"stream_gbps_cpu", stream_gbps_cpu},
                      {"bandwidth_ratio_cpu", bandwidth_ratio_cpu},
                      {"note", note}};
  return j.dump();
}

double stream_triad_gbps(NodePools& pools, size_t bytes_per_array, int reps, double* cpu_gbps) {
  const int nn = pools.nodes();
  const int64_t n = static_cast<int64_t>(bytes_per_array / sizeof(double));
  std::vector<NodeBuffer> a, b, c;
  std::vector<int64_t> per_node(static_cast<size_t>(nn)), chunks(static_cast<size_t>(nn));
  constexpr int64_t kChunk = 1 << 16;  // doubles per work item
  for (int j = 0; j < nn; ++j) {
    per_node[static_cast<size_t>(j)] = n / nn;
    chunks[static_cast<size_t>(j)] = (per_node[static_cast<size_t>(j)] + kChunk - 1) / kChunk;
    const int os = pools.topology().nodes[static_cast<size_t>(j)].os_index;
    const size_t bytes = static_cast<size_t>(per_node[static_cast<size_t>(j)]) * sizeof(double);
    a.emplace_back(bytes, os, pools.membind());
    b.emplace_back(bytes, os, pools.membind());
    c.emplace_back(bytes, os, pools.membind());
  }
  auto ptr = [](std::vector<NodeBuffer>& v, int j) { return reinterpret_cast<double*>(v[static_cast<size_t>(j)].data()); };
  auto range = [&](int j, int64_t i, int64_t& lo, int64_t& hi) {
    lo = i * kChunk;
    hi = std::min(per_node[static_cast<size_t>(j)], lo + kChunk);
  };
  pools.run(chunks, [&](int j, int64_t b0, int64_t e0, int) {
    for (int64_t i = b0; i < e0; ++i) {
      int64_t lo, hi;
      range(j, i, lo, hi);
      for (int64_t k = lo; k < hi; ++k) {
        ptr(a, j)[k] = 0.0;
        ptr(b, j)[k] = 1.0 + static_cast<double>(k & 7);
        ptr(c, j)[k] = 2.0;
      }
    }
  });
  double best = 0, best_cpu = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    pools.run(chunks, [&](int j, int64_t b0, int64_t e0, int) {
      double* __restrict pa = ptr(a, j);
      const double* __restrict pb = ptr(b, j);
      const double* __restrict pc = ptr(c, j);
      for (int64_t i = b0; i < e0; ++i) {
        int64_t lo, hi;
        range(j, i, lo, hi);
        for (int64_t k = lo; k < hi; ++k) pa[k] = pb[k] + 3.0 * pc[k];
      }
    });
    const double s = seconds_since(t0), cs = (process_cpu_seconds() - c0) / pools.threads();
    best = std::max(best, 3.0 * sizeof(double) * static_cast<double>(n / nn * nn) / s / 1e9);
    if (cs > 0) best_cpu = std::max(best_cpu, 3.0 * sizeof(double) * static_cast<double>(n / nn * nn) / cs / 1e9);
  }
  if (cpu_gbps) *cpu_gbps = best_cpu;
  // Keep the compiler from dropping the triad.
  if (ptr(a, 0)[0] != 3.0 * 2.0 + 1.0 && ptr(a, 0)[0] != 7.0) best = -best;
  return best;
}

ExpertBenchResult run_expert_bench(const ExpertBenchConfig& cfg, NodePools& pools, double stream_gbps, double stream_gbps_cpu) {
  ExpertBenchResult res;
  res.cfg = cfg;
  res.shape = expert_shape(cfg.shape);
  const ExpertShape& s = res.shape;
  if (cfg.tokens < 1 || cfg.tokens > 65536) fail(ErrorKind::invalid_argument, "--tokens must be in 1..65536, got " + std::to_string(cfg.tokens));
  const double bytes_per_elem = cfg.dtype == "bf16" ? 2.0 : cfg.dtype == "int8" ? 1.0 : 0.5;
  const double expert_bytes = 3.0 * static_cast<double>(s.hidden * s.intermediate) * bytes_per_elem;
  int64_t held = cfg.experts_held;
  if (held <= 0) held = std::min<int64_t>(s.experts, std::max<int64_t>(2 * s.top_k, static_cast<int64_t>(2.0 * (1 << 30) / expert_bytes)));
  if (held < s.top_k || held > s.experts)
    fail(ErrorKind::invalid_argument, "--experts-held must be in " + std::to_string(s.top_k) + ".." + std::to_string(s.experts));
  res.experts_held = held;
  if (held < s.experts)
    res.note = "subset: " + std::to_string(held) + " of " + std::to_string(s.experts) + " experts held (" +
               std::to_string(static_cast<int64_t>(held * expert_bytes / 1048576)) + " MiB), routed over at random";

  BenchWeights w = make_weights(s, cfg.dtype, held, pools);
  EngineOptions eo;
  eo.bf16_dot = cfg.bf16_dot;
  eo.int8_act = cfg.int8_act;
  eo.onednn_min_tokens = cfg.onednn_min_tokens;
  eo.print_memory = false;
  eo.name = s.name + " experts";
  ExpertEngine engine(w.experts, pools, eo);

  const int64_t n = cfg.tokens, K = s.top_k, H = s.hidden;
  std::vector<float> x(static_cast<size_t>(n * H)), out(static_cast<size_t>(n * H), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int64_t>(mix(i) % 2001) - 1000) / 1000.0f;
  std::mt19937_64 rng(1234);
  auto route = [&](std::vector<int32_t>& ids, std::vector<float>& wts, double& bytes) {
    ids.resize(static_cast<size_t>(n * K));
    wts.assign(static_cast<size_t>(n * K), 1.0f / static_cast<float>(K));
    std::vector<int32_t> perm(static_cast<size_t>(held));
    std::vector<char> used(static_cast<size_t>(held), 0);
    for (int64_t e = 0; e < held; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < K; ++j) std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(j + static_cast<int64_t>(rng() % static_cast<uint64_t>(held - j)))]);
      for (int64_t j = 0; j < K; ++j) {
        ids[static_cast<size_t>(t * K + j)] = perm[static_cast<size_t>(j)];
        used[static_cast<size_t>(perm[static_cast<size_t>(j)])] = 1;
      }
    }
    bytes = 0;
    for (int64_t e = 0; e < held; ++e)
      if (used[static_cast<size_t>(e)]) bytes += static_cast<double>(engine.expert_bytes(e));
  };
  std::vector<int32_t> ids;
  std::vector<float> wts;
  double bytes = 0;
  route(ids, wts, bytes);
  engine.forward(x.data(), n, ids.data(), wts.data(), K, out.data());  // warm-up (page faults, scratch)
  double total_bytes = 0, total_s = 0;
  const double cpu0 = process_cpu_seconds();
  int64_t steps = 0;
  while (steps < 2 || total_s < cfg.min_seconds) {
    route(ids, wts, bytes);
    const auto t0 = Clock::now();
    engine.forward(x.data(), n, ids.data(), wts.data(), K, out.data());
    total_s += seconds_since(t0);
    total_bytes += bytes;
    ++steps;
    if (steps >= 2 && total_s > 4 * cfg.min_seconds) break;
  }
  res.cpu_seconds_per_step = (process_cpu_seconds() - cpu0) / static_cast<double>(steps) / pools.threads();
  double checksum = 0;
  for (float v : out) checksum += v;
  if (!std::isfinite(checksum)) res.note += (res.note.empty() ? "" : "; ") + std::string("non-finite output");
  res.threads = pools.threads();
  res.nodes = pools.nodes();
  res.isa = std::string(cpu::isa_name(cpu::best_isa())) + (cfg.bf16_dot && cpu::has_bf16_dot() && cfg.dtype == "bf16" ? "+bf16dot" : "") +
            (engine.int8_act_used() ? "+int8act" : "") + (engine.onednn_steps() > 0 ? "+onednn" : "");
  res.steps = steps;
  res.seconds_per_step = total_s / static_cast<double>(steps);
  res.weight_bytes_per_step = total_bytes / static_cast<double>(steps);
  res.weight_gbps = total_bytes / total_s / 1e9;
  res.stream_gbps = stream_gbps;
  res.bandwidth_ratio = stream_gbps > 0 ? res.weight_gbps / stream_gbps : 0;
  res.stream_gbps_cpu = stream_gbps_cpu;
  res.weight_gbps_cpu = res.cpu_seconds_per_step > 0 ? res.weight_bytes_per_step / res.cpu_seconds_per_step / 1e9 : 0;
  res.bandwidth_ratio_cpu = stream_gbps_cpu > 0 ? res.weight_gbps_cpu / stream_gbps_cpu : 0;
  res.gflops = 2.0 * 3.0 * static_cast<double>(n * K * s.hidden * s.intermediate) / res.seconds_per_step / 1e9;
  return res;
}

double dnnl_sgemm_gflops(int64_t m, int64_t n, int64_t k, int reps) {
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(mix(i) % 100) / 100.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(mix(i + 1) % 100) / 100.0f;
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
    // Row-major C[m,n] = A[m,k] * B[n,k]^T: the y = x W^T of the kernels.
    if (dnnl_sgemm('N', 'T', m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n) != dnnl_success)
      fail(ErrorKind::internal, "dnnl_sgemm failed");
    const double s = seconds_since(t0);
    if (r > 0) best = std::max(best, 2.0 * static_cast<double>(m * n * k) / s / 1e9);
  }
  return best;
}

}  // namespace hmoe::numa
