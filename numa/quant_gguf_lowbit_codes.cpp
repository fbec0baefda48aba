// AVX-512 VNNI + VBMI (+ BITALG, GFNI) integer kernels of the grid IQ types
// (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), v4. v2
// (quant_gguf_lowbit_vbmi.cpp) decodes a row's group in the weights' own
// order and spends most of a step placing indices, signs and 16 integer
// scales; v4 lays a group out so that every scale sub-block sits in fixed
// int32 lanes of all four 64-weight vectors:
//  - output vector c, qword i takes grid row 4i + c (8-weight rows; IQ3's
//    4-weight rows: 8i + 2c, 8i + 2c + 1), so qword i is sub-block i for the
//    32-weight scales (one int32 accumulator, one fp32 fma per 16 lanes and
//    token) and two accumulators serve the 16-weight scales (IQ1_M,
//    IQ2_XS, IQ2_S); the activations are permuted into that order once per
//    call, with the bias terms (-bias * sum(x) of each lane) as lane seeds;
//  - 256- and 512-entry grids (IQ2_XXS, IQ3_XXS, IQ3_S) are looked up in
//    registers as 16-bit *codes* (the position of each byte among the grid's
//    3 or 8 levels, packed): two byte planes, 2 vpermi2b per plane and 64
//    rows (IQ2_XXS: two rows per step fill the 64); a register of 32 codes
//    becomes 64 weights by one vpmultishiftqb (byte j takes its weight's code
//    bits from the row the control names) and one vgf2p8affineqb (IQ2,
//    IQ3_S: the levels are an affine GF(2) image of the codes; port 0, where
//    vpermb would queue behind the shifts on port 5) or vpermb of a periodic
//    level table (IQ3_XXS, whose top level 62 is not affine);
//  - IQ1_S, IQ1_M (2048 entries), IQ2_S (1024) and IQ2_XS (512, measured
//    faster than 8 vpermi2b per 64 rows) gather their biased 8-byte rows;
//  - sign bits of 64 weights are one kmovq load from the sign bytes stored
//    in output order; u = bias + level or bias - level (one masked
//    subtract); IQ1's delta is added per qword.
// Two vpdpbusd chains per row and token (latency 5). Exact integer sums;
// equal to the scalar reference up to the order of fp32 sums.
// Measured (bench_gguf_lowbit --kernel / --compare-v2, bench/README.md):
// faster than v2 for every type at 4 and 8 tokens, and at 1 token except
// IQ1_M (gather-bound; v2 keeps it at one token) and IQ1_S (equal).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_LC __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,avx512bitalg,gfni,bmi2,f16c,fma")))

