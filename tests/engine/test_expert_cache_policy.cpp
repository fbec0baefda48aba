// The host-side decisions of split decode and the GPU expert cache
// (engine/layers/expert_cache_policy.h) on random traces: LRU slots against
// a plain reference model of LRU, and the split count against a brute-force
// balance of the two sides.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <map>
#include <random>
#include <set>

#include "engine/layers/expert_cache_policy.h"
#include "engine/layers/gpu_expert_cache.h"

using namespace hmoe;

namespace {

// Reference LRU: a list of keys, most recent first.
struct RefLru {
  size_t cap;
  std::list<uint64_t> order;
  bool access(uint64_t k, const std::set<uint64_t>& pinned, bool* evicted) {  // true: hit
    *evicted = false;
    for (auto it = order.begin(); it != order.end(); ++it)
      if (*it == k) {
        order.erase(it);
        order.push_front(k);
        return true;
      }
    if (order.size() == cap) {
      for (auto it = order.rbegin(); it != order.rend(); ++it)
        if (!pinned.count(*it)) {
          order.erase(std::next(it).base());
          *evicted = true;
          break;
        }
      if (!*evicted) return false;  // every slot in use this step: not admitted
    }
    order.push_front(k);
    return false;
  }
};

}  // namespace

TEST_CASE("ExpertSlotCache is LRU: the same hits and evictions as a reference LRU on random Zipf and uniform traces") {
  for (const bool zipf : {false, true})
    for (const int64_t slots : {1, 7, 32}) {
      std::mt19937_64 rng(static_cast<uint64_t>(slots) * 7 + zipf);
      const int64_t layers = 3, experts = 24, k = 4;
      std::vector<double> wts;
      for (int64_t e = 0; e < experts; ++e) wts.push_back(zipf ? 1.0 / std::pow(static_cast<double>(e + 1), 1.1) : 1.0);
      std::discrete_distribution<int> pick(wts.begin(), wts.end());
      ExpertSlotCache c(slots);
      RefLru ref{static_cast<size_t>(slots), {}};
      int64_t tick = 0, hits = 0, evictions = 0, ref_hits = 0, ref_evictions = 0;
      for (int step = 0; step < 400; ++step)
        for (int64_t l = 0; l < layers; ++l) {
          ++tick;
          std::set<int> chosen;
          while (static_cast<int64_t>(chosen.size()) < k) chosen.insert(pick(rng));
          std::set<uint64_t> used;  // keys touched in this layer step (protected from eviction)
          std::vector<int64_t> held;
          for (int e : chosen) {
            const uint64_t key = static_cast<uint64_t>(l) << 32 | static_cast<uint32_t>(e);
            const bool here = c.find(l, e) >= 0;
            bool ev = false;
            const bool rh = ref.access(key, used, &ev);
            CHECK(rh == here);
            ref_hits += rh;
            ref_evictions += ev;
            int64_t s = c.find(l, e);
            if (s >= 0) {
              ++hits;
              c.touch(s, tick);
            } else {
              bool cev = false;
              s = c.admit(l, e, tick, &cev);
              evictions += cev;
            }
            if (s >= 0) {
              used.insert(key);
              held.push_back(s);
            }
          }
          // The slots of this layer step are distinct and hold what they should.
          std::set<int64_t> distinct(held.begin(), held.end());
          CHECK(distinct.size() == held.size());
          CHECK(c.used() <= slots);
        }
      CHECK(hits == ref_hits);
      CHECK(evictions == ref_evictions);
      MESSAGE(std::string(zipf ? "Zipf 1.1" : "uniform") << ", " << slots << " slots of " << layers * experts << " experts: hit rate "
                                             << static_cast<double>(hits) / (400.0 * layers * k));
      if (slots >= 32 && zipf) CHECK(hits > 400 * layers * k / 3);  // a skewed trace hits well above capacity / experts (44%)
    }
}

