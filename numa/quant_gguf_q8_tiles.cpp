// Row-interleaved AVX-512 VNNI kernels of the integer GGUF path for Q4_K,
// Q5_K, Q6_K and Q8_0 (numa/quant_gguf_q8.h, "tile kernels", v3) for
// prompt-sized products, with the same bits as the per-row kernels.
//
// Why: the per-row kernels of quant_gguf_q8_avx512.cpp spend two vector
// instructions (vpmaddubsw + vpdpwssd) per 64 multiply-adds and a
// horizontal sum per row, token and block; prompt products are bound by
// that integer work (decode, bound by the weight reads, keeps them). Here one vpdpbusd does 64 multiply-adds for 16 weight rows at once
// (lane i = row i, its 4 bytes = 4 consecutive columns of that row), the
// activation's 4 bytes broadcast from memory, so a register tile of 2 x 16
// rows by 4 tokens reuses each weight vector 4 times and each broadcast 2
// times.
//
// Per call, every group of up to 32 rows is repacked once into thread-local
// scratch: 16 rows' raw block bytes are transposed as 16 x 16 dwords and the
// codes unpacked to u8 (Q8_0: w ^ 0x80), stored by quad of columns in
// natural order ([super-block or block][quad][row vector][64 bytes]),
// with the per-row scales beside them (lanes = rows, decoded from dword
// gathers); then every token tile runs over the group. The repack is paid
// once per 32 rows and call: about as much as the per-row kernels spend on
// one token, so these serve calls of more than a few tokens.
//
// Numerics (the contract every AVX-512 kernel of these types keeps, the
// per-row ones of quant_gguf_q8_avx512.cpp included; q8_tiles_model is its
// scalar statement, bit for bit): per row r and token t, in fp32 with fused
// multiply-adds, blocks in order:
//  - K types: per super-block b the exact integer I_b = sum_s sc_s * ia_s,
//    ia_s the sum of codes times activation codes over sub-block s (Q6_K:
//    codes - 32); acc = fma(float(I_b), d * dx_b, acc); Q4_K/Q5_K then
//    acc = fma(-float(M_b), dmin * dx_b, acc), M_b = sum_s m_s * bsum_s.
//  - Q8_0: per block acc = fma(float(ia), d_w * d_x, acc), ia = sum w * q.
// Products like d * dx_b are single fp32 roundings. The integer sums are
// exact (|I_b| < 2^28), so any lane split, tile shape or kernel gives the
// same bits; which kernel runs may then depend on the token count.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <cpuid.h>
#include <sys/wait.h>
#include <unistd.h>
#include <immintrin.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "configs/error.h"
#include "io/tensor/gguf_block_util.h"
#include "numa/quant_gguf_amx.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

namespace hmoe::cpu::detail {

namespace {

constexpr int kSubOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // Q4_K/Q5_K activation layout (Q8Acts::pos)

template <ExtType T> constexpr int kBB = T == ExtType::q4_k ? 144 : T == ExtType::q5_k ? 176 : T == ExtType::q6_k ? 210 : 34;
template <ExtType T> constexpr bool kK = T != ExtType::q8_0;
template <ExtType T> constexpr int kSubs = T == ExtType::q6_k ? 16 : 8;  // sub-blocks per super-block
template <ExtType T> constexpr bool kMins = T == ExtType::q4_k || T == ExtType::q5_k;

// Byte offset of natural column quad Q (columns 4Q..4Q+3) of a super-block
// within the activation row's super-block.
template <ExtType T> constexpr int xoff(int Q) {
  if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) return kSubOrder[Q / 8] * 32 + 4 * (Q % 8);
  else return 4 * Q;
}

float half_f(const uint8_t* p) { return gguf_half(p); }

// Codes of row `row` (natural column order) and its per-block scalars.
struct RowK {
  uint8_t c[256];
  int32_t sc[16];  // sub-block scales
  int32_t mn[8];   // Q4_K/Q5_K mins
  float d = 0, dmin = 0;
};

template <ExtType T>
void decode_row_block(const uint8_t* b, RowK& r) {
  if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
    r.d = half_f(b);
    r.dmin = half_f(b + 2);
    uint64_t sc, mn;
    gguf_scales_mins_k4(b + 4, sc, mn);
    for (int s = 0; s < 8; ++s) {
      r.sc[s] = static_cast<int32_t>((sc >> (8 * s)) & 0xFF);
      r.mn[s] = static_cast<int32_t>((mn >> (8 * s)) & 0xFF);
    }
    const uint8_t* qs = b + (T == ExtType::q4_k ? 16 : 48);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        int lo = qs[32 * j + l] & 0xF, hi = qs[32 * j + l] >> 4;
        if constexpr (T == ExtType::q5_k) {
          lo += ((b[16 + l] >> (2 * j)) & 1) << 4;
          hi += ((b[16 + l] >> (2 * j + 1)) & 1) << 4;
        }
        r.c[64 * j + l] = static_cast<uint8_t>(lo);
        r.c[64 * j + 32 + l] = static_cast<uint8_t>(hi);
      }
  } else {  // q6_k
    r.d = half_f(b + 208);
    for (int s = 0; s < 16; ++s) r.sc[s] = static_cast<int8_t>(b[192 + s]);
    for (int n = 0; n < 2; ++n)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* ql = b + 64 * n;
        const uint8_t qh = b[128 + 32 * n + l];
        r.c[128 * n + l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh & 3) << 4));
        r.c[128 * n + 32 + l] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
        r.c[128 * n + 64 + l] = static_cast<uint8_t>((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
        r.c[128 * n + 96 + l] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
      }
  }
}