namespace hmoe::cpu::detail {

namespace {

using lowbit_bytes::half;
using lowbit_bytes::prefetch;
using lowbit_bytes::u16;
using lowbit_bytes::u32;
using lowbit_bytes::u64;

constexpr uint32_t kIq2xxs = 16, kIq2xs = 17, kIq3xxs = 18, kIq1s = 19, kIq3s = 21, kIq2s = 22, kIq1m = 29;

template <uint32_t T> constexpr int kGroupBytes = T == kIq2xxs ? 66 : T == kIq2xs ? 74 : T == kIq3xxs ? 98 : T == kIq3s ? 110 : T == kIq2s ? 82 : T == kIq1s ? 50 : 56;
template <uint32_t T> constexpr int kBias = (T == kIq2xxs || T == kIq2xs || T == kIq2s) ? 43 : T == kIq3xxs ? 62 : T == kIq3s ? 15 : 9;
// fp32 factor of the integer scales (2 s + 1), applied to the activation scale
template <uint32_t T> constexpr float kDScale = T == kIq3xxs ? 0.25f : T == kIq3s ? 1.0f : 0.125f;
// rows decoded per step
template <uint32_t T> constexpr int kRows = T == kIq2xxs ? 2 : 1;
// accumulators (scale lane maps) per row: output c goes to c / (4 / kAcc)
template <uint32_t T> constexpr int kAcc = (T == kIq1m || T == kIq2xs || T == kIq2s) ? 2 : 1;

// Column (0..255 in the group) of byte p (0..63) of output c.
template <uint32_t T>
constexpr int column(int c, int p) {
  const int i = p / 8, j = p % 8;
  if constexpr (T == kIq3xxs || T == kIq3s) return 32 * i + 8 * c + j;  // grid rows 8i + 2c, 8i + 2c + 1
  else return 8 * (4 * i + c) + j;                         // grid row 4i + c
}

// Levels of a grid byte (the code is the level's position).
constexpr int kIq2Levels[3] = {8, 25, 43};
constexpr int kIq3Levels[8] = {4, 12, 20, 28, 36, 44, 52, 62};
constexpr int kIq3sLevels[8] = {1, 3, 5, 7, 9, 11, 13, 15};

struct Tables {
  alignas(64) uint8_t sign[128];      // 7-bit sign index -> sign byte with its parity bit
  alignas(64) uint8_t xperm[7][4][64];  // [type slot][c]: byte p <- column (mod 128)
  uint64_t xhigh[7][4];                 // [type slot][c]: byte p takes columns >= 128
  alignas(64) uint8_t x2_idx[64];     // IQ2_XXS: position p -> byte of the grid index (rows A | B)
  alignas(64) uint8_t x2_sms[64];     // IQ2_XXS: byte 8i + c = bits 32 + 7c (c < 4)
  alignas(64) uint8_t x2_scm[64];     // IQ2_XXS: position 8c + i <- 8i + c (A), 32 + 8c + i <- 64 + 8i + c (B)
  alignas(64) uint8_t x2_ms[4][64];   // IQ2_XXS output c: byte j of a qword = bits 16c + 2j
  alignas(64) uint8_t x3_idx[64];     // IQ3_XXS: position p -> grid index byte
  alignas(64) uint8_t x3_sms[64];     // IQ3_XXS: byte 8i + c = bits 7c
  alignas(64) uint8_t x3_scm[64];     // IQ3_XXS: position 8c + i <- 8i + c
  alignas(64) uint8_t x3_ms[2][64];   // IQ3_XXS output c: byte j = bits 16 (2 (c % 2) + j / 4) + 3 (j % 4)
  alignas(64) uint8_t x3_lv[64];      // IQ3 levels + bias, period 8
  alignas(64) uint8_t xs_scm[64];     // IQ2_XS: position 8c + i <- high byte of grid row 4i + c
  alignas(64) uint8_t s3_scm[64];     // IQ3_S: position 8c + i <- sign byte 4i + c
  alignas(64) uint8_t w2q[4][64];
  alignas(64) uint8_t spread[8][64];  // chunk k: every byte of qword i <- byte 8k + i     // IQ1 output c: qword i bytes 0, 1 <- word 4i + c
  alignas(64) int16_t e_quarter[32], e_sh3[32], e_half[32], e_sh4[32], e_sh2[32];
  alignas(64) int32_t m1_lanes[2][16];  // IQ1_M: lane L of accumulator a -> 16-weight scale 2 (L / 2) + a
  alignas(16) uint8_t m1_sms[16];      // IQ1_M: bit offset of scale j in the 64 scale bits
};

template <uint32_t T> constexpr int kSlot = T == kIq2xxs ? 0 : T == kIq3xxs ? 1 : T == kIq1s ? 2 : T == kIq1m ? 3 : T == kIq2xs ? 4 : T == kIq3s ? 5 : 6;

template <uint32_t T>
constexpr void put_perm(Tables& t) {
  for (int c = 0; c < 4; ++c) {
    t.xhigh[kSlot<T>][c] = 0;
    for (int p = 0; p < 64; ++p) {
      const int col = column<T>(c, p);
      t.xperm[kSlot<T>][c][p] = static_cast<uint8_t>(col & 127);
      if (col >= 128) t.xhigh[kSlot<T>][c] |= uint64_t{1} << p;
    }
  }
}

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 128; ++i) t.sign[i] = iq_sign_byte(i);
  put_perm<kIq2xxs>(t);
  put_perm<kIq3xxs>(t);
  put_perm<kIq1s>(t);
  put_perm<kIq1m>(t);
  put_perm<kIq2xs>(t);
  put_perm<kIq3s>(t);
  put_perm<kIq2s>(t);
  for (int p = 0; p < 64; ++p) {
    // IQ2_XXS lookups: position p = 16k + 8 row + b holds row's grid row 8k + b (unpacklo/hi pair them with their hi byte)
    const int k = p / 16, row = (p / 8) % 2, b = p % 8, e = 8 * k + b;
    t.x2_idx[p] = static_cast<uint8_t>(64 * row + 8 * (e / 4) + e % 4);
    {
      const int rr = p / 32, cc = (p % 32) / 8, ii = p % 8;
      t.xs_scm[p] = static_cast<uint8_t>(64 * rr + 2 * (4 * ii + cc) + 1);
      t.s3_scm[p] = static_cast<uint8_t>(rr == 0 ? 4 * ii + cc : 0);
    }
    const int c = p % 8;  // byte 8i + c
    t.x2_sms[p] = static_cast<uint8_t>(c < 4 ? 32 + 7 * c : 0);
    t.x3_sms[p] = static_cast<uint8_t>(c < 4 ? 7 * c : 0);
    const int r = p / 32, q = p % 32;  // position 8c' + i' of row r
    t.x2_scm[p] = static_cast<uint8_t>(64 * r + 8 * (q % 8) + q / 8);
    t.x3_scm[p] = static_cast<uint8_t>(r == 0 ? 8 * (q % 8) + q / 8 : 0);
    for (int cc = 0; cc < 4; ++cc) t.x2_ms[cc][p] = static_cast<uint8_t>(16 * cc + 2 * (p % 8));
    for (int h = 0; h < 2; ++h) t.x3_ms[h][p] = static_cast<uint8_t>(16 * (2 * h + (p % 8) / 4) + 3 * (p % 4));
    for (int cc = 0; cc < 4; ++cc) t.w2q[cc][p] = static_cast<uint8_t>(p % 8 < 2 ? 2 * (4 * (p / 8) + cc) + p % 8 : 0);
    // IQ3_XXS lookups: Q0 word 4i + k' = grid row 8i + k', Q1 word 4i + k' = 8i + 4 + k' (k' < 4);
    // unpacklo / unpackhi take positions 16k + b / 16k + 8 + b as word 8k + b.
    {
      const int kk = p / 16, hh = (p % 16) / 8, bb = p % 8, w = 8 * kk + bb;
      t.x3_idx[p] = static_cast<uint8_t>(8 * (w / 4) + 4 * hh + w % 4);
    }
    t.x3_lv[p] = static_cast<uint8_t>(62 + kIq3Levels[p & 7]);
  }
  for (int e = 0; e < 32; ++e) {
    t.e_quarter[e] = static_cast<int16_t>(e / 4);
    t.e_sh3[e] = static_cast<int16_t>(3 * (e % 4));
    t.e_sh2[e] = static_cast<int16_t>(2 * (e % 4));
    t.e_half[e] = static_cast<int16_t>(e / 2);
    t.e_sh4[e] = static_cast<int16_t>(4 * (e % 2));
  }
  for (int a = 0; a < 2; ++a)
    for (int l = 0; l < 16; ++l) {
      t.m1_lanes[a][l] = 2 * (l / 2) + a;
    }
  for (int j = 0; j < 16; ++j) t.m1_sms[j] = static_cast<uint8_t>(16 * (j / 4) + 3 * (j % 4));
  return t;
}
constexpr Tables kT = make_tables();

