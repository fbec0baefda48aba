// CPU implementations of the transformer ops other than matmul (numa/kernels.h)
// and routed experts (numa/expert_engine.h). fp32 activations; weights in
// any dtype the Mat view describes. Functions taking a pool split work over
// it; the rest are cheap enough to run on the calling thread.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "numa/kernels.h"

namespace hmoe::ops {

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for n rows of width d (w: d elements).
// x and y may alias.
void rms_norm(const float* x, int64_t n, int64_t d, const cpu::Mat& w, double eps, float* y);

// Rotary tables for one position: cos/sin of pos * inv_freq, computed as
// Hugging Face does (inv_freq in fp32, the product in fp32).
struct Rope {
  explicit Rope(int64_t head_dim, double theta);
  // Rotates each of `heads` vectors of x[head_dim] in place (rotate-half).
  void apply(float* x, int64_t heads, int64_t pos) const;
  int64_t head_dim;
  std::vector<float> inv_freq;
};

// One token's place in a batch: which sequence and which position.
struct TokenSlot {
  int seq;
  int64_t pos;
};

// Causal grouped-query attention over the paged cache. q: [n, heads, hd];
// the keys/values of every token in the batch must already be in `kv`.
// out: [n, heads, hd]. Token t attends to positions 0..slots[t].pos of its sequence.
// Threaded over (token, kv head, chunk of positions) with a log-sum-exp
// merge of the chunks (engine/ops/cpu_attention.cpp), reading the cache's
// head-major tiles in its dtype; AVX-512, AVX2 or plain C++ by
// cpu::best_isa(), any head dim. Pool null: the calling thread.
void attention(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots,
               KvCache& kv, int64_t layer, float scale, float* out, numa::ThreadPool* pool);
// The same for batches holding prompt chunks: runs of >= 16 consecutive
// positions of one sequence are computed as blocked matrix products (16
// query tokens x the group's heads per item, keys decoded once per run;
// engine/ops/cpu_attention_prefill.cpp, AVX-512, hd 64/128/256, fp32/bf16 KV),
// every other token by attention() above. Same contract; each token's
// result has the same bits as attention() gives it where attention() runs
// its context as one chunk (contexts below 256, or batches of >= 4 x threads
// (token group, kv head) items), so prompt runs keep batch invariance.
void attention_prefill(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots,
                       KvCache& kv, int64_t layer, float scale, float* out, numa::ThreadPool* pool);
// Plain reference of the same (one (token, head) at a time, double sums): tests.
void attention_reference(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots,
                         KvCache& kv, int64_t layer, float scale, float* out);

// h[i] = silu(g[i]) * u[i]
void silu_mul(const float* g, const float* u, int64_t n, float* h);

// Softmax over logits[0..e), then the k largest (ties: lower index first),
// renormalised when `normalize`. ids/weights receive k entries.
void softmax_topk(const float* logits, int64_t e, int64_t k, bool normalize, int32_t* ids, float* weights);

}  // namespace hmoe::ops
