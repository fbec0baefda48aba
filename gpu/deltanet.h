// CUDA kernels of Qwen3-Next (engine/layers/hybrid_gpu.h): Gated DeltaNet
// linear attention and the pieces of its gated full attention and gated
// shared expert. Launchers on device pointers, asynchronous on `s`, all
// arithmetic fp32; in a build without CUDA each throws Error(unsupported).
// The CPU meaning is engine/layers/gated_deltanet.h and hybrid_blocks.h;
// the delta rule itself is engine/ops/delta_rule.h.
//
// Gated DeltaNet works on the step's tokens ordered by sequence
// (DeltaNetGroups): ordered token i is batch row order[i]; sequence group g
// holds ordered tokens [start[g], start[g] + count[g]) and its state buffer
// at state[g] (device address; this layer's part at `state_off` bytes:
// the conv window [(conv_k - 1)][conv_dim] then the delta-rule state
// [value heads][dk][dv], fp32, deltanet_layer_state_bytes()). fresh[g]:
// the sequence has no state yet (a new sequence): both read as zero.
#pragma once
#include <cstdint>

#include "gpu/memory.h"

namespace hmoe::gpu {

struct DeltaNetShape {
  int64_t nk = 0, nv = 0, dk = 0, dv = 0, conv_k = 0;
  int64_t key_dim() const { return nk * dk; }
  int64_t value_dim() const { return nv * dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Columns of the fused input product per token: [q k v z] grouped per key
  // head as the checkpoint's in_proj_qkvz stores them, then in_proj_ba's
  // [b a] grouped per key head.
  int64_t proj_cols() const { return 2 * key_dim() + 2 * value_dim() + 2 * nv; }
};
// Device bytes of one layer's state per sequence (256-byte aligned).
int64_t deltanet_layer_state_bytes(const DeltaNetShape& sh);

struct DeltaNetGroups {
  const int32_t* order = nullptr;      // [n]
  const int32_t* tok_group = nullptr;  // [n] group of ordered token i
  const int32_t* start = nullptr;      // [groups]
  const int32_t* count = nullptr;      // [groups]
  const int32_t* fresh = nullptr;      // [groups]
  const uint64_t* state = nullptr;     // [groups]
};

// For ordered tokens [tok0, tok0 + ntok): the causal depthwise conv (weights
// conv_w [conv_dim][conv_k]) over the group's window and its rows of `proj`
// (batch rows of proj_cols() floats, stride ld), silu; q and k heads
// l2-normalised (x / sqrt(sum x^2 + 1e-6)), q also / sqrt(dk). conv_out:
// [ordered token][conv_dim] ([q | k | v]); gate / beta: [ordered token][nv],
// beta = sigmoid(b), gate = a_neg[h] * softplus(a + dt_bias[h]).
// Does not change the window (deltanet_conv_window does, afterwards).
// Takes the vectorised kernel (gpu/deltanet_io.cu) where the shape allows
// (conv_k 4, dk dividing 128 and a multiple of 4, dv and ld multiples of 4,
// 16-byte aligned buffers), else the plain one; so does deltanet_gated_norm
// (dv a multiple of 4 up to 512), whatever the delta-rule kernel.
void deltanet_prepare(const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok, const DeltaNetShape& sh,
                      const float* conv_w, const float* a_neg, const float* dt_bias, int64_t state_off, float* conv_out, float* gate,
                      float* beta, Stream& s);
// Groups [g0, g0 + gn): the window becomes the last conv_k - 1 inputs.
void deltanet_conv_window(const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const DeltaNetShape& sh,
                          int64_t state_off, Stream& s);
// The gated delta rule for groups [g0, g0 + gn) from conv_out / gate / beta,
// updating each group's state; out: [ordered token][nv * dv].
// chunked: groups of more than max_recurrent tokens, in chunks of `chunk`
// tokens (parallel within a chunk, recurrent across chunks; 0: the
// default 64). recurrent: groups of at most max_recurrent tokens, token by
// token. Each launch leaves the other's groups alone.
void deltanet_chunked(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                      const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t chunk, float* out, Stream& s);
// The chunked delta rule's kernels (gpu/deltanet_chunked.cu tells v2's design):
//  - v1: one block per (sequence, value head, 32 value columns) walking the
//    chunks in order, plain fp32, no scratch;
//  - v2: all chunks' intra-chunk work at once (W, U, the decayed q.k), then
//    a walk over the chunks per (sequence, value head, 32 value columns)
//    with its products on tensor cores in 3xTF32 (fp32 accuracy); needs a
//    device scratch of deltanet_v2_scratch_bytes and dk, dv multiples of 16;
//  - v3 (gpu/deltanet_v3.cu): v2's intra-chunk work, then a walk over the
//    chunks that computes only each chunk's entering state (two dependent
//    products per chunk, the next chunk's rows loaded meanwhile), then
//    every chunk's outputs at once; 3xTF32 like v2; scratch of
//    deltanet_v3_scratch_bytes (v2's plus K' and an entering state per
//    chunk and value head), dk, dv multiples of 16.
//  - v4 (gpu/deltanet_v4.cu): per chunk only (I + A)^-1 diag(beta) and the
//    decayed q.k (C x C each) and its decay factors to the scratch, then a
//    walk per (sequence, value head, 32 value columns) that computes u and
//    the outputs from the chunk's rows itself (3xTF32); writes nothing but
//    the outputs into out; scratch of deltanet_v4_scratch_bytes, dk, dv
//    multiples of 16.
//  - v5 (gpu/deltanet_v5.cu): v4's algebra in WY form: phase 1 adds per
//    chunk W = Tb diag(exp G) K and U = Tb V, the walk per (sequence, value
//    head, 32 value columns) computes only u = U - W S and the state (and
//    stores each chunk's entering state), phase 3 every chunk's outputs at
//    once; 3xTF32; scratch of deltanet_v5_scratch_bytes, dk, dv multiples of
//    16. Not the default until measured on a GPU.
enum class DeltaNetKernel { v1, v2, v3, v4, v5 };
// The kernel the layers use (setting gpu_deltanet_kernel; process-wide, set
// when the GPU runtime is built, before any layer runs).
void set_deltanet_kernel(DeltaNetKernel k);
DeltaNetKernel deltanet_kernel();
// v2's tokens per chunk for `chunk` (0: 64): 16, 32 or 64, halved while its
// shared memory does not fit this GPU; 0 when v2 cannot run the shape or
// chunk (dk or dv not a multiple of 16, another chunk size): v1 runs then.
int64_t deltanet_v2_chunk(const DeltaNetShape& sh, int64_t chunk);
// v2's chunk slots for a step of ntok ordered tokens in gn groups (a bound
// on the chunks of the groups it runs: ntok / v2_chunk + gn, so that a
// step's launch does not depend on how its tokens split into sequences),
// and the scratch bytes they take: slots x value heads x (C dk + C^2 + 2C
// + 8) floats (Qwen3-Next-80B-A3B, C = 64: 1.5 MiB per slot, 50 MiB for a
// 2048-token step of one sequence).
int64_t deltanet_v2_slots(int64_t ntok, int64_t gn, int64_t v2_chunk);
int64_t deltanet_v2_scratch_bytes(const DeltaNetShape& sh, int64_t v2_chunk, int64_t slots);
// v3's chunk (as deltanet_v2_chunk, with v3's shared memory) and scratch:
// slots x value heads x (2 C dk + C^2 + 2C + 8 + dk dv) floats (C = 64,
// Qwen3-Next-80B-A3B: 4.6 MiB per slot, 152 MiB for a 2048-token step);
// slots as deltanet_v2_slots.
int64_t deltanet_v3_chunk(const DeltaNetShape& sh, int64_t chunk);
int64_t deltanet_v3_scratch_bytes(const DeltaNetShape& sh, int64_t v3_chunk, int64_t slots);
// v4's chunk (as deltanet_v2_chunk, with v4's shared memory) and scratch:
// slots x value heads x (2 C^2 + 2C + 8) floats (C = 64, Qwen3-Next-80B-A3B:
// 1.0 MiB per slot, 34 MiB for a 2048-token step); slots as deltanet_v2_slots.
int64_t deltanet_v4_chunk(const DeltaNetShape& sh, int64_t chunk);
int64_t deltanet_v4_scratch_bytes(const DeltaNetShape& sh, int64_t v4_chunk, int64_t slots);
// Benchmarks only: v4's launches that run, bit 0 phase 1, bit 1 the walk
// (default 3; any other mask leaves wrong results); bit 2: the 16-warp walk
// copies nothing after the first chunk (its products alone, for timing).
// Process-wide.
void set_deltanet_v4_phases(int mask);
// Benchmarks and tests: v4's walk, 1 the first (8 warps, k35a) or 2 (16
// warps, gpu/deltanet_v4_walk.cu, k36a; the default since an H100 run of
// 2026-12-07: 8.22-8.58 ms against 8.92-9.11 at 32k tokens, and the same
// GPU tests); same results to rounding. Process-wide.
void set_deltanet_v4_walk(int walk);
int deltanet_v4_walk();
// v5's chunk (as deltanet_v2_chunk, with v5's shared memory) and scratch:
// slots x value heads x (2 C^2 + 2C + 8 + C dk + dk dv) floats (v4's record,
// W and the state entering the chunk; C = 64, Qwen3-Next-80B-A3B: 4.0 MiB
// per slot, 132.6 MiB for a 2048-token step); slots as deltanet_v2_slots.
int64_t deltanet_v5_chunk(const DeltaNetShape& sh, int64_t chunk);
int64_t deltanet_v5_scratch_bytes(const DeltaNetShape& sh, int64_t v5_chunk, int64_t slots);
// Benchmarks only: v5's launches that run, bit 0 phase 1 (v4's phase 1 and
// W, U), bit 1 the walk, bit 2 the outputs (default 7; any other mask leaves
// wrong results). Process-wide.
void set_deltanet_v5_phases(int mask);
// Benchmarks only (bench_gpu_deltanet's phase rows): the v3 launches that
// run, bit 0 phase 1, bit 1 the walk, bit 2 the outputs (default 7; any
// other mask leaves wrong results). Process-wide.
void set_deltanet_v3_phases(int mask);
// The scratch the chunked delta rule with `kernel` needs for a step of ntok
// ordered tokens in gn groups (0 for v1, or where the kernel falls back to v1).
int64_t deltanet_chunked_scratch_bytes(const DeltaNetShape& sh, DeltaNetKernel kernel, int64_t chunk, int64_t ntok, int64_t gn);
// As above with the kernel chosen: ntok is the step's ordered tokens (at
// least the groups' tokens), scratch (v2 to v5) at least
// deltanet_chunked_scratch_bytes(sh, kernel, chunk, ntok, gn) bytes,
// 16-byte aligned like conv_out and out. v2 and v3 write intermediate
// values into out's rows of the groups they run.
void deltanet_chunked(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                      const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t chunk, float* out, Stream& s, DeltaNetKernel kernel,
                      int64_t ntok, void* scratch);
void deltanet_recurrent(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                        const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, float* out, Stream& s);
// Gated RMSNorm per (token, value head): y[order[i] - row0] = bf16(w *
// rms(o) * silu(z)), z from proj's z columns; y: [batch row][nv * dv] bf16.
// y_lo (optional, laid out as y): the rounding remainder bf16(value - y),
// the lo half of a split input.
void deltanet_gated_norm(const float* core, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok,
                         const DeltaNetShape& sh, const float* w, float eps, uint16_t* y, Stream& s, uint16_t* y_lo = nullptr, int64_t row0 = 0);
// Tests and benchmarks only (process-wide): the kernels deltanet_prepare and
// deltanet_gated_norm take. automatic: as above (prepare's vec2); plain:
// the plain kernels always; vec1 / vec2: prepare's tiled / sliding
// vectorised kernel (gpu/deltanet_io.h) where the shape allows, the norm's
// vectorised one. vec2_tile: vec2's ordered tokens per warp (0: as many as
// make one resident wave of blocks).
enum class DeltaNetIo { automatic, plain, vec1, vec2 };
void set_deltanet_io(DeltaNetIo io, int64_t vec2_tile = 0);
DeltaNetIo deltanet_io();
// Shared memory the chunked kernel takes for this shape (for the one-time
// opt-in above 48 KiB; done by the first launch or by this call, which a
// layer makes before any CUDA graph capture).
void deltanet_configure(const DeltaNetShape& sh);

// Gated attention, rows of x (stride ld): per q head [query hd | gate hd],
// then the k heads, then the v heads. One launch: q and k heads get RMSNorm
// with weights wq / wk (fp32, already 1 + w) and rotary embeddings on their
// first `rot` dimensions (rotate-half within them, inv_freq [rot / 2]); q
// goes to q_out [n][heads * hd]; keys and values are stored to the cache
// rows slots[t] (kv_heads * hd bf16). hd <= 256, rot even and <= hd.
void gated_qkv_prepare(const float* x, int64_t n, int64_t ld, int64_t heads, int64_t kv_heads, int64_t hd, int64_t rot, const float* wq,
                       const float* wk, float eps, const int32_t* pos, const float* inv_freq, const int32_t* slots, uint16_t* kc, uint16_t* vc,
                       float* q_out, Stream& s);
// attn[t][h * hd + i] = bf16(attn * sigmoid(gate)), gate = x[t * ld + h * 2 * hd + hd + i].
// With hi and lo (a split input, laid out as attn): hi = bf16(value), lo =
// bf16(value - hi), attn unchanged.
void gated_attention_gate(uint16_t* attn, const float* x, int64_t n, int64_t ld, int64_t heads, int64_t hd, Stream& s, uint16_t* hi = nullptr,
                          uint16_t* lo = nullptr);
// d[t][i] += sigmoid(logit[t]) * y[t][i] for t < n, i < hidden.
void add_sigmoid_scaled(float* d, const float* y, const float* logit, int64_t n, int64_t hidden, Stream& s);

}  // namespace hmoe::gpu