template <ExtType T>
void model_rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  if constexpr (kK<T>) {
    const int64_t nb = w.cols / 256;
    constexpr int NS = kSubs<T>, W = 256 / NS;
    RowK rk;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = t0 + j;
        const int8_t* xq = xa.q.data() + t * xa.cols;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          decode_row_block<T>(base + (r * nb + b) * kBB<T>, rk);
          const float dx = xa.d[static_cast<size_t>(t * nb + b)];
          int32_t ib = 0;
          for (int s = 0; s < NS; ++s) {
            int32_t ia = 0;
            for (int e = 0; e < W; ++e) {
              const int k = s * W + e;
              ia += (static_cast<int32_t>(rk.c[k]) - (T == ExtType::q6_k ? 32 : 0)) * xq[b * 256 + xoff<T>(k / 4) + k % 4];
            }
            ib += rk.sc[s] * ia;
          }
          acc = std::fma(static_cast<float>(ib), rk.d * dx, acc);
          if constexpr (kMins<T>) {
            const int16_t* bs = xa.bsum.data() + (t * nb + b) * 16;
            int32_t m = 0;
            for (int s = 0; s < 8; ++s) m += rk.mn[s] * bs[s];
            acc = std::fma(-static_cast<float>(m), rk.dmin * dx, acc);
          }
        }
        y[j * ldy + r] = acc;
      }
  } else {
    const int64_t nblk = w.cols / 32;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = t0 + j;
        const int8_t* xq = xa.q.data() + t * xa.cols;
        float acc = 0.0f;
        for (int64_t k = 0; k < nblk; ++k) {
          const uint8_t* b = base + (r * nblk + k) * 34;
          int32_t ia = 0;
          for (int e = 0; e < 32; ++e) ia += static_cast<int8_t>(b[2 + e]) * xq[k * 32 + e];
          acc = std::fma(static_cast<float>(ia), half_f(b) * xa.d[static_cast<size_t>(t * nblk + k)], acc);
        }
        y[j * ldy + r] = acc;
      }
  }
}

// ---- AVX-512 ----------------------------------------------------------------------

// In place: r[i] = row i (16 dwords) becomes r[c] = column c (lane i = old r[i][c]).
HMOE_V512 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // r[4g + e]: 128-bit lane L holds column 4L + e of rows 4g..4g+3
  for (int e = 0; e < 4; ++e) {
    const __m512i ab_lo = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44), ab_hi = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
    const __m512i cd_lo = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44), cd_hi = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
    t[e] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
    t[4 + e] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    t[8 + e] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
    t[12 + e] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Scratch of one row group (RV vectors of 16 rows), all blocks of the row.
struct Pack {
  uint8_t* codes;  // K: [nb][64 quads][RV][64]; Q8_0: [nblk][8 quads][RV][64]
  float* dsc;      // K: [nb][RV][16] d; Q8_0: [nblk][RV][16] d_w
  int32_t* sc;     // K: [nb][subs][RV][16] sub-block scales
  int32_t* mn;     // Q4_K/Q5_K: [nb][4 pairs][RV][16] (m_2p | m_2p+1 << 16)
  float* dmin;     // Q4_K/Q5_K: [nb][RV][16]
};

HMOE_V512 inline __m512i load_rows64(const uint8_t* const* rows, int e, int valid, int64_t off) {
  return e < valid ? _mm512_loadu_si512(rows[e] + off) : _mm512_setzero_si512();
}

