// AVX-512 VNNI + VBMI integer kernels of the low-bit ggml types
// (numa/quant_gguf_lowbit.h), v2: the batch-1 and small-batch product of the
// routed experts. v1 (quant_gguf_lowbit_avx512.cpp, CPUs without VBMI) wrote
// each decoded group to memory with fp32 scales and spent about half of a
// step decoding; here a row's 256-weight group stays in registers and every
// scale is an integer, so a group costs a few dozen instructions:
//  - codes become unsigned bytes u = code + bias (sign bits as byte masks:
//    u = bias + |code| or bias - |code|), multiplied with the int8
//    activations by vpmaddubsw (no saturation: u <= 124, 124 * 127 * 2 <
//    2^15) and scaled per run of 16 by the integer sub-block scale with
//    vpdpwssd (as the K-quant kernels, numa/quant_gguf_q8_avx512.cpp); the
//    bias comes off once per group as bias * sum_r scale_r * sum(x over r)
//    (vpmaddwd with the activation's per-16 sums), the mins of Q2_K the same
//    way in fp32. Integer scales: Q2_K 0..15, Q3_K -32..31, IQ2 / IQ3_XXS /
//    IQ1 2s + 1 (their fp32 factor 1/8, 1/4 goes onto d), IQ3_S 1 + 2s,
//    IQ4_XS -32..31.
//  - IQ4_XS keeps |code| (<= 127) and puts the signs on the activations
//    (code + 128 would saturate vpmaddubsw); IQ4_NL and MXFP4 (an fp16 / E8M0
//    scale per 32) take vpdpbusd into int32 lanes and one fma per 64 weights
//    with the lanes' fp32 scales.
//  - small codes (Q2_K, Q3_K, IQ1_S/M, IQ3_S: u * 127 * 4 < 2^15) sum 4
//    products by vpdpbusd and pack two chunks to s16 (vpackssdw) before the
//    scales: 6 multiplies per group and token instead of 8.
//  - grids: 8-byte (IQ1/IQ2) and 4-byte (IQ3) rows by gathers, from copies
//    with the bias folded in (a signed code is then one masked subtract;
//    IQ1's u = 8 (v + 1) + 1 + delta), indices placed with vpermb (one uop,
//    vpermw is two); the 7-bit sign indices of IQ2_XXS/IQ2_XS/
//    IQ3_XXS are cut out with vpmultishiftqb and completed with their parity
//    bit by one 128-entry vpermi2b lookup; stored in entry order, each 64
//    weights' sign bits are one kmovq load (no shuffle port), as are
//    IQ2_S's / IQ3_S's stored sign bytes; 4-bit codes by vpshufb tables.
// A tile is R rows x NT tokens: each row's group is decoded once for the NT
// tokens, and R rows keep R weight streams (and their prefetches) in flight.
// Equal to the scalar reference up to the order of fp32 sums (integer sums
// are exact).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "configs/error.h"
#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_LV __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,bmi2,f16c,fma")))

