// Q8_0 on AVX2 CPUs (the integer GGUF path of numa/quant_gguf_q8.h), with
// the numerics contract of the AVX-512 kernels (quant_gguf_q8_tiles.cpp: per
// row, token and block the exact integer ia = sum w * q, then
// acc = fma(float(ia), d_w * d_x, acc) in block order), so the bits equal
// q8_tiles_model's and the AVX-512 kernels' at every token count.
//
// Products: per 32 codes vpsignb (x takes w's sign), vpmaddubsw (|w| as u8
// times that: a pair sums to at most 2 * 128 * 127, no saturation, w = -128
// included) and vpmaddwd with ones into int32 lanes.
//  - Below 8 tokens (decode), rows8: 8 rows by one token, block by block,
//    the 8 rows' lane sums by horizontal adds, one fp32 step for the 8 rows.
//  - From 8 tokens (columns a multiple of 256), panels: a row's 8 blocks of a
//    256-column group transposed by dwords, so that lane g of every product
//    belongs to block g and the 8 steps of the group add up lane-wise into
//    the 8 blocks' exact sums without horizontal adds; |w| stays in
//    registers while 8-token groups of activations (transposed the same way
//    once per call and 32 tokens) pass; one 8 x 8 transpose then turns the
//    lanes into tokens for the fp32 steps of 8 tokens at once. Per 32
//    products 4 vector operations, against 6 plus a scale multiply in the
//    per-lane fp32 form this replaced.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "numa/quant_gguf_q8.h"
#include "numa/quant_gguf_q8_avx2_util.h"

namespace hmoe::cpu::detail {

namespace {

using namespace avx2;
constexpr int kBB = 34;  // bytes of a Q8_0 block: f16 scale, 32 codes

// Rows r..r+nr-1 (nr <= 8) times token t of xa into y[0..nr): per block the
// rows' products in 8 vectors, their lane sums (lane i = row i's exact block
// sum) and one fp32 step for the 8 rows; missing rows repeat row r and are
// not stored. The rows' blocks advance together, 8 streams.
HMOE_V256 void rows8(const Q8Acts& xa, int64_t t, const Mat& w, int64_t r, int nr, float* y) {
  const int64_t nblk = w.cols / 32, rs = nblk * kBB;
  const int8_t* xq = xa.q.data() + t * xa.cols;
  const float* dx = xa.d.data() + t * nblk;
  const uint8_t* p[8];
  for (int i = 0; i < 8; ++i) p[i] = static_cast<const uint8_t*>(w.data) + (r + (i < nr ? i : 0)) * rs;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const __m256i xv = ld32(xq + 32 * blk);
    __m256i A[8];
    uint64_t hlo = 0, hhi = 0;  // the rows' f16 scales, built in registers
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const uint8_t* b = p[i] + blk * kBB;
      const __m256i c = ld32(b + 2);
      A[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(xv, c)), ones);
      uint16_t h;
      std::memcpy(&h, b, 2);
      (i < 4 ? hlo : hhi) |= static_cast<uint64_t>(h) << (16 * (i % 4));
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_set_epi64x(static_cast<long long>(hhi), static_cast<long long>(hlo)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8_i32(A)), _mm256_mul_ps(dw, _mm256_set1_ps(dx[blk])), acc);  // d_w * d_x: one rounding
  }
  if (nr == 8) return _mm256_storeu_ps(y, acc);
  alignas(32) float out[8];
  _mm256_store_ps(out, acc);
  for (int i = 0; i < nr; ++i) y[i] = out[i];
}

constexpr int64_t kPanelRows = 8, kPanelTokens = 32;

// A token block packed for panel (tp = tn rounded up to 8; padding tokens
// are zeros): 256-column group gi of token j at x[(gi * tp + j) * 8 + m]
// (vector m: dword m of each of the group's 8 blocks), the scale of block
// b of the row at dx[b * tp + j].
struct Packed {
  __m256i* x;
  float* dx;
  int64_t tp;
};
HMOE_V256 void pack_acts(const Q8Acts& xa, int64_t tx, int64_t tn, int64_t ngr, const Packed& pk) {
  const int64_t nblk = ngr * 8;
  for (int64_t j = 0; j < pk.tp; ++j) {
    const int8_t* xq = xa.q.data() + (tx + j) * xa.cols;
    for (int64_t gi = 0; gi < ngr; ++gi) {
      __m256i v[8];
      for (int g = 0; g < 8; ++g) v[g] = j < tn ? ld32(xq + gi * 256 + 32 * g) : _mm256_setzero_si256();
      transpose_dwords(v);
      for (int m = 0; m < 8; ++m) _mm256_store_si256(pk.x + (gi * pk.tp + j) * 8 + m, v[m]);
    }
    for (int64_t b = 0; b < nblk; ++b) pk.dx[b * pk.tp + j] = j < tn ? xa.d[static_cast<size_t>((tx + j) * nblk + b)] : 0.0f;
  }
}

