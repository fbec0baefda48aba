// Routing traces: which routed experts every token of every step chose, per
// MoE layer, recorded from a real run (setting routing_trace,
// `--routing-trace FILE`) or generated (zipf_routing_trace), and replayed by
// the expert cache simulator (engine/placement/expert_cache_sim.h, `hmoe
// bench cache-sim`) so that cache policies are chosen with figures.
//
// File format "hmoe routing trace v1" (little-endian, no padding):
//   header, 32 bytes: magic "HMOERT01" (8 bytes), u32 version (1),
//     u32 layers (the model's num_hidden_layers), u32 experts (routed
//     experts per MoE layer, <= 65535), u32 topk (experts per token),
//     u32 hidden, u32 moe_intermediate (one expert is 3 * hidden *
//     moe_intermediate weights);
//   then one record per (step, MoE layer whose experts ran on the host):
//     u32 step (counted from 0 per file), u32 layer, u32 tokens, u32 k,
//     then tokens * k u16 expert ids, token-major (token t's ids at t*k).
// Records of a step are in layer order; steps are in order. A record's k
// may be below the header's topk (a run with expert deferral records the
// full routing, so it is always topk today).
//
// Contract: RoutingTraceWriter is thread-safe (a mutex); a write error
// throws Error(internal) naming the file. read_routing_trace validates the
// whole file (magic, version, truncation, ids and layers in range) and
// throws Error(invalid_argument) naming the file, the byte offset and the
// problem.
#pragma once
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace hmoe {

struct RoutingTraceHeader {
  uint32_t layers = 0, experts = 0, topk = 0, hidden = 0, moe_intermediate = 0;
  // Bytes of one expert at `bytes_per_weight` (bf16: 2).
  uint64_t expert_bytes(double bytes_per_weight = 2.0) const {
    return static_cast<uint64_t>(3.0 * hidden * static_cast<double>(moe_intermediate) * bytes_per_weight);
  }
};

struct RoutingRecord {
  uint32_t step = 0, layer = 0, tokens = 0, k = 0;
  std::vector<uint16_t> ids;  // tokens * k
};

struct RoutingTrace {
  RoutingTraceHeader header;
  std::vector<RoutingRecord> records;
  uint32_t steps() const { return records.empty() ? 0 : records.back().step + 1; }
};

class RoutingTraceWriter {
 public:
  // Creates (truncates) `path`; Error(invalid_argument) naming it when it cannot.
  RoutingTraceWriter(const std::string& path, const RoutingTraceHeader& h);
  ~RoutingTraceWriter();
  RoutingTraceWriter(const RoutingTraceWriter&) = delete;
  RoutingTraceWriter& operator=(const RoutingTraceWriter&) = delete;
  // Step boundaries (the runtime's forward()); records between them share a step number.
  void begin_step();
  // tokens rows of k ids each (ids must be < header.experts; others are a caller bug: Error(internal)).
  void record(int64_t layer, int64_t tokens, int64_t k, const int32_t* ids);
  void flush();
  const std::string& path() const { return path_; }
  uint64_t records() const { return records_; }

 private:
  std::mutex mu_;
  std::string path_;
  std::FILE* f_ = nullptr;
  RoutingTraceHeader h_;
  int64_t step_ = -1;
  uint64_t records_ = 0;
  std::vector<uint16_t> buf_;
};

RoutingTrace read_routing_trace(const std::string& path);
void write_routing_trace(const std::string& path, const RoutingTrace& t);

// A synthetic trace: every MoE layer has its own random popularity order of
// the experts, expert of rank r (1-based) drawn with probability
// proportional to r^-s (s = 0: uniform), k distinct experts per token,
// `batch` tokens per step, `tokens` tokens in all, deterministic for a seed.
// Tokens are independent (real routing is also correlated in time, which
// helps a cache more; say so beside figures from it).
RoutingTrace zipf_routing_trace(double s, int64_t experts, int64_t topk, int64_t layers, int64_t tokens, int64_t batch = 1, uint64_t seed = 1,
                                int64_t hidden = 2048, int64_t moe_intermediate = 768);

// Benchmarks only: routed expert ids taken from a trace instead of the
// model's router, for the layers whose experts run on the host, so that the
// GPU expert cache and the CPU experts see a chosen popularity (a Zipf
// trace: random weights route almost uniformly) at the real cost of the
// step (`hmoe bench MODEL --routing-replay FILE`, engine/runtime/gpu_runtime.h).
// Per layer, the trace's token rows are taken in order, wrapping round at
// the end; the routing weights stay the model's.
// Contract: not thread-safe; Error(invalid_argument) at construction when
// the trace has no records, at apply() when its layer has none or k differs.
class RoutingReplay {
 public:
  explicit RoutingReplay(const RoutingTrace& t);
  // ids [n, k]: replaced by the next n rows of `layer` in the trace.
  void apply(int64_t layer, int32_t* ids, int64_t n, int64_t k);
  const RoutingTraceHeader& header() const { return header_; }

 private:
  RoutingTraceHeader header_;
  std::vector<std::vector<uint16_t>> rows_;  // per layer: token rows of k ids
  std::vector<uint32_t> k_;                  // per layer
  std::vector<size_t> next_;                 // per layer: next row
};

}  // namespace hmoe