TEST_CASE("decode's cyclic layer order: one LRU over all layers below a token's working set never hits, an LRU per layer does") {
  // Every token routes the same K experts in each of L layers, layer after layer.
  const int64_t L = 4, K = 3, slots = L * K - 1;
  ExpertSlotCache global(slots);
  std::vector<ExpertSlotCache> per;
  const std::vector<int64_t> q = per_layer_slots(slots, L);
  int64_t sum = 0;
  for (int64_t x : q) {
    CHECK(x >= slots / L);
    CHECK(x <= slots / L + 1);
    sum += x;
    per.emplace_back(x);
  }
  CHECK(sum == slots);
  int64_t tick = 0, global_hits = 0, layer_hits = 0, layers_whole = 0;
  for (int64_t l = 0; l < L; ++l) layers_whole += q[static_cast<size_t>(l)] >= K;
  for (int token = 0; token < 50; ++token)
    for (int64_t l = 0; l < L; ++l) {
      ++tick;
      for (int64_t e = 0; e < K; ++e) {
        if (const int64_t s = global.find(l, e); s >= 0) {
          ++global_hits;
          global.touch(s, tick);
        } else {
          global.admit(l, e, tick);
        }
        ExpertSlotCache& c = per[static_cast<size_t>(l)];
        if (const int64_t s = c.find(l, e); s >= 0) {
          ++layer_hits;
          c.touch(s, tick);
        } else {
          c.admit(l, e, tick);
        }
      }
    }
  MESSAGE("global LRU hits " << global_hits << ", per-layer LRU hits " << layer_hits << " of " << 50 * L * K);
  CHECK(global_hits == 0);
  CHECK(layer_hits >= 49 * layers_whole * K);  // every layer whose share holds its K experts hits from the second token on
  CHECK(layers_whole == L - 1);
  CHECK(per_layer_slots(5, 0).empty());
}

TEST_CASE("ExpertSlotCache never hands out a slot used by the current layer step, and drop() empties a slot") {
  ExpertSlotCache c(2);
  CHECK(c.admit(0, 1, 1) >= 0);
  CHECK(c.admit(0, 2, 1) >= 0);
  CHECK(c.admit(0, 3, 1) == -1);  // both slots in use at tick 1
  CHECK(c.used() == 2);
  bool ev = false;
  const int64_t s = c.admit(0, 3, 2, &ev);  // the next step may evict
  CHECK(s >= 0);
  CHECK(ev);
  CHECK(c.find(0, 3) == s);
  CHECK(c.find(0, 1) + c.find(0, 2) == -1 + (1 - s));  // one of the two is gone
  c.drop(s);
  CHECK(c.find(0, 3) == -1);
  CHECK(c.used() == 1);
}

TEST_CASE("split_stream_count balances the CPU's read time against the copies, as a brute force does") {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> bw(10e9, 200e9);
  std::uniform_int_distribution<int> cnt(0, 64);
  for (int i = 0; i < 500; ++i) {
    SplitCost c;
    c.host_bandwidth = bw(rng);
    c.pcie_bandwidth = bw(rng);
    c.copy_latency_s = 1e-5;
    const int64_t misses = cnt(rng), free_slots = cnt(rng);
    const uint64_t b = 1000000 + static_cast<uint64_t>(cnt(rng)) * 100000;
    const int64_t m = split_stream_count(misses, b, free_slots, c);
    CHECK(m >= 0);
    CHECK(m <= std::min(misses, free_slots));
    auto t = [&](int64_t x) {
      const double cpu = static_cast<double>(misses - x) * static_cast<double>(b) / c.host_bandwidth;
      return x == 0 ? cpu : std::max(cpu, c.copy_latency_s + static_cast<double>(x) * static_cast<double>(b) / c.pcie_bandwidth);
    };
    double best = t(0);
    for (int64_t x = 1; x <= std::min(misses, free_slots); ++x) best = std::min(best, t(x));
    CHECK(t(m) == doctest::Approx(best).epsilon(1e-12));
  }
  // Equal bandwidths, no latency: half the misses each way.
  SplitCost eq;
  eq.host_bandwidth = eq.pcie_bandwidth = 50e9;
  eq.copy_latency_s = 0;
  CHECK(split_stream_count(8, 3000000, 100, eq) == 4);
  CHECK(split_pcie_share(eq) == doctest::Approx(0.5));
  // A fixed share, capped by the free slots; unknown bandwidths: nothing copied.
  SplitCost fixed;
  fixed.share = 0.25;
  CHECK(split_stream_count(8, 1, 100, fixed) == 2);
  CHECK(split_stream_count(8, 1, 1, fixed) == 1);
  CHECK(split_stream_count(8, 1, 100, SplitCost{}) == 0);
}

TEST_CASE("gpu_expert_cache and gpu_split_decode settings parse, bad values name the flag") {
  CHECK(parse_gpu_expert_cache("auto") == -1);
  CHECK(parse_gpu_expert_cache("0") == 0);
  CHECK(parse_gpu_expert_cache("2GiB") == (2ll << 30));
  CHECK(parse_gpu_split_decode("auto") == -1);
  CHECK(parse_gpu_split_decode("0.5") == 0.5);
  CHECK(parse_gpu_split_decode("0") == 0);
  CHECK_THROWS_WITH(parse_gpu_split_decode("1.5"), doctest::Contains("--gpu-split-decode"));
  CHECK_THROWS_WITH(parse_gpu_split_decode("half"), doctest::Contains("--gpu-split-decode"));
  CHECK_THROWS_WITH(parse_gpu_expert_cache("lots"), doctest::Contains("--gpu-expert-cache"));
}
