// AVX-512 VNNI + VBMI integer kernels of the 256-entry-grid IQ types
// (IQ2_XXS, IQ3_XXS), v3: grid rows looked up in registers instead of
// gathered. v2 (quant_gguf_lowbit_vbmi.cpp) fetches a group's 32 (or 64)
// grid rows by four gathers and spends most of a group on placing indices
// and scales; here the weights are laid out by *plane*: plane j holds byte j
// of every grid row of the group, so one plane of a 256-entry grid is 4 zmm
// and a lookup for 64 indices is two vpermi2b and a blend. The activations
// are permuted into the same order once per call (a dot product does not
// care about the order inside a sub-block), and the planes are ordered so
// that the 4 bytes vpdpbusd sums into an int32 lane always belong to one
// scale sub-block: a group then costs one vpdpbusd per 64 weights and token,
// and one fp32 fma per 16 lanes.
//  - IQ2_XXS: two rows per step (rows A, B in lanes 0-31 / 32-63 of each of
//    the 8 planes; lane l < 8 = A's sub-block l, l >= 8 = B's);
//  - IQ3_XXS: one row per step (64 grid rows of 4 bytes: 4 planes), lane
//    positions ordered (r3) so that a lane's 4 rows share a sub-block.
// Signs: the 7-bit sign indices cut out by vpmultishiftqb, completed by
// their parity bit with one 128-entry vpermi2b; plane j's mask is one
// vptestmb on bit j (a transposition by vgf2p8affineqb with kmovq loads
// measured slower: the loads wait on the store).
// Measured (bench_gguf_lowbit, bench/README.md): IQ3_XXS 15-20% faster than
// v2 at batch 1 in the expert engine; IQ2_XXS as fast as v2 alone at batch 1
// (the 24 lookup uops per two rows cost what the gathers did) but slower in
// the engine, whose 32-row calls each repeat the activation planes, so v2
// keeps IQ2_XXS at one token; both 20-25% faster at batch 4.
// Codes unsigned: u = bias + |code| or bias - |code| (one masked subtract);
// the bias comes off by seeding the int32 lanes with -bias * sum(x of the
// lane's sub-block). Exact integer sums; equal to the scalar reference up to
// the order of fp32 sums.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_LP __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,f16c,fma")))

namespace hmoe::cpu::detail {

namespace {

constexpr uint32_t kIq2xxs = 16, kIq3xxs = 18;

// IQ3_XXS: lane position p (0..63) of a row's plane <-> grid row r3(p).
// Qword q of the sign bytes holds 8-weight groups 8q..8q+7 = grid rows
// 16q..16q+15; position 16q + 8h + b holds row 16q + 2b + h, so that mask
// byte (q, 4h + j) of the transposed sign bits covers positions 16q+8h..+7.
constexpr int r3(int p) { return 16 * (p / 16) + 2 * (p % 8) + (p % 16) / 8; }

struct Tables {
  alignas(64) uint8_t sign[128];        // 7-bit sign index -> sign byte with its parity bit
  alignas(64) uint8_t x2_idx[64];       // IQ2_XXS: position i -> byte of row i's grid index (rows A | B: + 64)
  alignas(64) uint8_t x2_aux[64];       // IQ2_XXS: dword l -> sub-block l's aux word (A | B)
  alignas(64) uint8_t x2_ms[64];        // IQ2_XXS: byte k of qword q = sign index of row 8q + k
  alignas(64) uint8_t x2_plane[8][64];  // IQ2_XXS activations: plane j position i -> column 8 (i % 32) + j (mod 128)
  alignas(64) uint8_t x3_idx[64];       // IQ3_XXS: position p -> byte r3(p) of qs
  alignas(64) uint8_t x3_ms[64];        // IQ3_XXS: byte k of qword q = sign index of 8-weight group 8q + k
  alignas(64) uint8_t x3_sgrp[64];      // IQ3_XXS: position p -> 8-weight group r3(p) / 2
  alignas(64) uint8_t x3_bit[4][64];    // IQ3_XXS plane j: position p -> 1 << (4 (r3(p) % 2) + j)
  alignas(64) int32_t x3_lane[16];      // IQ3_XXS: lane l -> sub-block
  alignas(64) uint8_t x3_plane[4][64];  // IQ3_XXS activations: plane j position p -> column 4 r3(p) + j (mod 128)
};

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 128; ++i) t.sign[i] = iq_sign_byte(i);
  for (int i = 0; i < 64; ++i) {
    const int k = i % 32, hb = i >= 32 ? 64 : 0;
    t.x2_idx[i] = static_cast<uint8_t>(8 * (k / 4) + k % 4 + hb);
    t.x2_aux[i] = static_cast<uint8_t>(8 * (k / 4) + 4 + k % 4 + hb);
    const int m = i % 8;  // row 8q + m: bits 7m of dword 2q, or 32 + 7 (m - 4)
    t.x2_ms[i] = static_cast<uint8_t>(m < 4 ? 7 * m : 32 + 7 * (m - 4));
    for (int j = 0; j < 8; ++j) t.x2_plane[j][i] = static_cast<uint8_t>((8 * k + j) & 127);
    t.x3_idx[i] = static_cast<uint8_t>(r3(i));
    const int g = i % 8;  // 8-weight group 8q + g: bits 7 (g % 4) of aux dword 2q + g / 4
    t.x3_ms[i] = static_cast<uint8_t>(32 * (g / 4) + 7 * (g % 4));
    for (int j = 0; j < 4; ++j) t.x3_plane[j][i] = static_cast<uint8_t>((4 * r3(i) + j) & 127);
    t.x3_sgrp[i] = static_cast<uint8_t>(r3(i) / 2);
    for (int j = 0; j < 4; ++j) t.x3_bit[j][i] = static_cast<uint8_t>(1u << (4 * (r3(i) % 2) + j));
  }
  for (int l = 0; l < 16; ++l) t.x3_lane[l] = r3(4 * l) / 8;
  return t;
}
constexpr Tables kT = make_tables();

