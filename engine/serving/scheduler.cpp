#include "engine/serving/scheduler.h"

#include <algorithm>

#include "configs/error.h"
#include "engine/layers/engram.h"
#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "engine/serving/scheduler_seq.h"

namespace hmoe {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::eos: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::shutdown: return "shutdown";
    case FinishReason::error: return "error";
  }
  return "?";
}

// ---- SeqChannel -----------------------------------------------------------
void SeqChannel::signal(std::unique_lock<std::mutex>& lk) {
  const bool call = !notified_;
  notified_ = true;
  lk.unlock();
  cv_.notify_all();
  if (call && notify_) notify_();
}

void SeqChannel::push(TokenEvent&& ev) {
  started_.store(true, std::memory_order_release);
  std::unique_lock lk(mu_);
  events_.push_back(std::move(ev));
  signal(lk);
}

void SeqChannel::finish(FinishReason reason, std::string error) {
  started_.store(true, std::memory_order_release);
  std::unique_lock lk(mu_);
  if (finish_ != FinishReason::none) return;
  finish_ = reason;
  error_ = std::move(error);
  signal(lk);
}

void SeqChannel::push_prompt(std::vector<TokenEvent>&& evs) {
  std::unique_lock lk(mu_);
  for (auto& e : evs) prompt_events_.push_back(std::move(e));
  signal(lk);
}

SeqChannel::Drained SeqChannel::drain() {
  std::lock_guard lk(mu_);
  Drained d;
  d.prompt.swap(prompt_events_);
  d.tokens.swap(events_);
  d.finish = finish_;
  d.error = error_;
  notified_ = false;
  return d;
}

SeqChannel::Drained SeqChannel::wait_all() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return finish_ != FinishReason::none; });
  Drained d;
  d.prompt.swap(prompt_events_);
  d.tokens.swap(events_);
  d.finish = finish_;
  d.error = error_;
  return d;
}

// ---- Scheduler ------------------------------------------------------------
Scheduler::Scheduler(Model& model, const SchedulerConfig& cfg)
    : model_(model),
      cfg_(cfg),
      kv_(model.kv_layout(), cfg.kv_blocks, cfg.block_size, KvCacheOptions{cfg.prefix_caching, cfg.prefix_salt, cfg.host_kv_blocks, cfg.state_snapshots}) {
  if ((cfg.block_size & (cfg.block_size - 1)) != 0)
    fail(ErrorKind::invalid_argument, "--block-size must be a power of two, got " + std::to_string(cfg.block_size));
  if (cfg.max_num_seqs <= 0) fail(ErrorKind::invalid_argument, "--max-num-seqs must be >= 1");
  if (cfg.max_num_batched_tokens <= 0) fail(ErrorKind::invalid_argument, "--max-num-batched-tokens must be >= 1");
  if (cfg.max_queue < 0) fail(ErrorKind::invalid_argument, "--max-queue must be >= 0");
  copy_ple_stats();
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { shutdown(); }

Scheduler::Submit Scheduler::submit(std::unique_ptr<SeqRequest> req) {
  if (!req->channel) fail(ErrorKind::internal, "SeqRequest without a channel");
  std::lock_guard lk(mu_);
  if (stop_) return Submit::shutting_down;
  // Requests beyond the free running slots count against the queue.
  const int64_t free_slots = std::max<int64_t>(0, cfg_.max_num_seqs - running_count_.load());
  if (queued_.load() + 1 > cfg_.max_queue + free_slots) return Submit::queue_full;
  incoming_.push_back(std::make_unique<Seq>(std::move(req)));
  ++queued_;
  cv_.notify_one();
  return Submit::ok;
}

void Scheduler::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.running = running_count_.load();
  s.queued = queued_.load();
  s.kv_blocks_used = kv_used_.load();
  s.kv_blocks_total = cfg_.kv_blocks;
  s.steps = steps_.load();
  s.batched_tokens = batched_tokens_.load();
  s.preemptions = preemptions_.load();
  s.spec_drafted = spec_drafted_.load();
  s.spec_accepted = spec_accepted_.load();
  s.prefix_caching = kv_.prefix_caching();
  s.kv_host_blocks_total = kv_.host_blocks();
  std::lock_guard lk(kv_stats_mu_);
  s.kv = kv_stats_;
  s.stream = stream_;
  s.expert_cache = expert_cache_;
  s.ple = ple_;
  return s;
}

