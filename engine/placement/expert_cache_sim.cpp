// Expert cache simulator (see expert_cache_sim.h).
#include "engine/placement/expert_cache_sim.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "configs/error.h"

namespace hmoe {

CachePolicy parse_cache_policy(const std::string& what, const std::string& v) {
  if (v == "lru") return CachePolicy::lru;
  if (v == "lfu") return CachePolicy::lfu;
  if (v == "freq_recency" || v == "freq-recency") return CachePolicy::freq_recency;
  fail(ErrorKind::invalid_argument, what + "='" + v + "': expected lru, lfu or freq_recency");
}

const char* cache_policy_name(CachePolicy p) {
  switch (p) {
    case CachePolicy::lru: return "lru";
    case CachePolicy::lfu: return "lfu";
    case CachePolicy::freq_recency: return "freq_recency";
  }
  return "?";
}

namespace {

bool served(const std::vector<bool>& layers, uint32_t l) { return layers.empty() || (l < layers.size() && layers[l]); }

// The distinct experts of one record, each with its token count.
void distinct(const RoutingRecord& r, std::vector<std::pair<uint16_t, int64_t>>& out, std::vector<int64_t>& count) {
  out.clear();
  for (uint16_t e : r.ids)
    if (count[e]++ == 0) out.push_back({e, 0});
  for (auto& [e, c] : out) c = std::exchange(count[e], 0);
}

}  // namespace

CacheSimResult simulate_expert_cache(const RoutingTrace& t, uint64_t bytes, uint64_t expert_bytes, CachePolicy p, const std::vector<bool>& layers) {
  CacheSimResult r;
  r.policy = p;
  r.bytes = bytes;
  r.expert_bytes = expert_bytes;
  r.capacity = expert_bytes ? static_cast<int64_t>(bytes / expert_bytes) : 0;
  const uint64_t E = t.header.experts;
  // Key: layer * E + expert. Cached entries ordered by the policy's eviction rank.
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> cached;  // key -> (frequency at insertion into `order`, last use)
  std::set<std::tuple<int64_t, int64_t, uint64_t>> order;              // (rank major, rank minor, key): begin() is the victim
  std::unordered_map<uint64_t, int64_t> freq;
  int64_t clock = 0, since_decay = 0;
  const int64_t decay_every = std::max<int64_t>(8 * r.capacity, 64);
  auto rank = [&](uint64_t key, int64_t f, int64_t last) {
    return p == CachePolicy::lfu ? std::make_tuple(f, last, key) : std::make_tuple(last, int64_t{0}, key);
  };
  std::vector<std::pair<uint16_t, int64_t>> ex;
  std::vector<int64_t> count(E, 0);
  uint32_t last_step = UINT32_MAX;
  for (const RoutingRecord& rec : t.records) {
    if (!served(layers, rec.layer)) continue;
    if (rec.step != last_step) {
      last_step = rec.step;
      ++r.steps;
      r.tokens += rec.tokens;
    }
    distinct(rec, ex, count);
    for (const auto& [e, c] : ex) {
      const uint64_t key = static_cast<uint64_t>(rec.layer) * E + e;
      ++clock;
      int64_t& f = freq[key];
      ++f;
      if (p == CachePolicy::freq_recency && ++since_decay >= decay_every) {
        since_decay = 0;
        for (auto it = freq.begin(); it != freq.end();) {
          it->second /= 2;
          it = it->second == 0 && !cached.count(it->first) ? freq.erase(it) : std::next(it);
        }
        // Cached entries' ranks do not use frequency under freq_recency: no reordering needed.
      }
      const int64_t fnow = freq.count(key) ? freq[key] : 0;
      ++r.loads;
      r.pairs += c;
      auto it = cached.find(key);
      if (it != cached.end()) {
        ++r.hits;
        r.pair_hits += c;
        order.erase(rank(key, it->second.first, it->second.second));
        it->second = {fnow, clock};
        order.insert(rank(key, fnow, clock));
        continue;
      }
      if (r.capacity == 0) continue;
      if (static_cast<int64_t>(cached.size()) >= r.capacity) {
        const uint64_t victim = std::get<2>(*order.begin());
        if (p == CachePolicy::freq_recency) {
          const auto fv = freq.find(victim);
          if (fnow <= (fv == freq.end() ? 0 : fv->second)) continue;  // not admitted: runs on the CPU, nothing copied
        }
        order.erase(order.begin());
        cached.erase(victim);
        ++r.evictions;
      }
      cached[key] = {fnow, clock};
      order.insert(rank(key, fnow, clock));
      ++r.admissions;
    }
  }
  return r;
}

double static_top_hit_rate(const RoutingTrace& t, int64_t capacity, const std::vector<bool>& layers) {
  const uint64_t E = t.header.experts;
  std::unordered_map<uint64_t, int64_t> uses;
  std::vector<std::pair<uint16_t, int64_t>> ex;
  std::vector<int64_t> count(E, 0);
  int64_t loads = 0;
  for (const RoutingRecord& rec : t.records) {
    if (!served(layers, rec.layer)) continue;
    distinct(rec, ex, count);
    for (const auto& [e, c] : ex) ++uses[static_cast<uint64_t>(rec.layer) * E + e], ++loads;
  }
  std::vector<int64_t> v;
  for (const auto& [k, u] : uses) v.push_back(u);
  std::sort(v.rbegin(), v.rend());
  int64_t top = 0;
  for (int64_t i = 0; i < std::min<int64_t>(capacity, static_cast<int64_t>(v.size())); ++i) top += v[static_cast<size_t>(i)];
  return loads ? static_cast<double>(top) / static_cast<double>(loads) : 0;
}

}  // namespace hmoe
