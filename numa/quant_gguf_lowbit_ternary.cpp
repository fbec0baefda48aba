// IQ1_S and IQ1_M repacked at load into base-3 trits (v5): the int8 kernel
// without grid gathers.
//
// Why: IQ1_S / IQ1_M store 8 weights in {-1, 0, 1} as an 11-bit index into
// a 2048-entry grid. No register holds that grid, so v2/v4 gather one
// 8-byte row per index: 4 vpgatherqq per 256 weights, ~5 cycles each on
// this box's cores, which alone cost ~7 ns of the ~12 ns a group took (the
// dev box reads ~8.5 GB/s per core: 50 bytes / 0.8 of that = 7.4 ns).
// Repacked once, the same weights are 5 trits per byte (3^5 = 243 <= 256):
//
//   row: the fp16 d of its groups (2 bytes each), then the groups; per 256
//   weights 58 bytes for IQ1_S (the file's 50, +16%), 66 for IQ1_M (56, +18%);
//   group (IQ1_S 56 bytes, IQ1_M 64):
//     [0, 52)   trits: byte j = sum_{k<4} t(j, k) 3^k + 84 t(j, 4), t = grid
//               value + 1 (plane k, byte j; plane 4's bytes 48..51 hold 0)
//     IQ1_S [52, 56)  u32: nibble i = 3-bit scale | delta sign << 3 of 32-weight sub-block i
//     IQ1_M [52, 58)  3-bit scales of the 16-weight blocks, little-endian
//           [58, 64)  u16 masks of the lanes whose grid row has the negative
//                     delta: chain A planes 0, 1; chain A planes 2, 3; chain B
// (the d of a row's groups together: converted 16 at a time, and times the
// token's activation scale once per row, not per group).
//
// Decoding is one 256-entry byte lookup (vpermi2b pair) of the packed bytes
// giving planes 0..3 as 2-bit fields, each moved to 8 t by one
// vgf2p8affineqb, and plane 4 by one vpermb of the byte / 4 (84 t keeps
// the three t apart there). A cell (plane k, dword lane L) holds 4 weights
// of one scale block, and planes 0, 1 (2, 3) of a lane one grid row's:
//  - IQ1_S: planes 0..3 lanes 2i, 2i + 1 are sub-block i (i < 6), lane 12
//    and plane 4 lanes 0..3 sub-block 6, plane 4 lanes 4..11 sub-block 7;
//  - IQ1_M: planes 0..3 lane L are block L (L < 13; planes 0, 1 its first
//    grid row), plane 4 lanes 4m..4m + 3 block 13 + m (lanes 4m, 4m + 1 its
//    first grid row).
// Planes 0, 1 and 2, 3 run two vpdpbusd chains (A), plane 4 a third (B);
// A and B take fp32 lane scales (a vpermps of the scale bits). The
// activations are permuted into that order once per call (the columns of
// plane k, byte j, zero past byte 52), with per lane and chain the seeds
// -7 sum(x) and -9 sum(x): 8 w / dl = 8 (t - 1) + 8 delta = 8 t - 7 or
// 8 t - 9, the delta's sign choosing the seed per lane (a blend).
// Exact integer sums; equal to the scalar reference up to the order of the
// fp32 sums.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_LT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni,bmi2,f16c,fma")))