namespace hmoe::cpu::detail {

bool lowbit_has_avx512_vbmi() {
  static const bool v = [] {
    __builtin_cpu_init();
    return lowbit_has_avx512_vnni() && __builtin_cpu_supports("avx512vbmi");
  }();
  return v;
}

namespace {

using namespace lowbit_bytes;

// Type ids (numa/quant_gguf_lowbit.h).
constexpr uint32_t kQ2K = 10, kQ3K = 11, kIq2xxs = 16, kIq2xs = 17, kIq3xxs = 18, kIq1s = 19, kIq4nl = 20, kIq3s = 21, kIq2s = 22,
                   kIq4xs = 23, kIq1m = 29, kMxfp4 = 39;
template <uint32_t T> constexpr int kGroupBytes = T == kQ2K ? 84 : T == kQ3K ? 110 : T == kIq2xxs ? 66 : T == kIq2xs ? 74 : T == kIq3xxs ? 98
                                                 : T == kIq1s ? 50 : T == kIq4nl ? 144 : T == kIq3s ? 110 : T == kIq2s ? 82 : T == kIq4xs ? 136
                                                 : T == kIq1m ? 56 : 136;
// code = u - bias
template <uint32_t T> constexpr int kBias = T == kQ3K ? 4 : (T == kIq2xxs || T == kIq2xs || T == kIq2s) ? 43 : T == kIq3xxs ? 62
                                           : T == kIq3s ? 15 : (T == kIq1s || T == kIq1m) ? 9 : 0;
// fp32 scales per 32 (vpdpbusd lanes) instead of integer scales per 16
template <uint32_t T> constexpr bool kFpLanes = T == kIq4nl || T == kMxfp4;
// |code| with the signs on the activations
template <uint32_t T> constexpr bool kSignedX = T == kIq4xs || kFpLanes<T>;
// Small codes (u * 127 * 4 < 2^15): vpdpbusd sums 4 products into int32
// lanes, vpackssdw packs two chunks' lanes into s16 (exactly), and one
// vpdpwssd per 128 weights applies the scales: 6 multiplies per 256 weights
// instead of 8.
template <uint32_t T> constexpr bool kPack = T == kQ2K || T == kQ3K || T == kIq1s || T == kIq1m || T == kIq3s;

// Constant vectors (index tables), built once.
struct Tables {
  alignas(64) int16_t run16[4][32];   // s16 lane j of code vector v: run 4v + j / 8
  alignas(64) int16_t half16[32];     // lane r (< 16) -> r / 2: per-32 values spread to the 16 runs
  alignas(64) uint8_t sign[128];      // 7-bit sign index -> the sign byte with its parity bit
  alignas(64) uint8_t xxs_idx[4][64]; // IQ2_XXS: byte 8i of chunk c = byte of run 8c + i's grid index in the 64 bytes at b + 2
  alignas(64) uint8_t xxs_ms[64];     // IQ2_XXS: qword i bytes g < 4 = bits 32 + 7g (sign index g of sub-block i)
  alignas(64) uint8_t xs_order[64];   // IQ2_XS: byte e = byte 2e (the sign byte of grid entry e)
  alignas(64) uint8_t xxs_order[64];  // IQ2_XXS: byte e = byte 8 (e / 4) + e % 4
  alignas(64) uint8_t x3_ms[64];      // IQ3_XXS: qword i byte 4h + g = bits 32h + 7g
  alignas(64) int16_t xxs_sc[32];     // IQ2_XXS: run r -> s16 lane 4 (r / 2) + 2 (the top 4 bits of aux word r / 2)
  alignas(64) int16_t x3_sc[32];      // IQ3_XXS: run r -> s16 lane 2 (r / 2)
  alignas(64) int32_t lanes32[4][16]; // fp lanes of chunk c: lanes 0-7 block 2c, 8-15 block 2c + 1
  alignas(16) uint8_t q3_hi[16];      // Q3_K high scale bits: shuffle of scale bytes 8..11
  alignas(16) uint8_t q3_ms[16];      // Q3_K: bit offset of scale j's high 2 bits
  alignas(16) uint8_t m1_ms[16];      // IQ1_M: bit offset of scale j in the 64 scale bits
  alignas(64) uint8_t q3_bits[4][64]; // Q3_K: hmask bit of chunk c, per byte
  alignas(64) int16_t e_quarter[32], e_half[32], e_sh3[32], e_sh4[32];  // grid entry e: e / 4, e / 2, 3 (e % 4), 4 (e % 2)
  alignas(64) int16_t w2q[4][32];     // chunk c: word 4i = entry 8c + i (the qword lanes of a gather)
  alignas(64) int16_t pack[2][32];    // kPack: s16 lane 8k + m of chunks (2p, 2p + 1) packed: run 8p + (m < 4 ? k : 4 + k)
  // The word permutations above as byte permutations (vpermb: one uop, vpermw: two).
  alignas(64) uint8_t pack_b[2][64];
  alignas(64) uint8_t run16_b[4][64], half16_b[64], xxs_sc_b[64], x3_sc_b[64], e_quarter_b[64], e_half_b[64], w2q_b[4][64];
};

constexpr void words_to_bytes(const int16_t (&w)[32], uint8_t (&b)[64]) {
  for (int j = 0; j < 32; ++j) {
    b[2 * j] = static_cast<uint8_t>(2 * w[j]);
    b[2 * j + 1] = static_cast<uint8_t>(2 * w[j] + 1);
  }
}

constexpr Tables make_tables() {
  Tables t{};
  for (int v = 0; v < 4; ++v)
    for (int j = 0; j < 32; ++j) t.run16[v][j] = static_cast<int16_t>(4 * v + j / 8);
  for (int j = 0; j < 32; ++j) t.half16[j] = static_cast<int16_t>(j < 16 ? j / 2 : 0);
  for (uint32_t i = 0; i < 128; ++i) t.sign[i] = iq_sign_byte(i);
  for (int c = 0; c < 4; ++c)
    for (int k = 0; k < 64; ++k) {
      const int i = k / 8;
      t.xxs_idx[c][k] = static_cast<uint8_t>(8 * (2 * c + i / 4) + i % 4);
      t.q3_bits[c][k] = static_cast<uint8_t>(1u << (k < 32 ? 2 * c : 2 * c + 1));
    }
  for (int e = 0; e < 64; ++e) {
    t.xs_order[e] = static_cast<uint8_t>(e < 32 ? 2 * e : 0);
    t.xxs_order[e] = static_cast<uint8_t>(e < 32 ? 8 * (e / 4) + e % 4 : 0);
  }
  for (int k = 0; k < 64; ++k) {
    const int g = k % 8;
    t.xxs_ms[k] = static_cast<uint8_t>(g < 4 ? 32 + 7 * g : 0);
    t.x3_ms[k] = static_cast<uint8_t>(32 * (g / 4) + 7 * (g % 4));
  }
  for (int r = 0; r < 32; ++r) {
    t.xxs_sc[r] = static_cast<int16_t>(r < 16 ? 4 * (r / 2) + 2 : 0);
    t.x3_sc[r] = static_cast<int16_t>(r < 16 ? 2 * (r / 2) : 0);
  }
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 16; ++l) t.lanes32[c][l] = 2 * c + l / 8;
  for (int j = 0; j < 16; ++j) {
    t.q3_hi[j] = static_cast<uint8_t>(8 + j % 4);
    t.q3_ms[j] = static_cast<uint8_t>(8 * (j % 4) + 2 * (j / 4));
    t.m1_ms[j] = static_cast<uint8_t>(16 * (j / 4) + 3 * (j % 4));
  }
  for (int e = 0; e < 32; ++e) {
    t.e_quarter[e] = static_cast<int16_t>(e / 4);
    t.e_half[e] = static_cast<int16_t>(e / 2);
    t.e_sh3[e] = static_cast<int16_t>(3 * (e % 4));
    t.e_sh4[e] = static_cast<int16_t>(4 * (e % 2));
  }
  for (int c = 0; c < 4; ++c)
    for (int j = 0; j < 32; ++j) t.w2q[c][j] = static_cast<int16_t>(j % 4 == 0 ? 8 * c + j / 4 : 0);
  for (int p = 0; p < 2; ++p) {
    for (int j = 0; j < 32; ++j) t.pack[p][j] = static_cast<int16_t>(8 * p + (j % 8 < 4 ? j / 8 : 4 + j / 8));
    words_to_bytes(t.pack[p], t.pack_b[p]);
  }
  for (int c = 0; c < 4; ++c) {
    words_to_bytes(t.run16[c], t.run16_b[c]);
    words_to_bytes(t.w2q[c], t.w2q_b[c]);
  }
  words_to_bytes(t.half16, t.half16_b);
  words_to_bytes(t.xxs_sc, t.xxs_sc_b);
  words_to_bytes(t.x3_sc, t.x3_sc_b);
  words_to_bytes(t.e_quarter, t.e_quarter_b);
  words_to_bytes(t.e_half, t.e_half_b);
  return t;
}
constexpr Tables kT = make_tables();

HMOE_LV inline __m512i ld(const void* p) { return _mm512_load_si512(p); }

// The grids with the bias added to every byte (IQ2: 43 + v, IQ3: 62 + v /
// 15 + v) and IQ1's as 8 (v + 1): a gathered row is then u for positive
// codes, and 2 bias - u for negative ones, one masked subtract.
struct BiasedGrids {
  alignas(64) uint64_t iq2xxs[256], iq2xs[512], iq2s[1024], iq1s[2048];
  alignas(64) uint32_t iq3xxs[256], iq3s[512];
};
template <class G, size_t N>
void add_bytes(const G (&src)[N], G (&dst)[N], int add, int mul) {
  for (size_t i = 0; i < N; ++i) {
    G v = 0;
    for (size_t j = 0; j < sizeof(G); ++j) v |= static_cast<G>((((src[i] >> (8 * j)) & 0xFF) * mul + add) & 0xFF) << (8 * j);
    dst[i] = v;
  }
}
const BiasedGrids& biased_grids() {
  static const BiasedGrids g = [] {
    BiasedGrids t;
    add_bytes(kIq2xxsGrid, t.iq2xxs, 43, 1);
    add_bytes(kIq2xsGrid, t.iq2xs, 43, 1);
    add_bytes(kIq2sGrid, t.iq2s, 43, 1);
    add_bytes(kIq1sGrid, t.iq1s, 0, 8);
    add_bytes(kIq3xxsGrid, t.iq3xxs, 62, 1);
    add_bytes(kIq3sGrid, t.iq3s, 15, 1);
    return t;
  }();
  return g;
}
const BiasedGrids& kG = biased_grids();  // built at load time (the grids are constant-initialized)

// One row's 256-weight group, decoded.
struct Dec {
  __m512i u[4];      // unsigned codes (code = u - bias), or |code| (kSignedX)
  __mmask64 neg[4];  // kSignedX: negative codes
  __m512i s[4];      // integer scales per s16 lane (runs of 16)
  __m256i sb;        // bias * scale per run (Q2_K: the mins)
  __m512 dl[4];      // kFpLanes: fp32 scale per int32 lane
  float d, dmin;
};

// u = bias + |code| where positive, bias - |code| where negative, from bu = bias + |code|.
template <int B>
HMOE_LV inline __m512i biased(__m512i bu, __mmask64 neg) {
  return _mm512_mask_sub_epi8(bu, neg, _mm512_set1_epi8(2 * B), bu);
}

// 16 integer scales (s16, one per run of 16) -> Dec::s and Dec::sb.
template <uint32_t T>
HMOE_LV inline void put_scales(__m256i sc16, Dec& k) {
  const __m512i s = _mm512_castsi256_si512(sc16);
  if constexpr (kPack<T>) {
    k.s[0] = _mm512_permutexvar_epi8(ld(kT.pack_b[0]), s);
    k.s[1] = _mm512_permutexvar_epi8(ld(kT.pack_b[1]), s);
  } else {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) k.s[v] = _mm512_permutexvar_epi8(ld(kT.run16_b[v]), s);
  }
  if constexpr (kBias<T> != 0) k.sb = _mm256_mullo_epi16(sc16, _mm256_set1_epi16(kBias<T>));
}

