// Run-time dispatch of the low-bit kernels (numa/quant_gguf_lowbit.h) and
// the scalar fallback (detail::rows_scalar over ext_row_to_f32).
#include "numa/quant_gguf_lowbit.h"

#include <atomic>
#include <cstring>

#include "numa/detail/kernels_impl.h"
#include "numa/quant_gguf_q8.h"

namespace hmoe::cpu {

namespace {
std::atomic<bool> g_codes{true};
}

bool detail::lowbit_set_codes_for_testing(bool on) { return g_codes.exchange(on); }

void lowbit_gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  switch (best_isa()) {
    case Isa::avx512: detail::lowbit_rows_avx512(x, ldx, n, w, r0, r1, y, ldy); break;
    case Isa::avx2: detail::lowbit_rows_avx2(x, ldx, n, w, r0, r1, y, ldy); break;
    default: detail::rows_scalar(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

bool lowbit_q8_applies(const Mat& w) {
  return w.quant == Quant::ext && lowbit_type(w.ext) && w.cols > 0 && w.cols % 256 == 0 && best_isa() != Isa::scalar;
}

void lowbit_gemm_rows_q8(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  const bool vbmi = best_isa() == Isa::avx512 && detail::lowbit_has_avx512_vbmi();
  if (vbmi && g_codes.load(std::memory_order_relaxed) && detail::lowbit_rows_q8_codes(xa, t0, n, w, r0, r1, y, ldy)) return;
  if (vbmi && detail::lowbit_rows_q8_planes(xa, t0, n, w, r0, r1, y, ldy)) return;
  if (vbmi) detail::lowbit_rows_q8_vbmi(xa, t0, n, w, r0, r1, y, ldy);
  else if (best_isa() == Isa::avx512 && detail::lowbit_has_avx512_vnni()) detail::lowbit_rows_q8_avx512(xa, t0, n, w, r0, r1, y, ldy);
  else if (best_isa() != Isa::scalar) {
    const bool v2 = g_codes.load(std::memory_order_relaxed);
    if (!(v2 && (detail::lowbit_rows_q8_avx2_grid(xa, t0, n, w, r0, r1, y, ldy) || detail::lowbit_rows_q8_avx2_nibble(xa, t0, n, w, r0, r1, y, ldy) ||
                detail::lowbit_rows_q8_avx2_kquant(xa, t0, n, w, r0, r1, y, ldy) || detail::lowbit_rows_q8_avx2_iq1m(xa, t0, n, w, r0, r1, y, ldy))))
      detail::lowbit_rows_q8_avx2(xa, t0, n, w, r0, r1, y, ldy);
  }
  else gemm_rows_q8_reference(xa, t0, n, w, r0, r1, y, ldy);
}

namespace {
// IQ1_S / IQ1_M on AVX-512 CPUs: the v5 trits; everything else (and IQ1_S / IQ1_M on AVX2) the AVX2 v3 layouts.
bool ternary_type(uint32_t ext) {
  return best_isa() == Isa::avx512 && (ext == static_cast<uint32_t>(lowbit::iq1_s) || ext == static_cast<uint32_t>(lowbit::iq1_m));
}

// IQ2_XS and IQ2_S on AVX-512 CPUs with slow gathers: v4 gathers their 512- / 1024-entry grids' 8-byte rows; on an
// AMD EPYC Zen 5 (the dev box of 2026-12-08, `bench_gguf_lowbit --type IQ2_S` against `--isa-avx2`, 2 threads) the
// AVX2 v3 layout (level codes and sign planes, vpshufb, 1.43x / 1.29x the file's bytes) streamed 12.0-13.9 / 15.8-15.9
// GB/s against v4's 9.7-10.3 / 8.2-9.4 (IQ2_XXS, whose grid v4 looks up in registers, stays on v4: 19.7-22.8 against
// 15.1-16.6). Intel's gathers are several times faster (the Xeon's v4 rows), so the choice is by vendor: AMD.
std::atomic<int> g_avx2_layout{-1};  // -1: by vendor; 0 / 1: set by a test
bool avx2_layout_on_avx512(uint32_t ext) {
  if (best_isa() != Isa::avx512 || (ext != static_cast<uint32_t>(lowbit::iq2_xs) && ext != static_cast<uint32_t>(lowbit::iq2_s))) return false;
  const int forced = g_avx2_layout.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
  }();
  return amd;
}
size_t packed_row_bytes(const Mat& w) {
  return ternary_type(w.ext) ? detail::lowbit_ternary_row_bytes(w.ext, w.cols) : detail::lowbit_avx2_row_bytes(w.ext, w.cols);
}
}  // namespace

int detail::lowbit_set_avx2_layout_for_testing(int on) { return g_avx2_layout.exchange(on); }

bool lowbit_repack_applies(const Mat& w) {
  if (w.quant != Quant::ext) return false;
  if (best_isa() == Isa::avx512)
    return detail::lowbit_ternary_applies(w.ext, w.cols) || (avx2_layout_on_avx512(w.ext) && detail::lowbit_avx2_pack_applies(w.ext, w.cols));
  return best_isa() == Isa::avx2 && detail::lowbit_avx2_pack_applies(w.ext, w.cols);
}

size_t lowbit_packed_bytes(const Mat& w) { return static_cast<size_t>(w.rows) * packed_row_bytes(w) + detail::kLowbitTernaryPad; }

LowbitPacked lowbit_pack(const Mat& w, uint8_t* dst) {
  if (ternary_type(w.ext)) detail::lowbit_ternary_pack(w, 0, w.rows, dst);
  else detail::lowbit_avx2_pack(w, 0, w.rows, dst);
  std::memset(dst + lowbit_packed_bytes(w) - detail::kLowbitTernaryPad, 0, detail::kLowbitTernaryPad);
  return {dst, packed_row_bytes(w)};
}

void lowbit_gemm_rows_q8_packed(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, const LowbitPacked& p, int64_t r0, int64_t r1, float* y,
                                int64_t ldy) {
  if (p.data && xa.type == static_cast<ExtType>(w.ext) && xa.cols == w.cols) {
    if (ternary_type(w.ext)) detail::lowbit_rows_q8_ternary(xa, t0, n, p.data, w.cols, r0, r1, y, ldy);
    else detail::lowbit_rows_q8_avx2_packed(xa, t0, n, p.data, w.cols, r0, r1, y, ldy);
    return;
  }
  gemm_rows_q8(xa, t0, n, w, r0, r1, y, ldy);
}

}  // namespace hmoe::cpu