// Rows rb..re (at most kPanelRows) times the packed tokens: group by group
// (a group's activations, 8 KiB for 32 tokens, stay in L1 while the rows
// pass), per row the group's codes transposed and |w| held in registers.
HMOE_V256 void panel(const Packed& pk, int64_t tn, const Mat& w, int64_t rb, int64_t re, float* y, int64_t ldy) {
  const int64_t ngr = w.cols / 256, tp = pk.tp, rs = w.cols / 32 * kBB;
  const auto* base = static_cast<const uint8_t*>(w.data);
  alignas(32) float acc[kPanelRows][kPanelTokens] = {};
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t gi = 0; gi < ngr; ++gi) {
    // The next group's weights (or the next panel's first) while this one computes: the rows' groups sit
    // a row apart, a pattern the hardware prefetchers do not follow.
    for (int64_t r = rb; r < re; ++r) {
      const int64_t nr = gi + 1 < ngr ? r : r + (re - rb);
      if (nr >= w.rows) break;
      const uint8_t* nx = base + nr * rs + (gi + 1 < ngr ? (gi + 1) * 8 * kBB : 0);
      for (int l = 0; l < 8 * kBB; l += 64) _mm_prefetch(reinterpret_cast<const char*>(nx + l), _MM_HINT_T0);
    }
    for (int64_t r = rb; r < re; ++r) {
      const uint8_t* b0 = base + r * rs + gi * 8 * kBB;
      alignas(32) __m256i c[8];
      __m256i ac[8];
      float dw[8];
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) c[g] = ld32(b0 + g * kBB + 2), dw[g] = half_at(b0 + g * kBB);
      transpose_dwords(c);
#pragma GCC unroll 8
      for (int m = 0; m < 8; ++m) ac[m] = _mm256_sign_epi8(c[m], c[m]);
      for (int64_t jg = 0; jg < tp; jg += 8) {
        alignas(32) __m256i A[8];
        for (int j = 0; j < 8; ++j) {
          const __m256i* xp = pk.x + (gi * tp + jg + j) * 8;
          __m256i a = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int m = 0; m < 8; ++m)
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(ac[m], _mm256_sign_epi8(_mm256_load_si256(xp + m), c[m])), ones));
          A[j] = a;  // lane g: block g's exact sum for token jg + j
        }
        transpose_dwords(A);  // A[g] lane j: block g, token jg + j
        float* ar = acc[r - rb] + jg;
        const float* dx = pk.dx + gi * 8 * tp + jg;
        __m256 s = _mm256_load_ps(ar);
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[g]), _mm256_mul_ps(_mm256_set1_ps(dw[g]), _mm256_load_ps(dx + g * tp)), s);
        _mm256_store_ps(ar, s);
      }
    }
  }
  for (int64_t r = rb; r < re; ++r)
    for (int64_t j = 0; j < tn; ++j) y[j * ldy + r] = acc[r - rb][j];
}

}  // namespace

void q8_0_rows_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (n >= 8 && r1 - r0 >= 4 && w.cols % 256 == 0) {
    const int64_t ngr = w.cols / 256;
    const auto need = static_cast<size_t>(kPanelTokens * ngr * 8);  // vectors; also the scales
    const PanelScratch sc = panel_scratch(need, need);
    for (int64_t tb = 0; tb < n; tb += kPanelTokens) {
      const int64_t tn = std::min(kPanelTokens, n - tb);
      const Packed pk{sc.x, sc.dx, (tn + 7) / 8 * 8};
      pack_acts(xa, t0 + tb, tn, ngr, pk);
      for (int64_t rb = r0; rb < r1; rb += kPanelRows) panel(pk, tn, w, rb, std::min(rb + kPanelRows, r1), y + tb * ldy, ldy);
    }
    return;
  }
  // below 8 tokens: 8 rows at a time, each token over them while they sit in L1
  for (int64_t r = r0; r < r1; r += 8) {
    const int nr = static_cast<int>(std::min<int64_t>(8, r1 - r));
    for (int64_t t = 0; t < n; ++t) rows8(xa, t0 + t, w, r, nr, y + t * ldy + r);
  }
}

}  // namespace hmoe::cpu::detail