// 8 values (one per 32 weights, s16 lanes 0..7) spread over the 16 runs.
HMOE_LV inline __m256i per32_to_runs(__m128i v8) {
  return _mm512_castsi512_si256(_mm512_permutexvar_epi8(ld(kT.half16_b), _mm512_castsi128_si512(v8)));
}

// 8 bytes of nibbles -> 16 bytes, nibble j at byte j.
HMOE_LV inline __m128i nibbles16(__m128i x) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  return _mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
}

// 2 s + 1 (s16)
HMOE_LV inline __m256i odd16(__m256i s) { return _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)); }

// The 32 sign bytes (7-bit indices in bits 0..6 of each byte) completed by their parity bit.
HMOE_LV inline __m512i sign_bytes(__m512i idx7) { return _mm512_permutex2var_epi8(ld(kT.sign), idx7, ld(kT.sign + 64)); }

// The sign bytes of the 32 grid entries in entry order (bytes 0..31 of v)
// through memory: chunk c's 64 sign bits are then qword c, loaded straight
// into a mask register (kmovq from memory: a load, no shuffle port).
struct SignBytes {
  alignas(64) uint8_t b[64];
  HMOE_LV void put(__m512i v) { _mm512_store_si512(b, v); }
  HMOE_LV __mmask64 chunk(int c) const { return _load_mask64(reinterpret_cast<__mmask64*>(const_cast<uint8_t*>(b + 8 * c))); }
};

