// Prefix caching and the host KV tier (engine/kv/kv_cache.h): block sharing and
// LRU eviction against a plain reference of what was written, copy-on-write,
// pool exhaustion, the host tier's offload/restore/drop; greedy outputs of
// the tiny Qwen3-MoE fixture identical with caching on, off, and with a
// first tier so small that every reuse comes from the host tier; a 10-turn
// chat through the HTTP API reporting usage.prompt_tokens_details.cached_tokens.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"
#include "tests/server/server_fixture.h"

using namespace hmoe;
using nlohmann::json;

namespace {

// Writes random floats into every K/V slot of positions [from, to) of seq and
// records them in ref[(token id chain position)].
struct Filler {
  std::mt19937_64 rng{99};
  std::uniform_real_distribution<float> d{-2.0f, 2.0f};
  // Expected K then V floats of (layer, pos), per sequence key.
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> fill(KvCache& kv, int seq, int64_t from, int64_t to) {
    std::map<std::pair<int64_t, int64_t>, std::vector<float>> out;
    const KvLayout& l = kv.layout();
    for (int64_t layer = 0; layer < l.layers; ++layer)
      for (int64_t p = from; p < to; ++p) {
        std::vector<float> v;
        float* k = kv.k(layer, seq, p);
        for (int64_t i = 0; i < l.k_floats(); ++i) v.push_back(k[i] = d(rng));
        float* vv = kv.v(layer, seq, p);
        for (int64_t i = 0; i < l.v_floats(); ++i) v.push_back(vv[i] = d(rng));
        out[{layer, p}] = v;
      }
    return out;
  }
};

bool holds(KvCache& kv, int seq, const std::map<std::pair<int64_t, int64_t>, std::vector<float>>& want, int64_t to) {
  const KvLayout& l = kv.layout();
  for (const auto& [key, v] : want) {
    if (key.second >= to) continue;
    const float* k = kv.k(key.first, seq, key.second);
    const float* vv = kv.v(key.first, seq, key.second);
    for (int64_t i = 0; i < l.k_floats(); ++i)
      if (k[i] != v[static_cast<size_t>(i)]) return false;
    for (int64_t i = 0; i < l.v_floats(); ++i)
      if (vv[i] != v[static_cast<size_t>(l.k_floats() + i)]) return false;
  }
  return true;
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 151000);
  return t;
}

const KvLayout kLayout{2, 2, 3};  // 2 layers, 6 floats per token in K and in V

}  // namespace

