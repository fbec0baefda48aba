// hmoe bench MODEL: the model benchmark (tools/hmoe/bench_model.cpp), the
// llama-bench of hmoe. What it times, exactly:
//   prefill "ppP": one prompt of P random token ids through Model::forward
//     in the chunks `serve` uses (--max-num-batched-tokens tokens per step),
//     logits of the last token only, from the first chunk's call until the
//     last chunk's logits are on the host. tok/s = P / seconds.
//   decode "tgN": N steps of B sequences (one token each per step, random
//     ids, logits of every token copied to the host, no sampling), from the
//     first step's call until the last step's logits are on the host.
//     tok/s = B * N / seconds (summed over the batch).
//   "@ dD": the test runs after a context of D random tokens per sequence,
//     computed once per test (untimed) and kept: each repetition truncates
//     the KV cache back to D, as llama-bench restores its depth state.
// Each test runs once untimed (warm-up: CUDA graphs, page faults, caches)
// and then --repetitions times; tok/s is the mean over repetitions with the
// sample standard deviation. Token ids come from a generator seeded by
// --seed; no tokenizer runs. The model is loaded, placed and threaded
// exactly as `serve` does it (the settings table: --device, --threads,
// --gpu-resident-moe-layers, ...). On the GPU path the time is split as
// GpuStepTimes reports it (GPU work, CPU experts, host<->device transfers).
// --decode-breakdown (GPU) adds a table per decode test: the CUDA graphs and
// kernel nodes one step replays (and per layer), ms per step, the GPU weight
// bytes a step reads (GpuRuntime::decode_weight_bytes) and the GB/s that
// makes against the device's read bandwidth (gpu::read_probe), then the
// step's kernels by name and count, then per layer the device time of its
// attention and feed-forward parts in 8 more steps per batch launched
// plainly with events between the parts (GpuRuntime::set_part_profile).
// On the GPU path with host layers, a "decode bound" table follows: per
// decode test the cold bytes per step (distinct host experts the CPU ran x
// their bytes, GpuStepTimes::cold_bytes) over the host read bandwidth
// measured at the end, plus the measured GPU time per step.
// --routing-replay FILE (GPU): the host layers' routed ids come from a
// routing trace (engine/layers/routing_trace.h, RoutingReplay; e.g. `hmoe
// bench trace --zipf 1.2`) instead of the router, to drive the GPU expert
// cache with a skewed popularity at the real cost of each step.
#pragma once
#include <string>
#include <vector>

#include "configs/settings.h"

namespace hmoe::cli {

// args: MODEL and the benchmark's own options (settings already consumed).
// Prints the markdown table (or one JSON object with --json) on stdout,
// progress on stderr; bad options throw Error(invalid_argument).
int run_bench_model(const Settings& s, std::vector<std::string>& args);

}  // namespace hmoe::cli
