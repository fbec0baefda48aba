#include "server/metrics.h"

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

void Metrics::request_done(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

std::string Metrics::render(const SchedulerStats& s, int64_t open_connections) const {
  std::string out;
  out += "# HELP hmoe_requests_total HTTP requests answered, by endpoint and status\n# TYPE hmoe_requests_total counter\n";
  {
    std::lock_guard lk(mu_);
    for (const auto& [k, v] : requests_)
      out += "hmoe_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " + std::to_string(v) + "\n";
  }
  auto gauge = [&](const char* name, const char* type, const char* help, int64_t v) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + std::to_string(v) + "\n";
  };
  gauge("hmoe_prompt_tokens_total", "counter", "Prompt tokens of finished requests", prompt_tokens_.load());
  gauge("hmoe_generation_tokens_total", "counter", "Generated tokens of finished requests", generated_tokens_.load());
  gauge("hmoe_num_requests_running", "gauge", "Sequences in the running batch", s.running);
  gauge("hmoe_num_requests_waiting", "gauge", "Requests waiting for a running slot", s.queued);
  gauge("hmoe_kv_blocks_used", "gauge", "KV cache blocks in use", s.kv_blocks_used);
  gauge("hmoe_kv_blocks_total", "gauge", "KV cache blocks in total", s.kv_blocks_total);
  gauge("hmoe_engine_steps_total", "counter", "Forward steps run by the engine", s.steps);
  gauge("hmoe_engine_batched_tokens_total", "counter", "Tokens processed by forward steps", s.batched_tokens);
  gauge("hmoe_preemptions_total", "counter", "Sequences preempted for lack of KV blocks", s.preemptions);
  gauge("hmoe_open_connections", "gauge", "Open HTTP connections", open_connections);
  ttft.render(out, "hmoe_time_to_first_token_seconds", "Time from request arrival to its first generated token");
  tpot.render(out, "hmoe_time_per_output_token_seconds", "Time between consecutive generated tokens of a request");
  e2e.render(out, "hmoe_e2e_request_latency_seconds", "Time from request arrival to its last token");
  return out;
}

}  // namespace hmoe::server
