// CUDA kernels of the transformer step, as plain launchers on device
// pointers. bf16 values travel as their raw 16-bit patterns (bf16_t); all
// arithmetic is fp32. The residual stream is fp32; inputs of matrix products
// are bf16. Each launcher is asynchronous on `s` and throws Error(device)
// with file:line when the launch fails; in a build without CUDA each throws
// Error(unsupported, "... not built with CUDA").
//
// Layouts: a matrix W is row-major [rows, cols] (nn.Linear); y = x W^T.
// Shapes are checked where a wrong one would read out of bounds; pointers
// are trusted. The CPU references are engine/ops/cpu_ops.h.
#pragma once
#include <cstdint>
#include <vector>

#include "gpu/memory.h"

namespace hmoe::gpu {

using bf16_t = uint16_t;  // raw bfloat16 bits

// out[t] = table[ids[t]] as fp32; table: [vocab, hidden].
void embedding(const bf16_t* table, const int32_t* ids, int64_t n, int64_t hidden, float* out, Stream& s);

// For i < n: r = rows ? rows[i] : i. If delta: x[r] += delta[r] (stored).
// Then y[i] = bf16(x[r] / sqrt(mean(x[r]^2) + eps) * w), and y_f32[i] the
// same before rounding when y_f32 is not null. d: row width.
void add_rms_norm(float* x, const float* delta, const int32_t* rows, int64_t n, int64_t d, const bf16_t* w, float eps, bf16_t* y,
                  float* y_f32, Stream& s);
// The same with fp32 weights (Qwen3-Next's zero-centred norms as 1 + w:
// bf16 would round 1 + w to 8 bits).
void add_rms_norm(float* x, const float* delta, const int32_t* rows, int64_t n, int64_t d, const float* w, float eps, bf16_t* y,
                  float* y_f32, Stream& s);

// Per-head RMSNorm (weight w[hd]) then rotate-half rotary embedding at
// position pos[t], in place. x: rows of stride ld floats; row t holds heads*hd
// values from its start. inv_freq: [hd/2]. hd even, <= 256.
void qk_norm_rope(float* x, int64_t n, int64_t ld, int64_t heads, int64_t hd, const bf16_t* w, float eps, const int32_t* pos,
                  const float* inv_freq, Stream& s);

// One launch for a GQA layer's rows [q heads | k heads | v heads] (stride
// ld): qk_norm_rope on the q heads (w_q) and the k heads (w_k), then
// kv_store of the rotated keys and the values (cache rows of kv_heads*hd).
// Same arithmetic as the three calls.
void qkv_norm_rope_store(float* x, int64_t n, int64_t ld, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* w_q, const bf16_t* w_k,
                         float eps, const int32_t* pos, const float* inv_freq, const int32_t* slots, bf16_t* kc, bf16_t* vc, Stream& s);

// kc[slots[t]] = bf16(k[t]), vc[slots[t]] = bf16(v[t]); rows of `width`
// values, source stride ld floats; cache rows of `width` values.
void kv_store(const float* k, const float* v, int64_t ld, int64_t n, int64_t width, const int32_t* slots, bf16_t* kc, bf16_t* vc,
              Stream& s);

constexpr int64_t attention_max_head_dim = 256;

// Causal GQA attention over a paged cache. Token t (query row t of stride
// ldq, heads*hd values) attends to cache slots slot_lists[offsets[t] + j],
// j < lens[t]; kc/vc rows hold kv_heads*hd values. out: [n, heads*hd] bf16.
// hd: any multiple of 32 up to attention_max_head_dim (256: Qwen3-Next;
// hd <= 128 runs a 128-thread block, hd > 128 a 256-thread one). max_len >= every lens[t];
// when few (token, head) pairs face long contexts the keys are split over
// several blocks (flash-decoding), which needs `scratch` of
// attention_scratch_floats(n, heads, hd, max_len) floats (may be null when that is 0).
void attention(const float* q, int64_t ldq, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const bf16_t* kc,
               const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, int64_t max_len, float scale,
               float* scratch, bf16_t* out, Stream& s);
int64_t attention_splits(int64_t n, int64_t heads, int64_t max_len);
int64_t attention_scratch_floats(int64_t n, int64_t heads, int64_t hd, int64_t max_len);

// The same attention on tensor cores for prefill (gpu/attention_tiles.cu):
// rows go in query tiles, tiles[2i] = first row, tiles[2i+1] = rows (1..64),
// the rows of a tile consecutive and sharing one slot list (offsets[row]);
// q is rounded to bf16 and the softmax weights to bf16 before the V product
// (mma.sync m16n8k16; sm_80 or newer)
// (flash-attention numerics). hd: 64, 128 or 256 (attention_tiles_takes;
// 256 streams keys in tiles of 32 and reads q from shared memory). No scratch.
void attention_tiles(const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads, int64_t hd,
                     const bf16_t* kc, const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens, float scale,
                     bf16_t* out, Stream& s);
constexpr bool attention_tiles_takes(int64_t hd) { return hd == 64 || hd == 128 || hd == 256; }
// Which kernel attention_tiles runs, process-wide (benchmarks, tests and the
// setting gpu_attention_tiles_kernel): 3 (the default) or 2,
// gpu/attention_tiles_v2.cu (two query heads of a kv head per block,
// cp.async double-buffered K/V, ldmatrix; 2: 16 rows a warp, 3: 32 rows a
// warp at hd 64 and 128), which fall back to 1 where their shared memory
// exceeds the device's (hd 128 and 256 on sm_86/89); or 1,
// gpu/attention_tiles.cu. All three round q, k and the softmax weights to
// bf16 for the tensor cores and agree to within that rounding (H100,
// 2026-12-07). Any other value means 1.
void set_attention_tiles_kernel(int version);
int attention_tiles_kernel();
// Host: the tiles for rows 0..n-1 with these list offsets: runs of equal
// offsets cut every 64 rows.
inline std::vector<int32_t> attention_tile_list(const int32_t* offsets, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) {
    if (t.empty() || offsets[i] != offsets[t[t.size() - 2]] || t.back() == 64) {
      t.push_back(static_cast<int32_t>(i));
      t.push_back(0);
    }
    ++t.back();
  }
  return t;
}