// Grid codes of the register-resident grids (IQ2_XXS, IQ3_XXS: 256 entries, IQ3_S: 512) as lo / hi code byte planes.
struct Codes {
  alignas(64) uint8_t iq2xxs[2][256];
  alignas(64) uint8_t iq3xxs[2][256];
  alignas(64) uint8_t iq3s[2][512];
};
int level_code(const int* levels, int n, int v) {
  for (int i = 0; i < n; ++i)
    if (levels[i] == v) return i;
  return -1;
}
const Codes& make_codes() {
  static const Codes c = [] {
    Codes t{};
    for (int e = 0; e < 256; ++e) {
      uint32_t c2 = 0, c3 = 0;
      for (int j = 0; j < 8; ++j) c2 |= static_cast<uint32_t>(level_code(kIq2Levels, 3, static_cast<int>((kIq2xxsGrid[e] >> (8 * j)) & 0xFF))) << (2 * j);
      for (int j = 0; j < 4; ++j) c3 |= static_cast<uint32_t>(level_code(kIq3Levels, 8, static_cast<int>((kIq3xxsGrid[e] >> (8 * j)) & 0xFF))) << (3 * j);
      t.iq2xxs[0][e] = static_cast<uint8_t>(c2);
      t.iq2xxs[1][e] = static_cast<uint8_t>(c2 >> 8);
      t.iq3xxs[0][e] = static_cast<uint8_t>(c3);
      t.iq3xxs[1][e] = static_cast<uint8_t>(c3 >> 8);
    }
    for (int e = 0; e < 512; ++e) {
      uint32_t c3 = 0;
      for (int j = 0; j < 4; ++j) c3 |= static_cast<uint32_t>(level_code(kIq3sLevels, 8, static_cast<int>((kIq3sGrid[e] >> (8 * j)) & 0xFF))) << (3 * j);
      t.iq3s[0][e] = static_cast<uint8_t>(c3);
      t.iq3s[1][e] = static_cast<uint8_t>(c3 >> 8);
    }
    return t;
  }();
  return c;
}
const Codes& kC = make_codes();  // built at load time (the grids are constant-initialized)

HMOE_LC inline __m512i ld(const void* p) { return _mm512_load_si512(p); }

// Activations of one token and group in the order of the 4 code vectors,
// and per accumulator the lane seeds -bias * sum(x of the lane).
template <uint32_t T>
struct XG {
  __m512i x[4];
  __m512i seed[kAcc<T>];
};

