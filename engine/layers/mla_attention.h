// Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), as transformers'
// DeepseekV3Attention computes it:
//   q      = q_b(RMSNorm(q_a(x)))            (or q_proj(x) when q_lora_rank = 0)
//   [c, kr] = kv_a_proj_with_mqa(x);  c = RMSNorm(c)   (latent, kv_lora_rank)
//   [k_nope, v] = kv_b(c)  per head;  k = [k_nope, rope(kr)] (kr shared by heads)
//   scores = q.k * qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2
// with yarn rope on the last qk_rope_head_dim dims of q and on kr.
//
// Why a latent cache: per token and layer the KV cache keeps only [c, rope(kr)]
// (kv_lora_rank + qk_rope_head_dim floats; 576 for DeepSeek-V3 against
// 2 * 128 * 128 for plain K and V). Two ways to attend over it, which agree up
// to fp32 rounding:
//  - expanded: kv_b is applied to every cached latent of the sequence, then
//    ordinary attention (cheaper for prefill chunks, many queries per latent);
//  - latent (absorbed): kv_b's K half is folded into the query
//    (q_lat = W_UK^T q_nope) and its V half into the output
//    (o = W_UV sum_j p_j c_j), so attention runs in the latent space
//    (cheaper for decode: one query, nothing expanded).
// MlaMode::expanded_prefill expands for sequences with more than one token
// in the step (unless their expanded K/V would pass 256 MiB) and attends in
// the latent space for single-token decode; the expanded path holds
// [context, heads, nope + v] floats of one sequence at a time.
// MlaMode::automatic is latent for everything on the CPU: bench_mla on a
// DeepSeek-V3 layer (2 cores, bf16) measured the latent path 5-50x faster
// at decode and 2-7x faster for 32-token prefill chunks at 256-2048 tokens
// of context (the expanded path re-applies kv_b to the whole context).
//
// Rope layout: with rope_interleave (the default, and what the published
// weights expect) the rotary pairs are (2i, 2i+1); transformers permutes them
// to rotate-half order first, and so do we, so q_pe and the cached rope key
// are stored in that permuted order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/layers/cpu_layers.h"

namespace hmoe {

enum class MlaMode { automatic, latent, expanded, expanded_prefill };
// "auto", "latent", "expanded" or "expanded_prefill" (the mla_attention
// setting); throws Error(invalid_argument) otherwise.
MlaMode parse_mla_mode(const std::string& s);

// The cache layout of an MLA model: K holds [latent, rope key], no V.
KvLayout mla_kv_layout(const ModelConfig& c);

// Rotary tables of transformers' default / yarn rope (rope utils
// _compute_yarn_parameters): inv_freq over qk_rope_head_dim and the
// attention factor that multiplies cos and sin.
struct MlaRope {
  explicit MlaRope(const ModelConfig& c);
  // Rotates `heads` vectors of dim floats, `stride` floats apart, in place;
  // the result is in rotate-half order (see the file comment).
  void apply(float* x, int64_t heads, int64_t stride, int64_t pos) const;
  int64_t dim = 0;
  bool interleave = true;
  float attention_factor = 1.0f;
  std::vector<float> inv_freq;
};

// Softmax scale: qk_head_dim^-0.5, times mscale^2 under yarn with mscale_all_dim.
double mla_softmax_scale(const ModelConfig& c);

// The weights of one MLA layer (views; the checkpoint owns the data).
struct MlaWeights {
  cpu::Mat q_proj;                  // [heads*qk_head_dim, hidden] when q_lora_rank == 0
  cpu::Mat q_a, q_a_norm, q_b;      // [q_lora, hidden], [q_lora], [heads*qk_head_dim, q_lora]
  cpu::Mat kv_a, kv_a_norm, kv_b;   // [kv_lora+rope, hidden], [kv_lora], [heads*(nope+v), kv_lora]
  cpu::Mat o_proj;                  // [hidden, heads*v]
};
MlaWeights bind_mla_weights(WeightBinder& bind, const ModelConfig& c, const std::string& prefix);

// gemm: the input treatment of the layer's products (numa/kernels.h); its
// round_bf16 also rounds the latent KV cache to bf16, as the GPU stores it.
std::unique_ptr<AttentionBlock> make_mla_attention(const MlaWeights& w, const ModelConfig& c, int64_t layer, numa::ThreadPool& pool,
                                                   MlaMode mode, const cpu::GemmOptions& gemm = {});

}  // namespace hmoe