// h[t, i] = bf16(silu(gu[t, i]) * gu[t, inter + i]); gu: [n, 2*inter].
// h_lo (optional, laid out as h): the rounding remainder bf16(value - h).
void silu_mul(const float* gu, int64_t n, int64_t inter, bf16_t* h, bf16_t* h_lo, Stream& s);

// An fp32 input split for two bf16 products: hi = bf16(x), lo = bf16(x -
// hi), element-wise over `count` values. x W = hi W + lo W to about 16
// significant bits of x instead of 8 (Blas::gemm of hi, then Blas::gemm_add
// of lo into the same output; or one product over the rows [hi; lo] when
// lo = hi + count, then the two halves added). hi or lo may be null (not
// written): lo alone where hi is already at hand (the norm's bf16 output).
void split_bf16(const float* x, int64_t count, bf16_t* hi, bf16_t* lo, Stream& s);

// Softmax over each row of logits [n, experts], then the k largest (ties:
// lower index), renormalised when `normalize`. ids/weights: [n, k].
void router_topk(const float* logits, int64_t n, int64_t experts, int64_t k, bool normalize, int32_t* ids, float* weights,
                 Stream& s);
// The same for the logits x W^T of n <= router_gemv_max_tokens() tokens
// (x bf16 [n, hidden], W bf16 [experts, hidden], fp32 sums), product and
// selection in one launch (decode). logits: [n, experts] fp32 scratch,
// overwritten. counter: one int32 of device memory that is 0 before the
// call and is 0 again after it (the blocks count themselves in it; one
// counter per stream at a time). experts <= 1024, hidden a multiple of 8.
void router_gemv_topk(const bf16_t* x, int64_t n, const bf16_t* w, int64_t experts, int64_t hidden, int64_t k, bool normalize, float* logits,
                      int32_t* counter, int32_t* ids, float* weights, Stream& s);
int64_t router_gemv_max_tokens();

// Groups the n*k (token, slot) pairs by expert: offsets[e]..offsets[e+1]
// index pair_list, which holds pair indices p = t*k + j. experts <= 4096.
void moe_route(const int32_t* ids, int64_t pairs, int64_t experts, int32_t* offsets, int32_t* pair_list, Stream& s);

// Grouped expert SwiGLU. w_gate_up: [experts][2*inter][hidden] (gate rows,
// then up rows); w_down: [experts][hidden][inter]. Each expert's weights are
// read once per 8 of its tokens. act: [n*k, inter] bf16 scratch;
// partial: [n*k, hidden] fp32 scratch; out[t] = sum_j weights[t*k+j] *
// expert_{ids[t*k+j]}(x[t]) (overwritten). hidden and inter: multiples of 8.
// act_lo (optional, [n*k, inter] bf16 scratch): the activation between the
// products is kept as a bf16 hi + lo pair (about 16 bits instead of 8; the
// down product reads both, the weights once).
void moe_experts(const bf16_t* x, int64_t n, int64_t hidden, int64_t inter, int64_t experts, int64_t k, const int32_t* ids,
                 const float* weights, const int32_t* offsets, const int32_t* pair_list, const bf16_t* w_gate_up,
                 const bf16_t* w_down, bf16_t* act, float* partial, float* out, Stream& s, bf16_t* act_lo = nullptr);

// y = x + d, element-wise over `count` floats (y may alias x).
void add(const float* x, const float* d, int64_t count, float* y, Stream& s);

// cuBLAS handle bound to one stream. y[n, rows] (fp32, row stride ldy) =
// x[n, cols] (bf16, row stride cols) W[rows, cols]^T (bf16), fp32 accumulation.
class Blas {
 public:
  explicit Blas(Stream& s);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  void gemm(const bf16_t* x, int64_t n, const bf16_t* w, int64_t rows, int64_t cols, float* y, int64_t ldy);
  // y += x W^T: the product added in fp32 to y's values (cuBLAS beta = 1;
  // the second half of a split input's product, without an fp32 buffer for it).
  void gemm_add(const bf16_t* x, int64_t n, const bf16_t* w, int64_t rows, int64_t cols, float* y, int64_t ldy);
  // The same product in fp32 throughout (no TF32): for routers, whose top-k
  // flips under bf16 rounding of the hidden state (DeepSeek-V3's reference
  // computes its router in fp32).
  void gemm_f32(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y, int64_t ldy);

 private:
  void* handle_ = nullptr;
  void* workspace_ = nullptr;  // fixed, so that products can be captured in CUDA graphs
};

}  // namespace hmoe::gpu
