#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace hmoe::server {

void Histogram::observe(double s) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  ++counts_[i];
  sum_ += s;
  ++n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lk(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  char buf[64];
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cum += counts_[i];
    std::snprintf(buf, sizeof buf, "%g", kBounds[i]);
    out += name + "_bucket{le=\"" + buf + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_[kBounds.size()];
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  std::snprintf(buf, sizeof buf, "%.6f", sum_);
  out += name + "_sum " + buf + "\n" + name + "_count " + std::to_string(n_) + "\n";
}

std::string route_label(std::string_view path) {
  static constexpr std::string_view kRoutes[] = {"/health", "/metrics", "/tokenize", "/detokenize", "/v1/models",
                                                 "/v1/chat/completions", "/v1/completions", "/v1/responses"};
  for (std::string_view r : kRoutes)
    if (path == r) return std::string(r);
  if (path.starts_with("/v1/models/")) return "/v1/models/{id}";
  if (path.starts_with("/v1/responses/")) return "/v1/responses/{id}";
  return "other";
}

std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Metrics::request_done(const std::string& endpoint, int status) {
  std::string label = route_label(endpoint);
  if (status < 100 || status > 599) status = 0;
  std::lock_guard lk(mu_);
  ++requests_[{std::move(label), status}];
}

namespace {

// The PLE n-gram table of an Engram model: totals, then per module (label
// module="0", ... in layer order) the figures that say whether its reads
// are hidden (--ple-ram-modules keeps a module's table in memory).
void render_ple(std::string& out, const PleTotals& p) {
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  const std::string backend = "backend=\"" + p.backend + "\"";
  struct Row {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const io::PleStats&);
  };
  static const Row rows[] = {
      {"hmoe_ple_rows_requested_total", "counter", "PLE table rows asked for, duplicates included", [](const io::PleStats& s) { return static_cast<double>(s.rows_requested); }},
      {"hmoe_ple_rows_distinct_total", "counter", "Distinct PLE table rows among them (per step and module)", [](const io::PleStats& s) { return static_cast<double>(s.rows_unique); }},
      {"hmoe_ple_rows_cached_total", "counter", "Distinct rows served from the PLE row cache instead of read", [](const io::PleStats& s) { return static_cast<double>(s.rows_cached); }},
      {"hmoe_ple_reads_total", "counter", "Read requests issued to the PLE table file (pages advised, for mmap)", [](const io::PleStats& s) { return static_cast<double>(s.reads); }},
      {"hmoe_ple_read_bytes_total", "counter", "Bytes those reads covered", [](const io::PleStats& s) { return static_cast<double>(s.bytes_read); }},
      {"hmoe_ple_io_wait_seconds_total", "counter", "Time forward steps sat blocked waiting for PLE rows", [](const io::PleStats& s) { return static_cast<double>(s.wait_ns) * 1e-9; }},
      {"hmoe_ple_io_seconds_total", "counter", "Time PLE reads were in flight (submit to last completion)", [](const io::PleStats& s) { return static_cast<double>(s.io_ns) * 1e-9; }},
      {"hmoe_ple_issue_seconds_total", "counter", "Of that, time from submit until the last read was handed to the kernel", [](const io::PleStats& s) { return static_cast<double>(s.issue_ns) * 1e-9; }},
      {"hmoe_ple_waits_total", "counter", "PLE row waits (one per module and forward step)", [](const io::PleStats& s) { return static_cast<double>(s.steps); }},
  };
  for (const Row& r : rows) {
    head(r.name, r.type, r.help);
    out += std::string(r.name) + "{" + backend + "} " + num(r.get(p.all)) + "\n";
    for (size_t m = 0; m < p.modules.size(); ++m)
      out += std::string(r.name) + "{" + backend + ",module=\"" + std::to_string(m) + "\"} " + num(r.get(p.modules[m])) + "\n";
  }
  head("hmoe_ple_hidden_fraction", "gauge", "Share of PLE read time overlapped with compute (1 - wait / in flight)");
  out += "hmoe_ple_hidden_fraction{" + backend + "} " + num(p.all.hidden_fraction()) + "\n";
  for (size_t m = 0; m < p.modules.size(); ++m)
    out += "hmoe_ple_hidden_fraction{" + backend + ",module=\"" + std::to_string(m) + "\"} " + num(p.modules[m].hidden_fraction()) + "\n";
  head("hmoe_ple_module_in_ram", "gauge", "1 when the module's PLE table is kept in memory (ram backend or --ple-ram-modules)");
  for (size_t m = 0; m < p.in_ram.size(); ++m)
    out += "hmoe_ple_module_in_ram{" + backend + ",module=\"" + std::to_string(m) + "\"} " + (p.in_ram[m] ? "1" : "0") + "\n";
}

}  // namespace

