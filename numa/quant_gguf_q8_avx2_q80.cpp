// Q8_0 on AVX2 CPUs (the integer GGUF path of numa/quant_gguf_q8.h), with
// the numerics contract of the AVX-512 kernels (quant_gguf_q8_tiles.cpp: per
// row, token and block the exact integer ia = sum w * q, then
// acc = fma(float(ia), d_w * d_x, acc) in block order), so the bits equal
// q8_tiles_model's and the AVX-512 kernels' at every token count.
//
//  - Decode (below 4 tokens, and 5), rows8: 8 rows by one token, block by
//    block: per 32 codes vpsignb (x takes w's sign), vpmaddubsw (|w| as u8
//    times that: a pair sums to at most 2 * 128 * 127, no saturation, w =
//    -128 included) and vpmaddwd with ones; the 8 rows' lane sums by
//    horizontal adds, one fp32 step for the 8 rows.
//  - From 6 tokens and at 4 (columns a multiple of 256), panels on int16
//    codes: a row's 256-column group (8 blocks) and each token's are widened
//    once to 16 vectors whose dword lane g holds 2 codes of block g; then per
//    16 codes of the 8 blocks one vpmaddwd (exact: |w x| pairs <= 2 * 128 *
//    127) and one vpaddd per (row, token), two rows by four tokens in 8
//    accumulators, and lane g ends as block g's exact sum with no horizontal
//    adds; an 8 x 8 transpose turns lanes into (row, token) for the fp32
//    steps. On Zen 3 (bench_simd_pipes) vpmaddubsw and vpmaddwd share two
//    pipes and vpsignb half-overlaps them: the 8-bit step (vpsignb,
//    vpmaddubsw, vpmaddwd, vpaddd per 32 products) issues at 3.44
//    instructions a cycle, this one (2 vpmaddwd, 2 vpaddd) at 4.0: 1.16
//    against 1.0 cycles per 32 products. In the kernel 1.03-1.39x the 8-bit
//    panels, most at 8-16 tokens, where experts sit in a prompt.
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