// Repacks `valid` (<= 16 * RV) rows starting at `base` (row stride rb) into pk.
template <ExtType T, int RV>
HMOE_V512 void pack_group(const uint8_t* base, int64_t rb, int64_t cols, int valid, const Pack& pk) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  if constexpr (kK<T>) {
    const int64_t nb = cols / 256;
    constexpr int NS = kSubs<T>;
    for (int64_t b = 0; b < nb; ++b)
      for (int i = 0; i < RV; ++i) {
        const int vi = std::clamp(valid - 16 * i, 0, 16);
        const uint8_t* rows[16];
        for (int e = 0; e < 16; ++e) rows[e] = base + (16 * i + std::min(e, std::max(vi - 1, 0))) * rb + b * kBB<T>;
        uint8_t* const cdst = pk.codes + b * 64 * RV * 64 + i * 64;
#define put(Q, v) _mm512_store_si512(cdst + (Q) * RV * 64, (v))
        __m512i A[16], B[16], H[16];
        constexpr int qs = T == ExtType::q4_k ? 16 : T == ExtType::q5_k ? 48 : 0;
        for (int e = 0; e < 16; ++e) {
          A[e] = load_rows64(rows, e, vi, qs);
          B[e] = load_rows64(rows, e, vi, qs + 64);
        }
        transpose16(A);
        transpose16(B);
        if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
          if constexpr (T == ExtType::q5_k) {
            for (int e = 0; e < 16; ++e)
              H[e] = e < vi ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[e] + 16))) : _mm512_setzero_si512();
            transpose16(H);
          }
          const __m512i bit4 = _mm512_set1_epi8(0x10);
          for (int c = 0; c < 32; ++c) {
            const __m512i v = c < 16 ? A[c] : B[c - 16];
            const int j = c / 8, u = c % 8;
            __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
            if constexpr (T == ExtType::q5_k) {
              // bit 2j (lo) / 2j+1 (hi) of each qh byte -> bit 4 of the code byte
              const __m512i h = H[u];
              const int sl = 2 * j, sh = 2 * j + 1;
              const __m512i hl = sl <= 4 ? _mm512_slli_epi32(h, static_cast<unsigned>(4 - sl)) : _mm512_srli_epi32(h, static_cast<unsigned>(sl - 4));
              const __m512i hh = sh <= 4 ? _mm512_slli_epi32(h, static_cast<unsigned>(4 - sh)) : _mm512_srli_epi32(h, static_cast<unsigned>(sh - 4));
              lo = _mm512_or_si512(lo, _mm512_and_si512(hl, bit4));
              hi = _mm512_or_si512(hi, _mm512_and_si512(hh, bit4));
            }
            put(16 * j + u, lo);
            put(16 * j + 8 + u, hi);
          }
        } else {  // q6_k
          for (int e = 0; e < 16; ++e) H[e] = load_rows64(rows, e, vi, 128);
          transpose16(H);
          const __m512i m30 = _mm512_set1_epi8(0x30);
          for (int n = 0; n < 2; ++n)
            for (int u = 0; u < 8; ++u) {
              const __m512i qa = n == 0 ? A[u] : B[u], qb = n == 0 ? A[8 + u] : B[8 + u], qh = H[8 * n + u];
              put(32 * n + u, _mm512_or_si512(_mm512_and_si512(qa, m4), _mm512_and_si512(_mm512_slli_epi32(qh, 4), m30)));
              put(32 * n + 8 + u, _mm512_or_si512(_mm512_and_si512(qb, m4), _mm512_and_si512(_mm512_slli_epi32(qh, 2), m30)));
              put(32 * n + 16 + u, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(qa, 4), m4), _mm512_and_si512(qh, m30)));
              put(32 * n + 24 + u, _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(qb, 4), m4), _mm512_and_si512(_mm512_srli_epi32(qh, 2), m30)));
            }
        }