template <uint32_t T>
HMOE_LC const XG<T>* prepare(const Q8Acts& xa, int64_t t0, int64_t n, int64_t ng, std::vector<uint8_t>& buf, std::vector<float>& dx) {
  buf.resize(static_cast<size_t>(n * ng) * sizeof(XG<T>) + 64);
  auto* out = reinterpret_cast<XG<T>*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
  dx.resize(static_cast<size_t>(n * ng));
  const __m512i bias = _mm512_set1_epi8(kBias<T>);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* xq = xa.q.data() + (t0 + t) * xa.cols;
    for (int64_t g = 0; g < ng; ++g) {
      const int8_t* x = xq + 256 * g;
      const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 64), x2 = _mm512_loadu_si512(x + 128), x3 = _mm512_loadu_si512(x + 192);
      XG<T>& o = out[t * ng + g];
      __m512i s[kAcc<T>];
      for (int a = 0; a < kAcc<T>; ++a) s[a] = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        const __m512i idx = ld(kT.xperm[kSlot<T>][c]);
        o.x[c] = _mm512_mask_blend_epi8(kT.xhigh[kSlot<T>][c], _mm512_permutex2var_epi8(x0, idx, x1), _mm512_permutex2var_epi8(x2, idx, x3));
        s[c * kAcc<T> / 4] = _mm512_dpbusd_epi32(s[c * kAcc<T> / 4], bias, o.x[c]);
      }
      for (int a = 0; a < kAcc<T>; ++a) o.seed[a] = _mm512_sub_epi32(_mm512_setzero_si512(), s[a]);
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)] * kDScale<T>;
    }
  }
  return out;
}

// A step's decoded rows: the 4 code vectors (unsigned) and fp32 lane scales per accumulator.
template <uint32_t T>
struct Dec {
  __m512i u[kRows<T>][4];
  __m512 sc[kRows<T>][kAcc<T>];
};

// Masks of 64 sign bits through memory: chunk k is a kmovq load (a load
// port, where moving them out of a vector register takes two shuffles).
struct SignBytes {
  alignas(64) uint8_t b[64];
  HMOE_LC void put(__m512i v) {
    _mm512_store_si512(b, v);
    asm volatile("" : "+m"(b));  // keep the loads (the compiler would extract the qwords by shuffles)
  }
  HMOE_LC __mmask64 chunk(int k) const { return _load_mask64(reinterpret_cast<__mmask64*>(const_cast<uint8_t*>(b + 8 * k))); }
};

// GF(2) affine maps of a byte's low code bits (the bits above ignored) to
// biased levels, for vgf2p8affineqb (port 0, where vpermb takes port 5 with
// the vpmultishiftqb before it): output bit i = parity(row i & x) ^ bit i of
// b, row i = byte 7 - i of the matrix. A map exists when the levels are an
// affine image of the codes: IQ2 (3 levels, any 3 points are), IQ3_S
// (15 + 2k + 1 = 16 | 2k); IQ3_XXS's 62 is not (vpermb there).
constexpr uint64_t affine_matrix(const uint8_t* cols, int n) {
  uint64_t m = 0;
  for (int i = 0; i < 8; ++i) {
    uint64_t row = 0;
    for (int j = 0; j < n; ++j) row |= static_cast<uint64_t>((cols[j] >> i) & 1) << j;
    m |= row << (8 * (7 - i));
  }
  return m;
}
constexpr uint8_t kIq2Cols[2] = {(43 + 25) ^ (43 + 8), (43 + 43) ^ (43 + 8)};  // code 1, code 2 against code 0
constexpr uint64_t kIq2Affine = affine_matrix(kIq2Cols, 2);
constexpr int kIq2Affine0 = 43 + 8;
constexpr uint8_t kIq3sCols[3] = {2, 4, 8};
constexpr uint64_t kIq3sAffine = affine_matrix(kIq3sCols, 3);
constexpr int kIq3sAffine0 = 16;

// One byte plane of a 256-entry table for 64 indices (hi: index bit 7).
HMOE_LC inline __m512i lookup256(const uint8_t* plane, __m512i idx, __mmask64 hi) {
  const __m512i lo = _mm512_permutex2var_epi8(ld(plane), idx, ld(plane + 64));
  const __m512i up = _mm512_permutex2var_epi8(ld(plane + 128), idx, ld(plane + 192));
  return _mm512_mask_blend_epi8(hi, lo, up);
}

// One byte plane of a 512-entry table (hi7, hi8: index bits 7 and 8).
HMOE_LC inline __m512i lookup512(const uint8_t* plane, __m512i idx, __mmask64 hi7, __mmask64 hi8) {
  return _mm512_mask_blend_epi8(hi8, lookup256(plane, idx, hi7), lookup256(plane + 256, idx, hi7));
}

HMOE_LC inline __m512i sign_bytes(__m512i idx7) { return _mm512_permutex2var_epi8(ld(kT.sign), idx7, ld(kT.sign + 64)); }

// fp32 odd scales (2 s + 1 given as int32 lanes) times the row's fp16 d.
HMOE_LC inline __m512 row_scale(__m512i odd, const uint8_t* d16) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(odd), _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(u16(d16)))));
}

