// hmoe bench MODEL (contract and exact definitions in bench_model.h).
#include "tools/hmoe/bench_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "configs/error.h"
#include "engine/layers/routing_trace.h"
#include "engine/loading/model.h"
#include "engine/placement/prefill_cost.h"
#include "engine/placement/placement.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/runtime/segment_graphs.h"
#include "gpu/memory.h"
#include "gpu/quant.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {

struct Options {
  std::vector<int64_t> prompts, gens, depths, batches;
  int64_t reps = 3;
  bool json = false;
  bool breakdown = false;  // --decode-breakdown
  std::string model;
  std::string replay;      // --routing-replay FILE
};

std::vector<int64_t> parse_list(const std::string& flag, const std::string& s, int64_t lo, int64_t hi) {
  std::vector<int64_t> v = parse_id_list(flag, s);
  for (int64_t x : v)
    if (x < lo || x > hi)
      fail(ErrorKind::invalid_argument, flag + ": " + std::to_string(x) + " is out of range (" + std::to_string(lo) + ".." + std::to_string(hi) + ")");
  return v;
}

// Takes the first of several spellings of one option ("-p", "--n-prompt").
bool take_any(std::vector<std::string>& args, std::initializer_list<const char*> names, std::string& value, std::string& used) {
  bool found = false;
  for (const char* n : names) {
    std::string v;
    if (take_option(args, n, v)) {
      if (found) fail(ErrorKind::invalid_argument, std::string(n) + ": given twice (also as " + used + ")");
      found = true;
      value = v;
      used = n;
    }
  }
  return found;
}

Options parse_options(std::vector<std::string>& args) {
  Options o;
  std::string p = "512,4096", n = "64", d = "0", b = "1,8", r = "3", used;
  take_any(args, {"-p", "--n-prompt"}, p, used);
  take_any(args, {"-n", "--n-gen"}, n, used);
  take_any(args, {"-d", "--n-depth"}, d, used);
  take_any(args, {"--batch"}, b, used);
  take_any(args, {"-r", "--repetitions"}, r, used);
  o.json = take_flag(args, "--json");
  o.breakdown = take_flag(args, "--decode-breakdown");
  take_option(args, "--routing-replay", o.replay);
  reject_unknown_flags(args, "bench");
  if (args.size() != 1)
    fail(ErrorKind::invalid_argument, "bench takes one MODEL (a model directory or .gguf file), or 'experts' or 'disk'; got " +
                                          std::to_string(args.size()) + " positional arguments");
  o.model = args[0];
  constexpr int64_t kMaxTokens = int64_t{1} << 20;
  o.prompts = parse_list("-p/--n-prompt", p, 0, kMaxTokens);
  o.gens = parse_list("-n/--n-gen", n, 0, kMaxTokens);
  o.depths = parse_list("-d/--n-depth", d, 0, kMaxTokens);
  o.batches = parse_list("--batch", b, 1, 1024);
  o.reps = parse_int("-r/--repetitions", r);
  if (o.reps < 1 || o.reps > 1000) fail(ErrorKind::invalid_argument, "-r/--repetitions must be in 1..1000, got " + r);
  std::erase(o.prompts, 0);  // 0 = no prefill test, as in llama-bench
  std::erase(o.gens, 0);
  if (o.prompts.empty() && o.gens.empty()) fail(ErrorKind::invalid_argument, "nothing to measure: -p and -n are both 0");
  return o;
}

struct Sample {
  double seconds = 0;
  GpuStepTimes times;        // zero on the CPU path
  ExpertStreamStats stream;  // prefill streaming of host experts (passes 0: none streamed)
  GpuExpertCacheStats cache; // split decode / GPU expert cache (steps 0: none split)
};