TEST_CASE("kv cache: full blocks are shared by hash, unreferenced ones evicted in LRU order") {
  std::mt19937_64 rng(5);
  Filler fl;
  KvCache kv(kLayout, 6, 4, KvCacheOptions{true, 42, 0});
  REQUIRE(kv.prefix_caching());
  const auto a = random_tokens(rng, 11);
  int sa = kv.add_sequence();
  CHECK(kv.attach_prefix(sa, a, 10) == 0);  // cold
  kv.reserve(sa, 11);
  auto ref_a = fl.fill(kv, sa, 0, 11);
  kv.commit(sa, a, 11);  // two full blocks (0..7) registered; the third is partial

  // B shares the first 8 tokens with A while A still runs.
  auto b = a;
  b[9] ^= 1;
  int sb = kv.add_sequence();
  const int64_t free_before = kv.free_blocks();
  CHECK(kv.attach_prefix(sb, b, static_cast<int64_t>(b.size()) - 1) == 8);
  CHECK(kv.free_blocks() == free_before);  // shared, nothing taken
  CHECK(holds(kv, sb, ref_a, 8));
  CHECK(kv.slot_index(sb, 5) == kv.slot_index(sa, 5));

  // A prefix that differs in the first block shares nothing; the chain
  // (previous hash) means block 2 of a cannot match at position 0.
  auto c = a;
  c[0] ^= 1;
  int sc = kv.add_sequence();
  CHECK(kv.attach_prefix(sc, c, 10) == 0);
  std::vector<int32_t> shifted(a.begin() + 4, a.end());
  int sd = kv.add_sequence();
  CHECK(kv.attach_prefix(sd, shifted, 6) == 0);
  kv.free_sequence(sc);
  kv.free_sequence(sd);

  // Freeing A keeps B's shared blocks intact even when the pool is reused.
  kv.free_sequence(sa);
  kv.reserve(sb, 12);
  fl.fill(kv, sb, 8, 12);
  int se = kv.add_sequence();
  kv.reserve(se, 4 * kv.free_blocks());  // takes every free block
  fl.fill(kv, se, 0, kv.capacity(se));
  CHECK(kv.free_blocks() == 0);
  CHECK(holds(kv, sb, ref_a, 8));
  CHECK_THROWS_AS(kv.reserve(sb, 17), Error);  // exhausted: an error, B unchanged
  CHECK(kv.capacity(sb) == 12);
  CHECK(holds(kv, sb, ref_a, 8));
  kv.free_sequence(se);
  kv.free_sequence(sb);
  CHECK(kv.free_blocks() == 6);

  // LRU: cache two one-block prefixes, X then Y; taking one block evicts X (oldest).
  KvCache lru(kLayout, 3, 4, KvCacheOptions{true, 1, 0});
  const auto x = random_tokens(rng, 5), y = random_tokens(rng, 5);
  for (const auto* t : {&x, &y}) {
    int s = lru.add_sequence();
    lru.reserve(s, 5);
    fl.fill(lru, s, 0, 5);
    lru.commit(s, *t, 5);
    lru.free_sequence(s);
  }
  CHECK(lru.cached_free_blocks() == 2);
  int s1 = lru.add_sequence();
  lru.reserve(s1, 8);  // one truly free block, then one evicted: X's
  CHECK(lru.stats().evictions == 1);
  int sx = lru.add_sequence(), sy = lru.add_sequence();
  CHECK(lru.attach_prefix(sx, x, 4) == 0);
  CHECK(lru.attach_prefix(sy, y, 4) == 4);
  CHECK(lru.stats().hit_tokens == 4);
}

TEST_CASE("kv cache: truncating into a shared block copies it first") {
  std::mt19937_64 rng(6);
  Filler fl;
  KvCache kv(kLayout, 4, 4, KvCacheOptions{true, 0, 0});
  const auto a = random_tokens(rng, 9);
  int sa = kv.add_sequence();
  kv.reserve(sa, 9);
  auto ref = fl.fill(kv, sa, 0, 9);
  kv.commit(sa, a, 9);
  int sb = kv.add_sequence();
  REQUIRE(kv.attach_prefix(sb, a, 8) == 8);
  kv.truncate(sb, 6);  // block 1 would be rewritten: B gets a private copy
  CHECK(kv.slot_index(sb, 5) != kv.slot_index(sa, 5));
  CHECK(holds(kv, sb, ref, 6));
  fl.fill(kv, sb, 6, 8);
  CHECK(holds(kv, sa, ref, 9));  // A untouched
}