namespace hmoe::cpu::detail {

namespace {

using lowbit_bytes::prefetch;
using lowbit_bytes::u16;
using lowbit_bytes::u32;
using lowbit_bytes::u64;

constexpr uint32_t kIq1s = 19, kIq1m = 29;
constexpr int kPackedBytes = 52;
template <uint32_t T> constexpr int kGroupBytes = T == kIq1s ? 56 : 64;
template <uint32_t T> constexpr int kRowBytesPerGroup = kGroupBytes<T> + 2;

// Column (0..255 within the group) of plane k, byte j; -1 for no weight.
template <uint32_t T>
constexpr int cell_column(int k, int j) {
  if (j >= kPackedBytes) return -1;
  if constexpr (T == kIq1m) {
    if (k < 4) return 16 * (j / 4) + 4 * k + j % 4;  // block L = j / 4: planes 0, 1 grid row 2L, planes 2, 3 row 2L + 1
    return j < 48 ? 208 + j : -1;                     // blocks 13..15: 16 bytes each, grid rows by 8
  }
  if (k < 4) {
    if (j < 48) return 32 * (j / 8) + 8 * k + j % 8;  // sub-blocks 0..5: lanes 2i, 2i + 1 of planes 0..3
    return 192 + 4 * k + (j - 48);                    // sub-block 6: lane 12 of planes 0..3
  }
  if (j < 16) return 208 + j;        // sub-block 6: plane 4 lanes 0..3
  if (j < 48) return 224 + (j - 16);  // sub-block 7: plane 4 lanes 4..11
  return -1;                          // plane 4 lanes 12: padding trits
}
// IQ1_S: sub-block of dword lane L in chain A (planes 0..3) and B (plane 4); lanes without weights take 0.
constexpr int lane_sub_a(int l) { return l < 12 ? l / 2 : l == 12 ? 6 : 0; }
constexpr int lane_sub_b(int l) { return l < 4 ? 6 : l < 12 ? 7 : 0; }
// IQ1_M: 16-weight block of dword lane L in chain A and B.
constexpr int lane_block_a(int l) { return l < 13 ? l : 0; }
constexpr int lane_block_b(int l) { return l < 12 ? 13 + l / 4 : 0; }

struct Tables {
  alignas(64) uint8_t fields[256];  // code -> t0 | t1 << 2 | t2 << 4 | t3 << 6
  alignas(64) uint8_t plane4[64];   // code / 4 -> 8 t4
  alignas(64) uint8_t xperm[2][5][64];  // [IQ1_S, IQ1_M] plane k, byte j <- column (mod 128)
  uint64_t xhigh[2][5];                 // plane k: bytes whose column is >= 128
  uint64_t xzero[2][5];                 // plane k: bytes with a weight
  alignas(64) uint32_t shift_a[16], shift_b[16];  // IQ1_S: 4 x sub-block of the lane
  alignas(64) uint8_t ms_a[64], ms_b[64];         // IQ1_M: every byte of lane L <- bits 3 x block of the lane
  alignas(64) float odd[16];                      // nibble -> (2 s + 1) / 8
};

constexpr Tables make_tables() {
  Tables t{};
  for (int c = 0; c < 256; ++c) {
    int v = c % 84 < 81 ? c % 84 : 0, f = 0;
    for (int k = 0; k < 4; ++k) {
      f |= (v % 3) << (2 * k);
      v /= 3;
    }
    t.fields[c] = static_cast<uint8_t>(f);
  }
  for (int i = 0; i < 64; ++i) t.plane4[i] = static_cast<uint8_t>(8 * std::min(i / 21, 2));
  for (int m = 0; m < 2; ++m)
    for (int k = 0; k < 5; ++k) {
      t.xhigh[m][k] = t.xzero[m][k] = 0;
      for (int j = 0; j < 64; ++j) {
        const int col = m == 0 ? cell_column<kIq1s>(k, j) : cell_column<kIq1m>(k, j);
        t.xperm[m][k][j] = static_cast<uint8_t>(col < 0 ? 0 : col & 127);
        if (col >= 128) t.xhigh[m][k] |= uint64_t{1} << j;
        if (col >= 0) t.xzero[m][k] |= uint64_t{1} << j;
      }
    }
  for (int l = 0; l < 16; ++l) {
    t.shift_a[l] = static_cast<uint32_t>(4 * lane_sub_a(l));
    t.shift_b[l] = static_cast<uint32_t>(4 * lane_sub_b(l));
  }
  for (int j = 0; j < 64; ++j) {
    t.ms_a[j] = static_cast<uint8_t>(3 * lane_block_a(j / 4));
    t.ms_b[j] = static_cast<uint8_t>(3 * lane_block_b(j / 4));
  }
  for (int n = 0; n < 16; ++n) t.odd[n] = static_cast<float>(2 * (n & 7) + 1) * 0.125f;
  return t;
}
constexpr Tables kT = make_tables();

// vgf2p8affineqb matrix moving bits 2k, 2k + 1 to bits 3, 4 (= 8 t_k), the
// rest 0: output bit i = parity(byte 7 - i of the matrix & x).
constexpr uint64_t field_matrix(int k) { return (uint64_t{1} << (2 * k)) << (8 * 4) | (uint64_t{1} << (2 * k + 1)) << (8 * 3); }

HMOE_LT inline __m512i ld(const void* p) { return _mm512_load_si512(p); }

// A token's activations for one group: the 5 planes, and per chain the lane
// seeds -7 / -9 sum(x) (chain A planes 0, 1: a; planes 2, 3: c, IQ1_M only; chain B: b).
struct SeedsC {
  __m512i c7, c9;
};
struct NoSeedsC {};
template <uint32_t T>
struct XG : std::conditional_t<T == kIq1m, SeedsC, NoSeedsC> {
  __m512i x[5];
  __m512i a7, a9, b7, b9;
};

HMOE_LT inline __m512i seed(__m512i sum, int f) { return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_mullo_epi32(sum, _mm512_set1_epi32(f))); }

template <uint32_t T>
HMOE_LT const XG<T>* prepare(const Q8Acts& xa, int64_t t0, int64_t n, int64_t ng, std::vector<uint8_t>& buf, std::vector<float>& dx) {
  constexpr int m = T == kIq1s ? 0 : 1;
  buf.resize(static_cast<size_t>(n * ng) * sizeof(XG<T>) + 64);
  auto* out = reinterpret_cast<XG<T>*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
  dx.resize(static_cast<size_t>(n * ng));
  const __m512i one = _mm512_set1_epi8(1);
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* xq = xa.q.data() + (t0 + t) * xa.cols;
    for (int64_t g = 0; g < ng; ++g) {
      const int8_t* x = xq + 256 * g;
      const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 64), x2 = _mm512_loadu_si512(x + 128), x3 = _mm512_loadu_si512(x + 192);
      XG<T>& o = out[t * ng + g];
      for (int k = 0; k < 5; ++k) {
        const __m512i idx = ld(kT.xperm[m][k]);
        o.x[k] = _mm512_maskz_mov_epi8(kT.xzero[m][k], _mm512_mask_blend_epi8(kT.xhigh[m][k], _mm512_permutex2var_epi8(x0, idx, x1),
                                                                                _mm512_permutex2var_epi8(x2, idx, x3)));
      }
      const __m512i z = _mm512_setzero_si512();
      const __m512i s01 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, one, o.x[0]), one, o.x[1]);
      const __m512i s23 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, one, o.x[2]), one, o.x[3]);
      const __m512i sb = _mm512_dpbusd_epi32(z, one, o.x[4]);
      const __m512i sa = T == kIq1m ? s01 : _mm512_add_epi32(s01, s23);
      o.a7 = seed(sa, 7);
      o.a9 = seed(sa, 9);
      o.b7 = seed(sb, 7);
      o.b9 = seed(sb, 9);
      if constexpr (T == kIq1m) {
        o.c7 = seed(s23, 7);
        o.c9 = seed(s23, 9);
      }
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)];
    }
  }
  return out;
}