// IQ2_XXS rows A, B.
HMOE_LC inline void decode_iq2xxs(const uint8_t* a, const uint8_t* b, Dec<kIq2xxs>& k) {
  const __m512i qa = _mm512_loadu_si512(a + 2), qb = _mm512_loadu_si512(b + 2);
  const __m512i idx = _mm512_permutex2var_epi8(qa, ld(kT.x2_idx), qb);
  const __mmask64 hi = _mm512_movepi8_mask(idx);
  const __m512i lo8 = lookup256(kC.iq2xxs[0], idx, hi), hi8 = lookup256(kC.iq2xxs[1], idx, hi);
  const __m512i q[2] = {_mm512_unpacklo_epi8(lo8, hi8), _mm512_unpackhi_epi8(lo8, hi8)};
  const __m512i ms = _mm512_permutex2var_epi8(_mm512_multishift_epi64_epi8(ld(kT.x2_sms), qa), ld(kT.x2_scm),
                                              _mm512_multishift_epi64_epi8(ld(kT.x2_sms), qb));
  SignBytes sb;
  sb.put(sign_bytes(ms));
  const __m512i lv = _mm512_set1_epi64(static_cast<long long>(kIq2Affine)), twob = _mm512_set1_epi8(86);
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i u = _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(ld(kT.x2_ms[c]), q[r]), lv, kIq2Affine0);
      const __mmask64 m = sb.chunk(4 * r + c);
      k.u[r][c] = _mm512_mask_sub_epi8(u, m, twob, u);
    }
  }
  // sub-block i's scale: the top 4 bits of dword 2i + 1; (aux >> 27) | 1 = 2 s + 1, to lanes 2i, 2i + 1
  const __m512i one = _mm512_set1_epi32(1);
  k.sc[0][0] = row_scale(_mm512_shuffle_epi32(_mm512_or_si512(_mm512_srli_epi32(qa, 27), one), _MM_PERM_DDBB), a);
  k.sc[1][0] = row_scale(_mm512_shuffle_epi32(_mm512_or_si512(_mm512_srli_epi32(qb, 27), one), _MM_PERM_DDBB), b);
}

// IQ3_XXS row.
HMOE_LC inline void decode_iq3xxs(const uint8_t* a, Dec<kIq3xxs>& k) {
  const __m512i idx = _mm512_permutexvar_epi8(ld(kT.x3_idx), _mm512_loadu_si512(a + 2));
  const __mmask64 hi = _mm512_movepi8_mask(idx);
  const __m512i lo8 = lookup256(kC.iq3xxs[0], idx, hi), hi8 = lookup256(kC.iq3xxs[1], idx, hi);
  const __m512i q[2] = {_mm512_unpacklo_epi8(lo8, hi8), _mm512_unpackhi_epi8(lo8, hi8)};
  const __m512i aux = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 66)));  // qword i = aux word i
  SignBytes sb;
  sb.put(sign_bytes(_mm512_permutexvar_epi8(ld(kT.x3_scm), _mm512_multishift_epi64_epi8(ld(kT.x3_sms), aux))));
  const __m512i lv = ld(kT.x3_lv), twob = _mm512_set1_epi8(124);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i u = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ld(kT.x3_ms[c % 2]), q[c / 2]), lv);
    k.u[0][c] = _mm512_mask_sub_epi8(u, sb.chunk(c), twob, u);
  }
  // (aux >> 27) | 1 = 2 s + 1 in the low dword of qword i: to lanes 2i, 2i + 1
  k.sc[0][0] = row_scale(_mm512_shuffle_epi32(_mm512_or_si512(_mm512_srli_epi64(aux, 27), _mm512_set1_epi64(1)), _MM_PERM_CCAA), a);
}

// IQ1: output c takes grid rows 4i + c (i = 0..7) of the 32 indices in w
// (words), gathered from the biased rows (8 (v + 1) per byte); 2 added where
// the row's delta is positive (pos: bit i of output c), u = 8 (v + 1) + 1 +- 1.
// The biased IQ1 grid rows.
struct Iq1Rows {
  alignas(64) uint64_t g[2048];
  alignas(64) uint64_t iq2s[1024];  // IQ2_S: 43 + level per byte
  alignas(64) uint64_t iq2xs[512];  // IQ2_XS: 43 + level per byte
};
const Iq1Rows& make_iq1_rows() {
  static const Iq1Rows r = [] {
    Iq1Rows t{};
    for (int e = 0; e < 2048; ++e) {
      uint64_t v = 0;
      for (int j = 0; j < 8; ++j) v |= ((kIq1sGrid[e] >> (8 * j)) & 0xFF) * 8 << (8 * j);
      t.g[e] = v;
    }
    for (int e = 0; e < 1024; ++e) {
      uint64_t v = 0;
      for (int j = 0; j < 8; ++j) v |= (((kIq2sGrid[e] >> (8 * j)) & 0xFF) + 43) << (8 * j);
      t.iq2s[e] = v;
    }
    for (int e = 0; e < 512; ++e) {
      uint64_t v = 0;
      for (int j = 0; j < 8; ++j) v |= (((kIq2xsGrid[e] >> (8 * j)) & 0xFF) + 43) << (8 * j);
      t.iq2xs[e] = v;
    }
    return t;
  }();
  return r;
}
const Iq1Rows& kG1 = make_iq1_rows();

