// Continuous batching of a hybrid linear-attention model (the tiny
// Qwen3-Next fixture): the recurrent state of each running sequence lives
// beside its KV blocks (KvCache seq_state, allocated by the scheduler's
// add_sequence, freed by free_sequence), so greedy outputs equal the
// reference and do not change with batch composition, chunked prefill
// (5-token chunks) or preemption (state dropped, prompt recomputed). With
// state snapshots, prefix-cache hits restore the state and every greedy
// token, logprob and top alternative is bit for bit that of a cold run; the
// server's KV budget counts the states and snapshots.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"
#include "configs/error.h"
#include "server/server.h"
#include "io/mmap_file.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::vector<std::vector<int32_t>> run_all(Model& m, const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens, SchedulerConfig c,
                                          SchedulerStats* stats = nullptr) {
  Scheduler sched(m, c);
  std::vector<std::shared_ptr<SeqChannel>> chans;
  for (const auto& p : prompts) {
    auto r = std::make_unique<SeqRequest>();
    r->prompt = p;
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0;
    r->channel = std::make_shared<SeqChannel>();
    chans.push_back(r->channel);
    REQUIRE(sched.submit(std::move(r)) == Scheduler::Submit::ok);
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& ch : chans) {
    auto d = ch->wait_all();
    CHECK(d.finish == FinishReason::length);
    std::vector<int32_t> t;
    for (const auto& e : d.tokens) t.push_back(e.token);
    out.push_back(t);
  }
  if (stats) *stats = sched.stats();
  return out;
}

}  // namespace

TEST_CASE("scheduler on a hybrid model: greedy equals the reference under batching, chunked prefill and preemption") {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00004.safetensors"), "run scripts/make-fixtures " << HMOE_BINARY_DIR);
  Settings s = Settings::defaults();
  s.threads = 2;
  s.progress = "none";
  s.device = "cpu";
  auto model = Model::load(dir, s);
  const std::string hf = test::fixture_ref("tiny-qwen3next/hf_reference.json");
  std::ifstream f(io::file_exists(hf) ? hf : test::fixture_ref("tiny-qwen3next/np_reference.json"));
  const auto ref = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts, want;
  for (const auto& chat : ref["chats"]) {
    prompts.push_back(chat["ids"].get<std::vector<int32_t>>());
    want.push_back(chat["greedy_ids"].get<std::vector<int32_t>>());
  }
  std::mt19937_64 rng(23);
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(2 + rng() % 40);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 151000);
    prompts.push_back(p);
  }
  SchedulerConfig one;
  one.max_num_seqs = 1;
  one.kv_blocks = 64;
  std::vector<std::vector<int32_t>> single;
  for (const auto& p : prompts) single.push_back(run_all(*model, {p}, 32, one)[0]);
  for (size_t i = 0; i < want.size(); ++i) CHECK(single[i] == want[i]);

  SchedulerConfig batched;
  batched.kv_blocks = 256;
  SchedulerStats st;
  CHECK(run_all(*model, prompts, 32, batched, &st) == single);
  CHECK(st.steps < static_cast<int64_t>(prompts.size()) * 32);
  CHECK_FALSE(st.prefix_caching);

  SchedulerConfig chunked = batched;
  chunked.max_num_batched_tokens = 5;
  CHECK(run_all(*model, prompts, 32, chunked) == single);

  SchedulerConfig tight = batched;
  tight.kv_blocks = 14;
  CHECK(run_all(*model, prompts, 32, tight, &st) == single);
  CHECK(st.preemptions > 0);
}