// A group's decoded row: the 5 planes as 8 t, the lane scales (2 s + 1) / 8
// of chains A and B, the lanes whose grid row has the negative delta (A
// planes 0, 1: na; planes 2, 3: nc; B: nb).
struct Dec {
  __m512i u[5];
  __m512 sa, sb;
  __mmask16 na, nb, nc;
};

// 256-entry byte table lookup of 64 codes (hi: code bit 7).
HMOE_LT inline __m512i lookup256(const uint8_t* tab, __m512i idx, __mmask64 hi) {
  const __m512i lo = _mm512_permutex2var_epi8(ld(tab), idx, ld(tab + 64));
  const __m512i up = _mm512_permutex2var_epi8(ld(tab + 128), idx, ld(tab + 192));
  return _mm512_mask_blend_epi8(hi, lo, up);
}

template <uint32_t T>
HMOE_LT inline void decode(const uint8_t* p, Dec& k) {
  const __m512i v = _mm512_loadu_si512(p);  // 52 packed bytes, then this group's and the next one's bytes (x is 0 there)
  const __mmask64 hi = _mm512_movepi8_mask(v);
  const __m512i f = lookup256(kT.fields, v, hi);
  k.u[4] = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 2), ld(kT.plane4));
  k.u[0] = _mm512_gf2p8affine_epi64_epi8(f, _mm512_set1_epi64(static_cast<long long>(field_matrix(0))), 0);
  k.u[1] = _mm512_gf2p8affine_epi64_epi8(f, _mm512_set1_epi64(static_cast<long long>(field_matrix(1))), 0);
  k.u[2] = _mm512_gf2p8affine_epi64_epi8(f, _mm512_set1_epi64(static_cast<long long>(field_matrix(2))), 0);
  k.u[3] = _mm512_gf2p8affine_epi64_epi8(f, _mm512_set1_epi64(static_cast<long long>(field_matrix(3))), 0);
  if constexpr (T == kIq1s) {
    const __m512i nib = _mm512_set1_epi32(static_cast<int>(u32(p + kPackedBytes)));
    const __m512i la = _mm512_srlv_epi32(nib, ld(kT.shift_a)), lb = _mm512_srlv_epi32(nib, ld(kT.shift_b));
    k.na = k.nc = _mm512_test_epi32_mask(la, _mm512_set1_epi32(8));
    k.nb = _mm512_test_epi32_mask(lb, _mm512_set1_epi32(8));
    k.sa = _mm512_permutexvar_ps(la, _mm512_load_ps(kT.odd));
    k.sb = _mm512_permutexvar_ps(lb, _mm512_load_ps(kT.odd));
  } else {
    const __m512i sc = _mm512_set1_epi64(static_cast<long long>(u64(p + kPackedBytes)));  // 48 scale bits (the masks above them unused)
    k.sa = _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(ld(kT.ms_a), sc), _mm512_load_ps(kT.odd));
    k.sb = _mm512_permutexvar_ps(_mm512_multishift_epi64_epi8(ld(kT.ms_b), sc), _mm512_load_ps(kT.odd));
    k.na = _load_mask16(reinterpret_cast<__mmask16*>(const_cast<uint8_t*>(p + kPackedBytes + 6)));
    k.nc = _load_mask16(reinterpret_cast<__mmask16*>(const_cast<uint8_t*>(p + kPackedBytes + 8)));
    k.nb = _load_mask16(reinterpret_cast<__mmask16*>(const_cast<uint8_t*>(p + kPackedBytes + 10)));
  }
}

