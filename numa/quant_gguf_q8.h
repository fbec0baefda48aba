// Integer dot products for ggml block weights (Q4_K, Q5_K, Q6_K, Q8_0,
// Q4_0, Q5_0): the activation row is quantized to 8 bits once per step, as
// llama.cpp does on these formats, and the weight codes are multiplied with
// it in integers (AVX-512 VNNI, AVX2 maddubs, scalar reference).
//
// Numerics. Activations are quantized symmetrically per block of the weight
// type: per 256 columns for the K types (d = max|x| / 127, q = round(x / d)),
// per 32 for Q8_0/Q4_0/Q5_0. The weight side is exact (its integer codes and
// block scales), so the only change against the fp32 path (gemm_exact) is
// the activation rounding: |y - y_exact| <= sum_k |w_k| * d_block(k) / 2.
// That is what llama.cpp computes on the same files (its CPU reference logits
// come from Q8_K / Q8_0 activations).
//
// Setting: cpu_gguf_int8 (HMOE_CPU_GGUF_INT8, default on) switches this path
// for the routed experts (numa::EngineOptions::gguf_int8) and for cpu::gemm
// on ggml weights (cpu::GemmOptions::gguf_int8: attention projections, dense
// MLPs, lm_head); off keeps the exact fp32 dequantize path everywhere.
// gemm_exact never takes it.
//
// Kernels (per row block and token block; y row stride ldy):
//  - K types: per 256-column super-block and row the codes are unpacked
//    into 4 x 64 bytes (nibbles, high bits by masks/shifts), multiplied with
//    vpmaddubsw (u8 codes x s8 activations -> s16 pairs, no saturation:
//    63 * 127 * 2 < 2^15), scaled by the 6/8-bit sub-block scales with
//    vpdpwssd into int32 lanes; mins / the Q6_K offset 32 come from the
//    activation's per-16 sums (bsum).
//  - 32-blocks: two blocks per 64-byte vector, u8 codes (Q8_0: w ^ 0x80)
//    times activations by vpdpbusd into int32 lanes seeded with -zero * sum(x)
//    of each block.
//  - Q4_K/Q5_K/Q6_K/Q8_0 on AVX-512: the lanes are added up per block and
//    row (exact integers) and each block adds one fp32 fma per row (the
//    numerics of quant_gguf_q8_tiles.cpp); from a few tokens on the
//    row-interleaved tile kernels (AMX-INT8 where present) compute the same
//    bits, so results never depend on the batch. The AVX2 kernels of the
//    K types and Q8_0 keep the same contract (their bits equal the AVX-512
//    ones'): one row (K types) or 8 rows (Q8_0) by one token below 8
//    tokens, weights-stationary 8-token panels above (quant_gguf_q8_avx2.cpp,
//    quant_gguf_q8_avx2_q80.cpp). Q4_0/Q5_0 keep per-lane fp32 sums (each
//    kernel alone at every token count).
// The activation row is stored in the order the weight bytes unpack in
// (Q8Acts::pos), so no shuffles run per weight.
//
// Thread safety: Q8Acts is filled by one writer per row; the kernels are
// pure functions of their inputs.
#pragma once
#include <cstdint>
#include <vector>

#include "numa/quant_gguf.h"
#include "numa/quant_gguf_amx.h"

