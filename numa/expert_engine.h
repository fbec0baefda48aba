// Routed experts on the CPU. Tokens routed to the same expert are computed
// together: one pass over that expert's weights per call, whatever the batch.
//
// Contract: moe_forward adds sum_k weight[t,k] * expert_{ids[t,k]}(x[t]) to
// out[t] for every token t. Expert weights are read-only and may be shared
// between concurrent callers; each call uses the given pool exclusively.
#pragma once
#include <cstdint>
#include <vector>

#include "numa/kernels.h"
#include "numa/thread_pool.h"

namespace hmoe::numa {

struct ExpertWeights {
  cpu::Mat gate, up;  // [intermediate, hidden]
  cpu::Mat down;      // [hidden, intermediate]
};

void moe_forward(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t k,
                 const std::vector<ExpertWeights>& experts, float* out, ThreadPool* pool);

// One SwiGLU MLP (dense layers, shared experts): out = down(silu(gate x) * up x), overwritten.
void mlp_forward(const float* x, int64_t n, const ExpertWeights& w, float* out, ThreadPool* pool);

}  // namespace hmoe::numa
