// Time to first token for a repeated long prefix on the GPU path, with the
// synthetic Qwen3-30B-A3B (bench/synthetic_model.h, 48 layers, ALL MoE
// layers resident on the GPU so that "cold" is a pure GPU prefill):
//   cold      - nothing cached: the whole prompt is prefilled, in chunks of
//               --chunk tokens (the scheduler's --max-num-batched-tokens);
//   GPU hit   - the prefix's blocks are still in the GPU pool: only the tail
//               is computed;
//   host hit  - the prefix's blocks were evicted to the pinned host pool
//               (GpuKvStorage): they are copied back, then the tail computed.
// The prompt is prefix + a distinct --tail-token tail per request. The
// benchmark drives KvCache + GpuRuntime as the scheduler does (attach_prefix,
// reserve, chunked forward, commit). Eviction to the host pool is done by
// another sequence taking every GPU block; its offload copies are waited for
// before the host-hit request starts (they belong to earlier steps).
// --cold-budget S: a cold prefill still running after S seconds stops; its
// remaining blocks are registered without being computed (hits then read
// stale K/V, which does not change their timing) and the cold row says
// "stopped" with the measured part. Never passes or fails on time.
// Usage: bench_prefix_cache [--quick] [--layers N] [--prefixes 8192,32768]
//        [--chunk 2048] [--tail 32] [--reps 3] [--cold-budget 150]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/synthetic_model.h"
#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_storage_gpu.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/device.h"
#include "numa/node_pools.h"

using namespace hmoe;