namespace {

struct Scored {
  std::vector<TokenEvent> tokens;
  int64_t cached = 0;
};

// Greedy with logprobs and the top 5 alternatives, requests one after another.
std::vector<Scored> run_scored(Model& m, const std::vector<std::vector<int32_t>>& prompts, int64_t max_tokens, SchedulerConfig c,
                               SchedulerStats* stats = nullptr) {
  Scheduler sched(m, c);
  std::vector<Scored> out;
  for (const auto& p : prompts) {
    auto r = std::make_unique<SeqRequest>();
    r->prompt = p;
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0;
    r->sampling.logprobs = true;
    r->sampling.top_logprobs = 5;
    r->channel = std::make_shared<SeqChannel>();
    auto ch = r->channel;
    REQUIRE(sched.submit(std::move(r)) == Scheduler::Submit::ok);
    auto d = ch->wait_all();
    CHECK(d.finish == FinishReason::length);
    out.push_back({d.tokens, ch->cached_tokens()});
  }
  if (stats) *stats = sched.stats();
  return out;
}

bool same_events(const std::vector<TokenEvent>& a, const std::vector<TokenEvent>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].token != b[i].token || std::memcmp(&a[i].logprob, &b[i].logprob, sizeof(float)) != 0 || a[i].top.size() != b[i].top.size()) return false;
    for (size_t k = 0; k < a[i].top.size(); ++k)
      if (a[i].top[k].id != b[i].top[k].id || std::memcmp(&a[i].top[k].logprob, &b[i].top[k].logprob, sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("scheduler on a hybrid model: prefix-cache hits restore the recurrent state; outputs bit for bit those of cold runs") {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00004.safetensors"), "run scripts/make-fixtures " << HMOE_BINARY_DIR);
  Settings s = Settings::defaults();
  s.threads = 2;
  s.progress = "none";
  s.device = "cpu";
  auto model = Model::load(dir, s);
  std::mt19937_64 rng(77);
  auto ids = [&](size_t n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = static_cast<int32_t>(rng() % 151000);
    return v;
  };
  // a: 200 tokens. b: a's first 150, then its own (matches 9 blocks, but a's
  // only snapshot is at 192: nothing reused, b snapshots where it diverges, 128).
  // c: a's first 140 (reuses 128 from b's snapshot). d: a again (reuses 192).
  // e: b's first 150 + more (reuses 128: b's prompt-end snapshot at 192 is
  // past the match).
  const auto a = ids(200);
  auto b = std::vector<int32_t>(a.begin(), a.begin() + 150), c = std::vector<int32_t>(a.begin(), a.begin() + 140);
  for (int32_t t : ids(60)) b.push_back(t);
  for (int32_t t : ids(30)) c.push_back(t);
  auto e = std::vector<int32_t>(b.begin(), b.begin() + 150);
  for (int32_t t : ids(20)) e.push_back(t);
  const std::vector<std::vector<int32_t>> prompts{a, b, c, a, e};

  SchedulerConfig off;
  off.kv_blocks = 128;
  std::vector<Scored> cold;
  for (const auto& p : prompts) cold.push_back(run_scored(*model, {p}, 8, off)[0]);  // each in a fresh scheduler
  // One piece, and a step budget of 100 tokens (prefill chunks then end at
  // multiples of 64, the state's alignment; snapshots fall inside chunks).
  for (int64_t chunk : {2048, 100}) {
    CAPTURE(chunk);
    SchedulerConfig on = off;
    on.state_snapshots = 6;
    on.max_num_batched_tokens = chunk;
    SchedulerStats st;
    const auto warm = run_scored(*model, prompts, 8, on, &st);
    CHECK(st.prefix_caching);
    const std::vector<int64_t> reused{0, 0, 128, 192, 128};
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(warm[i].cached == reused[i]);
      CHECK(same_events(warm[i].tokens, cold[i].tokens));
    }
    CHECK(st.kv.snapshots_restored == 3);
    CHECK(st.kv.snapshot_short_tokens >= 144);
  }
}

TEST_CASE("server KV budget of a hybrid model counts each sequence's state and the snapshots") {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  Settings s = Settings::defaults();
  s.threads = 2;
  s.progress = "none";
  s.device = "cpu";
  auto model = Model::load(dir, s);
  const KvLayout& lay = model->kv_layout();
  const int64_t block = KvCache::bytes_per_block(lay, 16);
  s.max_num_seqs = 4;
  s.max_model_len = 256;
  s.kv_cache_memory_bytes = static_cast<uint64_t>(64 * block + 12 * lay.seq_state_bytes);  // 4 sequences + 8 snapshots (auto: 2 per sequence)
  SchedulerConfig c = server::scheduler_config(s, *model);
  CHECK(c.prefix_caching);
  CHECK(c.state_snapshots == 8);
  CHECK(c.kv_blocks == 64);
  s.prefix_state_snapshots = 2;
  c = server::scheduler_config(s, *model);
  CHECK(c.state_snapshots == 2);
  CHECK(c.kv_blocks == 64 + 6 * lay.seq_state_bytes / block);
  s.enable_prefix_caching = false;
  c = server::scheduler_config(s, *model);
  CHECK(c.state_snapshots == 0);
  CHECK(c.kv_blocks == (64 * block + 8 * lay.seq_state_bytes) / block);
  // A budget the states alone nearly fill: an error naming both.
  s.enable_prefix_caching = true;
  s.prefix_state_snapshots = 0;
  s.kv_cache_memory_bytes = static_cast<uint64_t>(12 * lay.seq_state_bytes + block);
  try {
    server::scheduler_config(s, *model);
    FAIL("no error");
  } catch (const Error& err) {
    const std::string w = err.what();
    CHECK(w.find("--kv-cache-memory-bytes") != std::string::npos);
    CHECK(w.find("--max-num-seqs 4") != std::string::npos);
    CHECK(w.find("--prefix-state-snapshots") != std::string::npos);
  }
}