// Engine thread (or before it starts), under kv_stats_mu_.
void Scheduler::copy_step_stats() {
  if (const GpuRuntime* g = model_.gpu(); g && g->expert_stream()) {
    const ExpertStreamStats& x = g->expert_stream()->stats();
    stream_ = StreamTotals{x.passes, static_cast<int64_t>(x.layers.size()), x.bytes, x.copy_s, x.compute_s, x.stall_s, x.pinned_bandwidth};
  }
  if (const GpuRuntime* g = model_.gpu(); g && g->expert_cache()) {
    const GpuExpertCacheStats& x = g->expert_cache()->stats();
    expert_cache_ = ExpertCacheTotals{true,        x.c.hits,      x.c.misses, x.c.admitted, x.c.evictions,  x.c.bytes,
                                      x.c.gpu_pairs, x.c.cpu_pairs, x.slots,    x.slots_used, x.device_bytes, x.copy_s};
  }
  copy_ple_stats();
}

void Scheduler::copy_ple_stats() {
  EngramModules* e = model_.engram();
  if (!e) return;
  const io::PleTable& t = e->table();
  ple_.present = true;
  ple_.backend = io::ple_backend_name(t.backend());
  ple_.all = t.stats();
  ple_.modules.resize(static_cast<size_t>(t.tables()));
  ple_.in_ram.resize(static_cast<size_t>(t.tables()));
  for (int m = 0; m < static_cast<int>(t.tables()); ++m) {
    ple_.modules[static_cast<size_t>(m)] = t.table_stats(m);
    ple_.in_ram[static_cast<size_t>(m)] = t.table_in_ram(m);
  }
}

void Scheduler::finish(Seq& s, FinishReason r, const std::string& err) {
  if (s.kv_seq >= 0) kv_.free_sequence(s.kv_seq);
  s.kv_seq = -1;
  s.done = true;
  s.req->channel->finish(r, err);
}

void Scheduler::preempt(size_t index) {
  std::unique_ptr<Seq> s = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  ++queued_;  // before running_count_ drops
  kv_.free_sequence(s->kv_seq);
  s->kv_seq = -1;
  s->computed = 0;
  s->draft.clear();
  waiting_.push_front(std::move(s));
  running_count_ = static_cast<int64_t>(running_.size());
  ++preemptions_;
}

void Scheduler::run() {
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !incoming_.empty() || !running_.empty() || !waiting_.empty(); });
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      if (stop_) break;
    }
    step();
    running_count_ = static_cast<int64_t>(running_.size());
    kv_used_ = kv_.num_blocks() - kv_.free_blocks();
    std::lock_guard lk(kv_stats_mu_);
    kv_stats_ = kv_.stats();
    copy_step_stats();
  }
  for (auto& s : running_) finish(*s, FinishReason::shutdown, "the server is shutting down");
  for (auto& s : waiting_) finish(*s, FinishReason::shutdown, "the server is shutting down");
  running_.clear();
  waiting_.clear();
  queued_ = 0;
  running_count_ = 0;
}