struct Result {
  std::string kind;  // "prefill" or "decode"
  int64_t prompt = 0, gen = 0, depth = 0, batch = 1;
  std::vector<Sample> samples;
  // Decode on the GPU: the graphs and kernels of the last step replayed, and
  // the weight bytes a step reads (GpuRuntime::decode_weight_bytes).
  size_t graphs = 0;
  std::vector<std::string> kernels;
  double step_weight_bytes = 0;
  int64_t tokens() const { return kind == "prefill" ? prompt : gen * batch; }
  std::string name() const {
    std::string t = kind == "prefill" ? "pp" + std::to_string(prompt) : "tg" + std::to_string(gen);
    if (depth > 0) t += " @ d" + std::to_string(depth);
    return t;
  }
  std::vector<double> rates() const {
    std::vector<double> r;
    for (const auto& s : samples) r.push_back(static_cast<double>(tokens()) / s.seconds);
    return r;
  }
  double mean() const {
    const auto r = rates();
    double m = 0;
    for (double x : r) m += x;
    return m / static_cast<double>(r.size());
  }
  double sd() const {
    const auto r = rates();
    if (r.size() < 2) return 0;
    const double m = mean();
    double v = 0;
    for (double x : r) v += (x - m) * (x - m);
    return std::sqrt(v / static_cast<double>(r.size() - 1));
  }
  double wall() const {
    double w = 0;
    for (const auto& s : samples) w += s.seconds;
    return w;
  }
  GpuStepTimes summed() const {
    GpuStepTimes t;
    for (const auto& s : samples) {
      t.total_s += s.times.total_s;
      t.cpu_experts_s += s.times.cpu_experts_s;
      t.transfer_s += s.times.transfer_s;
      t.steps += s.times.steps;
      t.zero_copy_steps += s.times.zero_copy_steps;
      t.cold_bytes += s.times.cold_bytes;
    }
    return t;
  }
  GpuExpertCacheStats cached() const {
    GpuExpertCacheStats t;
    for (const auto& s : samples) {
      const ExpertCacheCounters& a = s.cache.c;
      t.c.hits += a.hits;
      t.c.misses += a.misses;
      t.c.admitted += a.admitted;
      t.c.streamed += a.streamed;
      t.c.evictions += a.evictions;
      t.c.bytes += a.bytes;
      t.c.gpu_pairs += a.gpu_pairs;
      t.c.cpu_pairs += a.cpu_pairs;
      t.steps += s.cache.steps;
      t.copy_s += s.cache.copy_s;
      t.slots = s.cache.slots;
      t.device_bytes = s.cache.device_bytes;
      t.pcie_bandwidth = s.cache.pcie_bandwidth;
      t.host_bandwidth = s.cache.host_bandwidth;
    }
    return t;
  }
  ExpertStreamStats streamed() const {
    ExpertStreamStats t;
    for (const auto& s : samples) {
      t.passes += s.stream.passes;
      t.bytes += s.stream.bytes;
      t.copy_s += s.stream.copy_s;
      t.compute_s += s.stream.compute_s;
      t.stall_s += s.stream.stall_s;
      t.pinned_bandwidth = s.stream.pinned_bandwidth;
    }
    return t;
  }
};

class Bench {
 public:
  Bench(Model& m, const Settings& s) : m_(m), s_(s), rng_(static_cast<uint64_t>(s.seed)) {}

  Result prefill(int64_t prompt, int64_t depth, int64_t reps) {
    Result r{"prefill", prompt, 0, depth, 1, {}, 0, {}, 0};
    KvCache kv(m_.kv_layout(), blocks_for(1, depth + prompt), block_);
    int seq = kv.add_sequence();
    kv.reserve(seq, depth + prompt);
    run_prompt(kv, seq, 0, depth);
    for (int64_t i = 0; i <= reps; ++i) {  // i == 0: warm-up
      if (i > 0) rewind(kv, seq, depth, depth + prompt);
      begin();
      run_prompt(kv, seq, depth, prompt);
      Sample smp = end();
      if (i > 0) r.samples.push_back(smp);
    }
    return r;
  }

