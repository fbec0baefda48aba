// Routing traces (engine/layers/routing_trace.h) and the expert cache
// simulator (engine/placement/expert_cache_sim.h): the file format round
// trip and its bad inputs, the Zipf generator's skew, the three policies on
// hand-counted sequences, and a trace recorded from the tiny Qwen3-MoE
// fixture with --routing-trace.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include "configs/error.h"
#include "engine/layers/routing_trace.h"
#include "engine/loading/model.h"
#include "engine/placement/expert_cache_sim.h"
#include "io/mmap_file.h"
#include "tests/model_run.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::string tmp_path(const std::string& name) { return std::string(HMOE_BINARY_DIR) + "/routing_trace_" + name; }

// One layer, one token per step, k = 1: the expert sequence `seq`.
RoutingTrace sequence_trace(const std::vector<uint16_t>& seq, uint32_t experts = 8) {
  RoutingTrace t;
  t.header = {1, experts, 1, 4, 4};
  for (size_t i = 0; i < seq.size(); ++i) t.records.push_back({static_cast<uint32_t>(i), 0, 1, 1, {seq[i]}});
  return t;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("routing trace: write, read back, bad files") {
  const RoutingTrace t = zipf_routing_trace(1.0, 64, 4, 3, 50, 2, 7, 128, 64);
  CHECK(t.steps() == 25);
  CHECK(t.records.size() == 75);
  const std::string p = tmp_path("roundtrip.bin");
  write_routing_trace(p, t);
  const RoutingTrace r = read_routing_trace(p);
  CHECK(r.header.layers == 3);
  CHECK(r.header.experts == 64);
  CHECK(r.header.topk == 4);
  CHECK(r.header.expert_bytes() == 3ull * 128 * 64 * 2);
  REQUIRE(r.records.size() == t.records.size());
  for (size_t i = 0; i < r.records.size(); ++i) {
    CHECK(r.records[i].step == t.records[i].step);
    CHECK(r.records[i].layer == t.records[i].layer);
    CHECK(r.records[i].ids == t.records[i].ids);
  }
  const auto good = read_bytes(p);
  auto expect_error = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
    const std::string q = tmp_path("bad.bin");
    write_bytes(q, bytes);
    try {
      read_routing_trace(q);
      FAIL("no error for " << what);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
      CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, e.what());
    }
  };
  expect_error({}, "shorter than the 32-byte header");
  auto b = good;
  b[0] = 'X';
  expect_error(b, "not an hmoe routing trace");
  b = good;
  b[8] = 2;
  expect_error(b, "version 2");
  expect_error(std::vector<uint8_t>(good.begin(), good.end() - 1), "truncated");
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 40), "truncated record header");
  b = good;
  b[32 + 16] = 0xff, b[32 + 17] = 0xff;  // first id of the first record: 65535 >= 64 experts
  expect_error(b, "expert id 65535");
  b = good;
  b[32 + 4] = 9;  // first record's layer
  expect_error(b, "layer 9 is beyond");
  CHECK_THROWS_AS(read_routing_trace(tmp_path("does-not-exist.bin")), Error);
  CHECK_THROWS_AS(RoutingTraceWriter("/nonexistent-dir/x.bin", r.header), Error);
  CHECK_THROWS_AS(zipf_routing_trace(1.0, 8, 9, 1, 10), Error);  // topk > experts
  CHECK_THROWS_AS(zipf_routing_trace(-1.0, 8, 2, 1, 10), Error);
  std::remove(p.c_str());
}