#undef put
        // per-row scalars, lanes = rows (rows past `valid` read row vi - 1 and get zeros)
        const __m512i vidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(static_cast<int>(rb)));
        const __mmask16 live = static_cast<__mmask16>((1u << vi) - 1u);
        auto gather = [&](int off) HMOE_V512 { return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, vidx, rows[0] + off, 1); };
        const __m512i bytef = _mm512_set1_epi32(0xFF);
        if constexpr (kMins<T>) {
          const __m512i g0 = gather(0), u0 = gather(4), u1 = gather(8), u2 = gather(12);
          const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g0));
          const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g0, 16)));
          const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f), m30 = _mm512_set1_epi32(0x30303030);
          const __m512i sc_lo = _mm512_and_si512(u0, m3f), mn_lo = _mm512_and_si512(u1, m3f);
          const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(u2, m0f), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m30));
          const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f), _mm512_and_si512(_mm512_srli_epi32(u1, 2), m30));
          for (int s = 0; s < 8; ++s) {
            const __m512i v = s < 4 ? sc_lo : sc_hi;
            _mm512_store_si512(pk.sc + ((b * NS + s) * RV + i) * 16, _mm512_and_si512(_mm512_srli_epi32(v, static_cast<unsigned>(8 * (s % 4))), bytef));
          }
          _mm512_store_ps(pk.dsc + (b * RV + i) * 16, d);
          const __m512i lo16 = _mm512_set1_epi32(0xFF), hi16 = _mm512_set1_epi32(0xFF0000);
          for (int p = 0; p < 4; ++p) {
            const __m512i v = p < 2 ? mn_lo : mn_hi;
            const __m512i pr = (p % 2) == 0 ? _mm512_or_si512(_mm512_and_si512(v, lo16), _mm512_and_si512(_mm512_slli_epi32(v, 8), hi16))
                                            : _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(v, 16), lo16), _mm512_and_si512(_mm512_srli_epi32(v, 8), hi16));
            _mm512_store_si512(pk.mn + ((b * 4 + p) * RV + i) * 16, pr);
          }
          _mm512_store_ps(pk.dmin + (b * RV + i) * 16, dm);
        } else {  // q6_k: 16 int8 scales at 192, d at 208 (read as the high half of the dword at 206)
          const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(gather(206), 16)));
          for (int g = 0; g < 4; ++g) {
            const __m512i v = gather(192 + 4 * g);
            for (int e = 0; e < 4; ++e) {
              _mm512_store_si512(pk.sc + ((b * NS + 4 * g + e) * RV + i) * 16, _mm512_srai_epi32(_mm512_slli_epi32(v, static_cast<unsigned>(24 - 8 * e)), 24));
            }
          }
          _mm512_store_ps(pk.dsc + (b * RV + i) * 16, d);
        }
      }
  } else {  // q8_0
    const int64_t nblk = cols / 32;
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t p = 0; p < nblk / 2; ++p)
      for (int i = 0; i < RV; ++i) {
        const int vi = std::clamp(valid - 16 * i, 0, 16);
        __m512i A[16];
        alignas(64) uint16_t dh[2][16];
        for (int e = 0; e < 16; ++e) {
          if (e >= vi) {
            A[e] = _mm512_setzero_si512();
            dh[0][e] = dh[1][e] = 0;
            continue;
          }
          const uint8_t* pa = base + (16 * i + e) * rb + 2 * p * 34;
          A[e] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2))),
                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 36)), 1);
          std::memcpy(&dh[0][e], pa, 2);
          std::memcpy(&dh[1][e], pa + 34, 2);
        }
        transpose16(A);
        for (int c = 0; c < 16; ++c)
          _mm512_store_si512(pk.codes + (((2 * p + c / 8) * 8 + c % 8) * RV + i) * 64, _mm512_xor_si512(A[c], flip));
        for (int h = 0; h < 2; ++h)
          _mm512_store_ps(pk.dsc + ((2 * p + h) * RV + i) * 16, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dh[h]))));
      }
  }
}

HMOE_V512 inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int RV, int NT>
HMOE_V512 inline void store_tile(const __m512 (&acc)[RV][NT], float* y, int64_t ldy, int valid) {
  for (int i = 0; i < RV; ++i) {
    const int vi = std::clamp(valid - 16 * i, 0, 16);
    const __mmask16 m = static_cast<__mmask16>((1u << vi) - 1u);
    for (int j = 0; j < NT; ++j) _mm512_mask_storeu_ps(y + j * ldy + 16 * i, m, acc[i][j]);
  }
}

// y[j * ldy + row] for the tile's NT tokens (from tx) and the group's rows.
template <ExtType T, int RV, int NT>
HMOE_V512 void tile_k(const Pack& pk, int64_t nb, const Q8Acts& xa, int64_t tx, float* y, int64_t ldy, int valid) {
  constexpr int NS = kSubs<T>, QPS = 64 / NS;
  const int8_t* xq[NT];
  const float* xd[NT];
  const int16_t* xb[NT];
  const int32_t* xs[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = xa.q.data() + (tx + j) * xa.cols;
    xd[j] = xa.d.data() + (tx + j) * nb;
    xb[j] = kMins<T> ? xa.bsum.data() + (tx + j) * nb * 16 : nullptr;
    xs[j] = T == ExtType::q6_k ? xa.seed.data() + (tx + j) * nb * 16 : nullptr;
  }
  __m512 acc[RV][NT];
#pragma GCC unroll 8
  for (int i = 0; i < RV; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i ib[RV][NT], ia[RV][NT];
#pragma GCC unroll 8
    for (int i = 0; i < RV; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) ib[i][j] = _mm512_setzero_si512();
    const uint8_t* cb = pk.codes + b * 64 * RV * 64;
#pragma GCC unroll 16
    for (int s = 0; s < NS; ++s) {
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512i s0 = T == ExtType::q6_k ? _mm512_set1_epi32(xs[j][b * 16 + s]) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int i = 0; i < RV; ++i) ia[i][j] = s0;
      }
#pragma GCC unroll 8
      for (int u = 0; u < QPS; ++u) {
        const int Q = s * QPS + u;
        __m512i wv[RV];
#pragma GCC unroll 8
        for (int i = 0; i < RV; ++i) wv[i] = _mm512_load_si512(cb + (Q * RV + i) * 64);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
          const __m512i xv = bcast32(xq[j] + b * 256 + xoff<T>(Q));
#pragma GCC unroll 8
          for (int i = 0; i < RV; ++i) ia[i][j] = _mm512_dpbusd_epi32(ia[i][j], wv[i], xv);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < RV; ++i) {
        const __m512i sv = _mm512_load_si512(pk.sc + ((b * NS + s) * RV + i) * 16);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) ib[i][j] = _mm512_add_epi32(ib[i][j], _mm512_mullo_epi32(ia[i][j], sv));
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RV; ++i) {
      const __m512 dv = _mm512_load_ps(pk.dsc + (b * RV + i) * 16);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[i][j]), _mm512_mul_ps(dv, _mm512_set1_ps(xd[j][b])), acc[i][j]);
    }
    if constexpr (kMins<T>) {
#pragma GCC unroll 8
      for (int i = 0; i < RV; ++i)
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) ia[i][j] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        __m512i mv[RV];
#pragma GCC unroll 8
        for (int i = 0; i < RV; ++i) mv[i] = _mm512_load_si512(pk.mn + ((b * 4 + p) * RV + i) * 16);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
          const __m512i bv = bcast32(xb[j] + b * 16 + 2 * p);