namespace {

struct Request {
  double ttft = 0;         // seconds from admission to the first token's logits
  int64_t cached = 0;      // prompt tokens reused (GPU or host)
  int64_t restored = 0;    // blocks copied back from the host pool
  double copy_s = 0;       // device time of the storage's copies in this request
  bool stopped = false;    // cold budget ran out
  int64_t computed = 0;    // tokens actually prefilled
};

// One request through the cache as the scheduler runs it.
Request run_request(GpuRuntime& stack, KvCache& kv, GpuKvStorage& st, const std::vector<int32_t>& prompt, int64_t chunk, double budget_s) {
  Request r;
  const auto restored0 = kv.stats().restored_blocks;
  const double copy0 = st.copy_seconds();
  const double t0 = bench::now_seconds();
  const int seq = kv.add_sequence();
  const int64_t len = static_cast<int64_t>(prompt.size());
  int64_t done = kv.attach_prefix(seq, prompt, len - 1);
  r.cached = done;
  kv.reserve(seq, len);
  Batch b;
  std::vector<float> logits;
  while (done < len) {
    if (bench::now_seconds() - t0 > budget_s) {
      r.stopped = true;
      kv.commit(seq, prompt, len);  // registered, not computed
      break;
    }
    const int64_t n = std::min(chunk, len - done);
    b.clear();
    for (int64_t p = done; p < done + n; ++p) b.add(prompt[static_cast<size_t>(p)], seq, p, p + 1 == len);
    stack.forward(b, kv, logits);
    done += n;
    r.computed += n;
    kv.commit(seq, prompt, done);
  }
  r.ttft = bench::now_seconds() - t0;
  r.restored = kv.stats().restored_blocks - restored0;
  r.copy_s = st.copy_seconds() - copy0;
  kv.free_sequence(seq);
  return r;
}

// Takes every GPU block for a throwaway sequence: the cached ones are offloaded.
void evict_all(KvCache& kv, GpuKvStorage& st) {
  const int s = kv.add_sequence();
  kv.reserve(s, kv.free_blocks() * kv.block_size());
  kv.free_sequence(s);  // never committed: plain free blocks
  st.synchronize();     // the offloads happen in earlier steps in a server
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(numa::NodePools& pools, int64_t layers, const std::vector<int64_t>& prefixes, int64_t chunk, int64_t tail, int reps, double budget) {
  numa::ThreadPool& pool = pools.pool(0);
  const auto model = bench::make_qwen3_30b_a3b(layers, pool);
  const ModelConfig& c = model->config();
  std::printf("synthetic Qwen3-30B-A3B: %lld layers, %.1f GB of random bf16 weights made in %.1f s\n", static_cast<long long>(layers),
              static_cast<double>(model->bytes()) / 1e9, model->build_seconds());
  const double t0 = bench::now_seconds();
  std::vector<bool> resident(static_cast<size_t>(layers), true);
  GpuRuntimeOptions ro;
  ro.resident = resident;
  const auto runtime = GpuRuntime::from_lookup(c, model->get(), pools, ro);
  GpuRuntime& stack = *runtime;
  std::printf("GpuRuntime: all %lld MoE layers resident, %.1f GB of weights on the GPU, uploaded in %.1f s\n", static_cast<long long>(layers),
              static_cast<double>(stack.weight_bytes()) / 1e9, bench::now_seconds() - t0);
  const int64_t bs = 16, kvw = c.num_key_value_heads * c.head_dim;
  const KvLayout layout{c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
  std::mt19937_64 rng(17);
  auto tokens = [&](int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.vocab_size));
    return t;
  };
  std::printf("\n| prefix | case | TTFT ms (median of n) | n | prompt tokens computed | blocks restored | restore copy ms | restore GB/s | x faster than cold |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t P : prefixes) {
    const int64_t blocks = (P + 2 * tail) / bs + 4, host_blocks = P / bs + 8;
    KvCache kv(layout, blocks, bs, KvCacheOptions{true, 1, host_blocks},
               std::make_unique<GpuKvStorage>(layers, blocks, bs, kvw, kvw, host_blocks));
    auto& st = gpu_kv_storage(kv, kvw, kvw);
    const double block_bytes = static_cast<double>(st.bytes_per_block());
    std::fprintf(stderr, "prefix %lld: GPU pool %lld blocks, host pool %lld blocks (%.2f GB pinned)\n", static_cast<long long>(P),
                 static_cast<long long>(blocks), static_cast<long long>(host_blocks), host_blocks * block_bytes / 1e9);
    // Warm-up: a short unrelated prompt (cuBLAS, scratch growth), then its blocks are evicted.
    run_request(stack, kv, st, tokens(std::min<int64_t>(chunk, P) + tail), chunk, 1e9);
    evict_all(kv, st);
    const auto prefix = tokens(P);
    auto prompt = [&] {
      auto p = prefix;
      const auto t = tokens(tail);
      p.insert(p.end(), t.begin(), t.end());
      return p;
    };
    const Request cold = run_request(stack, kv, st, prompt(), chunk, budget);
    std::vector<double> gpu_t, host_t, host_copy;
    int64_t gpu_cached = 0, host_cached = 0, host_restored = 0, host_computed = 0;
    for (int i = 0; i < reps; ++i) {
      const Request g = run_request(stack, kv, st, prompt(), chunk, 1e9);
      gpu_t.push_back(g.ttft);
      gpu_cached = g.cached;
    }
    for (int i = 0; i < reps; ++i) {
      evict_all(kv, st);
      const Request h = run_request(stack, kv, st, prompt(), chunk, 1e9);
      host_t.push_back(h.ttft);
      host_copy.push_back(h.copy_s);
      host_cached = h.cached;
      host_restored = h.restored;
      host_computed = h.computed;
    }
    const double gm = median(gpu_t), hm = median(host_t), hc = median(host_copy);
    if (cold.stopped)
      std::printf("| %lld | cold (stopped at the %.0f s budget after %lld of %lld tokens) | > %.0f | 1 | %lld | 0 | - | - | - |\n", static_cast<long long>(P),
                  budget, static_cast<long long>(cold.computed), static_cast<long long>(P + tail), cold.ttft * 1e3,
                  static_cast<long long>(cold.computed));
    else
      std::printf("| %lld | cold (chunks of %lld) | %.1f | 1 | %lld | 0 | - | - | 1.0 |\n", static_cast<long long>(P), static_cast<long long>(chunk),
                  cold.ttft * 1e3, static_cast<long long>(cold.computed));
    const char* gt = cold.stopped ? ">" : "";
    std::printf("| %lld | GPU hit (%lld cached) | %.1f | %d | %lld | 0 | - | - | %s%.1f |\n", static_cast<long long>(P),
                static_cast<long long>(gpu_cached), gm * 1e3, reps, static_cast<long long>(P + tail - gpu_cached), gt, cold.ttft / gm);
    std::printf("| %lld | host-pool hit (%lld restored) | %.1f | %d | %lld | %lld | %.1f | %.1f | %s%.1f |\n", static_cast<long long>(P),
                static_cast<long long>(host_cached), hm * 1e3, reps, static_cast<long long>(host_computed), static_cast<long long>(host_restored),
                hc * 1e3, hc > 0 ? host_restored * block_bytes / hc / 1e9 : 0.0, gt, cold.ttft / hm);
    std::fflush(stdout);
    std::fprintf(stderr, "prefix %lld: GPU hits ms:", static_cast<long long>(P));
    for (double t : gpu_t) std::fprintf(stderr, " %.1f", t * 1e3);
    std::fprintf(stderr, "; host hits ms:");
    for (double t : host_t) std::fprintf(stderr, " %.1f", t * 1e3);
    std::fprintf(stderr, "; 2-D copies issued so far %lld\n", static_cast<long long>(st.copy_calls()));
  }
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(std::stoll(x));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 48, chunk = 2048, tail = 32;
  int reps = 3;
  double budget = 150;
  std::vector<int64_t> prefixes = {8192, 32768};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--quick") {
      layers = 4;
      prefixes = {2048, 8192};
    } else if (a == "--layers" && more) layers = std::atoll(argv[++i]);
    else if (a == "--prefixes" && more) prefixes = parse_list(argv[++i]);
    else if (a == "--chunk" && more) chunk = std::atoll(argv[++i]);
    else if (a == "--tail" && more) tail = std::atoll(argv[++i]);
    else if (a == "--reps" && more) reps = std::atoi(argv[++i]);
    else if (a == "--cold-budget" && more) budget = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "bench_prefix_cache: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (layers < 1 || chunk < 1 || tail < 1 || reps < 1 || prefixes.empty()) {
    std::fprintf(stderr, "bench_prefix_cache: --layers, --chunk, --tail, --reps must be >= 1\n");
    return 2;
  }
  std::printf("%s\n", gpu::describe().c_str());
  if (gpu::device_count() == 0) {
    std::printf("SKIP: no CUDA device; nothing to measure\n");
    return 0;
  }
  try {
    numa::PoolOptions popt;
    numa::NodePools pools(popt);
    run(pools, layers, prefixes, chunk, tail, reps, budget);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_prefix_cache: %s\n", e.what());
    return 1;
  }
  return 0;
}