  Result decode(int64_t gen, int64_t depth, int64_t batch, int64_t reps) {
    Result r{"decode", 0, gen, depth, batch, {}, 0, {}, 0};
    KvCache kv(m_.kv_layout(), blocks_for(batch, depth + gen), block_);
    std::vector<int> seqs;
    for (int64_t b = 0; b < batch; ++b) {
      seqs.push_back(kv.add_sequence());
      kv.reserve(seqs.back(), depth + gen);
      run_prompt(kv, seqs.back(), 0, depth);
    }
    Batch step;
    for (int64_t i = 0; i <= reps; ++i) {
      if (i > 0)
        for (int& q : seqs) rewind(kv, q, depth, depth + gen);
      begin();
      for (int64_t t = 0; t < gen; ++t) {
        step.clear();
        for (int q : seqs) step.add(token(), q, depth + t, true);
        m_.forward(step, kv, logits_);
      }
      Sample smp = end();
      if (i > 0) r.samples.push_back(smp);
    }
    if (GpuRuntime* g = m_.gpu()) {
      r.graphs = g->last_step_graphs();
      r.kernels = g->last_step_kernels();
      r.step_weight_bytes = g->decode_weight_bytes(batch);
    }
    return r;
  }

  int64_t chunk() const { return chunk_; }

 private:
  int64_t blocks_for(int64_t seqs, int64_t tokens) const { return seqs * ((tokens + block_ - 1) / block_) + 1; }
  int32_t token() { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(m_.config().vocab_size)); }

  // Back to the first `depth` positions of seq, room for `len`. Per-sequence
  // state (Gated DeltaNet's recurrent state, Engram windows) cannot be cut
  // back: such a sequence starts over (new id, zero state) and its depth
  // prefix runs again, untimed.
  void rewind(KvCache& kv, int& seq, int64_t depth, int64_t len) {
    if (m_.kv_layout().seq_state_bytes == 0) {
      kv.truncate(seq, depth);
      kv.reserve(seq, len);
      return;
    }
    kv.free_sequence(seq);
    seq = kv.add_sequence();
    kv.reserve(seq, len);
    run_prompt(kv, seq, 0, depth);
  }
  // Positions [from, from + n) of seq with random ids, in chunks of --max-num-batched-tokens;
  // logits for the last position only.
  void run_prompt(KvCache& kv, int seq, int64_t from, int64_t n) {
    Batch b;
    for (int64_t off = 0; off < n; off += chunk_) {
      const int64_t len = std::min(chunk_, n - off);
      b.clear();
      for (int64_t i = 0; i < len; ++i) b.add(token(), seq, from + off + i, off + i + 1 == n);
      m_.forward(b, kv, logits_);
    }
  }
  void begin() {
    if (m_.gpu()) m_.gpu()->reset_times();
    if (m_.gpu() && m_.gpu()->expert_stream()) m_.gpu()->expert_stream()->reset_stats();
    if (m_.gpu() && m_.gpu()->expert_cache()) m_.gpu()->expert_cache()->reset_stats();
    t0_ = std::chrono::steady_clock::now();
  }
  Sample end() {
    Sample smp;
    smp.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    if (m_.gpu()) smp.times = m_.gpu()->times();
    if (m_.gpu() && m_.gpu()->expert_stream()) smp.stream = m_.gpu()->expert_stream()->stats();
    if (m_.gpu() && m_.gpu()->expert_cache()) smp.cache = m_.gpu()->expert_cache()->stats();
    return smp;
  }

  Model& m_;
  const Settings& s_;
  int64_t block_ = s_.block_size;
  int64_t chunk_ = s_.max_num_batched_tokens;
  std::mt19937_64 rng_;
  std::vector<float> logits_;
  std::chrono::steady_clock::time_point t0_;
};

std::string share(double part, double whole) {
  if (whole <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * std::max(part, 0.0) / whole);
  return buf;
}

