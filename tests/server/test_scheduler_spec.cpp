// Speculative decoding with Qwen3-Next's MTP head (--speculative-tokens N)
// on the tiny-qwen3next fixture, fp32 CPU: greedy outputs are token for
// token those of plain decoding for N = 1..3, alone, batched, with chunked
// prefill and with prefix caching; drafts forced right are all accepted and
// save steps, drafts forced wrong are all rejected (the recurrent state is
// rolled back) and change nothing; bad values and a model without a head
// are clear errors. The fixture's head is random, so its own acceptance is
// low; bench_speculative prints it and the speed-up.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"
#include "io/mmap_file.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::unique_ptr<Model> load_fixture(int64_t spec) {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00004.safetensors"), "run scripts/make-fixtures " << HMOE_BINARY_DIR);
  Settings s = Settings::defaults();
  s.threads = 2;
  s.progress = "none";
  s.device = "cpu";
  s.speculative_tokens = spec;
  return Model::load(dir, s);
}

std::vector<std::vector<int32_t>> prompts() {
  std::ifstream f(test::fixture_ref("tiny-qwen3next/np_reference.json"));
  const auto ref = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> out;
  for (const auto& chat : ref["chats"]) out.push_back(chat["ids"].get<std::vector<int32_t>>());
  std::mt19937_64 rng(41);
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p(3 + rng() % 90);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 151000);
    out.push_back(p);
  }
  return out;
}

struct Run {
  std::vector<std::vector<int32_t>> out;
  SchedulerStats stats;
};

// Greedy runs of every prompt; `together`: all submitted at once, else one after another.
Run run(Model& m, const std::vector<std::vector<int32_t>>& ps, int64_t max_tokens, const SchedulerConfig& c, bool together) {
  Scheduler sched(m, c);
  Run r;
  std::vector<std::shared_ptr<SeqChannel>> chans;
  auto collect = [&](SeqChannel& ch) {
    auto d = ch.wait_all();
    CHECK(d.error == "");
    std::vector<int32_t> t;
    for (const auto& e : d.tokens) t.push_back(e.token);
    r.out.push_back(t);
  };
  for (const auto& p : ps) {
    auto q = std::make_unique<SeqRequest>();
    q->prompt = p;
    q->max_tokens = max_tokens;
    q->sampling.temperature = 0;
    q->channel = std::make_shared<SeqChannel>();
    chans.push_back(q->channel);
    REQUIRE(sched.submit(std::move(q)) == Scheduler::Submit::ok);
    if (!together) collect(*chans.back());
  }
  if (together)
    for (auto& ch : chans) collect(*ch);
  r.stats = sched.stats();
  return r;
}

}  // namespace

TEST_CASE("speculative decoding (MTP head): greedy output equals plain decoding for 1..3 drafted tokens") {
  const auto ps = prompts();
  SchedulerConfig c;
  c.kv_blocks = 128;
  auto plain = load_fixture(0);
  CHECK(plain->speculative_tokens() == 0);
  const Run want = run(*plain, ps, 24, c, false);
  CHECK(want.stats.spec_drafted == 0);
  const Run want_batched = run(*plain, ps, 24, c, true);
  plain.reset();
  for (int64_t n = 1; n <= 3; ++n) {
    CAPTURE(n);
    auto m = load_fixture(n);
    REQUIRE(m->speculative_tokens() == n);
    REQUIRE(m->kv_layout().layers == 3);  // two full-attention layers and the head's
    const Run one = run(*m, ps, 24, c, false);
    CHECK(one.out == want.out);
    CHECK(one.stats.spec_drafted > 0);
    MESSAGE("N=" << n << ": " << one.stats.spec_accepted << " of " << one.stats.spec_drafted << " drafted tokens accepted (random head)");
    CHECK(run(*m, ps, 24, c, true).out == want_batched.out);
    SchedulerConfig chunked = c;
    chunked.max_num_batched_tokens = 5;  // prefill in pieces; verify chunks cut to what fits
    CHECK(run(*m, ps, 24, chunked, true).out == want_batched.out);
    SchedulerConfig cached = c;
    cached.state_snapshots = 8;
    const Run twice = run(*m, {ps[4], ps[4], ps[5]}, 24, cached, false);
    CHECK(twice.stats.kv.snapshots_restored >= 1);
    CHECK(twice.out[0] == want.out[4]);
    CHECK(twice.out[1] == want.out[4]);
    CHECK(twice.out[2] == want.out[5]);
  }
}

TEST_CASE("speculative decoding: drafts forced right are all accepted, forced wrong all rejected; output unchanged") {
  const auto ps = prompts();
  SchedulerConfig c;
  c.kv_blocks = 128;
  auto m = load_fixture(3);
  SchedulerConfig plain_c = c;
  plain_c.draft_override = [](std::span<const int32_t>, int64_t) { return std::vector<int32_t>{}; };  // no drafts: plain decoding
  const Run want = run(*m, ps, 24, plain_c, false);
  CHECK(want.stats.spec_drafted == 0);
  // Right: the known continuation (prompt i's greedy output).
  SchedulerConfig right = c;
  right.draft_override = [&](std::span<const int32_t> tokens, int64_t n) {
    std::vector<int32_t> d;
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto& p = ps[i];
      const auto& o = want.out[i];
      if (tokens.size() < p.size() || !std::equal(p.begin(), p.end(), tokens.begin())) continue;
      const size_t g = tokens.size() - p.size();
      if (g > o.size() || !std::equal(tokens.begin() + static_cast<std::ptrdiff_t>(p.size()), tokens.end(), o.begin())) continue;
      for (size_t k = g; k < o.size() && static_cast<int64_t>(d.size()) < n; ++k) d.push_back(o[k]);
      break;
    }
    return d;
  };
  const Run r = run(*m, ps, 24, right, false);
  CHECK(r.out == want.out);
  CHECK(r.stats.spec_drafted > 0);
  CHECK(r.stats.spec_accepted == r.stats.spec_drafted);
  CHECK(r.stats.steps < want.stats.steps);
  MESSAGE("forced right: " << r.stats.steps << " steps instead of " << want.stats.steps);
  // Wrong: a token the model never picks here, three times.
  SchedulerConfig wrong = c;
  wrong.draft_override = [](std::span<const int32_t>, int64_t n) { return std::vector<int32_t>(static_cast<size_t>(n), 151000); };
  const Run w = run(*m, ps, 24, wrong, true);
  CHECK(w.out == run(*m, ps, 24, plain_c, true).out);
  CHECK(w.stats.spec_drafted > 0);
  CHECK(w.stats.spec_accepted == 0);
}

TEST_CASE("speculative decoding: bad values and a model without an MTP head are clear errors") {
  for (const char* v : {"4", "-1", "x"}) {
    std::vector<std::string> args{"--speculative-tokens", v};
    try {
      Settings::load(args);
      FAIL("no error for --speculative-tokens " << v);
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("speculative-tokens") != std::string::npos);
    }
  }
  Settings s = Settings::defaults();
  s.threads = 2;
  s.progress = "none";
  s.device = "cpu";
  s.speculative_tokens = 2;
  const std::string moe = test::fixture_model("tiny-qwen3moe");
  REQUIRE(io::file_exists(moe + "/config.json"));
  try {
    Model::load(moe, s);
    FAIL("a model without mtp.* weights loaded with --speculative-tokens 2");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(std::string(e.what()).find("multi-token-prediction head (mtp.*") != std::string::npos);
  }
  s.speculative_tokens = 7;  // a value set in code, past the table's checks
  CHECK_THROWS_AS(Model::load(test::fixture_model("tiny-qwen3next"), s), Error);
}