TEST_CASE("zipf trace: k distinct experts per token, skew grows with s") {
  auto top_share = [](double s) {
    const RoutingTrace t = zipf_routing_trace(s, 128, 8, 1, 4000, 1, 3);
    std::map<uint16_t, int64_t> uses;
    for (const auto& r : t.records) {
      std::vector<uint16_t> ids = r.ids;
      std::sort(ids.begin(), ids.end());
      CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());  // distinct within the token
      for (uint16_t e : r.ids) ++uses[e];
    }
    std::vector<int64_t> v;
    for (const auto& [e, u] : uses) v.push_back(u);
    std::sort(v.rbegin(), v.rend());
    int64_t top = 0;
    for (size_t i = 0; i < 16 && i < v.size(); ++i) top += v[i];
    return static_cast<double>(top) / (4000.0 * 8);
  };
  const double uniform = top_share(0), zipf = top_share(1.2);
  MESSAGE("share of the 16 most used of 128 experts: uniform " << uniform << ", Zipf 1.2 " << zipf);
  CHECK(uniform < 0.16);  // 16/128 = 0.125 plus sampling noise
  CHECK(zipf > 0.4);
}

TEST_CASE("cache simulator: LRU, LFU and frequency+recency on hand-counted sequences") {
  // Capacity 2 experts. Sequence 0 1 0 2 0 1 (one expert per step).
  const RoutingTrace t = sequence_trace({0, 1, 0, 2, 0, 1});
  const uint64_t eb = 10;
  // LRU: 0 m, 1 m, 0 h, 2 m (evict 1), 0 h, 1 m (evict 2) -> 2 hits, 4 admissions, 2 evictions.
  CacheSimResult r = simulate_expert_cache(t, 2 * eb, eb, CachePolicy::lru);
  CHECK(r.capacity == 2);
  CHECK(r.loads == 6);
  CHECK(r.hits == 2);
  CHECK(r.admissions == 4);
  CHECK(r.evictions == 2);
  // LFU: same until 2 arrives (freq 0:2, 1:1) -> evicts 1; then 0 h; 1 (freq 2) vs cached 2 (freq 1): evicts 2 -> 2 hits.
  r = simulate_expert_cache(t, 2 * eb, eb, CachePolicy::lfu);
  CHECK(r.hits == 2);
  CHECK(r.evictions == 2);
  // freq_recency: 2 (freq 1) is not admitted over the LRU victim 1 (freq 1), so 1 stays and the last access hits -> 3 hits, 2 admissions.
  r = simulate_expert_cache(t, 2 * eb, eb, CachePolicy::freq_recency);
  CHECK(r.hits == 3);
  CHECK(r.admissions == 2);
  CHECK(r.evictions == 0);
  // A scan of one-off experts: LRU loses the hot one, freq_recency keeps it.
  const RoutingTrace scan = sequence_trace({0, 0, 1, 2, 3, 4, 5, 0, 6, 7, 0});
  CHECK(simulate_expert_cache(scan, eb, eb, CachePolicy::lru).hits == 1);
  CHECK(simulate_expert_cache(scan, eb, eb, CachePolicy::freq_recency).hits == 3);
  // No room, or everything fits.
  CHECK(simulate_expert_cache(t, eb - 1, eb, CachePolicy::lru).hits == 0);
  CHECK(simulate_expert_cache(t, 100 * eb, eb, CachePolicy::lru).hits == 3);  // only first uses miss
  CHECK(static_top_hit_rate(t, 2) == doctest::Approx(5.0 / 6));  // experts 0 and 1 cover 5 of 6 loads
  // Layers the cache does not serve are left out.
  CHECK(simulate_expert_cache(t, 2 * eb, eb, CachePolicy::lru, {false}).loads == 0);
  CHECK_THROWS_AS(parse_cache_policy("--policy", "fifo"), Error);
  // Distinct experts per step and layer: a batch of 2 tokens sharing an expert is one load, two pairs.
  RoutingTrace b;
  b.header = {1, 8, 2, 4, 4};
  b.records.push_back({0, 0, 2, 2, {1, 2, 1, 3}});
  r = simulate_expert_cache(b, 10 * eb, eb, CachePolicy::lru);
  CHECK(r.loads == 3);
  CHECK(r.pairs == 4);
}

