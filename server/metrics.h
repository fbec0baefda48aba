// Prometheus metrics of the server: requests by endpoint and status, prompt
// and generated tokens, time to first token and time per output token
// histograms, and (sampled at scrape time) running and queued sequences and
// KV blocks in use, and the PLE table counters of Engram models.
//
// Thread safety: every method may be called from any thread.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "engine/serving/scheduler.h"

namespace hmoe::server {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  void observe(double seconds);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::array<uint64_t, kBounds.size() + 1> counts_{};
  double sum_ = 0;
  uint64_t n_ = 0;
};

// The endpoint label of a request path: the known routes by name
// ("/v1/models/{id}" for any model id), every other path "other", so that
// clients cannot create series (the label set stays bounded).
std::string route_label(std::string_view path);
// A label value escaped for the Prometheus text format (\\, \", \n).
std::string escape_label(std::string_view v);

class Metrics {
 public:
  // endpoint: the request path (mapped by route_label).
  void request_done(const std::string& endpoint, int status);
  void add_tokens(int64_t prompt, int64_t generated, int64_t cached = 0) {
    prompt_tokens_ += prompt;
    generated_tokens_ += generated;
    cached_prompt_tokens_ += cached;
  }
  Histogram ttft, tpot, e2e;
  std::string render(const SchedulerStats& s, int64_t open_connections) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, cached_prompt_tokens_{0};
};

}  // namespace hmoe::server
