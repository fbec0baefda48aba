// Expert cache simulator: replays a routing trace (engine/layers/
// routing_trace.h) against a GPU cache of individual experts of host layers
// holding `bytes`, under one of three policies, and counts hits, misses,
// admissions (experts copied to the GPU) and evictions - so that the cache's
// policy and size are chosen with figures (`hmoe bench cache-sim`).
//
// What is simulated: per step and layer, the routed expert ids go through
// ExpertCacheSet::split (engine/layers/expert_cache_policy.h), the very code
// the GPU expert cache runs, with every miss the policy admits copied (split
// share 1): a cached expert is a hit (it runs on the GPU); a miss runs on
// the CPU in that step unless the policy admits it into a slot (copied to the
// GPU, evicting another when full). per_layer (the default, what the real
// cache does): each served layer gets an even share of the slots; global:
// one pool over all layers. Policies (lru, lfu, freq_recency) are described
// in expert_cache_policy.h.
// Hit rates are given per expert load (distinct experts per step and layer:
// the bytes a step reads) and per token-expert pair.
//
// Contract: pure functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/layers/expert_cache_policy.h"
#include "engine/layers/routing_trace.h"

namespace hmoe {


struct CacheSimResult {
  CachePolicy policy = CachePolicy::lru;
  bool per_layer = true;
  uint64_t bytes = 0, expert_bytes = 0;
  int64_t capacity = 0;           // experts the cache holds
  int64_t loads = 0, hits = 0;    // distinct experts per step and layer
  int64_t pairs = 0, pair_hits = 0;
  int64_t admissions = 0, evictions = 0;
  uint64_t copied_bytes = 0;      // admissions x expert_bytes (the real cache's bytes moved)
  int64_t steps = 0, tokens = 0;  // tokens: summed over steps (one layer's count)
  double hit_rate() const { return loads ? static_cast<double>(hits) / static_cast<double>(loads) : 0; }
  double pair_hit_rate() const { return pairs ? static_cast<double>(pair_hits) / static_cast<double>(pairs) : 0; }
  // Bytes copied to the GPU per token (admissions).
  double copied_bytes_per_token() const {
    return tokens ? static_cast<double>(admissions) * static_cast<double>(expert_bytes) / static_cast<double>(tokens) : 0;
  }
};

// layers: which layers the cache serves (empty: every layer with records in
// the trace), in ascending order (the order the slots are shared in).
CacheSimResult simulate_expert_cache(const RoutingTrace& t, uint64_t bytes, uint64_t expert_bytes, CachePolicy p,
                                     const std::vector<bool>& layers = {}, bool per_layer = true);

// The hit rate an ideal static placement of the `capacity` most used experts
// (over the whole trace, known in advance) would get: the bound a policy is
// compared against.
double static_top_hit_rate(const RoutingTrace& t, int64_t capacity, const std::vector<bool>& layers = {});

}  // namespace hmoe