// A 256-column group of 8 blocks (codes at b, b + stride, ..) as 16 int16
// vectors whose dword lane g holds 2 codes of block g (the same 2 codes in
// every call: the products only need weights and activations to agree).
// Three rounds of in-lane unpacks (16-, 32-, 64-bit) turn the 8 blocks into
// 8 vectors whose 128-bit halves each hold one 16-bit column of the 8
// blocks; each half widens to one int16 vector.
HMOE_V256 __attribute__((always_inline)) inline void widen_group(const int8_t* b, int64_t stride, __m256i* out) {
  __m256i v[8], t[8];
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) v[g] = ld32(b + g * stride);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi16(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi16(v[2 * i], v[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    v[4 * i + 0] = _mm256_unpacklo_epi32(t[4 * i], t[4 * i + 2]);
    v[4 * i + 1] = _mm256_unpackhi_epi32(t[4 * i], t[4 * i + 2]);
    v[4 * i + 2] = _mm256_unpacklo_epi32(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm256_unpackhi_epi32(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi64(v[i], v[4 + i]);
    t[2 * i + 1] = _mm256_unpackhi_epi64(v[i], v[4 + i]);
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    out[k] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(t[k]));
    out[8 + k] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(t[k], 1));
  }
}

// A token block packed for panel (tp = tn rounded up to 4; padding tokens
// are zeros): 256-column group gi of token j at x[(gi * tp + j) * 16 + k]
// (widen_group's vectors); the scales of block b for token quad q at
// dx[(b * tp / 4 + q) * 8 + l] = d of token 4q + l % 4 (a quad twice, for
// the two rows of a row pair).
struct Packed {
  __m256i* x;
  float* dx;
  int64_t tp;
};
HMOE_V256 void pack_acts(const Q8Acts& xa, int64_t tx, int64_t tn, int64_t ngr, const Packed& pk) {
  const int64_t nblk = ngr * 8, nq = pk.tp / 4;
  for (int64_t j = 0; j < pk.tp; ++j) {
    const int8_t* xq = xa.q.data() + (tx + j) * xa.cols;
    for (int64_t gi = 0; gi < ngr; ++gi) {
      __m256i* o = pk.x + (gi * pk.tp + j) * 16;
      if (j < tn) widen_group(xq + gi * 256, 32, o);
      else
        for (int k = 0; k < 16; ++k) o[k] = _mm256_setzero_si256();
    }
  }
  for (int64_t b = 0; b < nblk; ++b)
    for (int64_t q = 0; q < nq; ++q)
      for (int l = 0; l < 8; ++l) {
        const int64_t j = 4 * q + l % 4;
        pk.dx[(b * nq + q) * 8 + l] = j < tn ? xa.d[static_cast<size_t>((tx + j) * nblk + b)] : 0.0f;
      }
}

// Rows rb..re (at most kPanelRows) times the packed tokens, group by group
// (a group's activations, 16 KiB for 32 tokens, stay in L1 while the rows
// pass), two rows by four tokens at a time (8 accumulators, lane g = block
// g); an odd last row pairs with itself.
HMOE_V256 void panel(const Packed& pk, int64_t tn, const Mat& w, int64_t rb, int64_t re, float* y, int64_t ldy) {
  const int64_t ngr = w.cols / 256, tp = pk.tp, nq = tp / 4, rs = w.cols / 32 * kBB;
  const int64_t np = (re - rb + 1) / 2;
  const auto* base = static_cast<const uint8_t*>(w.data);
  alignas(32) float acc[kPanelRows / 2][kPanelTokens / 4][8] = {};
  alignas(32) __m256i W[2][16];
  alignas(32) float dwv[8][8];
  alignas(32) __m256i ia[kPanelTokens / 4][8];  // a row pair's integer block sums per token quad, (row, token) lanes
  for (int64_t gi = 0; gi < ngr; ++gi) {
    // The next group's weights (or the next panel's first) while this one computes: the rows' groups sit
    // a row apart, a pattern the hardware prefetchers do not follow.
    for (int64_t r = rb; r < re; ++r) {
      const int64_t nr = gi + 1 < ngr ? r : r + (re - rb);
      if (nr >= w.rows) break;
      const uint8_t* nx = base + nr * rs + (gi + 1 < ngr ? (gi + 1) * 8 * kBB : 0);
      for (int l = 0; l < 8 * kBB; l += 64) _mm_prefetch(reinterpret_cast<const char*>(nx + l), _MM_HINT_T0);
    }
    for (int64_t p = 0; p < np; ++p) {
      const int64_t r0 = rb + 2 * p, r1 = std::min(r0 + 1, re - 1);
      const uint8_t* b0 = base + r0 * rs + gi * 8 * kBB;
      const uint8_t* b1 = base + r1 * rs + gi * 8 * kBB;
      widen_group(reinterpret_cast<const int8_t*>(b0 + 2), kBB, W[0]);
      widen_group(reinterpret_cast<const int8_t*>(b1 + 2), kBB, W[1]);
      for (int g = 0; g < 8; ++g) {
        const __m128 d0 = _mm_set1_ps(half_at(b0 + g * kBB)), d1 = _mm_set1_ps(half_at(b1 + g * kBB));
        _mm256_store_ps(dwv[g], _mm256_set_m128(d1, d0));
      }
      for (int64_t q = 0; q < nq; ++q) {
        const __m256i* xp = pk.x + (gi * tp + 4 * q) * 16;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (int k = 0; k < 16; ++k) {
          // In assembly: left to itself GCC re-associated the sums (all the products first, spilled) or copied
          // every accumulator each step; both ran at about half this speed.
          __m256i w0, w1, t0, t1;
          asm("vmovdqa %[W0], %[w0]\n\t"
              "vmovdqa %[W1], %[w1]\n\t"
              "vpmaddwd %[X0], %[w0], %[t0]\n\t"
              "vpmaddwd %[X0], %[w1], %[t1]\n\t"
              "vpaddd %[t0], %[a0], %[a0]\n\t"
              "vpaddd %[t1], %[a4], %[a4]\n\t"
              "vpmaddwd %[X1], %[w0], %[t0]\n\t"
              "vpmaddwd %[X1], %[w1], %[t1]\n\t"
              "vpaddd %[t0], %[a1], %[a1]\n\t"
              "vpaddd %[t1], %[a5], %[a5]\n\t"
              "vpmaddwd %[X2], %[w0], %[t0]\n\t"
              "vpmaddwd %[X2], %[w1], %[t1]\n\t"
              "vpaddd %[t0], %[a2], %[a2]\n\t"
              "vpaddd %[t1], %[a6], %[a6]\n\t"
              "vpmaddwd %[X3], %[w0], %[t0]\n\t"
              "vpmaddwd %[X3], %[w1], %[t1]\n\t"
              "vpaddd %[t0], %[a3], %[a3]\n\t"
              "vpaddd %[t1], %[a7], %[a7]"
              : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7),
                [w0] "=&x"(w0), [w1] "=&x"(w1), [t0] "=&x"(t0), [t1] "=&x"(t1)
              : [W0] "m"(W[0][k]), [W1] "m"(W[1][k]), [X0] "m"(xp[k]), [X1] "m"(xp[16 + k]), [X2] "m"(xp[32 + k]), [X3] "m"(xp[48 + k]));
        }
        __m256i* a = ia[q];
        a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3, a[4] = a4, a[5] = a5, a[6] = a6, a[7] = a7;
        transpose_dwords(a);  // a[g] lane l: block g of row r0 + l / 4, token 4q + l % 4
      }
      // The fp32 steps after all quads' integer sums: each quad's 8 steps are one dependent fma chain (block order,
      // the contract), and placed after its own quad's products the chain's latency stalled them (~35 of ~136 cycles
      // a quad on Zen 3); here the quads' chains are independent neighbours and overlap.
      for (int64_t q = 0; q < nq; ++q) {
        const float* dx = pk.dx + (gi * 8 * nq + q) * 8;
        __m256 s = _mm256_load_ps(acc[p][q]);
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g)
          s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[q][g]), _mm256_mul_ps(_mm256_load_ps(dwv[g]), _mm256_load_ps(dx + g * nq * 8)), s);
        _mm256_store_ps(acc[p][q], s);
      }
    }
  }
  for (int64_t p = 0; p < np; ++p)
    for (int l = 0; l < 8; ++l) {
      const int64_t r = rb + 2 * p + l / 4;
      if (r >= re) continue;
      for (int64_t q = 0; q < nq; ++q) {
        const int64_t j = 4 * q + l % 4;
        if (j < tn) y[j * ldy + r] = acc[p][q][l];
      }
    }
}

}  // namespace

