// Expert cache simulator (see expert_cache_sim.h).
#include "engine/placement/expert_cache_sim.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "configs/error.h"

namespace hmoe {

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

CacheSimResult simulate_expert_cache(const RoutingTrace& t, uint64_t bytes, uint64_t expert_bytes, CachePolicy p, const std::vector<bool>& layers,
                                     bool per_layer) {
  CacheSimResult r;
  r.policy = p;
  r.per_layer = per_layer;
  r.bytes = bytes;
  r.expert_bytes = expert_bytes;
  r.capacity = expert_bytes ? static_cast<int64_t>(bytes / expert_bytes) : 0;
  std::vector<bool> seen(t.header.layers, false);
  for (const RoutingRecord& rec : t.records)
    if (rec.layer < seen.size() && served(layers, rec.layer)) seen[rec.layer] = true;
  std::vector<int64_t> order;
  for (uint32_t l = 0; l < t.header.layers; ++l)
    if (seen[l]) order.push_back(l);
  ExpertCacheSet set(order, r.capacity, p, per_layer);
  SplitCost copy_all;
  copy_all.share = 1;
  ExpertCacheCounters c;
  LayerSplit ls;
  std::vector<int32_t> ids;
  uint32_t last_step = UINT32_MAX;
  for (const RoutingRecord& rec : t.records) {
    if (rec.layer >= seen.size() || !seen[rec.layer]) continue;
    if (rec.step != last_step) {
      last_step = rec.step;
      ++r.steps;
      r.tokens += rec.tokens;
    }
    ids.assign(rec.ids.begin(), rec.ids.end());
    r.pairs += static_cast<int64_t>(ids.size());
    if (!set.covers(rec.layer)) {  // no slot for this layer: every expert a miss on the CPU
      std::vector<int64_t> cnt(t.header.experts, 0);
      for (int32_t e : ids) r.loads += cnt[static_cast<size_t>(e)]++ == 0;
      continue;
    }
    set.split(rec.layer, ids.data(), static_cast<int64_t>(ids.size()), t.header.experts, expert_bytes, copy_all, ls, c);
    r.loads += static_cast<int64_t>(ls.experts.size());
    for (size_t i = 0; i < ls.experts.size(); ++i)
      if (ls.slot[i] >= 0 && std::find(ls.copied.begin(), ls.copied.end(), i) == ls.copied.end()) r.pair_hits += ls.pairs[i];
  }
  r.hits = c.hits;
  r.admissions = c.admitted;
  r.evictions = c.evictions;
  r.copied_bytes = c.bytes;
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