template <uint32_t T, int NT>
HMOE_LT inline void dot(const Dec& k, const XG<T>* xp, const float* dd, int64_t g, int64_t ng, __m512 (&acc)[NT]) {
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) {
    const XG<T>& x = xp[t * ng + g];
    __m512i a0 = _mm512_mask_blend_epi32(k.na, x.a7, x.a9);
    __m512i a1;
    if constexpr (T == kIq1m) a1 = _mm512_mask_blend_epi32(k.nc, x.c7, x.c9);
    else a1 = _mm512_setzero_si512();
    a0 = _mm512_dpbusd_epi32(a0, k.u[0], x.x[0]);
    a1 = _mm512_dpbusd_epi32(a1, k.u[2], x.x[2]);
    a0 = _mm512_dpbusd_epi32(a0, k.u[1], x.x[1]);
    a1 = _mm512_dpbusd_epi32(a1, k.u[3], x.x[3]);
    const __m512i b = _mm512_dpbusd_epi32(_mm512_mask_blend_epi32(k.nb, x.b7, x.b9), k.u[4], x.x[4]);
    const __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b), k.sb, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), k.sa));
    acc[t] = _mm512_fmadd_ps(s, _mm512_set1_ps(dd[t * ng + g]), acc[t]);
  }
}


// dd[t * ng + g] = d of group g times token t's activation scale.
template <int NT>
HMOE_LT void row_scales(const uint8_t* d16, const float* dx, int64_t ng, float* dd) {
  for (int64_t g = 0; g < ng; g += 16) {
    const __mmask16 m = ng - g >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (ng - g)) - 1);
    const __m512 d = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, d16 + 2 * g));
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(dd + t * ng + g, m, _mm512_mul_ps(d, _mm512_maskz_loadu_ps(m, dx + t * ng + g)));
  }
}

