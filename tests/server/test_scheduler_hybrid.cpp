// Continuous batching of a hybrid linear-attention model (the tiny
// Qwen3-Next fixture): the recurrent state of each running sequence lives
// beside its KV blocks (KvCache seq_state, allocated by the scheduler's
// add_sequence, freed by free_sequence), so greedy outputs equal the
// reference and do not change with batch composition, chunked prefill
// (5-token chunks) or preemption (state dropped, prompt recomputed); prefix
// caching is off for such a model (shared KV blocks cannot restore a state).
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"
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