#pragma GCC unroll 8
          for (int i = 0; i < RV; ++i) ia[i][j] = _mm512_dpwssd_epi32(ia[i][j], mv[i], bv);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < RV; ++i) {
        const __m512 dm = _mm512_load_ps(pk.dmin + (b * RV + i) * 16);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j)
          acc[i][j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ia[i][j]), _mm512_mul_ps(dm, _mm512_set1_ps(xd[j][b])), acc[i][j]);
      }
    }
  }
  store_tile<RV, NT>(acc, y, ldy, valid);
}

template <int RV, int NT>
HMOE_V512 void tile_q8(const Pack& pk, int64_t nblk, const Q8Acts& xa, int64_t tx, float* y, int64_t ldy, int valid) {
  const int8_t* xq[NT];
  const float* xd[NT];
  const int32_t* xs[NT];
  for (int j = 0; j < NT; ++j) {
    xq[j] = xa.q.data() + (tx + j) * xa.cols;
    xd[j] = xa.d.data() + (tx + j) * nblk;
    xs[j] = xa.seed.data() + (tx + j) * nblk;
  }
  __m512 acc[RV][NT];
#pragma GCC unroll 8
  for (int i = 0; i < RV; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < nblk; ++k) {
    __m512i ia[RV][NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const __m512i s0 = _mm512_set1_epi32(xs[j][k]);
#pragma GCC unroll 8
      for (int i = 0; i < RV; ++i) ia[i][j] = s0;
    }
    const uint8_t* cb = pk.codes + k * 8 * RV * 64;
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) {
      __m512i wv[RV];
#pragma GCC unroll 8
      for (int i = 0; i < RV; ++i) wv[i] = _mm512_load_si512(cb + (u * RV + i) * 64);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512i xv = bcast32(xq[j] + k * 32 + 4 * u);
#pragma GCC unroll 8
        for (int i = 0; i < RV; ++i) ia[i][j] = _mm512_dpbusd_epi32(ia[i][j], wv[i], xv);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RV; ++i) {
      const __m512 dw = _mm512_load_ps(pk.dsc + (k * RV + i) * 16);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j)
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[i][j]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[j][k])), acc[i][j]);
    }
  }
  store_tile<RV, NT>(acc, y, ldy, valid);
}

template <ExtType T, int RV, int NT>
HMOE_V512 inline void run_tile(const Pack& pk, int64_t cols, const Q8Acts& xa, int64_t tx, float* y, int64_t ldy, int valid) {
  if constexpr (kK<T>) tile_k<T, RV, NT>(pk, cols / 256, xa, tx, y, ldy, valid);
  else tile_q8<RV, NT>(pk, cols / 32, xa, tx, y, ldy, valid);
}

// ---- AMX-INT8 (TDPBSUD) --------------------------------------------------------------
// The repacked group is TDPBSUD's B operand as it stands: per sub-block
// (Q8_0: block) of K columns, K/4 rows of 64 bytes, row u = column quad u of
// 16 weight rows (4 bytes each); the activation rows are the A operand (16
// tokens x K bytes, row stride = the row's columns); C[token][row] is then
// ia_s, exact, for 16 tokens x 16 rows at once. The epilogue is the VNNI
// tile's, per token, so the bits are the same: this pass may serve any
// 16-token block of a call and the VNNI tiles the rest.

struct alignas(64) AmxCfg {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxCfg) == 64);