template <uint32_t T>
HMOE_LC inline void iq1_rows(__m512i w, const uint32_t (&pos)[4], Dec<T>& k) {
  const __m512i two = _mm512_set1_epi8(2);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i idx = _mm512_maskz_permutexvar_epi8(0x0303030303030303ull, ld(kT.w2q[c]), w);
    const __m512i g = _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(kG1.g), 8);
    k.u[0][c] = _mm512_mask_add_epi64(g, static_cast<__mmask8>(pos[c]), g, two);
  }
}

// IQ1_S row: d, qs[32], qh u16[8] (3 high index bits per grid row, a 3-bit scale and the delta sign per 32 weights).
HMOE_LC inline void decode_iq1s(const uint8_t* a, Dec<kIq1s>& k) {
  const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 34));
  const __m512i qhw = _mm512_permutexvar_epi16(ld(kT.e_quarter), _mm512_castsi128_si512(qh));
  const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qhw, ld(kT.e_sh3)), _mm512_set1_epi16(7));
  const __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))), _mm512_slli_epi16(hi, 8));
  const uint32_t p = ~_cvtmask8_u32(_mm_movepi16_mask(qh)) & 0xFFu;  // qword i = sub-block i in every output
  const uint32_t pos[4] = {p, p, p, p};
  iq1_rows(w, pos, k);
  // 2 s + 1 = ((qh >> 11) & 14) | 1 in the low dword of qword i: to lanes 2i, 2i + 1
  const __m512i q64 = _mm512_cvtepu16_epi64(qh);
  const __m512i odd = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(q64, 11), _mm512_set1_epi64(14)), _mm512_set1_epi64(1));
  k.sc[0][0] = row_scale(_mm512_shuffle_epi32(odd, _MM_PERM_CCAA), a);
}

// IQ1_M row: qs[32], qh[16] (per grid row 3 high index bits and the delta sign), scales u16[4] (3 bits per 16 weights, d in the top nibbles).
HMOE_LC inline void decode_iq1m(const uint8_t* a, Dec<kIq1m>& k) {
  const uint64_t s64 = u64(a + 48);
  const uint16_t db = static_cast<uint16_t>(((s64 >> 12) & 0x000F) | ((s64 >> 24) & 0x00F0) | ((s64 >> 36) & 0x0F00) | ((s64 >> 48) & 0xF000));
  const __m512i qhw = _mm512_permutexvar_epi16(ld(kT.e_half), _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 32)))));
  const __m512i h = _mm512_srlv_epi16(qhw, ld(kT.e_sh4));
  const __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                                    _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(7)), 8));
  const uint32_t p = _cvtmask32_u32(_mm512_testn_epi16_mask(h, _mm512_set1_epi16(8)));  // grid row e: delta positive
  const uint32_t pos[4] = {_pext_u32(p, 0x11111111u), _pext_u32(p, 0x22222222u), _pext_u32(p, 0x44444444u), _pext_u32(p, 0x88888888u)};
  iq1_rows(w, pos, k);
  // 16-weight scale j = 3 bits at 16 (j / 4) + 3 (j % 4); accumulator a, lanes 2i, 2i + 1: scale 2i + a
  const __m128i sc = _mm_and_si128(_mm_multishift_epi64_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(kT.m1_sms)), _mm_set1_epi64x(static_cast<long long>(s64))),
                                   _mm_set1_epi8(7));
  const __m512i odd = _mm512_or_si512(_mm512_slli_epi32(_mm512_cvtepu8_epi32(sc), 1), _mm512_set1_epi32(1));
  const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(db)));
  k.sc[0][0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(ld(kT.m1_lanes[0]), odd)), d);
  k.sc[0][1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(ld(kT.m1_lanes[1]), odd)), d);
}

// IQ2_XS / IQ2_S scales (4 bits per 16 weights) as the two accumulators' lane
// scales: accumulator h (outputs 2h, 2h + 1), lanes 2i, 2i + 1 take the
// 16-weight scale 2i + h, nibble h of scale byte i; times the row's d.
HMOE_LC inline void scales16(const uint8_t* d16, const uint8_t* s8, __m512 (&sc)[2]) {
  const uint64_t s = u64(s8);
  const uint64_t lo = ((s & 0x0F0F0F0F0F0F0F0Full) << 1) | 0x0101010101010101ull, hi = ((s >> 3) & 0x1E1E1E1E1E1E1E1Eull) | 0x0101010101010101ull;
  const __m128i v = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
  const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(u16(d16))));
  sc[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, v))), d);
  sc[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(v, v))), d);
}