TEST_CASE("cache simulator on Zipf traces: skew raises every policy's hit rate") {
  const RoutingTrace u = zipf_routing_trace(0.0, 128, 8, 4, 2000, 1, 5);
  const RoutingTrace z = zipf_routing_trace(1.2, 128, 8, 4, 2000, 1, 5);
  const uint64_t eb = u.header.expert_bytes();
  const uint64_t bytes = eb * 128;  // a quarter of the 4 x 128 experts
  for (CachePolicy p : {CachePolicy::lru, CachePolicy::lfu, CachePolicy::freq_recency}) {
    const double hu = simulate_expert_cache(u, bytes, eb, p).hit_rate(), hz = simulate_expert_cache(z, bytes, eb, p).hit_rate();
    MESSAGE(std::string(cache_policy_name(p)) << ": uniform " << hu << ", Zipf 1.2 " << hz);
    CHECK(hu < 0.3);
    CHECK(hz > hu + 0.2);
    CHECK(hz <= static_top_hit_rate(z, 128) + 0.02);  // no online policy beats the ideal static choice by more than noise
  }
}

TEST_CASE("routing replay: a layer's token rows in order, wrapping round; bad traces and calls are named") {
  RoutingTrace t;
  t.header = {2, 8, 2, 4, 4};
  t.records.push_back({0, 1, 2, 2, {1, 2, 3, 4}});
  t.records.push_back({1, 1, 1, 2, {5, 6}});
  RoutingReplay r(t);
  std::vector<int32_t> ids(4, -1);
  r.apply(1, ids.data(), 2, 2);
  CHECK(ids == std::vector<int32_t>{1, 2, 3, 4});
  r.apply(1, ids.data(), 2, 2);  // row 3 then back to row 1
  CHECK(ids == std::vector<int32_t>{5, 6, 1, 2});
  CHECK_THROWS_WITH(r.apply(0, ids.data(), 1, 2), doctest::Contains("no records of layer 0"));
  CHECK_THROWS_WITH(r.apply(1, ids.data(), 1, 3), doctest::Contains("routes 2 experts per token"));
  CHECK_THROWS_AS(RoutingReplay(RoutingTrace{}), Error);
}

TEST_CASE("--routing-trace records the fixture's routing, one record per step and MoE layer") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures " << HMOE_BINARY_DIR);
  const std::string p = tmp_path("fixture.bin");
  std::vector<std::string> args = {"--routing-trace", p};
  Settings s = Settings::load(args);
  s.progress = "none";
  s.device = "cpu";
  {
    auto m = Model::load(dir, s);
    const ModelConfig& c = m->config();
    KvCache kv(m->kv_layout(), 4, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, 8);
    Batch b;
    for (int i = 0; i < 5; ++i) b.add(100 + i, seq, i, i == 4);
    std::vector<float> logits;
    m->forward(b, kv, logits);  // step 0: a 5-token prompt
    for (int i = 5; i < 8; ++i) {
      b.clear();
      b.add(200 + i, seq, i, true);
      m->forward(b, kv, logits);  // steps 1-3: one token each
    }
    const RoutingTrace t = read_routing_trace(p);
    CHECK(t.header.layers == static_cast<uint32_t>(c.num_hidden_layers));
    CHECK(t.header.experts == static_cast<uint32_t>(c.num_experts));
    CHECK(t.header.topk == static_cast<uint32_t>(c.num_experts_per_tok));
    int64_t moe = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe += c.is_moe_layer(l);
    CHECK(t.steps() == 4);
    REQUIRE(static_cast<int64_t>(t.records.size()) == 4 * moe);
    CHECK(t.records[0].tokens == 5);
    CHECK(t.records.back().tokens == 1);
    for (const auto& r : t.records) {
      CHECK(r.k == t.header.topk);
      std::vector<uint16_t> ids(r.ids.begin(), r.ids.begin() + r.k);
      std::sort(ids.begin(), ids.end());
      CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
    }
  }
  std::remove(p.c_str());
  // A trace file that cannot be written is an error at load, naming it.
  std::vector<std::string> bad = {"--routing-trace", "/nonexistent-dir/trace.bin"};
  Settings sb = Settings::load(bad);
  sb.progress = "none";
  sb.device = "cpu";
  try {
    Model::load(dir, sb);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent-dir/trace.bin") != std::string::npos);
  }
}