HMOE_LV inline __m512i gather8(const uint64_t* grid, __m512i idx) {
  return _mm512_i64gather_epi64(idx, reinterpret_cast<const long long*>(grid), 8);
}
HMOE_LV inline __m512i gather16(const uint32_t* grid, __m512i idx) { return _mm512_i32gather_epi32(idx, reinterpret_cast<const int*>(grid), 4); }

template <uint32_t T>
HMOE_LV inline void decode(const uint8_t* b, Dec& k) {
  if constexpr (T == kQ2K) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    k.d = half(b + 80);
    k.dmin = half(b + 82);
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    put_scales<T>(_mm256_cvtepu8_epi16(_mm_and_si128(x, m4)), k);
    k.sb = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(x, 4), m4));
    const __m512i three = _mm512_set1_epi8(3);
    const __m512i q0 = _mm512_loadu_si512(b + 16);  // qs[64]
    // chunk c: weights 64c.. = qs half c / 2 (32 bytes), shifts 4 (c % 2) and 4 (c % 2) + 2 in the two halves
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i q = _mm512_shuffle_i64x2(q0, q0, c < 2 ? 0x44 : 0xEE);
      const int s0 = 4 * (c % 2);
      const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s0)), _mm256_set1_epi16(static_cast<short>(s0 + 2)), 1);
      k.u[c] = _mm512_and_si512(_mm512_srlv_epi16(q, sh), three);
    }
  } else if constexpr (T == kQ3K) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    k.d = half(b + 108);
    const __m128i x = _mm_maskz_loadu_epi8(0x0FFF, b + 96);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_multishift_epi64_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(kT.q3_ms)),
                                                               _mm_shuffle_epi8(x, _mm_load_si128(reinterpret_cast<const __m128i*>(kT.q3_hi)))),
                                     _mm_set1_epi8(3));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    put_scales<T>(_mm256_cvtepi8_epi16(sc), k);
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const __m512i q0 = _mm512_loadu_si512(b + 32);
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i q = _mm512_shuffle_i64x2(q0, q0, c < 2 ? 0x44 : 0xEE);
      const int s0 = 4 * (c % 2);
      const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s0)), _mm256_set1_epi16(static_cast<short>(s0 + 2)), 1);
      const __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(q, sh), three);
      k.u[c] = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, ld(kT.q3_bits[c])), lo, four);
    }
  } else if constexpr (T == kIq2xxs) {
    k.d = half(b) * 0.125f;
    const __m512i q = _mm512_loadu_si512(b + 2);
    SignBytes sb;
    sb.put(_mm512_permutexvar_epi8(ld(kT.xxs_order), sign_bytes(_mm512_multishift_epi64_epi8(ld(kT.xxs_ms), q))));
    const __m256i sc = _mm512_castsi512_si256(_mm512_permutexvar_epi8(ld(kT.xxs_sc_b), _mm512_srli_epi32(q, 28)));
    put_scales<T>(odd16(sc), k);
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i idx = _mm512_maskz_permutexvar_epi8(0x0101010101010101ull, ld(kT.xxs_idx[c]), q);
      k.u[c] = biased<43>(gather8(kG.iq2xxs, idx), sb.chunk(c));
    }
  } else if constexpr (T == kIq2xs || T == kIq2s) {
    k.d = half(b) * 0.125f;
    const int so = T == kIq2xs ? 66 : 74;
    put_scales<T>(odd16(_mm256_cvtepu8_epi16(nibbles16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + so))))), k);
    if constexpr (T == kIq2xs) {
      const __m512i q = _mm512_loadu_si512(b + 2);
      SignBytes sb;
      sb.put(_mm512_permutexvar_epi8(ld(kT.xs_order), sign_bytes(_mm512_srli_epi16(q, 9))));
      const __m512i m9 = _mm512_set1_epi64(511);
      #pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i idx = _mm512_and_si512(_mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(q, c)), m9);
        k.u[c] = biased<43>(gather8(kG.iq2xs, idx), sb.chunk(c));
      }
    } else {
      const __m512i sh = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), m3 = _mm512_set1_epi64(3);
      #pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * c)));
        const __m512i hi = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(u16(b + 66 + 2 * c)), sh), m3);
        k.u[c] = biased<43>(gather8(kG.iq2s, _mm512_or_si512(lo, _mm512_slli_epi64(hi, 8))), _load_mask64(reinterpret_cast<__mmask64*>(const_cast<uint8_t*>(b + 34 + 8 * c))));
      }
    }
  } else if constexpr (T == kIq3xxs) {
    k.d = half(b) * 0.25f;
    const __m512i a = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 66)));
    SignBytes sb;
    sb.put(sign_bytes(_mm512_multishift_epi64_epi8(ld(kT.x3_ms), a)));  // already in entry order
    put_scales<T>(odd16(_mm512_castsi512_si256(_mm512_permutexvar_epi8(ld(kT.x3_sc_b), _mm512_srli_epi32(a, 28)))), k);
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * c)));
      k.u[c] = biased<62>(gather16(kG.iq3xxs, idx), sb.chunk(c));
    }
  } else if constexpr (T == kIq3s) {
    k.d = half(b);
    put_scales<T>(odd16(per32_to_runs(_mm_cvtepu8_epi16(nibbles16(_mm_cvtsi32_si128(static_cast<int>(u32(b + 106))))))), k);
    const __m512i bit8 = _mm512_set1_epi32(256);
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * c)));
      idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(u16(b + 66 + 2 * c)), idx, bit8);
      k.u[c] = biased<15>(gather16(kG.iq3s, idx), _load_mask64(reinterpret_cast<__mmask64*>(const_cast<uint8_t*>(b + 74 + 8 * c))));
    }
  } else if constexpr (T == kIq1s) {
    k.d = half(b) * 0.125f;
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 34));
    put_scales<T>(odd16(per32_to_runs(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)))), k);
    // the 32 grid indices as words: qs[e] | (qh[e / 4] >> 3 (e % 4) & 7) << 8
    const __m512i qhw = _mm512_permutexvar_epi8(ld(kT.e_quarter_b), _mm512_castsi128_si512(qh));
    const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qhw, ld(kT.e_sh3)), _mm512_set1_epi16(7));
    const __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2))), _mm512_slli_epi16(hi, 8));
    // u = 8 t + 2 where the delta is +1 (bit 15 of qh clear), 8 t where it is -1
    const uint32_t pos = ~_cvtmask32_u32(_mm512_movepi16_mask(qhw));
    const __m512i two = _mm512_set1_epi8(2);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i g = gather8(kG.iq1s, _mm512_maskz_permutexvar_epi8(0x0303030303030303ull, ld(kT.w2q_b[c]), w));
      k.u[c] = _mm512_mask_add_epi64(g, static_cast<__mmask8>(pos >> (8 * c)), g, two);
    }
  } else if constexpr (T == kIq1m) {
    const uint64_t s64 = u64(b + 48);
    const uint16_t db = static_cast<uint16_t>(((s64 >> 12) & 0x000F) | ((s64 >> 24) & 0x00F0) | ((s64 >> 36) & 0x0F00) | ((s64 >> 48) & 0xF000));
    k.d = _cvtsh_ss(db) * 0.125f;
    const __m128i sc = _mm_and_si128(_mm_multishift_epi64_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(kT.m1_ms)),
                                                               _mm_set1_epi64x(static_cast<long long>(s64))),
                                     _mm_set1_epi8(7));
    put_scales<T>(odd16(_mm256_cvtepu8_epi16(sc)), k);
    // entry e: h = qh[e / 2] >> 4 (e % 2) & 15; index qs[e] | (h & 7) << 8, delta -1 where h & 8
    const __m512i qhw = _mm512_permutexvar_epi8(ld(kT.e_half_b), _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32)))));
    const __m512i h = _mm512_srlv_epi16(qhw, ld(kT.e_sh4));
    const __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b))),
                                      _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(7)), 8));
    const uint32_t pos = _cvtmask32_u32(_mm512_testn_epi16_mask(h, _mm512_set1_epi16(8)));
    const __m512i two = _mm512_set1_epi8(2);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i g = gather8(kG.iq1s, _mm512_maskz_permutexvar_epi8(0x0303030303030303ull, ld(kT.w2q_b[c]), w));
      k.u[c] = _mm512_mask_add_epi64(g, static_cast<__mmask8>(pos >> (8 * c)), g, two);
    }
  } else if constexpr (T == kIq4xs) {
    k.d = half(b);
    const uint64_t ls = _pdep_u64(u32(b + 4), 0x0F0F0F0F0F0F0F0Full) | (_pdep_u64(u16(b + 2), 0x0303030303030303ull) << 4);
    const __m128i sc8 = _mm_sub_epi8(_mm_cvtsi64_si128(static_cast<long long>(ls)), _mm_set1_epi8(32));
    put_scales<T>(per32_to_runs(_mm_cvtepi8_epi16(sc8)), k);
    const __m512i qidx = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), sh = _mm512_setr_epi64(0, 0, 4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0,
                                                                                              4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll);
    const __m512i mag = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i z = _mm512_permutexvar_epi64(qidx, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8 + 32 * c))));
      const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(z, sh), _mm512_set1_epi8(0x0F));
      k.u[c] = _mm512_shuffle_epi8(mag, nib);
      k.neg[c] = _mm512_cmplt_epu8_mask(nib, _mm512_set1_epi8(8));
    }
  } else {  // IQ4_NL, MXFP4: 8 blocks of 32
    constexpr bool fp4 = T == kMxfp4;
    constexpr int bb = fp4 ? 17 : 18, o = fp4 ? 1 : 2;
    const __m256i offs = _mm256_setr_epi32(0, bb, 2 * bb, 3 * bb, 4 * bb, 5 * bb, 6 * bb, 7 * bb);
    const __m256i raw = _mm256_i32gather_epi32(reinterpret_cast<const int*>(b), offs, 1);
    __m256 d8;
    if constexpr (fp4) {
      const __m256i e = _mm256_and_si256(raw, _mm256_set1_epi32(0xFF));
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      d8 = _mm256_castsi256_ps(_mm256_mask_blend_epi32(_mm256_cmplt_epu32_mask(e, _mm256_set1_epi32(2)), normal, sub));
    } else {
      d8 = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(raw));
    }
    const __m512 d16 = _mm512_castps256_ps512(d8);
    const __m512i qidx = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), sh = _mm512_setr_epi64(0, 0, 4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0,
                                                                                              4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll);
    const __m512i mag = fp4 ? _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12))
                            : _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const uint8_t* b0 = b + 2 * c * bb;
      const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + o))),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + bb + o)), 1);
      const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi64(qidx, _mm512_castsi256_si512(y)), sh), _mm512_set1_epi8(0x0F));
      k.u[c] = _mm512_shuffle_epi8(mag, nib);
      k.neg[c] = fp4 ? _mm512_test_epi8_mask(nib, _mm512_set1_epi8(8)) : _mm512_cmplt_epu8_mask(nib, _mm512_set1_epi8(8));
      k.dl[c] = _mm512_permutexvar_ps(ld(kT.lanes32[c]), d16);
    }
  }
}

