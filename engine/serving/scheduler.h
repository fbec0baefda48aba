// Scheduler: continuous batching over Model::forward.
//
// One engine thread owns the Model's step loop, the KvCache and every
// running sequence. Each step it (1) drops cancelled requests and frees their
// KV blocks, (2) admits queued requests while fewer than max_num_seqs run and
// their prompt fits in free blocks, (3) builds one flat batch: one decode
// token for every sequence that is generating, then prefill chunks of the
// others (oldest first) until max_num_batched_tokens, (4) runs forward, and
// (5) samples the next token of every sequence whose chunk reached its end
// and sends it to that request's channel. When KV blocks run out, the
// youngest sequence is preempted: its blocks are freed and it goes back to
// the head of the queue to be recomputed (its tokens so far are kept, so the
// output does not change).
//
// Hybrid models (KvCache::snapshot_align() > 0): a prefix-cache hit needs a
// snapshot of the recurrent state where the shared blocks end. At admission
// each sequence gets its snapshot targets: the last aligned position before
// its prompt's last token (what a repeat of the prompt, a later turn or
// another choice of it reuses) and the last aligned position of the cached
// blocks it matched but could not reuse for want of a snapshot (where two
// prompts diverge: the next prompt with that prefix reuses it). The step
// whose chunk reaches a target plans it (KvCache::plan_state_snapshot), the
// layers write it and commit() keeps it. A prefill chunk that stops short of
// its tokens ends at a multiple of the state's alignment when the budget
// allows, so hits and cold runs give the same bits.
//
// Speculative decoding (Model::speculative_tokens() N > 0, greedy requests):
// after each step the MTP head runs over every position the step computed
// (filling its own KV layer from the main model's hidden states) and, for a
// sequence now decoding, drafts up to N tokens (the first from that pass,
// the others one head step each). The next step puts the last token and the
// drafts in one chunk; each row's logits are sampled in turn while the
// sampled token equals the next draft, so what is sent is exactly what plain
// decoding sends (the sampler decides every token). Rejected positions are
// rolled back: K/V truncated, the recurrent state copied back from the
// checkpoint the verify step took after the accepted token
// (scheduler_spec.cpp says why checkpoints). Sampled (temperature > 0)
// requests decode plainly.
//
// Threads: submit(), shutdown() and stats() are safe from any thread.
// SeqChannel is the only object the engine thread and a consumer share.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/text/sampler.h"
#include "io/ple_table.h"

namespace hmoe {

class Model;

enum class FinishReason { none, eos, length, cancelled, shutdown, error };

struct TokenEvent {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

// Events of one request, from the engine thread to its consumer. The engine
// pushes tokens and one final finish(); `notify` (set before submit) is called
// from the engine thread when events become available after a drain; it must
// not block (it posts to the consumer's executor).
class SeqChannel {
 public:
  using Notify = std::function<void()>;
  explicit SeqChannel(Notify notify = {}) : notify_(std::move(notify)) {}

  // Any thread: asks the engine to stop this request at its next step.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // Prompt tokens whose K/V came from the prefix cache at admission (set by
  // the engine thread before the first token is pushed).
  int64_t cached_tokens() const { return cached_tokens_.load(std::memory_order_relaxed); }
  void set_cached_tokens(int64_t n) { cached_tokens_.store(n, std::memory_order_relaxed); }
  // The engine pushed a token or finished (the prompt's K/V are in the cache).
  bool started() const { return started_.load(std::memory_order_acquire); }

  struct Drained {
    std::vector<TokenEvent> prompt;  // scores of prompt tokens 1.. (SeqRequest::prompt_logprobs), in order
    std::vector<TokenEvent> tokens;
    FinishReason finish = FinishReason::none;  // none: more to come
    std::string error;
  };
  // Consumer: takes everything pushed so far.
  Drained drain();
  // Consumer: blocks until finished (for callers without an event loop).
  Drained wait_all();

  // Engine thread.
  void push(TokenEvent&& ev);
  void push_prompt(std::vector<TokenEvent>&& evs);
  void finish(FinishReason reason, std::string error = {});