// The device's read bandwidth: gpu::read_probe over 1 GiB, the best of 3 after a warm-up.
double device_read_bandwidth() {
  gpu::Stream s;
  const size_t bytes = size_t{1} << 30;
  gpu::DeviceBuffer a(bytes), sink(64);
  gpu::memset_device(a.data(), 1, bytes, s);
  gpu::Event e0, e1;
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    e0.record(s);
    gpu::read_probe(a.data(), bytes, sink.as<uint32_t>(), s);
    e1.record(s);
    e1.synchronize();
    if (i > 0) best = std::max(best, static_cast<double>(bytes) / (e1.elapsed_ms(e0) * 1e-3));
  }
  return best;
}

// Per decode test: kernels per step (graph kernel nodes), per layer, step
// time, weights read per step and the bandwidth that makes; then which
// kernels a step launches.
void print_decode_breakdown(const std::vector<Result>& results, int64_t layers, double read_bw) {
  std::printf("\nDecode step breakdown (kernels: the kernel nodes of the CUDA graphs one step replays; weights: GPU weight bytes a step "
              "reads, routed experts expected under uniform routing; device read bandwidth %.0f GB/s, gpu::read_probe over 1 GiB):\n\n",
              read_bw / 1e9);
  std::printf("| test | batch | graphs | kernels per step | per layer | ms per step | weights MB per step | GB/s | of read bandwidth |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : results) {
    if (r.kind != "decode") continue;
    const double step_s = r.wall() / static_cast<double>(r.samples.size() * static_cast<size_t>(r.gen));
    const double gbs = r.step_weight_bytes / step_s;
    std::printf("| %s | %lld | %zu | %zu | %.1f | %.3f | %.1f | %.0f | %.0f%% |\n", r.name().c_str(), static_cast<long long>(r.batch), r.graphs,
                r.kernels.size(), static_cast<double>(r.kernels.size()) / static_cast<double>(std::max<int64_t>(layers, 1)), step_s * 1e3,
                r.step_weight_bytes / 1e6, gbs / 1e9, read_bw > 0 ? 100.0 * gbs / read_bw : 0.0);
  }
  for (const auto& r : results) {
    if (r.kind != "decode" || r.kernels.empty()) continue;
    std::map<std::string, int> count;
    std::vector<std::string> order;
    for (const auto& k : r.kernels) {
      const std::string n = kernel_short_name(k);
      if (count[n]++ == 0) order.push_back(n);
    }
    std::printf("\n%s batch %lld, kernels per step:", r.name().c_str(), static_cast<long long>(r.batch));
    for (const auto& n : order) std::printf(" %s x%d;", n.c_str(), count[n]);
    std::printf("\n");
  }
}

// Per layer: the attention and feed-forward parts of a decode step (plain
// launches, events between the parts), us per step, one column pair per batch.
void print_part_times(const std::vector<std::pair<int64_t, GpuPartTimes>>& parts) {
  if (parts.empty() || parts[0].second.steps == 0) return;
  std::printf("\nPer-layer device time of one decode step (us; launched plainly with an event between every two parts, so launch gaps are "
              "inside and the sum exceeds a graph step):\n\n| part |");
  for (const auto& [b, t] : parts) std::printf(" attention, batch %lld | feed-forward, batch %lld |", static_cast<long long>(b), static_cast<long long>(b));
  std::printf("\n|---|");
  for (size_t i = 0; i < parts.size(); ++i) std::printf("---|---|");
  std::printf("\n");
  auto per = [](const GpuPartTimes& t, double ms) { return 1e3 * ms / static_cast<double>(std::max<int64_t>(t.steps, 1)); };
  std::printf("| embedding |");
  for (const auto& [b, t] : parts) std::printf(" %.1f | |", per(t, t.embed_ms));
  std::printf("\n");
  for (size_t l = 0; l < parts[0].second.attn_ms.size(); ++l) {
    std::printf("| layer %zu |", l);
    for (const auto& [b, t] : parts) std::printf(" %.1f | %.1f |", per(t, t.attn_ms[l]), per(t, t.ffn_ms[l]));
    std::printf("\n");
  }
  std::printf("| tail (final norm, lm_head) |");
  for (const auto& [b, t] : parts) std::printf(" %.1f | |", per(t, t.tail_ms));
  std::printf("\n| step |");
  for (const auto& [b, t] : parts) {
    double sum = t.embed_ms + t.tail_ms;
    for (size_t l = 0; l < t.attn_ms.size(); ++l) sum += t.attn_ms[l] + t.ffn_ms[l];
    std::printf(" %.1f | |", per(t, sum));
  }
  std::printf("\n");
}

