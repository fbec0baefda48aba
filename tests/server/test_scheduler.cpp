// Continuous batching on the tiny Qwen3-MoE fixture: greedy outputs equal the
// Hugging Face reference and do not change with batch composition, chunked
// prefill, or preemption; cancellation frees KV blocks; the queue is bounded.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

struct Fixture {
  std::unique_ptr<Model> model;
  nlohmann::json ref;
  Fixture() {
    Settings s = Settings::defaults();
    s.threads = 2;
    s.progress = "none";
    model = Model::load(test::fixture_model("tiny-qwen3moe"), s);
    std::ifstream f(test::fixture_ref("tiny-qwen3moe/hf_reference.json"));
    ref = nlohmann::json::parse(f);
  }
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

std::unique_ptr<SeqRequest> greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  auto r = std::make_unique<SeqRequest>();
  r->prompt = prompt;
  r->max_tokens = max_tokens;
  r->sampling.temperature = 0;
  r->channel = std::make_shared<SeqChannel>();
  return r;
}

std::vector<int32_t> tokens_of(const SeqChannel::Drained& d) {
  std::vector<int32_t> t;
  for (const auto& e : d.tokens) t.push_back(e.token);
  return t;
}

// Runs all prompts at once through a scheduler with config c.
std::vector<std::vector<int32_t>> run_all(const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens, SchedulerConfig c,
                                          SchedulerStats* stats = nullptr) {
  Scheduler sched(*fixture().model, c);
  std::vector<std::shared_ptr<SeqChannel>> chans;
  for (const auto& p : prompts) {
    auto r = greedy(p, max_tokens);
    chans.push_back(r->channel);
    REQUIRE(sched.submit(std::move(r)) == Scheduler::Submit::ok);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& ch : chans) {
    auto d = ch->wait_all();
    CHECK(d.finish == FinishReason::length);
    out.push_back(tokens_of(d));
  }
  if (stats) *stats = sched.stats();
  return out;
}

}  // namespace

TEST_CASE("scheduler: batched greedy decoding equals the HF reference and single-stream runs") {
  Fixture& f = fixture();
  std::vector<std::vector<int32_t>> prompts, want;
  for (const auto& chat : f.ref["chats"]) {
    prompts.push_back(chat["ids"].get<std::vector<int32_t>>());
    want.push_back(chat["greedy_ids"].get<std::vector<int32_t>>());
  }
  // Extra prompts: random ids, so the batch mixes many lengths.
  std::mt19937_64 rng(17);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p(3 + rng() % 40);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 151000);
    prompts.push_back(p);
  }
  SchedulerConfig one;
  one.max_num_seqs = 1;
  one.kv_blocks = 64;
  std::vector<std::vector<int32_t>> single;
  for (const auto& p : prompts) single.push_back(run_all({p}, 32, one)[0]);
  for (size_t i = 0; i < want.size(); ++i) CHECK(single[i] == want[i]);

  SchedulerConfig batched;
  batched.kv_blocks = 256;
  SchedulerStats st;
  CHECK(run_all(prompts, 32, batched, &st) == single);
  CHECK(st.steps < static_cast<int64_t>(prompts.size()) * 32);  // they really shared steps

  SchedulerConfig chunked = batched;  // prefill split into 5-token chunks beside decodes
  chunked.max_num_batched_tokens = 5;
  CHECK(run_all(prompts, 32, chunked) == single);

  SchedulerConfig tight = batched;  // too few blocks for all: preemption + recompute
  tight.kv_blocks = 12;
  CHECK(run_all(prompts, 32, tight, &st) == single);
  CHECK(st.preemptions > 0);
}

TEST_CASE("scheduler: stop ids, cancellation frees KV blocks, bounded queue, shutdown") {
  Fixture& f = fixture();
  const auto prompt = f.ref["chats"][0]["ids"].get<std::vector<int32_t>>();
  const auto want = f.ref["chats"][0]["greedy_ids"].get<std::vector<int32_t>>();
  SchedulerConfig c;
  c.max_num_seqs = 2;
  c.max_queue = 3;
  c.kv_blocks = 200;
  Scheduler sched(*f.model, c);

  auto r = greedy(prompt, 32);
  r->stop_ids = {want[5]};
  auto ch = r->channel;
  REQUIRE(sched.submit(std::move(r)) == Scheduler::Submit::ok);
  auto d = ch->wait_all();
  CHECK(d.finish == FinishReason::eos);
  CHECK(tokens_of(d) == std::vector<int32_t>(want.begin(), want.begin() + 6));

  // A long request, cancelled after its first tokens.
  auto lr = greedy(prompt, 3000);
  auto lch = lr->channel;
  REQUIRE(sched.submit(std::move(lr)) == Scheduler::Submit::ok);
  while (lch->drain().tokens.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(sched.stats().kv_blocks_used > 0);
  lch->cancel();
  CHECK(lch->wait_all().finish == FinishReason::cancelled);
  for (int i = 0; i < 1000 && sched.stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK(sched.stats().kv_blocks_used == 0);

  // 2 running + 3 queued fit; the 6th is refused.
  std::vector<std::shared_ptr<SeqChannel>> chans;
  int refused = 0;
  for (int i = 0; i < 6; ++i) {
    auto q = greedy(prompt, 3000);
    chans.push_back(q->channel);
    if (sched.submit(std::move(q)) == Scheduler::Submit::queue_full) ++refused;
  }
  CHECK(refused >= 1);
  sched.shutdown();
  for (size_t i = 0; i + refused < chans.size(); ++i) CHECK(chans[i]->wait_all().finish == FinishReason::shutdown);
  CHECK(sched.submit(greedy(prompt, 1)) == Scheduler::Submit::shutting_down);
}

TEST_CASE("batch invariance: a token's logits are bit-identical alone and inside a mixed batch") {
  Model& m = *fixture().model;
  const int64_t V = m.config().vocab_size;
  std::mt19937_64 rng(23);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(1 + rng() % 20);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 151000);
    prompts.push_back(p);
  }
  // Alone: each sequence in its own cache, one forward over its prompt.
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    KvCache kv(m.kv_layout(), 8, 16);
    int s = kv.add_sequence();
    kv.reserve(s, static_cast<int64_t>(p.size()));
    Batch b;
    for (size_t i = 0; i < p.size(); ++i) b.add(p[i], s, static_cast<int64_t>(i), true);
    std::vector<float> lg;
    m.forward(b, kv, lg);
    alone.push_back(lg);
  }
  // Together: all prompts interleaved token by token in one batch.
  KvCache kv(m.kv_layout(), 64, 16);
  std::vector<int> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(kv.add_sequence());
    kv.reserve(seqs.back(), static_cast<int64_t>(p.size()));
  }
  Batch b;
  std::vector<std::pair<size_t, size_t>> where;
  for (size_t pos = 0; pos < 20; ++pos)
    for (size_t s = 0; s < prompts.size(); ++s)
      if (pos < prompts[s].size()) {
        b.add(prompts[s][pos], seqs[s], static_cast<int64_t>(pos), true);
        where.push_back({s, pos});
      }
  std::vector<float> lg;
  m.forward(b, kv, lg);
  size_t mismatched = 0;
  for (size_t r = 0; r < where.size(); ++r) {
    const float* got = lg.data() + static_cast<int64_t>(r) * V;
    const float* want = alone[where[r].first].data() + static_cast<int64_t>(where[r].second) * V;
    if (std::memcmp(got, want, static_cast<size_t>(V) * sizeof(float)) != 0) ++mismatched;
  }
  CHECK(mismatched == 0);
}