// Emulated tiles: tile 1 = A (16 x K signed bytes), 2 = B (K/4 x 64
// unsigned bytes), 0 = C (16 x 16 int32); tdpbsud as the ISA defines it.
struct EmuI8 {
  int8_t a[16][64];
  uint8_t b[16][64];
  int32_t c[16][16];
  int kb = 32;
};
thread_local EmuI8 g_emu8;

void emu8_dp(const int8_t* ap, int64_t as, const uint8_t* bp, int64_t bs, int kb, int32_t* cout) {
  EmuI8& e = g_emu8;
  for (int m = 0; m < 16; ++m) std::memcpy(e.a[m], ap + m * as, static_cast<size_t>(kb));
  for (int k = 0; k < kb / 4; ++k) std::memcpy(e.b[k], bp + k * bs, 64);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      int32_t acc = 0;
      for (int k = 0; k < kb / 4; ++k)
        for (int j = 0; j < 4; ++j) acc += static_cast<int32_t>(e.a[m][4 * k + j]) * static_cast<int32_t>(e.b[k][4 * n + j]);
      cout[m * 16 + n] = acc;
    }
}

void hw8_config(int kb) {
  AmxCfg cfg;
  cfg.colsb[0] = 64;
  cfg.rows[0] = 16;
  cfg.colsb[1] = static_cast<uint16_t>(kb);
  cfg.rows[1] = 16;
  cfg.colsb[2] = 64;
  cfg.rows[2] = static_cast<uint8_t>(kb / 4);
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}
void hw8_dp(const int8_t* ap, int64_t as, const uint8_t* bp, int64_t bs, int32_t* cout) {
  __asm__ volatile("tilezero %%tmm0" ::);
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm1" ::"r"(ap), "r"(as) : "memory");
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm2" ::"r"(bp), "r"(bs) : "memory");
  __asm__ volatile("tdpbsud %%tmm2, %%tmm1, %%tmm0" ::);
  __asm__ volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(cout), "r"(int64_t{64}) : "memory");
}

// Tokens [tx, tx + 16) through the packed group with tiles (HW) or their
// emulation; rows of vector i are lanes as in tile_k / tile_q8.
template <ExtType T, int RV, bool HW>
HMOE_V512 void amx_block(const Pack& pk, int64_t cols, const Q8Acts& xa, int64_t tx, float* y, int64_t ldy, int valid) {
  constexpr int KB = T == ExtType::q6_k ? 16 : 32, QPS = KB / 4;
  constexpr int NS = kK<T> ? kSubs<T> : 1;
  const int64_t nb = kK<T> ? cols / 256 : cols / 32;
  alignas(64) int32_t c[16 * 16];
  alignas(64) float accm[16][16];
  const int8_t* x0 = xa.q.data() + tx * xa.cols;
  for (int i = 0; i < RV; ++i) {
    __m512 acc[16];
    for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512i ib[16];
      for (int m = 0; m < 16; ++m) ib[m] = _mm512_setzero_si512();
      for (int s = 0; s < NS; ++s) {
        const int8_t* ap = kK<T> ? x0 + b * 256 + xoff<T>(s * QPS) : x0 + b * 32;
        const uint8_t* bp = kK<T> ? pk.codes + ((b * 64 + s * QPS) * RV + i) * 64 : pk.codes + (b * 8 * RV + i) * 64;
        if constexpr (HW) hw8_dp(ap, xa.cols, bp, RV * 64, c);
        else emu8_dp(ap, xa.cols, bp, RV * 64, KB, c);
        if constexpr (kK<T>) {
          const __m512i sv = _mm512_load_si512(pk.sc + ((b * NS + s) * RV + i) * 16);
          for (int m = 0; m < 16; ++m) {
            __m512i ia = _mm512_load_si512(c + 16 * m);
            if constexpr (T == ExtType::q6_k) ia = _mm512_add_epi32(ia, _mm512_set1_epi32(xa.seed[static_cast<size_t>((tx + m) * nb * 16 + b * 16 + s)]));
            ib[m] = _mm512_add_epi32(ib[m], _mm512_mullo_epi32(ia, sv));
          }
        } else {
          const __m512 dw = _mm512_load_ps(pk.dsc + (b * RV + i) * 16);
          for (int m = 0; m < 16; ++m) {
            const __m512i ia = _mm512_add_epi32(_mm512_load_si512(c + 16 * m), _mm512_set1_epi32(xa.seed[static_cast<size_t>((tx + m) * nb + b)]));
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(dw, _mm512_set1_ps(xa.d[static_cast<size_t>((tx + m) * nb + b)])), acc[m]);
          }
        }
      }
      if constexpr (kK<T>) {
        const __m512 dv = _mm512_load_ps(pk.dsc + (b * RV + i) * 16);
        for (int m = 0; m < 16; ++m) {
          const float dx = xa.d[static_cast<size_t>((tx + m) * nb + b)];
          acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib[m]), _mm512_mul_ps(dv, _mm512_set1_ps(dx)), acc[m]);
        }
        if constexpr (kMins<T>) {
          const __m512 dm = _mm512_load_ps(pk.dmin + (b * RV + i) * 16);
          for (int m = 0; m < 16; ++m) {
            __m512i mm = _mm512_setzero_si512();
            const int16_t* bs = xa.bsum.data() + ((tx + m) * nb + b) * 16;
            for (int p = 0; p < 4; ++p) mm = _mm512_dpwssd_epi32(mm, _mm512_load_si512(pk.mn + ((b * 4 + p) * RV + i) * 16), bcast32(bs + 2 * p));
            const float dx = xa.d[static_cast<size_t>((tx + m) * nb + b)];
            acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mm), _mm512_mul_ps(dm, _mm512_set1_ps(dx)), acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < 16; ++m) _mm512_store_ps(accm[m], acc[m]);
    const int vi = std::clamp(valid - 16 * i, 0, 16);
    const __mmask16 mk = static_cast<__mmask16>((1u << vi) - 1u);
    for (int m = 0; m < 16; ++m) _mm512_mask_storeu_ps(y + m * ldy + 16 * i, mk, _mm512_load_ps(accm[m]));
  }
}

