// hmoe bench trace / bench cache-sim (tools/hmoe/bench_trace.cpp):
//   bench trace --zipf S --experts E --topk K --layers L --tokens N
//     [--batch B] [--seed X] [--hidden H] [--moe-intermediate I] --out FILE
//   writes a synthetic routing trace (engine/layers/routing_trace.h;
//   S = 0 is uniform routing);
//   bench cache-sim TRACE --bytes 1GiB[,4GiB,...] [--policy lru,lfu,freq_recency]
//     [--bytes-per-weight 2 | --expert-bytes N] [--layers 0-47]
//     [--partition per_layer|global] [--json]
//   replays a trace (recorded with --routing-trace or written above)
//   against a GPU expert cache of each size under each policy (slots shared
//   per layer as the real cache does, or one pool: --partition) and prints
//   the hit rates, copies and the bound of an ideal static choice
//   (engine/placement/expert_cache_sim.h).
#pragma once
#include <string>
#include <vector>

#include "configs/settings.h"

namespace hmoe::cli {

int run_bench_trace(std::vector<std::string>& args);
int run_bench_cache_sim(std::vector<std::string>& args);

}  // namespace hmoe::cli