void q8_0_rows_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  // panels from 6 tokens and at 4 (whole quads); 5 tokens pad 3 and run faster as rows8 (AVX2 dev box, Zen 3)
  if ((n >= 6 || n == 4) && r1 - r0 >= 4 && w.cols % 256 == 0) {
    const int64_t ngr = w.cols / 256;
    const auto need = static_cast<size_t>(kPanelTokens * ngr * 16);  // vectors; the scales: 2 per token and block
    const PanelScratch sc = panel_scratch(need, need);
    for (int64_t tb = 0; tb < n; tb += kPanelTokens) {
      const int64_t tn = std::min(kPanelTokens, n - tb);
      const Packed pk{sc.x, sc.dx, (tn + 3) / 4 * 4};
      if (!sc.holds(PanelKey{xa.stamp, t0 + tb, tn, static_cast<int>(ExtType::q8_0)})) pack_acts(xa, t0 + tb, tn, ngr, pk);
      for (int64_t rb = r0; rb < r1; rb += kPanelRows) panel(pk, tn, w, rb, std::min(rb + kPanelRows, r1), y + tb * ldy, ldy);
    }
    return;
  }
  // below 4 tokens and at 5: 8 rows at a time, each token over them while they sit in L1
  for (int64_t r = r0; r < r1; r += 8) {
    const int nr = static_cast<int>(std::min<int64_t>(8, r1 - r));
    for (int64_t t = 0; t < n; ++t) rows8(xa, t0 + t, w, r, nr, y + t * ldy + r);
  }
}

}  // namespace hmoe::cpu::detail
