// CPU matrix kernels on the low-bit ggml block types of
// io/tensor/quant_blocks_lowbit.h (Q2_K, Q3_K, IQ1_S/M, IQ2_XXS/XS/S,
// IQ3_XXS/S, IQ4_NL/XS, MXFP4), reached through the Quant::ext hooks of
// numa/quant_gguf.h and numa/quant_gguf_q8.h.
//
// Products (both threaded by the callers, pure functions here):
//  - exact: fp32 activations times the dequantized weights (gemm_exact, and
//    everything when the setting cpu_gguf_int8 is off);
//  - int8 (default for the routed experts and cpu::gemm): the activation
//    row quantized per 256 columns as for the K types (numa/quant_gguf_q8.h,
//    Q8Acts with sums per 16), the codes of a 256-weight group (8 blocks of
//    the 32-types) multiplied in integers with VNNI (AVX-512) or maddubs
//    (AVX2): y = sum_16 dx * (scale * sum(code * xq) + offset * sum(xq)).
//    Needs cols % 256 == 0 (otherwise the exact path runs).
//    Kernels, best first: v5 for IQ1_S / IQ1_M repacked at load into
//    base-3 trits (quant_gguf_lowbit_ternary.cpp; callers that hold a
//    LowbitPacked copy, numa::ExpertEngine), v4 for the IQ1/IQ2/IQ3 types (AVX-512 VNNI +
//    VBMI + BITALG + GFNI, quant_gguf_lowbit_codes.cpp: sub-blocks in
//    fixed lanes, grid codes or gathered rows), v3 (grid planes,
//    quant_gguf_lowbit_planes.cpp; reached where v4 declines: a CPU
//    without BITALG or GFNI), v2 (AVX-512 VNNI + VBMI, quant_gguf_lowbit_vbmi.cpp:
//    registers only, integer sub-block scales, R rows x NT tokens per tile),
//    v1 (AVX-512 VNNI without VBMI, quant_gguf_lowbit_avx512.cpp); on AVX2
//    CPUs v2 for the grid IQ types (quant_gguf_lowbit_avx2_grid.cpp) and
//    the codebook types IQ4_NL / IQ4_XS / MXFP4 (quant_gguf_lowbit_avx2_nibble.cpp)
//    Q2_K / Q3_K (quant_gguf_lowbit_avx2_kquant.cpp) and IQ1_M
//    (quant_gguf_lowbit_avx2_iq1m.cpp), else v1; AVX2 v3 for the grid IQ
//    types, IQ1_S and IQ1_M repacked at load (quant_gguf_lowbit_avx2_packed.cpp,
//    _avx2_iq1m_packed.cpp; callers that hold a LowbitPacked copy).
#pragma once
#include <cstddef>
#include <cstdint>

#include "io/tensor/quant_blocks_lowbit.h"
#include "numa/quant_gguf.h"

namespace hmoe::cpu {

// y[t * ldy + r] = x_t . w_r for t < n, r0 <= r < r1 (exact path).
void lowbit_gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);

struct Q8Acts;
// Whether the int8 path serves w here (cols % 256 == 0, AVX2 or better).
bool lowbit_q8_applies(const Mat& w);
// The int8 path: xa quantized for w (Q8Acts::reset(n, w)), rows t0.. t0+n.
void lowbit_gemm_rows_q8(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);

// A matrix's rows repacked at load: for the v5 kernel (AVX-512: IQ1_S, IQ1_M
// into trits, see detail::lowbit_ternary_pack) or the AVX2 v3 kernel (AVX2
// CPUs: IQ2_XXS/XS/S, IQ3_XXS/S, IQ1_S, IQ1_M, detail::lowbit_avx2_pack): row r at data + r * row_bytes; data null
// when not repacked. The owner keeps kLowbitTernaryPad bytes after the last row.
struct LowbitPacked {
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  // The rows from r0 on (for a view of w.slice_rows(r0, ..)).
  LowbitPacked from(int64_t r0) const { return {data ? data + static_cast<size_t>(r0) * row_bytes : nullptr, row_bytes}; }
};
// Whether lowbit_pack serves w (cpu_lowbit_repack: the type, its shape and the CPU).
bool lowbit_repack_applies(const Mat& w);
size_t lowbit_packed_bytes(const Mat& w);  // rows * row bytes + the padding
// w's rows packed into dst (lowbit_packed_bytes(w) long).
LowbitPacked lowbit_pack(const Mat& w, uint8_t* dst);
// gemm_rows_q8 taking w's packed rows where p has them (every token count,
// so results do not depend on the batch), else w.
void lowbit_gemm_rows_q8_packed(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, const LowbitPacked& p, int64_t r0, int64_t r1, float* y,
                                int64_t ldy);