// IQ3_S row: d, qs[64] (low index bits), qh[8] (index bit 8), signs[32] (per 8 weights), scales[4] (4 bits per 32 weights).
HMOE_LC inline void decode_iq3s(const uint8_t* a, Dec<kIq3s>& k) {
  const __m512i pos = ld(kT.x3_idx);  // position p -> grid row
  const __m512i idx = _mm512_permutexvar_epi8(pos, _mm512_loadu_si512(a + 2));
  const __mmask64 hi7 = _mm512_movepi8_mask(idx), hi8 = _mm512_bitshuffle_epi64_mask(_mm512_set1_epi64(static_cast<long long>(u64(a + 66))), pos);
  const __m512i lo8 = lookup512(kC.iq3s[0], idx, hi7, hi8), hi8v = lookup512(kC.iq3s[1], idx, hi7, hi8);
  const __m512i q[2] = {_mm512_unpacklo_epi8(lo8, hi8v), _mm512_unpackhi_epi8(lo8, hi8v)};
  SignBytes sb;
  sb.put(_mm512_permutexvar_epi8(ld(kT.s3_scm), _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 74)))));
  const __m512i lv = _mm512_set1_epi64(static_cast<long long>(kIq3sAffine)), twob = _mm512_set1_epi8(30);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i u = _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(ld(kT.x3_ms[c % 2]), q[c / 2]), lv, kIq3sAffine0);
    k.u[0][c] = _mm512_mask_sub_epi8(u, sb.chunk(c), twob, u);
  }
  // sub-block i: nibble i of the 4 scale bytes, 2 s + 1, to lanes 2i, 2i + 1
  const uint64_t odd = (_pdep_u64(u32(a + 106), 0x0F0F0F0F0F0F0F0Full) << 1) | 0x0101010101010101ull;
  const __m128i v = _mm_cvtsi64_si128(static_cast<long long>(odd));
  k.sc[0][0] = row_scale(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, v)), a);
}

// IQ2_S row: d, qs[32] (index bits 0..7), signs[32] (one byte per grid row), qh[8] (index bits 8, 9), scales[8].
// The 1024-entry grid is gathered (biased rows, output c: grid rows 4i + c), the signs are the stored bytes.
HMOE_LC inline void decode_iq2s(const uint8_t* a, Dec<kIq2s>& k) {
  const __m512i qhw = _mm512_permutexvar_epi16(ld(kT.e_quarter), _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + 66)))));
  const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qhw, ld(kT.e_sh2)), _mm512_set1_epi16(3));
  const __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))), _mm512_slli_epi16(hi, 8));
  SignBytes sb;  // byte 8c + i: the sign byte of grid row 4i + c
  sb.put(_mm512_permutexvar_epi8(ld(kT.s3_scm), _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 34)))));
  const __m512i twob = _mm512_set1_epi8(86);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i idx = _mm512_maskz_permutexvar_epi8(0x0303030303030303ull, ld(kT.w2q[c]), w);
    const __m512i u = _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(kG1.iq2s), 8);
    k.u[0][c] = _mm512_mask_sub_epi8(u, sb.chunk(c), twob, u);
  }
  scales16(a, a + 74, k.sc[0]);
}

// IQ2_XS row: d, qs u16[32] (9-bit grid index, 7-bit sign index), scales[8] (4 bits per 16 weights); the
// 512-entry grid gathered (biased rows; 512-entry register lookups measured slower), output c: grid rows 4i + c.
HMOE_LC inline void decode_iq2xs(const uint8_t* a, Dec<kIq2xs>& k) {
  const __m512i q = _mm512_loadu_si512(a + 2);
  const __m512i w = _mm512_and_si512(q, _mm512_set1_epi16(511));
  SignBytes sb;  // byte 8c + i: grid row 4i + c's high byte >> 1
  sb.put(sign_bytes(_mm512_srli_epi16(_mm512_permutexvar_epi8(ld(kT.xs_scm), q), 1)));
  const __m512i twob = _mm512_set1_epi8(86);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i idx = _mm512_maskz_permutexvar_epi8(0x0303030303030303ull, ld(kT.w2q[c]), w);
    const __m512i u = _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(kG1.iq2xs), 8);
    k.u[0][c] = _mm512_mask_sub_epi8(u, sb.chunk(c), twob, u);
  }
  scales16(a, a + 66, k.sc[0]);
}

template <uint32_t T>
HMOE_LC inline void decode(const uint8_t* a, [[maybe_unused]] const uint8_t* b, Dec<T>& k) {
  if constexpr (T == kIq2s) decode_iq2s(a, k);
  else if constexpr (T == kIq2xs) decode_iq2xs(a, k);
  else if constexpr (T == kIq2xxs) decode_iq2xxs(a, b, k);
  else if constexpr (T == kIq3s) decode_iq3s(a, k);
  else if constexpr (T == kIq3xxs) decode_iq3xxs(a, k);
  else if constexpr (T == kIq1s) decode_iq1s(a, k);
  else decode_iq1m(a, k);
}