namespace hmoe::cpu {

// Whether w is a ggml type this path serves here: Q4_K/Q5_K/Q6_K (cols %
// 256 == 0) or Q8_0/Q4_0/Q5_0 (cols % 64 == 0), and the CPU has at least AVX2
// (the scalar reference is for tests) and the ISA is not forced to scalar.
bool gguf_q8_applies(const Mat& w);
// Whether the types (and so the activation layout) of a and b are the same.
bool gguf_q8_same_layout(const Mat& a, const Mat& b);

// Activation rows quantized for one ggml weight type.
struct Q8Acts {
  ExtType type = ExtType::q8_0;
  int64_t n = 0, cols = 0;
  int64_t block = 32;          // 256 (K types) or 32
  std::vector<int8_t> q;       // [n, cols], column k at pos(k)
  std::vector<float> d;        // [n, cols / block] block scales
  std::vector<int16_t> bsum;   // K types: [n, cols / 256, 16] sums of q per 16 columns (Q4_K/Q5_K: 8 sums per 32)
  std::vector<int32_t> init;   // 32-blocks: [n, cols / 64, 16] int32 lanes seeded with -zero * sum(q) of the lane's block
  std::vector<float> dv;       // 32-blocks: [n, cols / 64, 16] d of the lane's block
  std::vector<int32_t> seed;   // Q6_K: [n, cols / 16] -32 * sum of q per 16; 32-blocks: [n, cols / 32] -zero * sum of q per block
  // New (process-wide unique, never 0) on every reset(): kernels may keep work derived from the rows (packed
  // activations) under it between calls, so a caller that rewrites rows a kernel has read calls reset() first.
  uint64_t stamp = 0;

  // Sizes for `rows` rows quantized for weights like w (gguf_q8_applies(w)).
  void reset(int64_t rows, const Mat& w);
  // Quantizes row t from x (cols floats).
  void quantize(int64_t t, const float* x);
  // Row t = row ts of src (quantized for the same type and columns).
  void copy_row(int64_t t, const Q8Acts& src, int64_t ts);
  // Where column k is stored within its row.
  int64_t pos(int64_t k) const;
  // Dequantized activation (q * d) of row t, column k (tests, reference).
  float value(int64_t t, int64_t k) const;
};

// y[t, r] (row stride ldy) for rows t0 <= row < t0 + n of xa and r0 <= r < r1
// of w (w's type must be xa.type, its cols xa.cols). Best kernel for the ISA.
void gemm_rows_q8(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Plain reference: double sums of dequantized weights times dequantized
// activations (equal to the integer kernels up to rounding of the sums).
void gemm_rows_q8_reference(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Whole product y[n, rows] = x W^T through this path, split across the pool:
// quantizes x (n rows) and runs gemm_rows_q8 over row blocks.
void gemm_q8(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool);

namespace detail {  // quant_gguf_q8_avx512.cpp, quant_gguf_q8_avx2.cpp
bool q8_has_vnni();
void q8_rows_avx512(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// The per-row kernels for every token count (q8_rows_avx512 uses them
// below a few tokens; same bits as the tile kernels): tests, benchmarks.
void q8_rows_avx512_rowwise(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// vpdpbusd multiply-adds per second with all operands in registers, summed
// over the pool's threads (0 without AVX-512 VNNI): the int8 limit the
// benchmarks print against.
double q8_vnni_peak_macs(numa::ThreadPool* pool);
// Block b of row t from xb (block floats): codes, scale and (K types) block
// sums, as Q8Acts::quantize; false (nothing written) when the block holds inf or NaN.
bool q8_quantize_block_avx512(Q8Acts& a, int64_t t, int64_t b, const float* xb);
// quant_gguf_q8_tiles.cpp: the row-interleaved kernels (Q4_K, Q5_K, Q6_K,
// Q8_0 on AVX-512 VNNI, every token count) and the scalar model of their
// arithmetic, which they equal bit for bit (see that file's comment).
bool q8_tiles_serve(ExtType t);
// Whether the tile kernels run 16-token blocks on AMX-INT8 tiles (hardware:
// cpu::amx_mode() is hardware and the CPU has AMX-INT8; emulate: the tests'
// scalar tiles; off). Same bits either way.
AmxMode q8_amx_mode();
void q8_tiles_avx512(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void q8_tiles_model(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Q8Acts::quantize's block on AVX2 (as q8_quantize_block_avx512).
bool q8_quantize_block_avx2(Q8Acts& a, int64_t t, int64_t b, const float* xb);
void q8_rows_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Q8_0's AVX2 kernels (quant_gguf_q8_avx2_q80.cpp; q8_rows_avx2 calls them): the
// contract of q8_tiles_model, bit for bit, at every token count.
void q8_0_rows_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
}  // namespace detail

}  // namespace hmoe::cpu