nlohmann::json result_json(const Result& r) {
  const GpuStepTimes t = r.summed();
  nlohmann::json samples_s = nlohmann::json::array(), samples_ts = nlohmann::json::array();
  for (const auto& s : r.samples) samples_s.push_back(s.seconds);
  for (double x : r.rates()) samples_ts.push_back(x);
  nlohmann::json j = {{"test", r.name()},
                      {"kind", r.kind},
                      {"n_prompt", r.prompt},
                      {"n_gen", r.gen},
                      {"n_depth", r.depth},
                      {"batch", r.batch},
                      {"context_start", r.depth},
                      {"context_end", r.depth + (r.kind == "prefill" ? r.prompt : r.gen)},
                      {"tokens", r.tokens()},
                      {"samples_s", samples_s},
                      {"samples_ts", samples_ts},
                      {"avg_ts", r.mean()},
                      {"stddev_ts", r.sd()},
                      {"wall_s", r.wall()}};
  if (r.kind == "decode" && r.step_weight_bytes > 0) {
    j["graphs_per_step"] = r.graphs;
    j["kernels_per_step"] = r.kernels.size();
    j["step_weight_bytes"] = r.step_weight_bytes;
  }
  if (t.steps > 0)
    j["gpu_times"] = {{"forward_s", t.total_s}, {"gpu_s", t.gpu_s()}, {"cpu_experts_s", t.cpu_experts_s}, {"transfer_s", t.transfer_s}, {"steps", t.steps},
                       {"zero_copy_steps", t.zero_copy_steps}};
  if (const ExpertStreamStats x = r.streamed(); x.passes > 0)
    j["expert_stream"] = {{"passes", x.passes},          {"bytes", x.bytes},       {"copy_s", x.copy_s},
                          {"compute_s", x.compute_s},    {"stall_s", x.stall_s},   {"achieved_bytes_per_s", x.achieved_bandwidth()},
                          {"pinned_bytes_per_s", x.pinned_bandwidth}, {"hidden_fraction", x.hidden_fraction()}};
  if (const GpuExpertCacheStats x = r.cached(); x.steps > 0)
    j["split_decode"] = {{"layer_steps", x.steps},       {"gpu_pairs", x.c.gpu_pairs},   {"cpu_pairs", x.c.cpu_pairs},     {"gpu_share", x.gpu_share()},
                         {"cache_hits", x.c.hits},      {"cache_misses", x.c.misses},   {"hit_rate", x.c.hit_rate()},     {"evictions", x.c.evictions},
                         {"bytes", x.c.bytes},          {"copy_s", x.copy_s},           {"achieved_bytes_per_s", x.achieved_bandwidth()},
                         {"slots", x.slots},            {"device_bytes", x.device_bytes}, {"pcie_bytes_per_s", x.pcie_bandwidth},
                         {"host_bytes_per_s", x.host_bandwidth}};
  return j;
}

}  // namespace

