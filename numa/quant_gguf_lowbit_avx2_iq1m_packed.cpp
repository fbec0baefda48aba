// IQ1_M repacked at load for the AVX2 int8 kernel ("AVX2 v3" of IQ1_M; the
// other AVX2 v3 types are in quant_gguf_lowbit_avx2_packed.cpp). Why: on the
// file's blocks (AVX2 v2, quant_gguf_lowbit_avx2_iq1m.cpp) every 8 weights
// cost a kIq1sGrid row load and its insert into a vector: 23-31 ns a group
// and row on the dev box's Zen 3 (kernel alone), against ~4 ns in which a
// core reads the 56 bytes; this one takes 5.6 ns.
//
// A row: the fp16 d of its groups (2 bytes each, multiplied by the
// activations' scales once per row and tile), then its groups of 80 bytes:
// 82 per 256 weights against the file's 56 (x1.46). Lanes as
// numa/detail/lowbit_avx2_layout.h's 16-weight blocks (vector j, qword Q =
// chunk 2 (Q + 4 (j / 2)) + j % 2: pair k = vectors 2k, 2k + 1 holds block
// Q + 4k in qword Q). Group:
//   [0, 64)  the trits t = grid + 1 in 0..2, 2 bits a weight: byte p of
//            [32 (j % 2), +32) bits kCodeShift[j / 2] = vector j's byte p
//            (pair k's codes at the same bits of both halves);
//   [64, 80) per chunk its block's 3-bit scale | the delta's sign << 3 (set:
//            delta -1); nibble h of byte i = chunk sum_chunk(16 h + i).
//            Every scale twice: two vpshufb give the chunk sums'
//            coefficients, two more a pair's scales, with none of the bit
//            arithmetic of the file's packing (a first form with the 48
//            scale and 32 sign bits, 76 bytes with the d, took 8.3 ns a
//            group against 7.0 for this one, before the vector
//            activation prep).
// Why not v5's trits (52 bytes of codes against 64): AVX2 has no
// 256-entry byte lookup, and base-3 bytes decoded by multiplies cost more
// instructions than the bytes they save (compute-bound at one token).
//
// Sums: 8 w / (d (2 s + 1)) = 8 t - (8 - delta), so per group
//   2 sum 8 w x / d = sum_b 16 odd_b sum_{i in b} t_i x_i
//                   - sum_c 2 X_c odd_{b(c)} (8 - delta_c)
// with X_c the activations' sum over chunk c (odd = 2 s + 1). The first
// term: the codes masked in place, f t with f = 1, 16 (pairs 0, 1: bits
// 0-1, 4-5), 4 (pair 2: bits 2-3; pair 3: bits 6-7 shifted to 2-3),
// vpmaddubsw with the permuted activations, the pair added in 16 bits
// (<= 2 * 2 * 32 * 127), vpmaddwd by 16 odd / f (<= 240, bytes by vpshufb
// lookups, placed by vpshufb). The second: -2 X_c (per call: vpsadbw, 32
// words) vpmaddwd the odd (8 - delta) (<= 135) looked up by vpshufb from the
// nibbles. One int32 sum per group and token, times d / 16 and the
// activation scale in fp32: the same integer sums as the scalar reference's
// codes and scales (lowbit_block_codes), fp32 sums in another order. One
// L1 prefetch 1 KiB ahead (CPU time in the engine 4.92 -> 4.72 ms, mean of
// six alternating runs each).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_avx2_layout.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_AM __attribute__((target("avx2,fma,f16c,bmi2")))