TEST_CASE("kv cache: evicted blocks go to the host tier and come back; a full host tier drops its LRU block") {
  std::mt19937_64 rng(7);
  Filler fl;
  KvCache kv(kLayout, 2, 4, KvCacheOptions{true, 3, 2});
  const auto a = random_tokens(rng, 9);
  int sa = kv.add_sequence();
  kv.reserve(sa, 8);
  auto ref_a = fl.fill(kv, sa, 0, 8);
  kv.commit(sa, a, 8);
  kv.free_sequence(sa);
  // Another sequence takes both first-tier blocks: A's go to the host tier.
  int sx = kv.add_sequence();
  kv.reserve(sx, 8);
  fl.fill(kv, sx, 0, 8);
  CHECK(kv.stats().offloaded_blocks == 2);
  CHECK(kv.stats().offloaded_bytes == 2 * KvCache::bytes_per_block(kLayout, 4));
  kv.free_sequence(sx);  // X never committed: its blocks are plain free ones
  int sb = kv.add_sequence();
  CHECK(kv.attach_prefix(sb, a, 8) == 8);
  CHECK(kv.stats().hit_tokens == 0);
  CHECK(kv.stats().host_hit_tokens == 8);
  CHECK(kv.stats().restored_blocks == 2);
  CHECK(holds(kv, sb, ref_a, 8));
  kv.free_sequence(sb);

  // Three more cached blocks through a 2-block host tier: the oldest is dropped.
  KvCache small(kLayout, 1, 4, KvCacheOptions{true, 3, 2});
  std::vector<std::vector<int32_t>> ts;
  std::vector<std::map<std::pair<int64_t, int64_t>, std::vector<float>>> refs;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(random_tokens(rng, 5));
    int s = small.add_sequence();
    small.reserve(s, 4);  // evicts (offloads) the previous one
    refs.push_back(fl.fill(small, s, 0, 4));
    small.commit(s, ts.back(), 4);
    small.free_sequence(s);
  }
  CHECK(small.stats().offloaded_blocks == 3);
  CHECK(small.stats().host_dropped == 1);
  int s = small.add_sequence();
  CHECK(small.attach_prefix(s, ts[0], 4) == 0);  // dropped
  small.free_sequence(s);
  s = small.add_sequence();
  CHECK(small.attach_prefix(s, ts[1], 4) == 4);  // from the host tier (evicting ts[3] to it)
  CHECK(holds(small, s, refs[1], 4));
  small.free_sequence(s);
  s = small.add_sequence();
  CHECK(small.attach_prefix(s, ts[3], 4) == 4);
  CHECK(holds(small, s, refs[3], 4));
}

TEST_CASE("kv cache: Engram per-sequence state turns prefix caching off; bad settings are errors") {
  KvLayout l = kLayout;
  l.seq_state_bytes = 64;
  KvCache kv(l, 4, 4, KvCacheOptions{true, 0, 4});
  CHECK_FALSE(kv.prefix_caching());
  CHECK(kv.host_blocks() == 0);
  int s = kv.add_sequence();
  const std::vector<int32_t> t{1, 2, 3, 4, 5};
  kv.reserve(s, 5);
  kv.commit(s, t, 5);
  kv.free_sequence(s);
  s = kv.add_sequence();
  CHECK(kv.attach_prefix(s, t, 4) == 0);

  CHECK_THROWS_AS(KvCache(kLayout, 4, 4, KvCacheOptions{true, 0, -1}), Error);

  std::vector<std::string> args{"--no-enable-prefix-caching", "--block-size", "32"};
  Settings st = Settings::load(args);
  CHECK_FALSE(st.enable_prefix_caching);
  CHECK(st.block_size == 32);
  CHECK(Settings::defaults().enable_prefix_caching);
}

namespace {
struct Fix {
  std::unique_ptr<Model> model;
  Fix() {
    Settings s = Settings::defaults();
    s.threads = 2;
    s.progress = "none";
    model = Model::load(test::fixture_model("tiny-qwen3moe"), s);
  }
};
Fix& fix() {
  static Fix f;
  return f;
}

std::vector<int32_t> run_one(Scheduler& sched, const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t* cached = nullptr) {
  auto r = std::make_unique<SeqRequest>();
  r->prompt = prompt;
  r->max_tokens = max_tokens;
  r->sampling.temperature = 0;
  r->channel = std::make_shared<SeqChannel>();
  auto ch = r->channel;
  REQUIRE(sched.submit(std::move(r)) == Scheduler::Submit::ok);
  auto d = ch->wait_all();
  CHECK(d.finish == FinishReason::length);
  if (cached) *cached = ch->cached_tokens();
  std::vector<int32_t> out;
  for (const auto& e : d.tokens) out.push_back(e.token);
  return out;
}
}  // namespace