int run_bench_model(const Settings& s, std::vector<std::string>& args) {
  const Options o = parse_options(args);

  auto model = Model::load(o.model, s);
  const ModelConfig& c = model->config();
  const int64_t ctx = s.max_model_len > 0 ? s.max_model_len : c.max_position_embeddings;
  const int64_t dmax = *std::max_element(o.depths.begin(), o.depths.end());
  int64_t longest = 0;
  for (int64_t p : o.prompts) longest = std::max(longest, p);
  for (int64_t n : o.gens) longest = std::max(longest, n);
  if (dmax + longest > ctx)
    fail(ErrorKind::invalid_argument, "depth " + std::to_string(dmax) + " + " + std::to_string(longest) + " tokens exceeds the context length " +
                                          std::to_string(ctx) + " (--max-model-len or the model's max_position_embeddings)");

  const bool on_gpu = model->gpu() != nullptr;
  RoutingTrace replay;
  if (!o.replay.empty()) {
    if (!on_gpu) fail(ErrorKind::invalid_argument, "--routing-replay: the model runs on the CPU; replay drives the GPU path's host layers");
    replay = read_routing_trace(o.replay);
    model->gpu()->set_routing_replay(&replay);
  }
  const uint64_t gpu_bytes = on_gpu ? model->gpu()->weight_bytes() : 0;
  const int threads = model->pool().size();
  std::string header = "hmoe bench " + o.model + ": " + std::to_string(c.num_hidden_layers) + " layers, " + std::to_string(c.num_experts) +
                       " experts (top-" + std::to_string(c.num_experts_per_tok) + "), weights " + format_bytes(static_cast<uint64_t>(model->weight_bytes())) +
                       "; device " + (on_gpu ? "cuda (" + format_bytes(gpu_bytes) + " of weights on the GPU, --gpu-resident-moe-layers " + s.gpu_resident_moe_layers + ")" : std::string("cpu")) +
                       "; --threads " + std::to_string(s.threads) + " (" + std::to_string(threads) + " in the main pool); prefill in chunks of " +
                       std::to_string(s.max_num_batched_tokens) + " tokens (--max-num-batched-tokens, as serve); KV blocks of " + std::to_string(s.block_size) +
                       "; random token ids (--seed " + std::to_string(s.seed) + "); " + std::to_string(o.reps) + " repetitions after one warm-up" +
                       (o.replay.empty() ? "" : "; host layers routed by the trace " + o.replay + " (--routing-replay)");
  const LoadReport& lr = model->load_report();
  char load_line[512];
  std::snprintf(load_line, sizeof load_line, "; loaded in %.2f s, host experts for GPU DMA: %s", lr.seconds, lr.host_residence.c_str());
  header += load_line;
  if (lr.host_residence == "copy") {
    std::snprintf(load_line, sizeof load_line, " (%s copied in %.2f s, %s registered in %.2f s, %s of file pages dropped)", format_bytes(lr.residence_copied_bytes).c_str(),
                  lr.residence_copy_s, format_bytes(lr.residence_registered_bytes).c_str(), lr.residence_register_s, format_bytes(lr.residence_dropped_bytes).c_str());
    header += load_line;
  }
  std::fprintf(stderr, "%s\n", header.c_str());

  Bench bench(*model, s);
  std::vector<Result> results;
  auto progress = [&](const Result& r) {
    std::fprintf(stderr, "hmoe bench: %s batch %lld: %.2f +- %.2f tok/s\n", r.name().c_str(), static_cast<long long>(r.batch), r.mean(), r.sd());
    if (const ExpertStreamStats x = r.streamed(); x.passes > 0)
      std::fprintf(stderr,
                   "hmoe bench:   streamed experts: %lld passes, %.2f GB copied in %.1f ms (%.1f GB/s; pinned H2D probe %.1f GB/s), expert products %.1f ms, "
                   "step stream waited %.1f ms (%.0f%% of the copies hidden)\n",
                   static_cast<long long>(x.passes), static_cast<double>(x.bytes) / 1e9, x.copy_s * 1e3, x.achieved_bandwidth() / 1e9,
                   x.pinned_bandwidth / 1e9, x.compute_s * 1e3, x.stall_s * 1e3, 100.0 * x.hidden_fraction());
    if (const GpuExpertCacheStats x = r.cached(); x.steps > 0)
      std::fprintf(stderr,
                   "hmoe bench:   split decode: routed pairs GPU %.1f%% / CPU %.1f%% (%lld / %lld), expert cache hit rate %.1f%% (%lld hits, %lld misses, %lld "
                   "admitted, %lld copied for one step only, %lld evictions; %lld slots, %s), %.2f GB copied in %.1f ms of copy stream (%.1f GB/s achieved; PCIe probe %.1f GB/s, host read %.1f GB/s)\n",
                   100.0 * x.gpu_share(), 100.0 * (1 - x.gpu_share()), static_cast<long long>(x.c.gpu_pairs), static_cast<long long>(x.c.cpu_pairs),
                   100.0 * x.c.hit_rate(), static_cast<long long>(x.c.hits), static_cast<long long>(x.c.misses), static_cast<long long>(x.c.admitted),
                   static_cast<long long>(x.c.streamed), static_cast<long long>(x.c.evictions),
                   static_cast<long long>(x.slots), format_bytes(x.device_bytes).c_str(), static_cast<double>(x.c.bytes) / 1e9, x.copy_s * 1e3,
                   x.achieved_bandwidth() / 1e9, x.pcie_bandwidth / 1e9, x.host_bandwidth / 1e9);
  };
  for (int64_t d : o.depths) {
    for (int64_t p : o.prompts) {
      results.push_back(bench.prefill(p, d, o.reps));
      progress(results.back());
    }
    for (int64_t n : o.gens)
      for (int64_t b : o.batches) {
        results.push_back(bench.decode(n, d, b, o.reps));
        progress(results.back());
      }
  }

  if (o.json) {
    nlohmann::json j = {{"model", o.model},
                        {"layers", c.num_hidden_layers},
                        {"experts", c.num_experts},
                        {"experts_per_token", c.num_experts_per_tok},
                        {"vocab", c.vocab_size},
                        {"weight_bytes", model->weight_bytes()},
                        {"device", on_gpu ? "cuda" : "cpu"},
                        {"gpu_weight_bytes", gpu_bytes},
                        {"gpu_resident_moe_layers", s.gpu_resident_moe_layers},
                        {"threads_setting", s.threads},
                        {"main_pool_threads", threads},
                        {"prefill_chunk", s.max_num_batched_tokens},
                        {"block_size", s.block_size},
                        {"seed", s.seed},
                        {"repetitions", o.reps},
                        {"warmup_runs", 1},
                        {"load_s", lr.seconds},
                        {"host_residence", lr.host_residence},
                        {"host_residence_why", lr.host_residence_why},
                        {"residence_copied_bytes", lr.residence_copied_bytes},
                        {"residence_copy_s", lr.residence_copy_s},
                        {"residence_registered_bytes", lr.residence_registered_bytes},
                        {"residence_register_s", lr.residence_register_s},
                        {"results", nlohmann::json::array()}};
    for (const auto& r : results) j["results"].push_back(result_json(r));
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("<!-- %s -->\n\n", header.c_str());
  std::printf("| test | batch | context | tok/s | +- sd | ms per %s | GPU | CPU experts | transfers |\n|---|---|---|---|---|---|---|---|---|\n",
              "prompt / step");
  for (const auto& r : results) {
    const GpuStepTimes t = r.summed();
    const double w = r.wall();
    const int64_t per = r.kind == "prefill" ? 1 : r.gen;
    const double ms = 1e3 * w / static_cast<double>(r.samples.size() * static_cast<size_t>(per));
    const bool split = on_gpu && t.steps > 0;
    std::printf("| %s | %lld | %lld-%lld | %.2f | %.2f | %.2f | %s | %s | %s |\n", r.name().c_str(), static_cast<long long>(r.batch),
                static_cast<long long>(r.depth), static_cast<long long>(r.depth + (r.kind == "prefill" ? r.prompt : r.gen)), r.mean(), r.sd(), ms,
                split ? share(t.gpu_s(), w).c_str() : "-", split ? share(t.cpu_experts_s, w).c_str() : "-", split ? share(t.transfer_s, w).c_str() : "-");
  }
  for (const auto& r : results)
    if (const GpuExpertCacheStats x = r.cached(); x.steps > 0)
      std::printf("\nsplit decode, %s batch %lld: routed pairs of host layers GPU %.1f%% / CPU %.1f%%, PCIe %.1f GB/s achieved (%.2f GB copied), "
                  "GPU expert cache hit rate %.1f%% (%lld slots, %s)",
                  r.name().c_str(), static_cast<long long>(r.batch), 100.0 * x.gpu_share(), 100.0 * (1 - x.gpu_share()), x.achieved_bandwidth() / 1e9,
                  static_cast<double>(x.c.bytes) / 1e9, 100.0 * x.c.hit_rate(), static_cast<long long>(x.slots), format_bytes(x.device_bytes).c_str());
  std::printf("\n");
  if (!on_gpu) std::printf("\nCPU path: no GPU/CPU split (all of the time is CPU work).\n");
  // How the GPU/CPU columns are measured, for the hand-off each test ran.
  for (const auto& r : results) {
    const GpuStepTimes t = r.summed();
    if (!on_gpu || t.steps == 0 || t.transfer_s <= 0) continue;
    const bool zc = t.zero_copy_steps > 0;
    std::printf("\n%s batch %lld: %s hand-off (%lld of %lld steps zero-copy), %.1f us per step in hand-offs: %s", r.name().c_str(),
                static_cast<long long>(r.batch), zc ? "zero-copy" : "copy", static_cast<long long>(t.zero_copy_steps), static_cast<long long>(t.steps),
                1e6 * t.transfer_s / static_cast<double>(t.steps),
                zc ? "transfers = the GPU's hand-off kernels (hidden states and routing into mapped host memory, the sums back) + the flags' "
                     "PCIe crossings (host-side interval between a release and the next ready, less the GPU's span between them); CPU experts = "
                     "host wall time in the experts; GPU = the rest (kernels, the GPU's spin reads)"
                   : "transfers = the hand-offs' copies (GPU events around them); CPU experts = host wall time in the experts; GPU = the rest "
                     "(kernels, launches, event waits)");
  }
  std::printf("\n");
  // The decode bound: per step, the cold bytes the CPU read (distinct host experts it ran) at the host's read
  // bandwidth plus the measured GPU work (step wall time less CPU experts and transfers).
  bool any_cold = false;
  for (const auto& r : results) any_cold = any_cold || (r.kind == "decode" && r.summed().cold_bytes > 0);
  if (on_gpu && any_cold) {
    const double dram = measure_host_read_bandwidth(&model->pool());
    std::printf("\nDecode bound (cold bytes / host DRAM read bandwidth %.1f GB/s, measured here, + GPU time per step as measured):\n\n"
                "| test | batch | tok/s | cold MB per step | DRAM ms | GPU ms | bound tok/s | of bound |\n|---|---|---|---|---|---|---|---|\n",
                dram / 1e9);
    for (const auto& r : results) {
      const GpuStepTimes t = r.summed();
      if (r.kind != "decode" || t.steps == 0) continue;
      const double cold = static_cast<double>(t.cold_bytes) / static_cast<double>(t.steps), dram_s = cold / dram,
                   gpu_s = t.gpu_s() / static_cast<double>(t.steps), bound = static_cast<double>(r.batch) / (dram_s + gpu_s);
      std::printf("| %s | %lld | %.2f | %.1f | %.2f | %.2f | %.1f | %.0f%% |\n", r.name().c_str(), static_cast<long long>(r.batch), r.mean(), cold / 1e6,
                  dram_s * 1e3, gpu_s * 1e3, bound, 100.0 * r.mean() / bound);
    }
  }
  if (on_gpu && o.breakdown) {
    print_decode_breakdown(results, c.num_hidden_layers, device_read_bandwidth());
    std::vector<std::pair<int64_t, GpuPartTimes>> parts;
    for (int64_t b : o.batches) {  // 8 steps after a short context, profiled as they run (no repetition recorded)
      model->gpu()->set_part_profile(true);
      bench.decode(8, 0, b, 0);
      parts.emplace_back(b, model->gpu()->part_times());
      model->gpu()->set_part_profile(false);
    }
    print_part_times(parts);
  }
  return 0;
}

}  // namespace hmoe::cli