namespace hmoe::cpu::detail {

namespace {
using lowbit_avx2::hsum8;

using lowbit_bytes::half;
using lowbit_bytes::u16;

constexpr int kFileBytes = 56, kGroupBytes = 80, kNibAt = 64;  // a row: its groups' fp16 d (2 ng bytes), then the groups
constexpr int kXBytes = 256 + 64;  // per token and group: the permuted activations, then -2 X_c as 32 words
// Pair k's codes at bits kCodeShift[k] of the two halves: f = 1, 16 for pairs 0, 1 (blocks 0..7), 4 for 2, 3.
constexpr int kCodeShift[4] = {0, 4, 2, 6};

// Chunk of word w (0..31) of the chunk sums (and of nibble w / 16 of byte w % 16 at kNibAt).
constexpr int sum_chunk(int w) { return 16 * (w / 16) + 4 * (w % 4) + (w % 16) / 4; }

// vpshufb controls of pair k's scales (the words of qword Q: block Q + 4 k) from the nibble bytes of
// the half k / 2 (blocks 8 (k / 2) ..): block b of a half at byte 8 (b % 2) + b / 2 (its chunk 2 b).
struct Ctl {
  alignas(32) uint8_t k[4][32];
};
constexpr Ctl make_ctl() {
  Ctl c{};
  for (int k = 0; k < 4; ++k)
    for (int p = 0; p < 32; ++p) {
      const int q = 2 * (p / 16) + (p % 16) / 8, b = q + 4 * (k % 2);
      c.k[k][p] = p % 2 ? 0x80 : static_cast<uint8_t>(8 * (b % 2) + b / 2);
    }
  return c;
}
constexpr Ctl kCtl = make_ctl();

void pack_group(const uint8_t* b, uint8_t* dst) {
  std::memset(dst, 0, kGroupBytes);
  for (int w = 0; w < 32; ++w) {  // scale of the chunk's block | the delta's sign << 3
    const int c = sum_chunk(w);
    const uint32_t s = (u16(b + 48 + 2 * (c / 8)) >> (3 * ((c / 2) % 4))) & 7u, sign = (b[32 + c / 2] >> (4 * (c % 2) + 3)) & 1u;
    dst[kNibAt + w % 16] = static_cast<uint8_t>(dst[kNibAt + w % 16] | (s | sign << 3) << (4 * (w / 16)));
  }
  for (int j = 0; j < 8; ++j)
    for (int q = 0; q < 4; ++q) {
      const int c = lowbit_avx2::chunk(true, j, q);
      const uint64_t row = kIq1sGrid[b[c] | ((b[32 + c / 2] >> (4 * (c % 2))) & 7u) << 8];  // bytes 0, 1, 2
      uint64_t v;
      std::memcpy(&v, dst + 32 * (j % 2) + 8 * q, 8);
      v |= row << kCodeShift[j / 2];
      std::memcpy(dst + 32 * (j % 2) + 8 * q, &v, 8);
    }
}

uint16_t file_d(const uint8_t* b) {
  return static_cast<uint16_t>((u16(b + 48) >> 12) | ((u16(b + 50) >> 8) & 0x00F0) | ((u16(b + 52) >> 4) & 0x0F00) | (u16(b + 54) & 0xF000));
}

// Byte tables of scale | sign << 3 (both lanes): odd (8 - delta), and f odd (the sign ignored).
struct Tables {
  alignas(32) uint8_t delta[32], odd16[32], odd4[32], odd1[32];
};
constexpr Tables make_tables() {
  Tables t{};
  for (int i = 0; i < 32; ++i) {
    const int odd = 2 * (i & 7) + 1;
    t.delta[i] = static_cast<uint8_t>(odd * (i & 8 ? 9 : 7));
    t.odd16[i] = static_cast<uint8_t>(16 * odd);
    t.odd4[i] = static_cast<uint8_t>(4 * odd);
    t.odd1[i] = static_cast<uint8_t>(odd);
  }
  return t;
}
constexpr Tables kTables = make_tables();

HMOE_AM inline __m256i ld(const int8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
HMOE_AM inline __m256i tab(const uint8_t* t) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(t)); }

// Row at a (its d's, then its groups) times NT tokens; xp: per token and group kXBytes (token t, group g at
// xp + (t ng + g) kXBytes); dd: NT ng floats of scratch.
template <int NT>
HMOE_AM void tile(const uint8_t* a, const int8_t* xp, const float* dx, int64_t ng, float* dd, float* y, int64_t ldy) {
  for (int t = 0; t < NT; ++t) {  // d / 16 times the activations' scale, per group
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8)
      _mm256_storeu_ps(dd + t * ng + g, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * g))),
                                                                    _mm256_set1_ps(0.0625f)),
                                                      _mm256_loadu_ps(dx + t * ng + g)));
    for (; g < ng; ++g) dd[t * ng + g] = half(a + 2 * g) * 0.0625f * dx[t * ng + g];
  }
  a += 2 * ng;
  const __m256i lut = tab(kTables.delta), m15 = _mm256_set1_epi8(15);
  const __m256i m0 = _mm256_set1_epi8(0x03), m1 = _mm256_set1_epi8(0x0C), m2 = _mm256_set1_epi8(0x30);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g, a += kGroupBytes) {
    _mm_prefetch(reinterpret_cast<const char*>(a) + 1024, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a) + 1024 + 64, _MM_HINT_T0);
    // the chunk sums' coefficients: words 0..15 from the low nibbles, 16..31 the high ones (the nibbles in both lanes)
    const __m256i nb = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + kNibAt)));
    const __m256i lo = _mm256_and_si256(nb, m15), hi = _mm256_and_si256(_mm256_srli_epi16(nb, 4), m15);
    const __m256i ca = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(_mm256_shuffle_epi8(lut, lo)));
    const __m256i cc = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(_mm256_shuffle_epi8(lut, hi)));
    // the blocks' scales: blocks 0..7 in lo, 8..15 in hi (kCtl); pair k takes 16 odd / f_k (f = 1, 4, 16, 4)
    const __m256i sc0 = _mm256_shuffle_epi8(_mm256_shuffle_epi8(tab(kTables.odd16), lo), tab(kCtl.k[0]));
    const __m256i sc1 = _mm256_shuffle_epi8(_mm256_shuffle_epi8(tab(kTables.odd1), lo), tab(kCtl.k[1]));
    const __m256i hi4 = _mm256_shuffle_epi8(tab(kTables.odd4), hi);
    const __m256i sc2 = _mm256_shuffle_epi8(hi4, tab(kCtl.k[2])), sc3 = _mm256_shuffle_epi8(hi4, tab(kCtl.k[3]));
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)), c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
    const __m256i u00 = _mm256_and_si256(c0, m0), u01 = _mm256_and_si256(c1, m0), u10 = _mm256_and_si256(c0, m2), u11 = _mm256_and_si256(c1, m2);
    const __m256i u20 = _mm256_and_si256(c0, m1), u21 = _mm256_and_si256(c1, m1);
    const __m256i u30 = _mm256_and_si256(_mm256_srli_epi16(c0, 4), m1), u31 = _mm256_and_si256(_mm256_srli_epi16(c1, 4), m1);
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const int8_t* x = xp + (t * ng + g) * kXBytes;
      __m256i s = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u00, ld(x + 0)), _mm256_maddubs_epi16(u01, ld(x + 32))), sc0);
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u10, ld(x + 64)), _mm256_maddubs_epi16(u11, ld(x + 96))), sc1));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u20, ld(x + 128)), _mm256_maddubs_epi16(u21, ld(x + 160))), sc2));
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u30, ld(x + 192)), _mm256_maddubs_epi16(u31, ld(x + 224))), sc3));
      s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(ld(x + 256), ca), _mm256_madd_epi16(ld(x + 288), cc)));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(dd + t * ng + g), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

