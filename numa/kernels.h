// CPU matrix kernels: activations in fp32, weights in f32/bf16/f16, int8
// per-channel or int4 group-wise, fp32 accumulation. Each weight type has a
// scalar path (tests), AVX2 and AVX-512 paths chosen at run time by cpuid,
// and bf16 weights also an AVX512_BF16 (vdpbf16ps) path that rounds the
// activations to bf16 (opt-in: HMOE_CPU_BF16_DOT; not for exactness runs).
//
// The weight views they take (cpu::Mat: layout and quantized formats) are
// declared in io/tensor/mat.h, shared with gpu/.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/tensor/mat.h"
#include "numa/thread_pool.h"

namespace hmoe::cpu {

enum class Isa { scalar, avx2, avx512 };
Isa best_isa();
const char* isa_name(Isa isa);
// Forces an ISA (tests compare paths); returns the previous one. Not thread-safe.
Isa set_isa_for_testing(Isa isa);
// Whether the CPU has AVX512_BF16 (vdpbf16ps).
bool has_bf16_dot();

// y[t, r] (row stride ldy) = sum_k x[t, k] (row stride ldx) * W[r, k], for
// t < n and r0 <= r < r1. Single-threaded; the building block of the others.
void gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// The same for bf16 weights with activations already rounded to bf16 (xb),
// through vdpbf16ps; falls back to gemm_rows on the bf16-rounded activations
// where the CPU lacks it. w must be bf16.
void gemm_rows_bf16dot(const uint16_t* xb, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// How gemm treats its input. Held by whoever owns the products (the CPU
// layers take it from CpuRuntimeOptions, built from the settings once) and
// passed per call: no process-wide switch.
struct GemmOptions {
  // Setting cpu_emulate_gpu_bf16 (checking GPU runs against the CPU): the
  // input is rounded to bf16 (on a copy) where the GPU path rounds it; the
  // MLA layer also rounds its latent KV cache.
  bool round_bf16 = false;
  // Setting gpu_mla_split_inputs: under round_bf16, gemm_split_input keeps
  // the input as a bf16 hi + lo pair, as the GPU's precise products do.
  bool split_inputs = true;
  // Setting gpu_hybrid_precise: under round_bf16, Qwen3-Next's layers round
  // where that GPU mode does (on: zero-centred norm weights, routers and the
  // shared-expert gate exact, the linear/gated-attention projections' inputs
  // a hi + lo pair; off: (1 + w), router and gate inputs and those
  // projections' inputs rounded to bf16 once).
  bool hybrid_precise = true;
  // Setting cpu_gguf_int8: ggml block weights go through the 8-bit
  // activation integer path (numa/quant_gguf_q8.h) where it applies.
  bool gguf_int8 = true;
  // Setting cpu_amx_min_tokens: with gguf_int8, products of at least this
  // many rows on GGUF weights take the AMX-BF16 path where the CPU has it
  // (numa/quant_gguf_amx.h); 0 = off.
  int64_t amx_min_tokens = 0;
};
// Same over all rows, split across the pool's threads by row blocks, with
// the input treatment of o (see GemmOptions).
void gemm(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool, const GemmOptions& o = {});
// gemm that never rounds x (routers: the GPU path computes them in fp32 too).
void gemm_exact(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool);
// The products whose input the GPU path keeps as a bf16 hi + lo pair
// (DeepSeek-V3's attention projections, setting gpu_mla_split_inputs):
// with o.round_bf16 and o.split_inputs it computes y = hi W + lo W,
// hi = bf16(x), lo = bf16(x - hi), as the GPU does; otherwise gemm(.., o).
void gemm_split_input(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool, const GemmOptions& o);
// x rounded to the nearest bf16 (ties to even, NaN stays NaN), kept as fp32.
float round_bf16(float x);
// Plain scalar reference (double accumulation) for tests.
void gemm_reference(const float* x, int64_t n, const Mat& w, float* y);

// ---- integer dot products for int8 / int4 weights (opt-out: HMOE_CPU_INT8_ACT=0) ----
// Changes numerics: the activation row is quantized to int8 once per token,
// per group (int4: the weight group; int8: 128 columns), symmetric, with one
// fp32 scale per group (s = max|x| / 127, q = round(x / s)), and the weight
// codes are multiplied with it in integers by AVX512-VNNI vpdpbusd (u8 x s8):
// int4 codes are already unsigned (0..15); int8 weights are made unsigned by
// adding 128 (w ^ 0x80), the 128 * sum(q) this adds is taken off per token.
// Per weight group the integer sums are scaled once:
//   int4: y = sum_g ws_g * xs_g * (sum_k q_k xq_k - z_g * sum_k xq_k)
//   int8: y = ws_row * sum_g xs_g * sum_k w_k xq_k
// The error against fp32 activations is that of the activation rounding
// (~1/254 of a group's max per element: ~0.5% of max |y| for one product on
// random data, 1-2% after a SwiGLU expert), below the weights' own
// quantization error; bf16/f16/f32 weights never take this path
// (the fixture tests stay exact). Where the CPU lacks AVX512-VNNI, or the
// columns are not a multiple of 128, the engine keeps the fp32 path.
struct QActs {
  int64_t n = 0, cols = 0, group = 0, groups = 0;
  bool q4 = false;          // int4 order: per 128 columns, the 64 low-nibble then the 64 high-nibble partners
  std::vector<int8_t> q;    // [n, cols]
  std::vector<float> scale; // [n, groups] xs_g
  std::vector<float> zsum;  // [n, groups] xs_g * sum_k xq_k (zero-point / offset term)
  // Sizes for n rows quantized for weights like w (int8 or int4 view).
  void reset(int64_t rows, const Mat& w);
  // Quantizes row t from x (cols floats).
  void quantize(int64_t t, const float* x);
  // Row t = row ts of src (quantized for the same weights).
  void copy_row(int64_t t, const QActs& src, int64_t ts);
  // Element k of row t, in column order (tests, scalar path).
  int8_t at(int64_t t, int64_t k) const;
};
// Whether the integer path serves w here: int8/int4 weights, cols % 128 == 0,
// and the CPU has AVX-512 with VNNI (and the ISA is not forced lower).
bool int8_act_applies(const Mat& w);
bool has_vnni();
// y[t, r] (row stride ldy) for rows t0 <= row < t0 + n of xa and r0 <= r < r1.
// VNNI kernel where int8_act_applies(w), else the scalar path below.
void gemm_rows_q(const QActs& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Scalar reference of the same arithmetic (integer sums per group).
void gemm_rows_q_reference(const QActs& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);

// Converts a run of plain (unquantized) elements to fp32.
void to_f32(DType t, const void* src, float* dst, int64_t n);
// Row r of any weight view, dequantized to fp32 (cols values).
void row_to_f32(const Mat& w, int64_t r, float* dst);

// Owned quantized matrix (tests, benchmarks, format converters).
struct QuantMat {
  std::vector<uint8_t> data;
  std::vector<float> scales, zeros;
  Mat view;  // points into the vectors above: do not copy a QuantMat, move it
  QuantMat() = default;
  QuantMat(QuantMat&&) = default;
  QuantMat& operator=(QuantMat&&) = default;
  QuantMat(const QuantMat&) = delete;
  QuantMat& operator=(const QuantMat&) = delete;
};
// Round-to-nearest quantization of fp32 rows [rows, cols].
QuantMat quantize_int8(const float* w, int64_t rows, int64_t cols);
QuantMat quantize_int4(const float* w, int64_t rows, int64_t cols, int group, bool asymmetric);

}  // namespace hmoe::cpu