// Every token of [t0, t0 + n) through the packed group, NT at a time.
template <ExtType T, int RV>
HMOE_V512 void run_tokens(const Pack& pk, int64_t cols, const Q8Acts& xa, int64_t t0, int64_t n, float* y, int64_t ldy, int valid, AmxMode amx) {
  constexpr int NT = 4;
  int64_t t = 0;
  if (amx == AmxMode::hardware) {
    hw8_config(T == ExtType::q6_k ? 16 : 32);
    for (; t + 16 <= n; t += 16) amx_block<T, RV, true>(pk, cols, xa, t0 + t, y + t * ldy, ldy, valid);
    __asm__ volatile("tilerelease" ::: "memory");
  } else if (amx == AmxMode::emulate) {
    for (; t + 16 <= n; t += 16) amx_block<T, RV, false>(pk, cols, xa, t0 + t, y + t * ldy, ldy, valid);
  }
  for (; t + NT <= n; t += NT) run_tile<T, RV, NT>(pk, cols, xa, t0 + t, y + t * ldy, ldy, valid);
  switch (n - t) {
    case 3: run_tile<T, RV, 3>(pk, cols, xa, t0 + t, y + t * ldy, ldy, valid); break;
    case 2: run_tile<T, RV, 2>(pk, cols, xa, t0 + t, y + t * ldy, ldy, valid); break;
    case 1: run_tile<T, RV, 1>(pk, cols, xa, t0 + t, y + t * ldy, ldy, valid); break;
    default: break;
  }
}

template <ExtType T>
HMOE_V512 void rows_tiles(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy, AmxMode amx) {
  const int64_t cols = w.cols;
  const int64_t rb = kK<T> ? cols / 256 * kBB<T> : cols / 32 * 34;
  const int64_t nb = kK<T> ? cols / 256 : cols / 32;  // blocks with their own scales
  constexpr int NS = kK<T> ? kSubs<T> : 1;
  const size_t codes = static_cast<size_t>(cols) * 32, scales = static_cast<size_t>(nb * (NS + 1)) * 32 * sizeof(float);
  const size_t mins = kMins<T> ? static_cast<size_t>(nb) * 4 * 32 * sizeof(int32_t) : 0, dmins = kMins<T> ? static_cast<size_t>(nb) * 32 * sizeof(float) : 0;
  thread_local std::vector<uint8_t> scratch;
  const size_t need = codes + scales + mins + dmins + 64;
  if (scratch.size() < need) scratch.resize(need);
  auto* p0 = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t r = r0; r < r1; r += 32) {
    const int valid = static_cast<int>(std::min<int64_t>(32, r1 - r));
    const int rv = valid > 16 ? 2 : 1;
    const size_t cbytes = static_cast<size_t>(cols) * 16 * static_cast<size_t>(rv);
    const size_t dbytes = static_cast<size_t>(nb) * 16 * rv * sizeof(float);
    const size_t sbytes = kK<T> ? static_cast<size_t>(nb * NS) * 16 * rv * sizeof(int32_t) : 0;
    const size_t mbytes = kMins<T> ? static_cast<size_t>(nb) * 4 * 16 * rv * sizeof(int32_t) : 0;
    uint8_t* p = p0 + cbytes;
    Pack pk{p0, reinterpret_cast<float*>(p), reinterpret_cast<int32_t*>(p + dbytes), reinterpret_cast<int32_t*>(p + dbytes + sbytes),
            reinterpret_cast<float*>(p + dbytes + sbytes + mbytes)};
    if (rv == 2) {
      pack_group<T, 2>(base + r * rb, rb, cols, valid, pk);
      run_tokens<T, 2>(pk, cols, xa, t0, n, y + r, ldy, valid, amx);
    } else {
      pack_group<T, 1>(base + r * rb, rb, cols, valid, pk);
      run_tokens<T, 1>(pk, cols, xa, t0, n, y + r, ldy, valid, amx);
    }
  }
}

