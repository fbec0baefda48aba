// hmoe bench MODEL --decode-kernels (tools/hmoe/bench_kernels.cpp): one
// decode step's CUDA graph node by node (gpu::Graph::time_nodes): per node
// its part of the step (layer, attention / feed-forward, tail), kernel,
// grid, block, shared memory, the bytes its launcher declared, its time
// alone (after every earlier node finished, events either side) and in the
// graph (the cut after it minus the cut before it, programmatic edges kept),
// and GB/s against the read probe; then sums per kernel and per part, and
// the whole graph's time against the benchmark's step.
#pragma once
#include <cstdint>

#include "gpu/memory.h"

namespace hmoe::cli {

// step_ms: the benchmark's measured wall time per step; read_bw: bytes/s of gpu::read_probe.
void print_decode_kernels(int64_t batch, const gpu::GraphTiming& t, double step_ms, double read_bw);

}  // namespace hmoe::cli