 private:
  void signal(std::unique_lock<std::mutex>& lk);
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<TokenEvent> events_, prompt_events_;
  FinishReason finish_ = FinishReason::none;
  std::string error_;
  bool notified_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> cached_tokens_{0};
  std::atomic<bool> started_{false};
  Notify notify_;
};

struct SeqRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // EOS ids and stop_token_ids (the token is sent, then the sequence ends)
  // >= 0: score the prompt (completions echo + logprobs): every prompt token
  // after the first gets its logprob given the tokens before it, with this
  // many top alternatives, pushed as prompt events before the first token.
  // Such a prompt is computed from the start (no prefix cache reuse), at most
  // kPromptLogprobRows positions per step. -1: off.
  int prompt_logprobs = -1;
  std::shared_ptr<SeqChannel> channel;
  // Several choices of one prompt (n > 1): the other choices wait for the
  // first one's prompt to be computed and then attach its cached blocks
  // (with prefix caching on), instead of computing the prompt n times.
  std::shared_ptr<const SeqChannel> after;
};

struct SchedulerConfig {
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_queue = 256;
  int64_t kv_blocks = 1024;
  int64_t block_size = 16;
  // Prefix caching (engine/kv/kv_cache.h); off for Engram's per-sequence
  // state; hybrid (linear-attention) models keep it through state_snapshots.
  bool prefix_caching = true;
  uint64_t prefix_salt = 0;
  int64_t host_kv_blocks = 0;  // second KV tier, in blocks (not for hybrid models)
  int64_t state_snapshots = 0;  // hybrid models: recurrent-state snapshot slots (0: no prefix caching for them)
  // Speculative decoding (Model::speculative_tokens() > 0): benchmarks may
  // replace the MTP head's drafts with their own (given a sequence's tokens,
  // up to n that should follow; e.g. a known greedy continuation, to time the
  // verify path alone). Empty: the head drafts.
  std::function<std::vector<int32_t>(std::span<const int32_t> tokens, int64_t n)> draft_override;
};

// Expert streaming of big passes (engine/layers/expert_stream.h), totals since start; zero when off.
struct StreamTotals {
  int64_t passes = 0, layers = 0;  // streamed passes; streamed layers per pass
  uint64_t bytes = 0;              // host -> device bytes copied
  double copy_s = 0, compute_s = 0, stall_s = 0;
  double pinned_bandwidth = 0;  // measured at load, bytes/s
};

// Split decode and the GPU expert cache of host layers
// (engine/layers/gpu_expert_cache.h), totals since start; `present` false
// when off.
struct ExpertCacheTotals {
  bool present = false;
  int64_t hits = 0, misses = 0, admitted = 0, evictions = 0;
  uint64_t bytes = 0;  // host -> device bytes copied into slots
  int64_t gpu_pairs = 0, cpu_pairs = 0, slots = 0, slots_used = 0;
  uint64_t device_bytes = 0;
  double copy_s = 0;
};

// The PLE n-gram table of an Engram model (io/ple_table.h), totals since
// start; `present` false for other models.
struct PleTotals {
  bool present = false;
  std::string backend;                // in use (io_uring may have fallen back to pread)
  io::PleStats all;                   // every module
  std::vector<io::PleStats> modules;  // per module, in layer order
  std::vector<bool> in_ram;           // per module: table kept in memory
};

struct SchedulerStats {
  int64_t running = 0, queued = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t steps = 0, batched_tokens = 0, preemptions = 0;
  int64_t spec_drafted = 0, spec_accepted = 0;  // speculative decoding: draft tokens verified, and accepted
  bool prefix_caching = false;
  int64_t kv_host_blocks_total = 0;
  KvCacheStats kv;  // prefix cache and host tier counters
  StreamTotals stream;
  PleTotals ple;
  ExpertCacheTotals expert_cache;
};

class Scheduler {
 public:
  // The Model must outlive the Scheduler. Starts the engine thread.
  Scheduler(Model& model, const SchedulerConfig& cfg);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Prompt positions scored per step in all (SeqRequest::prompt_logprobs):
  // each needs a vocabulary-sized logits row.
  static constexpr int64_t kPromptLogprobRows = 128;

  enum class Submit { ok, queue_full, shutting_down };
  // Thread-safe. Rejects when max_queue requests are already waiting.
  Submit submit(std::unique_ptr<SeqRequest> req);
  // Finishes every request with FinishReason::shutdown and joins the engine
  // thread; later submits are refused. Idempotent.
  void shutdown();
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return cfg_; }

 private:
  struct Seq;
  void run();
  bool step();
  void finish(Seq& s, FinishReason r, const std::string& err = {});
  void preempt(size_t index);
  void copy_ple_stats();
  void copy_step_stats();  // streamed-expert and PLE counters (kv_stats_mu_ held)
  // Speculative decoding (scheduler_spec.cpp).
  struct SpecItem {
    Seq* s;
    int64_t computed_before, row0;  // its computed tokens before the step; its first batch row
  };
  void plan_rollback(Seq& s);
  void settle_verify(Seq& s, int64_t computed_before);
  void draft_tokens(const std::vector<SpecItem>& items);

  Model& model_;
  SchedulerConfig cfg_;
  KvCache kv_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> incoming_;
  bool stop_ = false;

  // Engine thread only.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;

  mutable std::mutex kv_stats_mu_;
  KvCacheStats kv_stats_;  // copy of kv_.stats() after each step
  ExpertCacheTotals expert_cache_;  // copy of the GPU expert cache's totals after each step (under kv_stats_mu_)
  StreamTotals stream_;    // copy of the GPU expert stream's totals after each step (under kv_stats_mu_)
  PleTotals ple_;          // copy of the PLE table's counters after each step (under kv_stats_mu_)
  std::atomic<int64_t> queued_{0}, running_count_{0}, kv_used_{0}, steps_{0}, batched_tokens_{0}, preemptions_{0};
  std::atomic<int64_t> spec_drafted_{0}, spec_accepted_{0};
};

const char* finish_reason_name(FinishReason r);

}  // namespace hmoe