// One 32-row Q8_0 group of pseudo-random codes times 16 tokens on the
// hardware AMX-INT8 tiles against the VNNI tiles, in a forked child (as
// quant_gguf_amx.cpp's bf16 self-check), so that a fault or a wrong bit from
// a kernel or hypervisor that does not really give the tile state costs the
// child: every buffer is made in the parent (the child allocates nothing).
bool amx_int8_self_check() {
  constexpr int64_t rows = 32, cols = 256, n = 16;
  std::vector<uint8_t> wb(static_cast<size_t>(rows * cols / 32 * 34));
  uint64_t st = 0x9e3779b97f4a7c15ull;
  auto next = [&st] {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
  };
  for (auto& b : wb) b = static_cast<uint8_t>(next());
  for (size_t blk = 0; blk < wb.size(); blk += 34) {
    const uint16_t d = static_cast<uint16_t>(0x2000 + next() % 0x400);  // fp16 scales in [0.0078, 0.0156)
    std::memcpy(wb.data() + blk, &d, 2);
  }
  const Mat w = ext_view(ExtType::q8_0, wb.data(), rows, cols, "AMX-INT8 self-check");
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) * 1e-3f;
  Q8Acts a;
  a.reset(n, w);
  for (int64_t t = 0; t < n; ++t) a.quantize(t, x.data() + t * cols);
  std::vector<float> hw(static_cast<size_t>(n * rows), 0.0f), vnni(hw.size(), 1.0f);
  rows_tiles<ExtType::q8_0>(a, 0, n, w, 0, rows, vnni.data(), rows, AmxMode::off);  // also sizes this thread's scratch
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    for (int sig : {SIGILL, SIGSEGV, SIGBUS, SIGFPE}) std::signal(sig, SIG_DFL);
    rows_tiles<ExtType::q8_0>(a, 0, n, w, 0, rows, hw.data(), rows, AmxMode::hardware);
    _exit(std::memcmp(hw.data(), vnni.data(), hw.size() * sizeof(float)) == 0 ? 0 : 1);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return false;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  std::fprintf(stderr, "hmoe: AMX-INT8 tiles %s in a self-check; GGUF prompts use the VNNI tiles (same bits)\n",
               WIFSIGNALED(status) ? "fault here" : "gave other bits than the VNNI tiles");
  return false;
}

bool amx_int8_cpu() {
  static const bool v = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ((d >> 25) & 1u) != 0 && amx_int8_self_check();  // AMX-INT8, and it gives the VNNI tiles' bits
  }();
  return v;
}

}  // namespace

AmxMode q8_amx_mode() {
  const AmxMode m = amx_mode();
  return m == AmxMode::hardware && !amx_int8_cpu() ? AmxMode::off : m;
}

bool q8_tiles_serve(ExtType t) { return t == ExtType::q4_k || t == ExtType::q5_k || t == ExtType::q6_k || t == ExtType::q8_0; }

void q8_tiles_avx512(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const AmxMode amx = n >= 16 ? q8_amx_mode() : AmxMode::off;
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_k: return rows_tiles<ExtType::q4_k>(xa, t0, n, w, r0, r1, y, ldy, amx);
    case ExtType::q5_k: return rows_tiles<ExtType::q5_k>(xa, t0, n, w, r0, r1, y, ldy, amx);
    case ExtType::q6_k: return rows_tiles<ExtType::q6_k>(xa, t0, n, w, r0, r1, y, ldy, amx);
    case ExtType::q8_0: return rows_tiles<ExtType::q8_0>(xa, t0, n, w, r0, r1, y, ldy, amx);
    default: break;
  }
  fail(ErrorKind::internal, "q8_tiles_avx512: type " + std::to_string(w.ext) + " has no tile kernel");
}

void q8_tiles_model(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_k: return model_rows<ExtType::q4_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_k: return model_rows<ExtType::q5_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q6_k: return model_rows<ExtType::q6_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q8_0: return model_rows<ExtType::q8_0>(xa, t0, n, w, r0, r1, y, ldy);
    default: break;
  }
  fail(ErrorKind::internal, "q8_tiles_model: type " + std::to_string(w.ext) + " has no tile kernel");
}

}  // namespace hmoe::cpu::detail
