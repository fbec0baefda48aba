// Decode kernels that do in one launch what the step did in several
// (issue 26: fewer launches per layer). Each matches the unfused launches
// it replaces (gpu/kernels.h) to within summation order; tests in
// tests/gpu/test_gpu_decode_step.cpp.
//
// Contract: device pointers; asynchronous on s; programmatic dependent
// launch where s asks for it (gpu::Stream::set_programmatic_launch). Shapes
// out of range throw Error(invalid_argument / unsupported) before anything
// is enqueued; the *_fits() functions say which shapes are taken.
#pragma once
#include <cstdint>

#include "gpu/kernels.h"
#include "gpu/memory.h"
#include "gpu/quant.h"

namespace hmoe::gpu {

// The post-attention residual add + RMSNorm fused into the decode router
// (gpu::add_rms_norm followed by gpu::router_gemv_topk): for t < n,
// x[t] += delta[t] (stored; delta may be null), hb[t] = bf16(x[t] /
// rms * norm_w) (and hf[t] the same in fp32 when hf is given), then the
// router logits of hb and the softmax top-k into ids / weights. The norm's
// sums run in the order add_rms_norm's do (bit for bit). hidden <= 8192.
// logits: [n, experts] fp32 scratch; counter as for router_gemv_topk.
bool norm_router_fits(int64_t n, int64_t hidden, int64_t experts);
void add_rms_norm_router_topk(float* x, const float* delta, int64_t n, int64_t hidden, const bf16_t* norm_w, float eps, bf16_t* hb, float* hf,
                              const bf16_t* w, int64_t experts, int64_t k, bool normalize, float* logits, int32_t* counter, int32_t* ids,
                              float* weights, Stream& s);

// gpu::qkv_norm_rope_store followed by gpu::attention in one launch, for
// steps whose every sequence has one token (decode): the raw q|k|v rows
// (qkv, row stride ldq: heads q heads, then kv_heads k heads, then kv_heads
// v heads of hd) are normed and rotated on the fly, each group's first head
// stores the token's key and value at slots[t] of kc / vc, and each head
// attends over the slot lists as gpu::attention does, the token's own key
// and value taken from the block (the same bf16 values the cache gets).
// qkv is not written. Same arguments and limits as the two it replaces.
void norm_rope_store_attention(float* qkv, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* w_q,
                               const bf16_t* w_k, float eps, const int32_t* pos, const float* inv_freq, const int32_t* slots, bf16_t* kc,
                               bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale,
                               float* scratch, bf16_t* out, Stream& s);

// gpu::add_rms_norm followed by gpu::gguf_gemv of the normed row, for one
// token (decode at batch 1): x += delta (stored; delta may be null),
// hb = bf16(x / rms * norm_w) (hf the same in fp32 when given), y = hb W^T
// (row stride ldy), in one launch: every block normalises the row itself
// in add_rms_norm's order (the same hb, and so the same y, bit for bit).
// counter: one int32 of device memory, 0 before and after (needed with
// delta). w as gguf_gemv takes it, with up to 8192 columns.
bool norm_gemv_fits(const GgufWeight& w, int64_t n);
void add_rms_norm_gguf_gemv(float* x, const float* delta, int64_t n, const bf16_t* norm_w, float eps, bf16_t* hb, float* hf, const GgufWeight& w,
                            float* y, int64_t ldy, int32_t* counter, Stream& s);

}  // namespace hmoe::gpu