// Byte j of every grid row, biased (IQ2: 43 + v, IQ3: 62 + v).
struct PlaneGrids {
  alignas(64) uint8_t iq2xxs[8][256];
  alignas(64) uint8_t iq3xxs[4][256];
};
const PlaneGrids& plane_grids() {
  static const PlaneGrids g = [] {
    PlaneGrids t;
    for (int e = 0; e < 256; ++e) {
      for (int j = 0; j < 8; ++j) t.iq2xxs[j][e] = static_cast<uint8_t>(((kIq2xxsGrid[e] >> (8 * j)) & 0xFF) + 43);
      for (int j = 0; j < 4; ++j) t.iq3xxs[j][e] = static_cast<uint8_t>(((kIq3xxsGrid[e] >> (8 * j)) & 0xFF) + 62);
    }
    return t;
  }();
  return g;
}

HMOE_LP inline __m512i ld(const void* p) { return _mm512_load_si512(p); }
using lowbit_bytes::half;

// One plane of a 256-entry grid for 64 indices (hi: index bit 7).
HMOE_LP inline __m512i lookup256(const uint8_t* plane, __m512i idx, __mmask64 hi) {
  const __m512i lo = _mm512_permutex2var_epi8(ld(plane), idx, ld(plane + 64));
  const __m512i up = _mm512_permutex2var_epi8(ld(plane + 128), idx, ld(plane + 192));
  return _mm512_mask_blend_epi8(hi, lo, up);
}

// The sign bytes: 7-bit indices cut out of `aux` by `ms`, completed by their parity bit.
HMOE_LP inline __m512i sign_bytes(__m512i aux, const uint8_t* ms) {
  return _mm512_permutex2var_epi8(ld(kT.sign), _mm512_multishift_epi64_epi8(ld(ms), aux), ld(kT.sign + 64));
}

template <int B>
HMOE_LP inline __m512i signed_u(__m512i u, __mmask64 neg) {
  return _mm512_mask_sub_epi8(u, neg, _mm512_set1_epi8(2 * B), u);
}

// Activations of one token permuted into the weights' plane order, per
// group: P planes of 64 bytes and the lane seeds -bias * sum(x of the
// lane's sub-block), then dx.
template <uint32_t T> constexpr int kPlanes = T == kIq2xxs ? 8 : 4;
template <uint32_t T> constexpr int kBias = T == kIq2xxs ? 43 : 62;
template <uint32_t T>
struct XPlanes {
  __m512i x[kPlanes<T>];
  __m512i seed;
};