std::string Metrics::render(const SchedulerStats& s, int64_t open_connections) const {
  std::string out;
  out += "# HELP hmoe_requests_total HTTP requests answered, by endpoint and status\n# TYPE hmoe_requests_total counter\n";
  {
    std::lock_guard lk(mu_);
    for (const auto& [k, v] : requests_)
      out += "hmoe_requests_total{endpoint=\"" + escape_label(k.first) + "\",status=\"" + std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  }
  auto gauge = [&](const char* name, const char* type, const char* help, int64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + std::to_string(v) + "\n";
  };
  gauge("hmoe_prompt_tokens_total", "counter", "Prompt tokens of finished requests", prompt_tokens_.load());
  gauge("hmoe_generation_tokens_total", "counter", "Generated tokens of finished requests", generated_tokens_.load());
  gauge("hmoe_prompt_tokens_cached_total", "counter", "Prompt tokens of finished requests served from the prefix cache", cached_prompt_tokens_.load());
  gauge("hmoe_num_requests_running", "gauge", "Sequences in the running batch", s.running);
  gauge("hmoe_num_requests_waiting", "gauge", "Requests waiting for a running slot", s.queued);
  gauge("hmoe_kv_blocks_used", "gauge", "KV cache blocks in use", s.kv_blocks_used);
  gauge("hmoe_kv_blocks_total", "gauge", "KV cache blocks in total", s.kv_blocks_total);
  gauge("hmoe_engine_steps_total", "counter", "Forward steps run by the engine", s.steps);
  gauge("hmoe_engine_batched_tokens_total", "counter", "Tokens processed by forward steps", s.batched_tokens);
  gauge("hmoe_preemptions_total", "counter", "Sequences preempted for lack of KV blocks", s.preemptions);
  {
    const KvCacheStats& k = s.kv;
    gauge("hmoe_prefix_cache_enabled", "gauge", "1 when prefix caching is on", s.prefix_caching ? 1 : 0);
    gauge("hmoe_prefix_cache_queries_total", "counter", "Prefix cache lookups (one per admitted sequence)", k.queries);
    gauge("hmoe_prefix_cache_hits_total", "counter", "Prefix cache lookups that reused at least one block", k.hits);
    gauge("hmoe_prefix_cache_queried_tokens_total", "counter", "Tokens looked up in the prefix cache", k.queried_tokens);
    gauge("hmoe_prefix_cache_hit_tokens_total", "counter", "Tokens reused from first-tier KV blocks", k.hit_tokens);
    gauge("hmoe_prefix_cache_host_hit_tokens_total", "counter", "Tokens restored from the host KV tier", k.host_hit_tokens);
    auto rate = [&](const char* name, const char* help, int64_t hit) {
      char v[64];
      std::snprintf(v, sizeof v, "%.6f", k.queried_tokens ? static_cast<double>(hit) / static_cast<double>(k.queried_tokens) : 0.0);
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + v + "\n";
    };
    rate("hmoe_prefix_cache_hit_rate", "First-tier hit tokens / queried tokens", k.hit_tokens);
    rate("hmoe_prefix_cache_host_hit_rate", "Host-tier hit tokens / queried tokens", k.host_hit_tokens);
    gauge("hmoe_kv_cached_free_blocks_evicted_total", "counter", "Cached unreferenced first-tier blocks taken for new data (LRU)", k.evictions);
    gauge("hmoe_kv_host_blocks_total", "gauge", "Blocks of the host KV tier", s.kv_host_blocks_total);
    gauge("hmoe_kv_host_blocks_used", "gauge", "Host KV tier blocks holding a cached block", k.host_used);
    gauge("hmoe_kv_offloaded_blocks_total", "counter", "Blocks copied from the first tier to the host tier", k.offloaded_blocks);
    gauge("hmoe_kv_offloaded_bytes_total", "counter", "Bytes copied from the first tier to the host tier", k.offloaded_bytes);
    gauge("hmoe_kv_restored_blocks_total", "counter", "Blocks copied back from the host tier instead of recomputed", k.restored_blocks);
    gauge("hmoe_kv_restored_bytes_total", "counter", "Bytes copied back from the host tier", k.restored_bytes);
    gauge("hmoe_kv_host_dropped_blocks_total", "counter", "Host tier blocks dropped (LRU) for room", k.host_dropped);
    gauge("hmoe_prefix_cache_state_snapshots_taken_total", "counter", "Hybrid models: recurrent-state snapshots written at block boundaries", k.snapshots_taken);
    gauge("hmoe_prefix_cache_state_snapshots_restored_total", "counter", "Hybrid models: prefix hits that restored a state snapshot", k.snapshots_restored);
    gauge("hmoe_prefix_cache_state_snapshots_dropped_total", "counter", "Hybrid models: snapshots dropped (pool full, or their block evicted)", k.snapshots_dropped);
    gauge("hmoe_prefix_cache_state_snapshots_held", "gauge", "Hybrid models: snapshot slots holding one now", k.snapshots_held);
    gauge("hmoe_prefix_cache_snapshot_short_tokens_total", "counter", "Hybrid models: matched tokens recomputed for want of a snapshot at their end", k.snapshot_short_tokens);
  }
  gauge("hmoe_spec_draft_tokens_total", "counter", "Speculative decoding: tokens drafted by the MTP head and verified", s.spec_drafted);
  gauge("hmoe_spec_accepted_tokens_total", "counter", "Speculative decoding: drafted tokens accepted", s.spec_accepted);
  {
    const StreamTotals& x = s.stream;  // GPU expert streaming of big passes (gpu/README.md)
    auto real = [&](const char* name, const char* type, const char* help, double v) {
      char b[64];
      std::snprintf(b, sizeof b, "%.6g", v);
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + b + "\n";
    };
    const double layer_passes = static_cast<double>(x.passes * x.layers);
    gauge("hmoe_gpu_stream_passes_total", "counter", "Forward passes whose non-resident MoE layers streamed their experts to the GPU", x.passes);
    gauge("hmoe_gpu_stream_layers", "gauge", "MoE layers streamed per such pass", x.layers);
    gauge("hmoe_gpu_stream_bytes_total", "counter", "Expert bytes copied host to device by the streamed passes", static_cast<int64_t>(x.bytes));
    real("hmoe_gpu_stream_copy_seconds_total", "counter", "Copy-stream time of the expert copies", x.copy_s);
    real("hmoe_gpu_stream_compute_seconds_total", "counter", "GPU time of the streamed layers' expert products", x.compute_s);
    real("hmoe_gpu_stream_stall_seconds_total", "counter", "Time the step waited for expert copies", x.stall_s);
    real("hmoe_gpu_stream_bytes_per_layer", "gauge", "Mean bytes copied per streamed layer", layer_passes > 0 ? static_cast<double>(x.bytes) / layer_passes : 0);
    real("hmoe_gpu_stream_copy_seconds_per_layer", "gauge", "Mean copy time per streamed layer", layer_passes > 0 ? x.copy_s / layer_passes : 0);
    real("hmoe_gpu_stream_h2d_bytes_per_second", "gauge", "Achieved host-to-device bandwidth of the expert copies", x.copy_s > 0 ? static_cast<double>(x.bytes) / x.copy_s : 0);
    real("hmoe_gpu_stream_pinned_bytes_per_second", "gauge", "Pinned host-to-device bandwidth measured at load", x.pinned_bandwidth);
    real("hmoe_gpu_stream_copy_hidden_fraction", "gauge", "Fraction of copy time hidden under compute (1 - stall / copy)",
         x.copy_s > 0 ? std::max(0.0, 1.0 - x.stall_s / x.copy_s) : 0);
  }
  {  // split decode / GPU expert cache of host layers (engine/layers/gpu_expert_cache.h); zero when off
    const ExpertCacheTotals& x = s.expert_cache;
    gauge("hmoe_gpu_expert_cache_enabled", "gauge", "1 when decode steps split host layers' experts with the GPU (--gpu-expert-cache)", x.present ? 1 : 0);
    gauge("hmoe_gpu_expert_cache_hits_total", "counter", "Routed experts of host MoE layers found in the GPU expert cache (decode steps)", x.hits);
    gauge("hmoe_gpu_expert_cache_misses_total", "counter", "Routed experts of host MoE layers not in the cache (copied, or run on the CPU)", x.misses);
    gauge("hmoe_gpu_expert_cache_admissions_total", "counter", "Experts copied into a cache slot", x.admitted);
    gauge("hmoe_gpu_expert_cache_evictions_total", "counter", "Slots taken from another expert (the victim of --gpu-expert-cache-policy)", x.evictions);
    gauge("hmoe_gpu_expert_cache_bytes_moved_total", "counter", "Expert bytes copied host to device into cache slots", static_cast<int64_t>(x.bytes));
    gauge("hmoe_gpu_expert_cache_gpu_pairs_total", "counter", "Routed (token, expert) pairs of host layers run on the GPU", x.gpu_pairs);
    gauge("hmoe_gpu_expert_cache_cpu_pairs_total", "counter", "Routed (token, expert) pairs of host layers run on the CPU", x.cpu_pairs);
    gauge("hmoe_gpu_expert_cache_slots", "gauge", "Expert slots of the cache", x.slots);
    gauge("hmoe_gpu_expert_cache_slots_used", "gauge", "Slots holding an expert", x.slots_used);
    gauge("hmoe_gpu_expert_cache_device_bytes", "gauge", "VRAM of the cache's slots and scratch", static_cast<int64_t>(x.device_bytes));
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", x.copy_s);
    out += std::string("# HELP hmoe_gpu_expert_cache_copy_seconds_total Copy-stream time of the batched expert copies\n# TYPE "
                       "hmoe_gpu_expert_cache_copy_seconds_total counter\nhmoe_gpu_expert_cache_copy_seconds_total ") + b + "\n";
  }
  if (const PleTotals& p = s.ple; p.present) render_ple(out, p);
  gauge("hmoe_open_connections", "gauge", "Open HTTP connections", open_connections);
  ttft.render(out, "hmoe_time_to_first_token_seconds", "Time from request arrival to its first generated token");
  tpot.render(out, "hmoe_time_per_output_token_seconds", "Time between consecutive generated tokens of a request");
  e2e.render(out, "hmoe_e2e_request_latency_seconds", "Time from request arrival to its last token");
  return out;
}

}  // namespace hmoe::server