template <uint32_t T, int NT>
HMOE_LT void tile(const uint8_t* a, int64_t rb, int64_t r, const XG<T>* xp, const float* dx, int64_t ng, float* dd, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>;
  __m512 acc[NT];
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  row_scales<NT>(a, dx, ng, dd);
  a += 2 * ng;
  const int64_t ahead = lowbit_bytes::tile_ahead(rb);
  int64_t g = 0;
  for (; g + 2 <= ng; g += 2, a += 2 * GB) {
    prefetch(a, ahead, 2 * GB);
    Dec k0, k1;
    decode<T>(a, k0);
    decode<T>(a + GB, k1);
    dot<T, NT>(k0, xp, dd, g, ng, acc);
    dot<T, NT>(k1, xp, dd, g + 1, ng, acc);
  }
  if (g < ng) {
    Dec k;
    decode<T>(a, k);
    dot<T, NT>(k, xp, dd, g, ng, acc);
  }
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
}

// The grid rows of one file group as trits (grid value + 1) by column.
void iq1_trits(const uint64_t* rows, uint8_t* trit) {
  std::memcpy(trit, rows, 256);  // little-endian: byte j of row i is column 8 i + j
  trit[256] = 0;
}

// cell_column as a table (plane 4's padding points at a trit of 0 past the 256).
struct Columns {
  uint16_t c[5][kPackedBytes];
};
template <uint32_t T>
constexpr Columns make_columns() {
  Columns t{};
  for (int k = 0; k < 5; ++k)
    for (int j = 0; j < kPackedBytes; ++j) t.c[k][j] = static_cast<uint16_t>(cell_column<T>(k, j) < 0 ? 256 : cell_column<T>(k, j));
  return t;
}
template <uint32_t T>
constexpr Columns kColumns = make_columns<T>();

// trit: 257 entries, the last 0.
template <uint32_t T>
void put_trits(const uint8_t* trit, uint8_t* dst) {
  const Columns& cc = kColumns<T>;
  for (int j = 0; j < kPackedBytes; ++j)
    dst[j] = static_cast<uint8_t>(trit[cc.c[0][j]] + 3 * trit[cc.c[1][j]] + 9 * trit[cc.c[2][j]] + 27 * trit[cc.c[3][j]] + 84 * trit[cc.c[4][j]]);
}

// IQ1_S group (50 bytes: d, qs[32], qh u16[8]) -> d, packed group.
uint16_t pack_iq1s(const uint8_t* src, uint8_t* dst) {
  uint64_t rows[32];
  uint32_t nibbles = 0;
  for (int sb = 0; sb < 8; ++sb) {
    const uint16_t qh = u16(src + 34 + 2 * sb);
    nibbles |= static_cast<uint32_t>(((qh >> 12) & 7) | ((qh >> 15) << 3)) << (4 * sb);
    for (int l = 0; l < 4; ++l) rows[4 * sb + l] = kIq1sGrid[src[2 + 4 * sb + l] | (((qh >> (3 * l)) & 7) << 8)];
  }
  uint8_t trit[257];
  iq1_trits(rows, trit);
  put_trits<kIq1s>(trit, dst);
  std::memcpy(dst + kPackedBytes, &nibbles, 4);
  return u16(src);
}