// One token's part of a group: its 256 codes, 16 run sums and scale.
struct Xg {
  __m512i x[4];
  __m256i bs;
  float dx;
};
HMOE_LV inline void load_x(const int8_t* xq, const int16_t* bs, float dx, Xg& g) {
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) g.x[c] = _mm512_loadu_si512(xq + 64 * c);
  g.bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs));
  g.dx = dx;
}

// acc += the group's product with one token.
template <uint32_t T>
HMOE_LV inline __m512 dot(const Dec& k, const Xg& g, __m512 acc) {
  if constexpr (kFpLanes<T>) {
    __m512 f = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i xs = _mm512_mask_sub_epi8(g.x[c], k.neg[c], _mm512_setzero_si512(), g.x[c]);
      f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k.u[c], xs)), k.dl[c], f);
    }
    return _mm512_fmadd_ps(f, _mm512_set1_ps(g.dx), acc);
  } else {
    __m512i a = _mm512_setzero_si512();
    if constexpr (kPack<T>) {
      const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m512i lo = _mm512_dpbusd_epi32(z, k.u[2 * p], g.x[2 * p]), hi = _mm512_dpbusd_epi32(z, k.u[2 * p + 1], g.x[2 * p + 1]);
        a = _mm512_dpwssd_epi32(a, _mm512_packs_epi32(lo, hi), k.s[p]);
      }
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        __m512i x = g.x[c];
        if constexpr (kSignedX<T>) x = _mm512_mask_sub_epi8(x, k.neg[c], _mm512_setzero_si512(), x);
        a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(k.u[c], x), k.s[c]);
      }
    }
    if constexpr (kBias<T> != 0) a = _mm512_sub_epi32(a, _mm512_zextsi256_si512(_mm256_madd_epi16(k.sb, g.bs)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(k.d * g.dx), acc);
    if constexpr (T == kQ2K) {
      const __m256i ms = _mm256_madd_epi16(k.sb, g.bs);
      acc = _mm512_fnmadd_ps(_mm512_zextps256_ps512(_mm256_cvtepi32_ps(ms)), _mm512_set1_ps(k.dmin * g.dx), acc);
    }
    return acc;
  }
}