// acc[i][t] += group g's product of the decoded rows with the NT tokens.
template <uint32_t T, int NT>
HMOE_LC inline void dot(const Dec<T>& k, const XG<T>* xp, const float* dx, int64_t g, int64_t ng, __m512 (&acc)[kRows<T>][NT]) {
  constexpr int R = kRows<T>, A = kAcc<T>;
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) {
    const XG<T>& x = xp[t * ng + g];
    const __m512 d = _mm512_set1_ps(dx[t * ng + g]);
#pragma GCC unroll 2
    for (int i = 0; i < R; ++i) {
      __m512i s[A];
      if constexpr (A == 1) {  // two chains of 2 (vpdpbusd's latency is 5)
        const __m512i s0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(x.seed[0], k.u[i][0], x.x[0]), k.u[i][2], x.x[2]);
        const __m512i s1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k.u[i][1], x.x[1]), k.u[i][3], x.x[3]);
        s[0] = _mm512_add_epi32(s0, s1);
      } else {
#pragma GCC unroll 2
        for (int j = 0; j < A; ++j) s[j] = x.seed[j];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) s[c * A / 4] = _mm512_dpbusd_epi32(s[c * A / 4], k.u[i][c], x.x[c]);
      }
#pragma GCC unroll 2
      for (int j = 0; j < A; ++j) acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[j]), _mm512_mul_ps(k.sc[i][j], d), acc[i][t]);
    }
  }
}


// Rows r.. r + kRows - 1 (`pair` false: one row, the second repeats it) times NT tokens.
// Two groups per step, both decoded before their products: two independent
// decode chains (lookups, expansion, sign masks through memory) in flight.
template <uint32_t T, int NT>
HMOE_LC void tile(const Mat& w, int64_t r, bool pair, const XG<T>* xp, const float* dx, int64_t ng, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>, R = kRows<T>;
  const uint8_t* a = w.row(r);
  const uint8_t* b = R == 2 && pair ? w.row(r + 1) : a;
  __m512 acc[R][NT];
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 2
    for (int i = 0; i < R; ++i) acc[i][t] = _mm512_setzero_ps();
  // the same groups of the next step's rows (the weights stream from memory in the expert engine)
  const int64_t rb = static_cast<int64_t>(w.row_bytes()), ahead = lowbit_bytes::tile_ahead(R * rb);
  int64_t g = 0;
  for (; g + 2 <= ng; g += 2, a += 2 * GB, b += 2 * GB) {
    prefetch(a, ahead, 2 * GB);
    if (R == 2 && pair) prefetch(b, ahead, 2 * GB);
    Dec<T> k0, k1;
    decode<T>(a, b, k0);
    decode<T>(a + GB, b + GB, k1);
    dot<T, NT>(k0, xp, dx, g, ng, acc);
    dot<T, NT>(k1, xp, dx, g + 1, ng, acc);
  }
  if (g < ng) {
    Dec<T> k;
    decode<T>(a, b, k);
    dot<T, NT>(k, xp, dx, g, ng, acc);
  }
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) {
    y[t * ldy + r] = _mm512_reduce_add_ps(acc[0][t]);
    if (R == 2 && pair) y[t * ldy + r + 1] = _mm512_reduce_add_ps(acc[R - 1][t]);
  }
}

template <uint32_t T>
HMOE_LC void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = w.cols / 256;
  thread_local std::vector<uint8_t> buf;
  thread_local std::vector<float> dx;
  const XG<T>* xp = prepare<T>(xa, t0, n, ng, buf, dx);
  for (int64_t r = r0; r < r1; r += kRows<T>) {
    const bool pair = r + 1 < r1;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(w, r, pair, xp + t * ng, dx.data() + t * ng, ng, y + t * ldy, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(w, r, pair, xp + t * ng, dx.data() + t * ng, ng, y + t * ldy, ldy);
    for (; t < n; ++t) tile<T, 1>(w, r, pair, xp + t * ng, dx.data() + t * ng, ng, y + t * ldy, ldy);
  }
}

}  // namespace

bool lowbit_rows_q8_codes(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bitalg") && __builtin_cpu_supports("gfni");
  }();
  if (!isa) return false;
  switch (w.ext) {
    case kIq2xxs: rows<kIq2xxs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq2xs: rows<kIq2xs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq3xxs: rows<kIq3xxs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq2s: rows<kIq2s>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq3s: rows<kIq3s>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq1s: rows<kIq1s>(xa, t0, n, w, r0, r1, y, ldy); return true;
    case kIq1m:  // one token: v2 measured faster (both gather-bound; v4's two accumulators cost more there)
      if (n < 2) return false;
      rows<kIq1m>(xa, t0, n, w, r0, r1, y, ldy);
      return true;
    default: return false;
  }
}

}  // namespace hmoe::cpu::detail
