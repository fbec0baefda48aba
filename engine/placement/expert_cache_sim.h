// Expert cache simulator: replays a routing trace (engine/layers/
// routing_trace.h) against a GPU cache of individual experts of host layers
// holding `bytes`, under one of three policies, and counts hits, misses,
// admissions (experts copied to the GPU) and evictions - so that the cache's
// policy and size are chosen with figures (`hmoe bench cache-sim`).
//
// What is simulated: per step and layer, the distinct experts the step's
// tokens route to. A cached expert is a hit (it runs on the GPU); a miss runs
// on the CPU in that step and may be admitted (copied to the GPU) for later
// steps, evicting others when full. Policies:
//  - lru: admit every miss, evict the least recently used;
//  - lfu: admit every miss, evict the least frequently used (counts over the
//    whole trace so far, cached or not; ties: least recent);
//  - freq_recency: LRU order for eviction, but a miss is admitted only when
//    its recent frequency (counts halved every 8 x capacity accesses) is
//    above the LRU victim's (TinyLFU-style admission): one-off experts do not
//    push hot ones out, and fewer copies cross PCIe.
// Hit rates are given per expert load (distinct experts per step and layer:
// the bytes a step reads) and per token-expert pair.
//
// Contract: pure functions; Error(invalid_argument) for a policy name that
// is none of the three, naming it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/layers/routing_trace.h"

namespace hmoe {

enum class CachePolicy { lru, lfu, freq_recency };
CachePolicy parse_cache_policy(const std::string& what, const std::string& v);
const char* cache_policy_name(CachePolicy p);

struct CacheSimResult {
  CachePolicy policy = CachePolicy::lru;
  uint64_t bytes = 0, expert_bytes = 0;
  int64_t capacity = 0;           // experts the cache holds
  int64_t loads = 0, hits = 0;    // distinct experts per step and layer
  int64_t pairs = 0, pair_hits = 0;
  int64_t admissions = 0, evictions = 0;
  int64_t steps = 0, tokens = 0;  // tokens: summed over steps (one layer's count)
  double hit_rate() const { return loads ? static_cast<double>(hits) / static_cast<double>(loads) : 0; }
  double pair_hit_rate() const { return pairs ? static_cast<double>(pair_hits) / static_cast<double>(pairs) : 0; }
  // Bytes copied to the GPU per token (admissions).
  double copied_bytes_per_token() const {
    return tokens ? static_cast<double>(admissions) * static_cast<double>(expert_bytes) / static_cast<double>(tokens) : 0;
  }
};

// layers: which layers the cache serves (empty: every layer in the trace).
CacheSimResult simulate_expert_cache(const RoutingTrace& t, uint64_t bytes, uint64_t expert_bytes, CachePolicy p,
                                     const std::vector<bool>& layers = {});

// The hit rate an ideal static placement of the `capacity` most used experts
// (over the whole trace, known in advance) would get: the bound a policy is
// compared against.
double static_top_hit_rate(const RoutingTrace& t, int64_t capacity, const std::vector<bool>& layers = {});

}  // namespace hmoe