namespace detail {  // quant_gguf_lowbit_avx512.cpp / quant_gguf_lowbit_avx2.cpp
bool lowbit_has_avx512_vnni();
// Unsigned codes of 256 weights starting at block pointer p (one K/IQ block,
// or 8 consecutive 32-blocks), with w = scale * (ucode - bias) + offset
// folded as w = scale * ucode + offset_u (offset_u = offset - bias * scale).
void lowbit_decode256_avx512(ExtType type, const uint8_t* p, uint8_t* ucode, float* scale, float* offset_u);
// v2 (quant_gguf_lowbit_vbmi.cpp): registers only, integer scales; needs VBMI as well.
bool lowbit_has_avx512_vbmi();
void lowbit_rows_q8_vbmi(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// v3 (quant_gguf_lowbit_planes.cpp): IQ3_XXS, and IQ2_XXS at 2 or more
// tokens, by grid planes; same CPUs as v2. Returns false (nothing done)
// otherwise.
bool lowbit_rows_q8_planes(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// v4 (quant_gguf_lowbit_codes.cpp): IQ1_S, IQ1_M (2 or more tokens),
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S with every scale sub-block in fixed
// lanes (grid codes expanded by vpmultishiftqb, or gathered rows); v2's
// CPUs with AVX-512 BITALG and GFNI as well. Returns false (nothing done)
// otherwise.
bool lowbit_rows_q8_codes(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// v5 (quant_gguf_lowbit_ternary.cpp): IQ1_S and IQ1_M repacked once into
// base-3 trits (58 / 66 bytes per 256 weights against the file's 50 / 56),
// decoded by register lookups instead of v2/v4's grid gathers. applies: the
// type, the shape (cols % 256 == 0) and the CPU (AVX-512 VNNI, VBMI, GFNI).
bool lowbit_ternary_applies(uint32_t ext, int64_t cols);
size_t lowbit_ternary_row_bytes(uint32_t ext, int64_t cols);
// Rows [r0, r1) of w (IQ1_S or IQ1_M) packed into dst, row after row
// (lowbit_ternary_row_bytes each). The kernel reads up to 64 bytes past a
// group's start: a buffer needs kLowbitTernaryPad bytes after its last row.
constexpr size_t kLowbitTernaryPad = 64;
void lowbit_ternary_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst);
// y[t * ldy + r] for rows r0 <= r < r1 of the packed matrix (row r at
// packed + r * lowbit_ternary_row_bytes(xa.type, cols)); xa quantized for
// the matrix it came from.
void lowbit_rows_q8_ternary(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                            int64_t ldy);
// Benchmarks and tests: whether the dispatcher takes v4 (AVX2 CPUs: the AVX2 v2 kernel; default true); returns the previous value.
bool lowbit_set_codes_for_testing(bool on);
// Tests: whether IQ2_XS / IQ2_S on AVX-512 CPUs repack into the AVX2 v3 layout (lowbit_repack_applies): 1 yes, 0 no,
// -1 by the CPU's vendor (the default: AMD, whose gathers v4 would wait on); returns the previous value.
int lowbit_set_avx2_layout_for_testing(int on);
// AVX2 v2 (quant_gguf_lowbit_avx2_grid.cpp): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S on CPUs with AVX2 + FMA + BMI2 (grid rows by table loads, scale
// blocks in fixed lanes). Returns false (nothing done) otherwise.
bool lowbit_rows_q8_avx2_grid(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// AVX2 v2 of the 16-entry codebook types (quant_gguf_lowbit_avx2_nibble.cpp):
// IQ4_NL, IQ4_XS, MXFP4 on the file's blocks (vpshufb lookups of the
// nibbles) on CPUs with AVX2 + FMA + F16C + BMI2. Returns false (nothing done) otherwise.
bool lowbit_rows_q8_avx2_nibble(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// AVX2 v2 of Q2_K and Q3_K (quant_gguf_lowbit_avx2_kquant.cpp) on the file's
// blocks, same CPUs as the codebook kernel. Returns false (nothing done) otherwise.
bool lowbit_rows_q8_avx2_kquant(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// AVX2 v2 of IQ1_M (quant_gguf_lowbit_avx2_iq1m.cpp) on the file's blocks, on
// CPUs with AVX2 + FMA + F16C + BMI2. Returns false (nothing done) otherwise.
bool lowbit_rows_q8_avx2_iq1m(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
// AVX2 v3 (quant_gguf_lowbit_avx2_packed.cpp): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
// IQ3_S, IQ1_S repacked once into level codes beside their signs (102 / 106 /
// 106 / 134 / 134 / 70 bytes per 256 weights against the file's 66 / 74 / 82
// / 98 / 110 / 50), decoded by vpshufb; IQ1_M (quant_gguf_lowbit_avx2_iq1m_packed.cpp)
// as 2-bit trits masked in place, its deltas against the activations'
// sums per 8 (82 bytes against 56); same CPUs as AVX2 v2.
bool lowbit_avx2_pack_applies(uint32_t ext, int64_t cols);
size_t lowbit_avx2_row_bytes(uint32_t ext, int64_t cols);
// Rows [r0, r1) of w packed into dst, row after row (lowbit_avx2_row_bytes each).
void lowbit_avx2_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst);
// As lowbit_rows_q8_ternary, for the AVX2 packed rows.
void lowbit_rows_q8_avx2_packed(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                                int64_t ldy);
// IQ1_M's AVX2 v3, reached through the three above.
size_t lowbit_avx2_iq1m_row_bytes(int64_t cols);
void lowbit_avx2_iq1m_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst);
void lowbit_rows_q8_avx2_iq1m_packed(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                                     int64_t ldy);
// v1: for AVX-512 VNNI CPUs without VBMI.
void lowbit_rows_q8_avx512(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void lowbit_rows_q8_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void lowbit_rows_avx512(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
void lowbit_rows_avx2(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy);
}  // namespace detail

}  // namespace hmoe::cpu