template <uint32_t T>
HMOE_LP XPlanes<T>* prepare(const Q8Acts& xa, int64_t t0, int64_t n, int64_t ng, std::vector<uint8_t>& buf, std::vector<float>& dx) {
  buf.resize(static_cast<size_t>(n * ng) * sizeof(XPlanes<T>) + 64);
  auto* out = reinterpret_cast<XPlanes<T>*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t{63});
  dx.resize(static_cast<size_t>(n * ng));
  for (int64_t t = 0; t < n; ++t) {
    const int8_t* xq = xa.q.data() + (t0 + t) * xa.cols;
    const int16_t* bs = xa.bsum.data() + (t0 + t) * ng * 16;
    for (int64_t g = 0; g < ng; ++g) {
      const int8_t* x = xq + 256 * g;
      const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 64), x2 = _mm512_loadu_si512(x + 128), x3 = _mm512_loadu_si512(x + 192);
      XPlanes<T>& o = out[t * ng + g];
      const int16_t* s = bs + 16 * g;
      alignas(64) int32_t seed[16];
      if constexpr (T == kIq2xxs) {
        for (int j = 0; j < 8; ++j) {  // positions i % 32 < 16 are columns < 128
          const __m512i idx = ld(kT.x2_plane[j]);
          o.x[j] = _mm512_mask_blend_epi8(0xFFFF0000FFFF0000ull, _mm512_permutex2var_epi8(x0, idx, x1), _mm512_permutex2var_epi8(x2, idx, x3));
        }
        for (int l = 0; l < 16; ++l) seed[l] = -43 * (s[2 * (l % 8)] + s[2 * (l % 8) + 1]);
      } else {
        for (int j = 0; j < 4; ++j) {  // positions p < 32 hold rows r3(p) < 32: columns < 128
          const __m512i idx = ld(kT.x3_plane[j]);
          o.x[j] = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull, _mm512_permutex2var_epi8(x0, idx, x1), _mm512_permutex2var_epi8(x2, idx, x3));
        }
        for (int l = 0; l < 16; ++l) {  // a sub-block spans lanes h = 0, 1 (same scale): the first takes the whole seed
          const int sb = kT.x3_lane[l];
          seed[l] = (l % 4) / 2 == 0 ? -62 * (s[2 * sb] + s[2 * sb + 1]) : 0;
        }
      }
      o.seed = _mm512_load_si512(seed);
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)];
    }
  }
  return out;
}

// The decoded group of one step: planes (unsigned codes) and fp32 lane scales.
template <uint32_t T>
struct Dec {
  __m512i p[kPlanes<T>];
  __m512 sc;
};

// IQ2_XXS rows A and B (66-byte groups at a, b).
HMOE_LP inline void decode_iq2xxs(const uint8_t* a, const uint8_t* b, Dec<kIq2xxs>& k) {
  const PlaneGrids& G = plane_grids();
  const __m512i qa = _mm512_loadu_si512(a + 2), qb = _mm512_loadu_si512(b + 2);
  const __m512i idx = _mm512_permutex2var_epi8(qa, ld(kT.x2_idx), qb);
  const __m512i aux = _mm512_permutex2var_epi8(qa, ld(kT.x2_aux), qb);
  const __m512i s = _mm512_srli_epi32(aux, 28);
  const __m512 d = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(half(a) * 0.125f), _mm512_set1_ps(half(b) * 0.125f));
  k.sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1))), d);
  const __m512i sb = sign_bytes(aux, kT.x2_ms);  // byte i: row i's signs (A | B)
  const __mmask64 hi = _mm512_movepi8_mask(idx);
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) k.p[j] = signed_u<43>(lookup256(G.iq2xxs[j], idx, hi), _mm512_test_epi8_mask(sb, _mm512_set1_epi8(static_cast<char>(1 << j))));
}