bool Scheduler::step() {
  const int64_t bs = kv_.block_size();
  // (1) cancellations
  for (auto& s : running_)
    if (s->req->channel->cancelled()) finish(*s, FinishReason::cancelled);
  std::erase_if(running_, [](const auto& s) { return s->done; });
  for (auto& s : waiting_)
    if (s->req->channel->cancelled()) {
      finish(*s, FinishReason::cancelled);
      --queued_;
    }
  std::erase_if(waiting_, [](const auto& s) { return s->done; });

  // (2) admission, oldest first; a later choice of a prompt whose first choice has not
  // computed it yet is passed over (it then attaches the cached prompt).
  for (size_t w = 0; w < waiting_.size() && static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs;) {
    Seq& s = *waiting_[w];
    if (s.req->after && kv_.prefix_caching() && !s.admitted_once && !s.req->after->started()) {
      ++w;
      continue;
    }
    const int64_t need = (static_cast<int64_t>(s.tokens.size()) + 1 + bs - 1) / bs;
    if (need > kv_.num_blocks()) {
      finish(s, FinishReason::error,
             "the sequence needs " + std::to_string(need) + " KV blocks but the cache has " + std::to_string(kv_.num_blocks()));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
      --queued_;
      continue;
    }
    if (need > kv_.free_blocks()) break;  // conservative: shared prefix blocks only lower the need
    s.kv_seq = kv_.add_sequence();
    // Reuse cached full blocks of the prefix; the last token is always
    // computed (its logits pick the next token).
    // A prompt to score is computed from where its scoring stands.
    const int64_t reuse = s.req->prompt_logprobs >= 0 ? std::min<int64_t>(s.prompt_scored, static_cast<int64_t>(s.tokens.size()) - 1)
                                                       : static_cast<int64_t>(s.tokens.size()) - 1;
    s.computed = kv_.attach_prefix(s.kv_seq, s.tokens, reuse);
    s.snapshot_at.clear();
    if (const int64_t a = kv_.snapshot_align(); a > 0 && kv_.prefix_caching()) {
      for (const int64_t at : {kv_.last_match_tokens() / a * a, (static_cast<int64_t>(s.req->prompt.size()) - 1) / a * a})
        if (at > s.computed && std::find(s.snapshot_at.begin(), s.snapshot_at.end(), at) == s.snapshot_at.end()) s.snapshot_at.push_back(at);
    }
    if (!s.admitted_once) s.req->channel->set_cached_tokens(std::min<int64_t>(s.computed, static_cast<int64_t>(s.req->prompt.size())));
    s.admitted_once = true;
    running_.push_back(std::move(waiting_[w]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    running_count_ = static_cast<int64_t>(running_.size());  // before queued_ drops: submit() never over-admits
    --queued_;
  }
  if (running_.empty()) return false;

  // (3) plan: decodes first, then prefill chunks, oldest first.
  struct Item {
    Seq* s;
    int64_t chunk;
    int64_t row0 = 0;  // its first row in the batch
  };
  std::vector<Item> plan;
  int64_t budget = cfg_.max_num_batched_tokens;
  int64_t score_rows = kPromptLogprobRows;  // prompt positions scored this step (a logits row each)
  auto scoring = [](const Seq& s) {
    return s.req->prompt_logprobs >= 0 && s.prompt_scored + 1 < static_cast<int64_t>(s.req->prompt.size());
  };
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<Seq*> order;
    for (auto& r : running_) order.push_back(r.get());
    for (Seq* s : order) {
      if (budget <= 0) break;
      if (s->kv_seq < 0) continue;  // preempted in this step
      const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
      if ((pass == 0) != (remaining == 1) || remaining <= 0) continue;
      int64_t chunk = std::min(remaining, budget);
      // A decode with drafts verifies them in the same chunk (as many as fit).
      if (pass == 0 && !s->draft.empty()) chunk = std::min<int64_t>(1 + static_cast<int64_t>(s->draft.size()), budget);
      if (scoring(*s)) {
        chunk = std::min(chunk, score_rows);
        if (chunk <= 0) continue;
        score_rows -= chunk;
      }
      for (;;) {
        const int64_t room = kv_.capacity(s->kv_seq) - s->computed + kv_.free_blocks() * bs;
        if (room >= chunk || (room > 0 && (pass == 1 || chunk > 1))) {
          chunk = std::min(chunk, room);
          break;
        }
        // Out of blocks: preempt the youngest sequence that is not planned yet.
        size_t victim = running_.size();
        for (size_t j = running_.size(); j-- > 0;) {
          const Seq* v = running_[j].get();
          if (std::none_of(plan.begin(), plan.end(), [&](const Item& it) { return it.s == v; })) {
            victim = j;
            break;
          }
        }
        if (victim == running_.size()) {
          chunk = 0;
          break;
        }
        const bool self = running_[victim].get() == s;
        preempt(victim);
        if (self) {
          chunk = 0;
          break;
        }
      }
      if (chunk <= 0) continue;
      // Hybrid models: a prefill chunk that stops short of the tokens ends at a
      // multiple of the state's alignment when it can, so that the prompt's
      // result does not depend on the step budget (prefix-cache hits equal cold runs).
      if (const int64_t a = kv_.layout().state_align; a > 0 && pass == 1 && s->computed + chunk < static_cast<int64_t>(s->tokens.size()))
        if (const int64_t end = (s->computed + chunk) / a * a; end > s->computed) chunk = end - s->computed;
      kv_.reserve(s->kv_seq, s->computed + chunk);
      s->verify = pass == 0 ? chunk - 1 : 0;
      if (s->verify > 0) plan_rollback(*s);
      else s->draft.clear();
      for (const int64_t at : s->snapshot_at)
        if (at > s->computed && at <= s->computed + chunk) kv_.plan_state_snapshot(s->kv_seq, s->tokens, at);
      plan.push_back({s, chunk});
      budget -= chunk;
    }
  }
  if (plan.empty()) return false;
  kv_used_ = kv_.num_blocks() - kv_.free_blocks();  // before any token of this step is sent

  Batch batch;
  struct Row {
    Seq* s;
    int64_t pos;  // >= 0: scores prompt token pos + 1; -1: samples the next token
  };
  std::vector<Row> rows;  // one per logits row, in batch order
  for (Item& it : plan) {
    Seq& s = *it.s;
    it.row0 = static_cast<int64_t>(batch.tokens.size());
    if (s.verify > 0) {  // the last token and the drafts, each row's logits checking the next
      for (int64_t j = 0; j <= s.verify; ++j) {
        batch.add(j == 0 ? s.tokens[static_cast<size_t>(s.computed)] : s.draft[static_cast<size_t>(j - 1)], s.kv_seq, s.computed + j, true);
        rows.push_back({&s, -1});
      }
      continue;
    }
    const bool last = s.computed + it.chunk == static_cast<int64_t>(s.tokens.size());
    const int64_t plen = static_cast<int64_t>(s.req->prompt.size());
    const bool score = scoring(s);
    for (int64_t p = s.computed; p < s.computed + it.chunk; ++p) {
      const bool sample = last && p + 1 == s.computed + it.chunk;
      const bool scored = score && p >= s.prompt_scored && p + 1 < plen;
      batch.add(s.tokens[static_cast<size_t>(p)], s.kv_seq, p, sample || scored);
      if (scored) rows.push_back({&s, p});
      if (sample) rows.push_back({&s, -1});
    }
  }
  std::vector<float> logits;
  std::vector<int64_t> computed_before;
  for (const Item& it : plan) computed_before.push_back(it.s->computed);
  try {
    model_.forward(batch, kv_, logits);
  } catch (const std::exception& e) {
    kv_.clear_state_checkpoints();
    for (const Item& it : plan) it.s->draft.clear();
    for (const Item& it : plan) finish(*it.s, FinishReason::error, e.what());
    std::erase_if(running_, [](const auto& s) { return s->done; });
    return true;
  }
  {  // before this step's requests are answered: a client that reads /metrics after its reply sees the step
    std::lock_guard lk(kv_stats_mu_);
    copy_step_stats();
  }
  ++steps_;
  batched_tokens_ += static_cast<int64_t>(batch.tokens.size());
  for (const Item& it : plan) {
    if (it.s->verify > 0) continue;  // settled once its rows are sampled
    it.s->computed += it.chunk;
    kv_.commit(it.s->kv_seq, it.s->tokens, it.s->computed);
  }

  // (5) score prompt positions, sample. The PLE counters of this step are published first,
  // so a client that reads /metrics after its reply sees the steps that made it.
  {
    std::lock_guard lk(kv_stats_mu_);
    copy_ple_stats();
  }
  const int64_t V = model_.config().vocab_size;
  std::vector<TokenEvent> scored;
  for (size_t r = 0; r < rows.size(); ++r) {
    Seq& s = *rows[r].s;
    const float* row = logits.data() + static_cast<int64_t>(r) * V;
    if (rows[r].pos >= 0) {
      const int32_t next = s.req->prompt[static_cast<size_t>(rows[r].pos + 1)];
      const double lse = logsumexp(row, V);
      TokenEvent ev{next, static_cast<float>(static_cast<double>(row[next]) - lse), {}};
      if (s.req->prompt_logprobs > 0) {
        std::vector<int32_t> ids;
        std::vector<float> vals;
        top_k(row, V, s.req->prompt_logprobs, ids, vals);
        for (size_t i = 0; i < ids.size(); ++i) ev.top.push_back({ids[i], static_cast<float>(static_cast<double>(vals[i]) - lse)});
      }
      scored.push_back(std::move(ev));
      s.prompt_scored = rows[r].pos + 1;
      if (r + 1 == rows.size() || rows[r + 1].s != &s || rows[r + 1].pos < 0) s.req->channel->push_prompt(std::move(scored)), scored.clear();
      continue;
    }
    if (s.done) continue;  // a verified chunk whose sequence ended at an earlier row
    size_t first = r;  // the verify chunk's row 0
    while (first > 0 && rows[first - 1].s == &s) --first;
    const int64_t j = static_cast<int64_t>(r - first);
    if (s.verify > 0 && j > 0 && s.tokens.back() != s.draft[static_cast<size_t>(j - 1)]) continue;  // an earlier draft was rejected
    SampleResult res = s.sampler.sample(row, V, s.prompt(), s.output());
    s.tokens.push_back(res.token);
    ++s.generated;
    s.req->channel->push(TokenEvent{res.token, res.logprob, std::move(res.top)});
    const auto& stops = s.req->stop_ids;
    if (std::find(stops.begin(), stops.end(), res.token) != stops.end()) finish(s, FinishReason::eos);
    else if (s.generated >= s.req->max_tokens) finish(s, FinishReason::length);
  }
  for (size_t k = 0; k < plan.size(); ++k)
    if (plan[k].s->verify > 0) settle_verify(*plan[k].s, computed_before[k]);
  kv_.clear_state_checkpoints();
  if (model_.speculative_tokens() > 0) {
    std::vector<SpecItem> items;
    for (size_t k = 0; k < plan.size(); ++k)
      if (!plan[k].s->done) items.push_back({plan[k].s, computed_before[k], plan[k].row0});
    draft_tokens(items);
  }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  return true;
}

}  // namespace hmoe