template <uint32_t T, int R, int NT>
HMOE_LV void tile(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>;
  const int64_t ng = w.cols / 256;
  const int64_t rb = static_cast<int64_t>(w.row_bytes());
  const int64_t ahead = lowbit_bytes::tile_ahead(rb * R);
  const uint8_t* rows[R];
  #pragma GCC unroll 4
  for (int i = 0; i < R; ++i) rows[i] = w.row(r + i);
  const int8_t* xq[NT];
  const float* xd[NT];
  const int16_t* xb[NT];
  #pragma GCC unroll 4
  for (int j = 0; j < NT; ++j) {
    xq[j] = xa.q.data() + (tx + j) * xa.cols;
    xd[j] = xa.d.data() + (tx + j) * ng;
    xb[j] = xa.bsum.data() + (tx + j) * ng * 16;
  }
  __m512 acc[R][NT];
  #pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 4
    for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t gi = 0; gi < ng; ++gi) {
    // up to 2 tokens: their codes stay in registers across the R rows
    Xg xg[NT <= 2 ? NT : 1];
    if constexpr (NT <= 2) {
#pragma GCC unroll 2
      for (int j = 0; j < NT; ++j) load_x(xq[j] + gi * 256, xb[j] + gi * 16, xd[j][gi], xg[j]);
    }
    #pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      const uint8_t* b = rows[i] + gi * GB;
      const char* pf = reinterpret_cast<const char*>(b + ahead);
      for (int o = 0; o < GB; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
      _mm_prefetch(pf + GB - 1, _MM_HINT_T0);
      Dec k;
      decode<T>(b, k);
      #pragma GCC unroll 4
      for (int j = 0; j < NT; ++j) {
        if constexpr (NT <= 2) {
          acc[i][j] = dot<T>(k, xg[j], acc[i][j]);
        } else {
          load_x(xq[j] + gi * 256, xb[j] + gi * 16, xd[j][gi], xg[0]);
          acc[i][j] = dot<T>(k, xg[0], acc[i][j]);
        }
      }
    }
  }
  #pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
    #pragma GCC unroll 4
    for (int j = 0; j < NT; ++j) y[j * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

template <uint32_t T>
HMOE_LV void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4, 4>(xa, t0 + t, w, r, y + t * ldy, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 4, 2>(xa, t0 + t, w, r, y + t * ldy, ldy);
    for (; t < n; ++t) tile<T, 4, 1>(xa, t0 + t, w, r, y + t * ldy, ldy);
  }
  for (; r < r1; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 1, 4>(xa, t0 + t, w, r, y + t * ldy, ldy);
    for (; t < n; ++t) tile<T, 1, 1>(xa, t0 + t, w, r, y + t * ldy, ldy);
  }
}

}  // namespace

void lowbit_rows_q8_vbmi(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (w.ext) {
    case kQ2K: return rows<kQ2K>(xa, t0, n, w, r0, r1, y, ldy);
    case kQ3K: return rows<kQ3K>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq2xxs: return rows<kIq2xxs>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq2xs: return rows<kIq2xs>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq3xxs: return rows<kIq3xxs>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq1s: return rows<kIq1s>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq4nl: return rows<kIq4nl>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq3s: return rows<kIq3s>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq2s: return rows<kIq2s>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq4xs: return rows<kIq4xs>(xa, t0, n, w, r0, r1, y, ldy);
    case kIq1m: return rows<kIq1m>(xa, t0, n, w, r0, r1, y, ldy);
    case kMxfp4: return rows<kMxfp4>(xa, t0, n, w, r0, r1, y, ldy);
    default: break;
  }
  fail(ErrorKind::internal, "lowbit_rows_q8_vbmi: type " + std::to_string(w.ext) + " is not a low-bit type");
}

}  // namespace hmoe::cpu::detail
