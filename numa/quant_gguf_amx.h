// Prefill products on ggml block weights with AMX-BF16 tiles (issue 26):
// y[t, r] = x[t] . w[r] for many tokens at once, where the 8-bit VNNI path
// (numa/quant_gguf_q8.h) is bound by its per-token integer work.
//
// How: per call, a strip of up to 32 weight rows is dequantized exactly to
// fp32 and rounded to bf16 into an L2 scratch laid out as AMX A tiles
// ([cols / 32][32 rows][32 values]); the activations were rounded to bf16
// once per step and packed as B tiles in the VNNI pair order
// ([token block of 16][cols / 2][16 tokens][2 values], AmxActs); the 16 x 16
// fp32 result tiles (weight rows x tokens) are computed by tdpbf16ps, two
// weight tiles by two token tiles per pass, and written to y. The dequantize
// cost is paid once per strip and call, whatever the token count, so the
// path pays off from a few tokens per expert on (setting cpu_amx_min_tokens).
//
// Numerics: weights and activations are rounded to bf16 (relative 2^-9
// each), products summed in fp32; compared with the 8-bit path this is
// finer on the activations (8 mantissa bits instead of 7 bits per block of
// 256) and coarser on the weights (Q8_0 / Q6_K codes are exact in bf16,
// their block scale products are rounded).
//
// Dispatch: amx_mode() is `hardware` where cpuid has AMX-TILE and AMX-BF16
// and Linux grants the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked
// once per process), else `off` (callers then use the VNNI path). Tests set
// `emulate`: the same packing, strips and passes with the tile instructions
// done in scalar code, so the whole path is checked on CPUs without AMX.
//
// Thread safety: the kernels use thread-local scratch and load the tile
// configuration per call; AmxActs is filled by one writer per token block.
#pragma once
#include <cstdint>
#include <vector>

#include "numa/kernels.h"

namespace hmoe::numa {
class ThreadPool;
}

namespace hmoe::cpu {

enum class AmxMode { off, hardware, emulate };

// cpuid AMX-TILE + AMX-BF16 and the OS permission (requested on the first call).
bool amx_hardware();
// What amx_applies / the kernels use; defaults to hardware where
// amx_hardware(), else off. Set once, before a forward (tests: emulate).
AmxMode amx_mode();
void set_amx_mode(AmxMode m);
// Process-wide minimum token count (per expert, or per cpu::gemm call) for
// this path (setting cpu_amx_min_tokens); 0 turns it off.
void set_amx_min_tokens(int64_t n);
int64_t amx_min_tokens();

// Whether w is a weight this path serves (a ggml block type or another
// Quant::ext format, cols % 32 == 0) and amx_mode() is not off.
bool amx_applies(const Mat& w);
// Whether a product of n tokens on w should take this path (amx_applies,
// min tokens set and reached).
bool amx_wanted(const Mat& w, int64_t n);

// Activations rounded to bf16, packed as B tiles (see the file comment).
struct AmxActs {
  int64_t cols = 0, blocks = 0;  // token blocks of 16
  std::vector<uint16_t> p;       // [blocks][cols / 2][16][2]

  // Room for `blocks` token blocks of `cols` (cols % 32 == 0); contents undefined.
  void reset(int64_t blocks, int64_t cols);
  // Token j (< 16) of block b = x (cols floats), or zeros when x is null.
  void set_row(int64_t b, int j, const float* x);
  // Blocks b0.. = rows of x (row stride ldx), n of them, the last block padded with zeros.
  void pack(int64_t b0, const float* x, int64_t ldx, int64_t n);
  // Activation value of token j of block b, column k (tests).
  float value(int64_t b, int j, int64_t k) const;
};

// y[t * ldy + r] for t < n (the tokens starting at block b0 of xa) and
// r0 <= r < r1 of w. Needs amx_mode() != off and amx_applies(w).
void gemm_rows_amx(const AmxActs& xa, int64_t b0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// Plain reference: double sums of bf16-rounded dequantized weights times
// the packed activations.
void gemm_rows_amx_reference(const AmxActs& xa, int64_t b0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// y[n, rows] = x W^T through this path, strips of 32 rows across the pool.
void gemm_amx(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool);

// The tiles' own limit: tdpbf16ps FLOP/s with all operands in tile
// registers (no loads), summed over the pool's threads (hardware mode only; 0
// otherwise). What the bench rows are measured against.
double amx_bf16_peak_flops(numa::ThreadPool* pool);

namespace detail {
// Rows [r0, r0 + nr) (nr <= 32) of w dequantized and rounded to bf16 into
// out[(kk * 32 + i) * 32 + c] = w[r0 + i, 32 kk + c]; rows nr..31 are not written.
void ext_rows_to_bf16_tiles(const Mat& w, int64_t r0, int64_t nr, uint16_t* out);
void ext_rows_to_bf16_tiles_avx512(const Mat& w, int64_t r0, int64_t nr, uint16_t* out);  // quant_gguf_simd.cpp
bool has_avx512_bf16();
// Runs one hardware tile pass in a forked child and compares it with the
// emulation: true when equal; false when the child faulted (no AMX, no tile
// state) or differed, with a notice on stderr. amx_hardware() uses it.
bool amx_self_check();
}  // namespace detail

}  // namespace hmoe::cpu