// Token t's activations of group g at o: vector j's bytes in the layout's order (pair k's two vectors at 64 k: the
// even chunks of columns [64 k, +64), then the odd ones), then -2 X_c in sum_chunk's order.
HMOE_AM void prepare(const int8_t* x, int8_t* o) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i s[8];
  for (int v = 0; v < 8; ++v) {  // qword q: the sum of chunk 4 v + q, + 1024 (the bytes taken as x + 128)
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * v));
    s[v] = _mm256_sad_epu8(_mm256_xor_si256(xv, flip), _mm256_setzero_si256());
    if (v % 2) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * v - 32));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32 * v - 32), _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(a, xv), 0xD8));
      _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32 * v), _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(a, xv), 0xD8));
    }
  }
  for (int h = 0; h < 2; ++h) {  // word 4 q + i = chunk 16 h + 4 i + q
    const __m256i* v = s + 4 * h;
    const __m256i w = _mm256_or_si256(_mm256_or_si256(v[0], _mm256_slli_epi64(v[1], 16)), _mm256_or_si256(_mm256_slli_epi64(v[2], 32), _mm256_slli_epi64(v[3], 48)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o + 256 + 32 * h), _mm256_sub_epi16(_mm256_set1_epi16(2048), _mm256_slli_epi16(w, 1)));
  }
}

HMOE_AM void rows(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = cols / 256, rb = ng * (kGroupBytes + 2);
  thread_local std::vector<int8_t> buf;
  thread_local std::vector<float> dx, dd;
  dd.resize(static_cast<size_t>(4 * ng));
  buf.resize(static_cast<size_t>(n * ng * kXBytes) + 32);
  dx.resize(static_cast<size_t>(n * ng));
  int8_t* xp = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 31) & ~uintptr_t{31});
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < ng; ++g) {
      prepare(xa.q.data() + (t0 + t) * xa.cols + 256 * g, xp + (t * ng + g) * kXBytes);
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)];
    }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = packed + r * rb;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<4>(a, xp + t * ng * kXBytes, dx.data() + t * ng, ng, dd.data(), y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<2>(a, xp + t * ng * kXBytes, dx.data() + t * ng, ng, dd.data(), y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<1>(a, xp + t * ng * kXBytes, dx.data() + t * ng, ng, dd.data(), y + t * ldy + r, ldy);
  }
}

}  // namespace

size_t lowbit_avx2_iq1m_row_bytes(int64_t cols) { return static_cast<size_t>(cols / 256) * (kGroupBytes + 2); }

void lowbit_avx2_iq1m_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  const int64_t ng = w.cols / 256;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.row(r);
    for (int64_t g = 0; g < ng; ++g, src += kFileBytes) {
      const uint16_t d = file_d(src);
      std::memcpy(dst + 2 * g, &d, 2);
      pack_group(src, dst + 2 * ng + g * kGroupBytes);
    }
    dst += ng * (kGroupBytes + 2);
  }
}

void lowbit_rows_q8_avx2_iq1m_packed(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                                     int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  rows(xa, t0, n, packed, cols, r0, r1, y, ldy);
}

}  // namespace hmoe::cpu::detail
