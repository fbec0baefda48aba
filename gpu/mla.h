// CUDA kernels of multi-head latent attention (DeepSeek-V3 / Kimi-K2) and
// DeepSeek's group-limited sigmoid routing, as plain launchers on device
// pointers (conventions of gpu/kernels.h: bf16 as raw bits, fp32 math,
// asynchronous on `s`, Error(device) on a failed launch; without CUDA each
// throws Error(unsupported)). The CPU references are engine/blocks_mla.cpp
// and engine/blocks_deepseek_moe.cpp.
//
// The latent KV cache: one bf16 row of lw = kv_lora + rope values per slot
// and layer, [RMSNorm(latent), rope(k_pe)], rope in rotate-half order.
#pragma once
#include <cstdint>

#include "gpu/kernels.h"

namespace hmoe::gpu {

// Rotary tables of engine/layers/mla_attention.h's MlaRope: inv_freq[dim/2] on the
// device; with `interleave` the pairs (2i, 2i+1) are permuted to rotate-half
// order first; cos and sin are multiplied by attention_factor.
struct MlaRopeArgs {
  const float* inv_freq = nullptr;
  int64_t dim = 0;  // even, <= 256
  float attention_factor = 1.0f;
  bool interleave = true;
};

// y[t] = bf16(w * x[t] / sqrt(mean(x[t]^2) + eps)) over d values; x rows
// ldx floats apart, y rows d values. y_lo (optional, laid out as y): the
// rounding remainder, bf16(value - y) (a split input, see store_bf16_pair).
void rms_norm_rows(const float* x, int64_t ldx, int64_t n, int64_t d, const bf16_t* w, float eps, bf16_t* y, bf16_t* y_lo, Stream& s);

// Rope in place on `heads` vectors of rope.dim floats per token: token t's
// head h starts at x[t*ldx + h*hx] and takes position pos[t].
void mla_rope(float* x, int64_t ldx, int64_t hx, int64_t n, int64_t heads, const MlaRopeArgs& rope, const int32_t* pos, Stream& s);

// Latent cache store: kv[t*ldkv ...] holds [latent (r), k_pe (rope.dim)];
// cache[slots[t]] = bf16([RMSNorm_w(latent), rope(k_pe)]), rows of r + rope.dim.
void mla_kv_store(const float* kv, int64_t ldkv, int64_t n, int64_t r, const bf16_t* norm_w, float eps, const MlaRopeArgs& rope,
                  const int32_t* pos, const int32_t* slots, bf16_t* cache, Stream& s);

// Per-head products: y[t, h, o] = sum_i x[t*ldx + h*hx + i] * w[h*hw + o*in + i]
// for o < out, i < in, in fp32 (x is not rounded to bf16: the absorbed
// query and the latent attention output keep their fp32 values, which the
// tiny DeepSeek-V3 fixture's near-tied routing needs; it costs nothing in
// this SIMT kernel). Written to y (fp32) or, when y is
// null, to yb (bf16), at [t*ldy + h*hy + o]. in, hw: multiples of 8; in <= 2048.
void head_matmul(const float* x, int64_t ldx, int64_t hx, int64_t n, int64_t heads, int64_t in, int64_t out, const bf16_t* w, int64_t hw,
                 float* y, bf16_t* yb, int64_t ldy, int64_t hy, Stream& s);

// Attention in the latent space (kv_b absorbed). Token t, head h: query
// [q_lat[(t*heads + h)*r ..], q_pe[t*ldpe + h*hpe ..]] (r + rope values),
// keys the cache rows slot_lists[offsets[t] + j], j < lens[t], values their
// first r values; o_lat[(t*heads + h)*r ..] = softmax(scale * q.k) . c.
// Tokens with skip[t] != 0 (skip may be null) get zeros. r, rope: multiples
// of 8; r <= 1024. work: mla_attention_latent_workspace(n, ...) floats of
// device memory for the split-K partials, or null (then each block takes a
// token's whole context: correct, but slow for a few tokens).
void mla_attention_latent(const float* q_lat, const float* q_pe, int64_t ldpe, int64_t hpe, int64_t n, int64_t heads, int64_t r, int64_t rope,
                          const bf16_t* cache, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, const int32_t* skip,
                          float scale, float* o_lat, float* work, Stream& s);
// Floats of `work` mla_attention_latent needs for n tokens on the current device (0: none).
int64_t mla_attention_latent_workspace(int64_t n, int64_t heads, int64_t r, int64_t rope);

// cache rows slot_lists[i], first `cols` values, gathered: out[i] (bf16, rows of cols).
void gather_rows(const bf16_t* cache, int64_t ld, const int32_t* slot_lists, int64_t rows, int64_t cols, bf16_t* out, Stream& s);

// Attention over keys/values expanded from the latent cache. kv: fp32 rows
// (one per slot-list entry) of heads*(nope+vd): per head [k_nope, v]. Token
// t, head h: query q[t*ldq + h*(nope+rope) ..] ([q_nope, q_pe]); key j =
// [kv[offsets[t]+j, h, :nope], cache[slot_lists[offsets[t]+j], r : r+rope]];
// out[(t*heads + h)*vd ..] = bf16(softmax . v). When `only` is given, tokens
// with only[t] == 0 are left alone. nope + rope <= 1024, vd <= 128. out_lo
// (optional, laid out as out): the rounding remainder of each output value.
void mla_attention_expanded(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t nope, int64_t rope, int64_t vd, const float* kv,
                            const bf16_t* cache, int64_t lw, int64_t r, const int32_t* slot_lists, const int32_t* offsets,
                            const int32_t* lens, const int32_t* only, float scale, bf16_t* out, bf16_t* out_lo, Stream& s);

// DeepSeek-V3 routing (engine/layers/deepseek_moe.h's deepseek_route) for n
// tokens: logits [n, experts], bias [experts] fp32; ids/weights [n, k].
// experts <= 4096, n_group <= 64.
void deepseek_topk(const float* logits, const float* bias, int64_t n, int64_t experts, int64_t k, int64_t n_group, int64_t topk_group,
                   bool normalize, float scaling, int32_t* ids, float* weights, Stream& s);

}  // namespace hmoe::gpu