TEST_CASE("scheduler: greedy outputs are identical with prefix caching on, off, and from the host tier") {
  Model& m = *fix().model;
  std::mt19937_64 rng(31);
  const auto prefix = random_tokens(rng, 37);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    auto p = prefix;
    auto tail = random_tokens(rng, 2 + rng() % 9);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  prompts.push_back(prefix);                                // exactly the prefix: its last block must still be computed
  prompts.push_back({prefix.begin(), prefix.begin() + 32});  // ends on a block boundary

  SchedulerConfig off;
  off.prefix_caching = false;
  off.kv_blocks = 64;
  std::vector<std::vector<int32_t>> want;
  {
    Scheduler s(m, off);
    for (const auto& p : prompts) want.push_back(run_one(s, p, 8));
    CHECK(s.stats().kv.queries == 0);
  }

  SchedulerConfig on = off;
  on.prefix_caching = true;
  {
    Scheduler s(m, on);
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      int64_t cached = -1;
      CHECK(run_one(s, prompts[i], 8, &cached) == want[i]);
      // Whole blocks of the shared prefix, never the last prompt token's block.
      CHECK(cached == (i == 0 ? 0 : i == 6 ? 16 : 32));
    }
    // The engine thread publishes stats after the step that finished the last request.
    for (int i = 0; i < 1000 && s.stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto st = s.stats();
    CHECK(st.kv.hit_tokens == 32 * 5 + 16);
    CHECK(st.kv.host_hit_tokens == 0);
    CHECK(st.kv_blocks_used == 0);  // cached blocks are free to take, not in use
  }

  // All at once: sequences share blocks while they run.
  {
    Scheduler s(m, on);
    run_one(s, prefix, 1);
    std::vector<std::shared_ptr<SeqChannel>> chans;
    for (const auto& p : prompts) {
      auto r = std::make_unique<SeqRequest>();
      r->prompt = p;
      r->max_tokens = 8;
      r->sampling.temperature = 0;
      r->channel = std::make_shared<SeqChannel>();
      chans.push_back(r->channel);
      REQUIRE(s.submit(std::move(r)) == Scheduler::Submit::ok);
    }
    for (size_t i = 0; i < chans.size(); ++i) {
      auto d = chans[i]->wait_all();
      std::vector<int32_t> got;
      for (const auto& e : d.tokens) got.push_back(e.token);
      CHECK(got == want[i]);
    }
  }

  // First tier of 4 blocks (one sequence), host tier of 16: every request
  // (47 prompt + 8 generated tokens, or 50 + 8) takes all 4 first-tier
  // blocks, so each reuse comes from the host tier.
  SchedulerConfig tiny = on;
  tiny.kv_blocks = 4;
  tiny.host_kv_blocks = 16;
  {
    const auto other = random_tokens(rng, 50);
    std::vector<std::vector<int32_t>> ps, ws;
    std::vector<int32_t> other_want;
    {
      Scheduler ref(m, off);
      other_want = run_one(ref, other, 8);
      for (int i = 0; i < 4; ++i) {
        auto p = prefix;
        auto tail = random_tokens(rng, 10);
        p.insert(p.end(), tail.begin(), tail.end());
        ps.push_back(p);
        ws.push_back(run_one(ref, p, 8));
      }
    }
    Scheduler s(m, tiny);
    for (size_t i = 0; i < ps.size(); ++i) {
      CAPTURE(i);
      int64_t cached = -1;
      CHECK(run_one(s, ps[i], 8, &cached) == ws[i]);
      CHECK(cached == (i == 0 ? 0 : 32));
      CHECK(run_one(s, other, 8, &cached) == other_want);
      CHECK(cached == (i == 0 ? 0 : 48));
    }
    for (int i = 0; i < 1000 && s.stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto st = s.stats();
    CHECK(st.kv.hit_tokens == 0);  // every reuse came from the host tier
    CHECK(st.kv.host_hit_tokens == 3 * 32 + 3 * 48);
    CHECK(st.kv.restored_blocks == 3 * 2 + 3 * 3);
    // 9 distinct blocks reach the host once each: 2 prefix, 4 prompt tails, 3 of `other`
    // (a restored block evicted again is already there and is not copied twice).
    CHECK(st.kv.offloaded_blocks == 9);
    CHECK(st.kv.host_dropped == 0);
  }
}

TEST_CASE("scheduler: KV pool exhaustion with shared prefixes preempts but never corrupts another sequence") {
  Model& m = *fix().model;
  std::mt19937_64 rng(41);
  const auto prefix = random_tokens(rng, 33);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 10; ++i) {
    auto p = prefix;
    auto tail = random_tokens(rng, 1 + rng() % 20);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  SchedulerConfig single;
  single.prefix_caching = false;
  single.max_num_seqs = 1;
  single.kv_blocks = 16;
  std::vector<std::vector<int32_t>> want;
  {
    Scheduler s(m, single);
    for (const auto& p : prompts) want.push_back(run_one(s, p, 24));
  }
  for (int64_t host : {0, 8}) {
    CAPTURE(host);
    SchedulerConfig tight;
    tight.kv_blocks = 10;  // far fewer than 10 sequences need
    tight.host_kv_blocks = host;
    Scheduler s(m, tight);
    std::vector<std::shared_ptr<SeqChannel>> chans;
    for (const auto& p : prompts) {
      auto r = std::make_unique<SeqRequest>();
      r->prompt = p;
      r->max_tokens = 24;
      r->sampling.temperature = 0;
      r->channel = std::make_shared<SeqChannel>();
      chans.push_back(r->channel);
      REQUIRE(s.submit(std::move(r)) == Scheduler::Submit::ok);
    }
    for (size_t i = 0; i < chans.size(); ++i) {
      CAPTURE(i);
      auto d = chans[i]->wait_all();
      CHECK(d.finish == FinishReason::length);
      std::vector<int32_t> got;
      for (const auto& e : d.tokens) got.push_back(e.token);
      CHECK(got == want[i]);
    }
    CHECK(s.stats().preemptions > 0);
    CHECK(s.stats().kv.hit_tokens > 0);
  }
}

TEST_CASE("scheduler and server: a block size that is not a power of two is an error") {
  SchedulerConfig c;
  c.block_size = 12;
  CHECK_THROWS_AS(Scheduler(*fix().model, c), Error);
  Settings s = test::test_settings();
  s.block_size = 24;
  CHECK_THROWS_AS(server::scheduler_config(s, *fix().model), Error);
  s.block_size = 32;
  CHECK(server::scheduler_config(s, *fix().model).block_size == 32);
  s.kv_offloading_size = 1e7;  // 10 PiB of host pool
  CHECK_THROWS_AS(server::scheduler_config(s, *fix().model), Error);
  s.kv_offloading_size = 0.01;
  CHECK(server::scheduler_config(s, *fix().model).host_kv_blocks > 0);
}

namespace {
double metric_of(uint16_t port, const std::string& name) {
  test::HttpReply r = test::http(port, "GET", "/metrics");
  std::smatch mt;
  std::regex re("\n" + name + " ([0-9.e+-]+)\n");
  std::string body = "\n" + r.body;
  if (!std::regex_search(body, mt, re)) return -1;
  return std::stod(mt[1]);
}
}  // namespace

TEST_CASE("http: a 10-turn chat reports cached prompt tokens from turn 2 and equals a run without caching") {
  Settings on_s = test::test_settings();
  Settings off_s = test::test_settings();
  off_s.enable_prefix_caching = false;
  test::RunningServer on(on_s), off(off_s);
  json tools = json::array({json{{"type", "function"},
                                 {"function", json{{"name", "get_weather"},
                                                   {"description", "Current weather of a city"},
                                                   {"parameters", json{{"type", "object"},
                                                                       {"properties", json{{"city", json{{"type", "string"}}}}},
                                                                       {"required", json::array({"city"})}}}}}}});
  json messages_on = json::array({json{{"role", "system"},
                                       {"content", "You are a careful agent. Use the tools when they help, and answer briefly. "
                                                   "Think step by step about what the user asks before you answer."}}});
  json messages_off = messages_on;
  int64_t cached_sum = 0;
  const double cached_before = metric_of(on.port, "hmoe_prompt_tokens_cached_total");
  for (int turn = 1; turn <= 10; ++turn) {
    CAPTURE(turn);
    const std::string user = "Turn " + std::to_string(turn) + ": what is the weather in city number " + std::to_string(turn * 7) + "?";
    messages_on.push_back(json{{"role", "user"}, {"content", user}});
    messages_off.push_back(json{{"role", "user"}, {"content", user}});
    if (turn % 3 == 0) {  // a tool call and its result in the history
      json call = json{{"role", "assistant"},
                       {"content", ""},
                       {"tool_calls", json::array({json{{"id", "call_" + std::to_string(turn)},
                                                        {"type", "function"},
                                                        {"function", json{{"name", "get_weather"}, {"arguments", "{\"city\":\"c7\"}"}}}}})}};
      json result = json{{"role", "tool"}, {"tool_call_id", "call_" + std::to_string(turn)}, {"content", "sunny, 21 C"}};
      for (json* msgs : {&messages_on, &messages_off}) {
        msgs->push_back(call);
        msgs->push_back(result);
      }
    }
    json body = {{"model", "tiny-qwen3moe"}, {"temperature", 0}, {"max_tokens", 6}, {"tools", tools}};
    body["messages"] = messages_on;
    test::HttpReply ron = test::http(on.port, "POST", "/v1/chat/completions", body.dump());
    body["messages"] = messages_off;
    test::HttpReply roff = test::http(off.port, "POST", "/v1/chat/completions", body.dump());
    REQUIRE(ron.status == 200);
    REQUIRE(roff.status == 200);
    json jon = json::parse(ron.body), joff = json::parse(roff.body);
    const json& mon = jon["choices"][0]["message"];
    const json& moff = joff["choices"][0]["message"];
    CHECK(mon["content"] == moff["content"]);
    CHECK(mon.value("reasoning_content", json()) == moff.value("reasoning_content", json()));
    CHECK(mon.contains("tool_calls") == moff.contains("tool_calls"));
    if (mon.contains("tool_calls") && moff.contains("tool_calls") && mon["tool_calls"].size() == moff["tool_calls"].size())
      for (size_t k = 0; k < mon["tool_calls"].size(); ++k) CHECK(mon["tool_calls"][k]["function"] == moff["tool_calls"][k]["function"]);
    CHECK(jon["usage"]["prompt_tokens"] == joff["usage"]["prompt_tokens"]);
    const int64_t cached = jon["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    CHECK(joff["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
    if (turn == 1) CHECK(cached == 0);
    else CHECK(cached > 0);
    CHECK(cached < jon["usage"]["prompt_tokens"].get<int64_t>());
    cached_sum += cached;
    json reply = jon["choices"][0]["message"];
    json assistant = {{"role", "assistant"}, {"content", reply["content"].is_string() ? reply["content"] : json("")}};
    messages_on.push_back(assistant);
    messages_off.push_back(assistant);
  }
  CHECK(cached_sum > 0);
  CHECK(metric_of(on.port, "hmoe_prompt_tokens_cached_total") - cached_before == static_cast<double>(cached_sum));
  CHECK(metric_of(on.port, "hmoe_prefix_cache_hit_tokens_total") >= static_cast<double>(cached_sum));
  CHECK(metric_of(on.port, "hmoe_prefix_cache_hits_total") >= 9);
  CHECK(metric_of(on.port, "hmoe_prefix_cache_hit_rate") > 0);
  CHECK(metric_of(off.port, "hmoe_prefix_cache_queries_total") == 0);
  CHECK(metric_of(off.port, "hmoe_prompt_tokens_cached_total") == 0);
}