// IQ1_M group (56 bytes: qs[32], qh[16], scales u16[4] with d in the top nibbles) -> d, packed group.
uint16_t pack_iq1m(const uint8_t* src, uint8_t* dst) {
  uint64_t rows[32];
  bool neg[32];
  for (int i = 0; i < 32; ++i) {
    const int h = (src[32 + i / 2] >> (4 * (i % 2))) & 0xF;
    rows[i] = kIq1sGrid[src[i] | ((h & 7) << 8)];
    neg[i] = (h & 8) != 0;
  }
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = u16(src + 48 + 2 * i);
  uint64_t scales = 0;
  for (int j = 0; j < 16; ++j) scales |= static_cast<uint64_t>((sc[j / 4] >> (3 * (j % 4))) & 7) << (3 * j);
  uint16_t ma = 0, mc = 0, mb = 0;
  for (int l = 0; l < 13; ++l) {
    ma = static_cast<uint16_t>(ma | (neg[2 * l] ? 1u << l : 0u));
    mc = static_cast<uint16_t>(mc | (neg[2 * l + 1] ? 1u << l : 0u));
  }
  for (int l = 0; l < 12; ++l) mb = static_cast<uint16_t>(mb | (neg[2 * (13 + l / 4) + (l % 4) / 2] ? 1u << l : 0u));
  uint8_t trit[257];
  iq1_trits(rows, trit);
  put_trits<kIq1m>(trit, dst);
  std::memcpy(dst + kPackedBytes, &scales, 6);
  std::memcpy(dst + kPackedBytes + 6, &ma, 2);
  std::memcpy(dst + kPackedBytes + 8, &mc, 2);
  std::memcpy(dst + kPackedBytes + 10, &mb, 2);
  return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

template <uint32_t T>
void pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  const int64_t ng = w.cols / 256;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.row(r);
    uint8_t* d16 = dst;
    dst += 2 * ng;
    for (int64_t g = 0; g < ng; ++g, src += T == kIq1s ? 50 : 56, dst += kGroupBytes<T>) {
      const uint16_t d = T == kIq1s ? pack_iq1s(src, dst) : pack_iq1m(src, dst);
      std::memcpy(d16 + 2 * g, &d, 2);
    }
  }
}

template <uint32_t T>
HMOE_LT void rows(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = cols / 256, rb = ng * kRowBytesPerGroup<T>;
  thread_local std::vector<uint8_t> buf;
  thread_local std::vector<float> dx, dd;
  const XG<T>* xp = prepare<T>(xa, t0, n, ng, buf, dx);
  dd.resize(static_cast<size_t>(4 * ng));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = packed + r * rb;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(a, rb, r, xp + t * ng, dx.data() + t * ng, ng, dd.data(), y + t * ldy, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(a, rb, r, xp + t * ng, dx.data() + t * ng, ng, dd.data(), y + t * ldy, ldy);
    for (; t < n; ++t) tile<T, 1>(a, rb, r, xp + t * ng, dx.data() + t * ng, ng, dd.data(), y + t * ldy, ldy);
  }
}

}  // namespace

bool lowbit_ternary_applies(uint32_t ext, int64_t cols) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("gfni");
  }();
  return isa && (ext == kIq1s || ext == kIq1m) && cols > 0 && cols % 256 == 0;
}

size_t lowbit_ternary_row_bytes(uint32_t ext, int64_t cols) {
  return static_cast<size_t>(cols / 256) * (ext == kIq1s ? kRowBytesPerGroup<kIq1s> : kRowBytesPerGroup<kIq1m>);
}

void lowbit_ternary_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  if (w.ext == kIq1s) pack<kIq1s>(w, r0, r1, dst);
  else pack<kIq1m>(w, r0, r1, dst);
}

void lowbit_rows_q8_ternary(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                            int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  if (xa.type == static_cast<ExtType>(kIq1s)) rows<kIq1s>(xa, t0, n, packed, cols, r0, r1, y, ldy);
  else rows<kIq1m>(xa, t0, n, packed, cols, r0, r1, y, ldy);
}

}  // namespace hmoe::cpu::detail