// IQ3_XXS row (98-byte group at a).
HMOE_LP inline void decode_iq3xxs(const uint8_t* a, Dec<kIq3xxs>& k) {
  const PlaneGrids& G = plane_grids();
  const __m512i idx = _mm512_permutexvar_epi8(ld(kT.x3_idx), _mm512_loadu_si512(a + 2));
  const __m512i aux = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 66)));
  const __m512i s = _mm512_permutexvar_epi32(_mm512_load_si512(kT.x3_lane), _mm512_srli_epi32(aux, 28));
  k.sc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1))), _mm512_set1_ps(half(a) * 0.25f));
  // byte p: the sign byte of position p's row (8-weight group r3(p) / 2); bit 4h + j for plane j
  const __m512i sb = _mm512_permutexvar_epi8(ld(kT.x3_sgrp), sign_bytes(aux, kT.x3_ms));
  const __mmask64 hi = _mm512_movepi8_mask(idx);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) k.p[j] = signed_u<62>(lookup256(G.iq3xxs[j], idx, hi), _mm512_test_epi8_mask(sb, ld(kT.x3_bit[j])));
}

// acc (lanes) += the group's product with one token.
template <uint32_t T>
HMOE_LP inline __m512 dot(const Dec<T>& k, const XPlanes<T>& x, float dx, __m512 acc) {
  // two chains (vpdpbusd has a latency of 5: one chain of 8 would hold a group for 40 cycles)
  __m512i a = _mm512_dpbusd_epi32(x.seed, k.p[0], x.x[0]), b = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k.p[1], x.x[1]);
#pragma GCC unroll 8
  for (int j = 2; j < kPlanes<T>; j += 2) {
    a = _mm512_dpbusd_epi32(a, k.p[j], x.x[j]);
    b = _mm512_dpbusd_epi32(b, k.p[j + 1], x.x[j + 1]);
  }
  a = _mm512_add_epi32(a, b);
  return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(dx)), k.sc, acc);
}

// Rows r (and r + 1 for an IQ2_XXS pair; `pair` false repeats row r) times NT tokens.
template <uint32_t T, int NT>
HMOE_LP void tile(const Mat& w, int64_t r, bool pair, const XPlanes<T>* xp, const float* dx, int64_t ng, float* y, int64_t ldy) {
  constexpr int GB = T == kIq2xxs ? 66 : 98;
  const uint8_t* a = w.row(r);
  const uint8_t* b = T == kIq2xxs && pair ? w.row(r + 1) : a;
  __m512 acc[NT];
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g, a += GB, b += GB) {
    _mm_prefetch(reinterpret_cast<const char*>(a) + 1024, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a) + 1024 + GB - 1, _MM_HINT_T0);
    Dec<T> k;
    if constexpr (T == kIq2xxs) {
      if (pair) {
        _mm_prefetch(reinterpret_cast<const char*>(b) + 1024, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(b) + 1024 + GB - 1, _MM_HINT_T0);
      }
      decode_iq2xxs(a, b, k);
    } else {
      decode_iq3xxs(a, k);
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[t] = dot<T>(k, xp[t * ng + g], dx[t * ng + g], acc[t]);
  }
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) {
    if constexpr (T == kIq2xxs) {
      y[t * ldy + r] = _mm512_mask_reduce_add_ps(0x00FF, acc[t]);
      if (pair) y[t * ldy + r + 1] = _mm512_mask_reduce_add_ps(0xFF00, acc[t]);
    } else {
      y[t * ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
  }
}

template <uint32_t T>
HMOE_LP void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = w.cols / 256;
  thread_local std::vector<uint8_t> buf;
  thread_local std::vector<float> dx;
  const XPlanes<T>* xp = prepare<T>(xa, t0, n, ng, buf, dx);
  constexpr int step = T == kIq2xxs ? 2 : 1;
  for (int64_t r = r0; r < r1; r += step) {
    const bool pair = r + 1 < r1;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(w, r, pair, xp + t * ng, dx.data() + t * ng, ng, y + t * ldy, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(w, r, pair, xp + t * ng, dx.data() + t * ng, ng, y + t * ldy, ldy);
    for (; t < n; ++t) tile<T, 1>(w, r, pair, xp + t * ng, dx.data() + t * ng, ng, y + t * ldy, ldy);
  }
}

}  // namespace

bool lowbit_rows_q8_planes(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (w.ext) {
    case kIq2xxs:  // one token: v2 measured faster inside the expert engine (its 32-row calls repeat the activation planes)
      if (n < 2) return false;
      rows<kIq2xxs>(xa, t0, n, w, r0, r1, y, ldy);
      return true;
    case kIq3xxs: rows<kIq3xxs>(xa, t0, n, w, r0, r1, y, ldy); return true;
    default: return false;
  }
}

}  // namespace hmoe::cpu::detail
