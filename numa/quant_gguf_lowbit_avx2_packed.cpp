// The grid IQ types repacked at load for the AVX2 int8 kernel ("AVX2 v3"):
// weights as level codes beside their signs, decoded by vpshufb instead of
// the grid-table loads of AVX2 v2 (quant_gguf_lowbit_avx2_grid.cpp), which
// on a Zen 3 core are bound by the ~170 instructions a group takes there
// (32 table loads, their index arithmetic and the vector inserts).
//
// Group (lanes as in numa/detail/lowbit_avx2_layout.h: vector j, qword Q =
// chunk(j, Q); byte p of vector j = byte p % 8 of qword p / 8):
//   IQ2_XXS, IQ2_XS, IQ2_S: [0, 64) the 3-level codes of the grid bytes
//     (8, 25, 43 -> 0, 1, 2): byte p of [32 (j / 4), +32) bits 2 (j % 4) =
//     vector j's byte p; [64, 96) signs: bit j of byte p = vector j's byte p;
//   IQ3_XXS, IQ3_S: [0, 128) nibbles, code of the 8 levels | sign << 3:
//     byte p of [32 (j / 2), +32), nibble j % 2 = vector j's byte p;
//   IQ1_S: [0, 64) the grid's trits (value + 1) as IQ2's codes, no signs;
//   then the odd-scale nibbles (IQ2_XXS, IQ3_*: u32, nibble h = 32-weight
//   block h; IQ1_S the same with the delta's sign in bit 3; IQ2_XS, IQ2_S:
//   u64, nibble h = 16-weight block h), the fp16 d.
// Bytes per 256 weights: IQ2_XXS 102 (the file's 66, x1.55), IQ2_XS 106
// (74, x1.43), IQ2_S 106 (82, x1.29), IQ3_XXS 134 (98, x1.37), IQ3_S 134
// (110, x1.22), IQ1_S 70 (50, x1.40): on the dev box's Zen 3 (~15 GB/s of
// reads per core) the table-load kernels took 2-3x longer than reading
// these bytes.
// IQ1_S: 8 w / dl = 8 t - 8 + delta, so u = 8 t and the pair's x sums
// (precomputed per call) times -(8 - delta) (-7 or -9) per 32-weight block.
//
// Kernel: per vector one vpshufb of the codes (IQ2: magnitudes; IQ3: bias
// + signed level, bias 62 / 15), vpmaddubsw with the permuted activations
// (IQ2: the sign of vector j is bit 7 of the planes shifted by 7 - j,
// choosing the activations or their negation, vpblendvb; IQ3: minus the
// bias times the activations, precomputed per call), pairs of vectors added
// in 16 bits and multiplied by the blocks' odd scales (vpmaddwd), one int32
// sum per group and row, times d and the activation scale in fp32. No
// software prefetch (measured 0.35 -> 0.38 of the read bandwidth without it
// on the dev box: Zen 3's stream prefetchers keep up). The same integer
// sums as the scalar reference per scale block; fp32 sums in another order.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_avx2_layout.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_AP __attribute__((target("avx2,fma,f16c,bmi2")))

namespace hmoe::cpu::detail {

namespace {

using namespace lowbit_avx2;
using lowbit_bytes::half;
using lowbit_bytes::u16;
using lowbit_bytes::u32;
using lowbit_bytes::u64;

template <uint32_t T> constexpr bool kIq3 = T == kIq3xxs || T == kIq3s;
template <uint32_t T> constexpr bool kIq1 = T == kIq1s;
template <uint32_t T> constexpr int kCodeBytes = kIq3<T> ? 128 : kIq1<T> ? 64 : 96;  // IQ2: codes 64 + sign planes 32
template <uint32_t T> constexpr int kScaleBytes = kBlocks16<T> ? 8 : 4;
template <uint32_t T> constexpr int kGroupBytes = kCodeBytes<T> + kScaleBytes<T> + 2;
template <uint32_t T> constexpr int kFileBytes = T == kIq2xxs ? 66 : T == kIq2xs ? 74 : T == kIq2s ? 82 : T == kIq3xxs ? 98 : T == kIq1s ? 50 : 110;
// IQ3: the bias of the unsigned weights u = bias + signed level
template <uint32_t T> constexpr int kBias = T == kIq3xxs ? 62 : 15;
template <uint32_t T> constexpr int chunk(int j, int q) { return lowbit_avx2::chunk(kBlocks16<T>, j, q); }

// The position of a grid byte among the type's levels.
template <uint32_t T>
constexpr uint32_t level_code(uint32_t v) {
  if constexpr (kIq1<T>) return v;  // the grid's value + 1: 0, 1, 2
  if constexpr (kIq3<T>) {
    if constexpr (T == kIq3s) return (v - 1) / 2;  // 1, 3, .. 15
    return v == 62 ? 7 : (v - 4) / 8;              // 4, 12, .. 52, 62
  }
  return v == 8 ? 0 : v == 25 ? 1 : 2;
}

// Per grid entry, its bytes' level codes (one byte each), built once.
template <uint32_t T>
const std::vector<uint64_t>& code_rows() {
  static const std::vector<uint64_t> t = [] {
    const int n = T == kIq2xxs ? 256 : T == kIq2xs ? 512 : T == kIq2s ? 1024 : T == kIq3xxs ? 256 : T == kIq1s ? 2048 : 512;
    std::vector<uint64_t> v(static_cast<size_t>(n));
    for (int e = 0; e < n; ++e) {
      const uint64_t row = T == kIq2xxs ? kIq2xxsGrid[e] : T == kIq2xs ? kIq2xsGrid[e] : T == kIq2s ? kIq2sGrid[e] : T == kIq3xxs ? kIq3xxsGrid[e]
                           : T == kIq1s ? kIq1sGrid[e] : kIq3sGrid[e];
      for (int k = 0; k < (kIq3<T> ? 4 : 8); ++k) v[static_cast<size_t>(e)] |= static_cast<uint64_t>(level_code<T>(static_cast<uint32_t>(row >> (8 * k)) & 0xFF)) << (8 * k);
    }
    return v;
  }();
  return t;
}

// Grid indices (IQ3: two 4-weight rows, the second in bits 16..) and the sign byte of chunk c of a file group.
template <uint32_t T>
inline void file_chunk(const uint8_t* b, int c, uint32_t& idx, uint32_t& sign) {
  if constexpr (T == kIq2xxs) {
    idx = b[2 + 8 * (c / 4) + c % 4];
    sign = iq_sign_byte(u32(b + 6 + 8 * (c / 4)) >> (7 * (c % 4)));
  } else if constexpr (T == kIq2xs) {
    const uint32_t q = u16(b + 2 + 2 * c);
    idx = q & 511;
    sign = iq_sign_byte(q >> 9);
  } else if constexpr (T == kIq2s) {
    idx = b[2 + c] | (((b[66 + c / 4] >> (2 * (c % 4))) & 3u) << 8);
    sign = b[34 + c];
  } else if constexpr (T == kIq1s) {
    idx = b[2 + c] | ((static_cast<uint32_t>(u16(b + 34 + 2 * (c / 4))) >> (3 * (c % 4))) & 7u) << 8;
    sign = 0;
  } else if constexpr (T == kIq3xxs) {
    idx = b[2 + 2 * c] | static_cast<uint32_t>(b[3 + 2 * c]) << 16;
    sign = iq_sign_byte(u32(b + 66 + 4 * (c / 4)) >> (7 * (c % 4)));
  } else {
    const uint32_t h = b[66 + c / 4] >> (2 * (c % 4));
    idx = (b[2 + 2 * c] | ((h & 1) << 8)) | (b[3 + 2 * c] | ((h & 2) << 7)) << 16;
    sign = b[74 + c];
  }
}

template <uint32_t T>
uint32_t file_scale(const uint8_t* b, int h) {  // 32-weight block h (IQ1_S: the 3-bit scale | the delta's sign << 3)
  if constexpr (T == kIq2xxs) return u32(b + 6 + 8 * h) >> 28;
  else if constexpr (T == kIq1s) return (static_cast<uint32_t>(u16(b + 34 + 2 * h)) >> 12) & 15u;
  else if constexpr (T == kIq3xxs) return u32(b + 66 + 4 * h) >> 28;
  else return (b[106 + h / 2] >> (4 * (h % 2))) & 15u;
}

inline void or64(uint8_t* p, uint64_t v) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  x |= v;
  std::memcpy(p, &x, 8);
}

template <uint32_t T>
HMOE_AP void pack_group(const uint8_t* b, uint8_t* dst) {
  const uint64_t* codes = code_rows<T>().data();
  std::memset(dst, 0, kCodeBytes<T>);
  for (int j = 0; j < 8; ++j)
    for (int q = 0; q < 4; ++q) {
      uint32_t idx, sign;
      file_chunk<T>(b, chunk<T>(j, q), idx, sign);
      if constexpr (kIq3<T>) {  // byte k: code | sign << 3, in nibble j % 2
        const uint64_t c = codes[idx & 0xFFFF] | codes[idx >> 16] << 32;
        or64(dst + 32 * (j / 2) + 8 * q, (c | _pdep_u64(sign, 0x0808080808080808ull)) << (4 * (j % 2)));
      } else {  // byte k: code at bits 2 (j % 4); sign plane bit j
        or64(dst + 32 * (j / 4) + 8 * q, codes[idx] << (2 * (j % 4)));
        if constexpr (!kIq1<T>) or64(dst + 64 + 8 * q, _pdep_u64(sign, 0x0101010101010101ull) << j);
      }
    }
  uint8_t* sc = dst + kCodeBytes<T>;
  if constexpr (kBlocks16<T>) {
    std::memcpy(sc, b + (T == kIq2xs ? 66 : 74), 8);
  } else {
    uint32_t v = 0;
    for (int h = 0; h < 8; ++h) v |= file_scale<T>(b, h) << (4 * h);
    std::memcpy(sc, &v, 4);
  }
  std::memcpy(sc + kScaleBytes<T>, b, 2);
}

template <uint32_t T>
HMOE_AP void pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  const int64_t ng = w.cols / 256;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.row(r);
    for (int64_t g = 0; g < ng; ++g, src += kFileBytes<T>, dst += kGroupBytes<T>) pack_group<T>(src, dst);
  }
}

// The odd scales (2 s + 1) as bytes for the set shuffles (kLayout.ctl32 / ctl16).
template <uint32_t T>
HMOE_AP inline __m256i odd_scales(const uint8_t* sc) {
  __m256i v;
  if constexpr (kBlocks16<T>) {
    const __m256i s = _mm256_set1_epi64x(static_cast<long long>(u64(sc)));
    const __m256i m = _mm256_set1_epi8(15);
    v = _mm256_unpacklo_epi8(_mm256_and_si256(s, m), _mm256_and_si256(_mm256_srli_epi16(s, 4), m));
  } else {  // lane 0 bytes 0, 4, 8, 12 = blocks 0, 1, 4, 5; lane 1 blocks 2, 3, 6, 7
    v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u32(sc))), _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28)),
                         _mm256_set1_epi32(15));
  }
  return _mm256_or_si256(_mm256_add_epi8(v, v), _mm256_set1_epi8(1));
}

// Level table for vpshufb: IQ2 code -> magnitude; IQ3 code | sign << 3 -> bias +- level.
template <uint32_t T>
HMOE_AP inline __m256i level_table() {
  alignas(32) int8_t t[32] = {};
  for (int i = 0; i < 16; ++i) {
    int v = 0;
    if constexpr (T == kIq3xxs) v = kBias<T> + (i & 8 ? -1 : 1) * ((i & 7) == 7 ? 62 : 4 + 8 * (i & 7));
    else if constexpr (T == kIq3s) v = kBias<T> + (i & 8 ? -1 : 1) * (1 + 2 * (i & 7));
    else if constexpr (kIq1<T>) v = i < 3 ? 8 * i : 0;
    else v = i == 0 ? 8 : i == 1 ? 25 : i == 2 ? 43 : 0;
    t[i] = t[16 + i] = static_cast<int8_t>(v);
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(t));
}

// Row at a times NT tokens; xp: per token and group 256 permuted activations, then (IQ2) their negation or (IQ3)
// the products of the bias with them (vpmaddubsw, 8 vectors of 16 words).
template <uint32_t T, int NT>
HMOE_AP void tile(const uint8_t* a, const int8_t* xp, const float* dx, int64_t ng, float* y, int64_t ldy) {
  constexpr int GB = kGroupBytes<T>;
  const __m256i lv = level_table<T>(), three = _mm256_set1_epi8(3), fifteen = _mm256_set1_epi8(15);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g, a += GB) {
    __m256i odd, sc1[2], dl1[2];  // IQ1_S: per set the odd scales and -(8 -+ 1) times them as words (madd with the x sums)
    if constexpr (kIq1<T>) {
      const __m256i v = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u32(a + kCodeBytes<T>))), _mm256_setr_epi32(0, 4, 16, 20, 8, 12, 24, 28)),
          _mm256_set1_epi32(15));
      const __m256i o = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(7)), 1), _mm256_set1_epi32(1));
      // 8 w / dl = 8 t - 8 + delta: the sums of x times -7 (delta +1) or -9 (bit 3 set: delta -1)
      const __m256i f = _mm256_sub_epi32(_mm256_set1_epi32(-7), _mm256_srli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(8)), 2));
      const __m256i od = _mm256_mullo_epi32(o, f);
      for (int s2 = 0; s2 < 2; ++s2) {
        const __m256i ctl = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.ctl32w[s2]));
        sc1[s2] = _mm256_shuffle_epi8(o, ctl);
        dl1[s2] = _mm256_shuffle_epi8(od, ctl);
      }
    } else {
      odd = odd_scales<T>(a + kCodeBytes<T>);
    }
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)), c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32));
    const __m256i planes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 64));
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i sc = kIq1<T> ? sc1[k / 2] : scale_set<T>(odd, k);
      __m256i u0, u1, m0, m1;
      if constexpr (kIq3<T>) {
        const __m256i nib = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * k));
        u0 = _mm256_shuffle_epi8(lv, _mm256_and_si256(nib, fifteen));
        u1 = _mm256_shuffle_epi8(lv, _mm256_and_si256(_mm256_srli_epi16(nib, 4), fifteen));
      } else {  // vector j: codes at bits 2 (j % 4) of c0 / c1, sign at bit j of the planes (IQ2)
        const __m256i c = k < 2 ? c0 : c1;
        u0 = _mm256_shuffle_epi8(lv, _mm256_and_si256(k % 2 ? _mm256_srli_epi16(c, 4) : c, three));
        u1 = _mm256_shuffle_epi8(lv, _mm256_and_si256(_mm256_srli_epi16(c, k % 2 ? 6 : 2), three));
        if constexpr (!kIq1<T>) {
          m0 = _mm256_slli_epi16(planes, 7 - 2 * k);
          m1 = _mm256_slli_epi16(planes, 6 - 2 * k);
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const int8_t* x = xp + (t * ng + g) * 512 + 64 * k;
        const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x)), x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 32));
        const __m256i e0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 256)), e1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + 288));
        __m256i p;
        if constexpr (kIq3<T>)  // (bias + w) x - bias x: |.| <= 62 * 127 * 2 each
          p = _mm256_add_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(u0, x0), e0), _mm256_sub_epi16(_mm256_maddubs_epi16(u1, x1), e1));
        else if constexpr (kIq1<T>) {  // 8 t x (|.| <= 16 * 127 * 2 each), and the x sums of the pair (e0) times -(8 -+ 1)
          p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1));
          sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(e0, dl1[k / 2]));
        } else
          p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_blendv_epi8(x0, e0, m0)), _mm256_maddubs_epi16(u1, _mm256_blendv_epi8(x1, e1, m1)));
        sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, sc));
      }
    }
    const float d = half(a + kCodeBytes<T> + kScaleBytes<T>) * kDScale<T>;
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

template <uint32_t T>
HMOE_AP void rows(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t ng = cols / 256, rb = ng * kGroupBytes<T>;
  thread_local std::vector<int8_t> buf;
  thread_local std::vector<float> dx;
  buf.resize(static_cast<size_t>(n * ng * 512) + 32);
  dx.resize(static_cast<size_t>(n * ng));
  int8_t* xp = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(buf.data()) + 31) & ~uintptr_t{31});
  const uint8_t* perm = kLayout.xperm[kBlocks16<T> ? 1 : 0];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g = 0; g < ng; ++g) {
      const int8_t* x = xa.q.data() + (t0 + t) * xa.cols + 256 * g;
      int8_t* o = xp + (t * ng + g) * 512;
      for (int p = 0; p < 256; p += 8) std::memcpy(o + p, x + perm[p], 8);  // chunks of 8 columns
      if constexpr (kIq1<T>) {  // pair k: the sums of x per word of vectors 2k + 2k + 1 at 256 + 64 k (|.| <= 4 * 127)
        const __m256i one = _mm256_set1_epi8(1);
        for (int k = 0; k < 4; ++k)
          _mm256_store_si256(reinterpret_cast<__m256i*>(o + 256 + 64 * k),
                             _mm256_add_epi16(_mm256_maddubs_epi16(one, _mm256_load_si256(reinterpret_cast<const __m256i*>(o + 64 * k))),
                                              _mm256_maddubs_epi16(one, _mm256_load_si256(reinterpret_cast<const __m256i*>(o + 64 * k + 32)))));
      } else
      for (int p = 0; p < 256; p += 32) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(o + p));
        const __m256i e = kIq3<T> ? _mm256_maddubs_epi16(_mm256_set1_epi8(kBias<T>), v) : _mm256_sub_epi8(_mm256_setzero_si256(), v);  // |x| <= 127
        _mm256_store_si256(reinterpret_cast<__m256i*>(o + 256 + p), e);
      }
      dx[static_cast<size_t>(t * ng + g)] = xa.d[static_cast<size_t>((t0 + t) * ng + g)];
    }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = packed + r * rb;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<T, 4>(a, xp + t * ng * 512, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<T, 2>(a, xp + t * ng * 512, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<T, 1>(a, xp + t * ng * 512, dx.data() + t * ng, ng, y + t * ldy + r, ldy);
  }
}

template <uint32_t T>
constexpr size_t group_bytes() { return kGroupBytes<T>; }

}  // namespace

bool lowbit_avx2_pack_applies(uint32_t ext, int64_t cols) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
  }();
  return isa && (ext == kIq2xxs || ext == kIq2xs || ext == kIq2s || ext == kIq3xxs || ext == kIq3s || ext == kIq1s || ext == kIq1m) && cols > 0 &&
         cols % 256 == 0;
}

size_t lowbit_avx2_row_bytes(uint32_t ext, int64_t cols) {
  if (ext == kIq1m) return lowbit_avx2_iq1m_row_bytes(cols);
  const size_t gb = ext == kIq2xxs ? group_bytes<kIq2xxs>() : ext == kIq2xs ? group_bytes<kIq2xs>() : ext == kIq2s ? group_bytes<kIq2s>()
                    : ext == kIq3xxs ? group_bytes<kIq3xxs>() : ext == kIq1s ? group_bytes<kIq1s>() : group_bytes<kIq3s>();
  return static_cast<size_t>(cols / 256) * gb;
}

void lowbit_avx2_pack(const Mat& w, int64_t r0, int64_t r1, uint8_t* dst) {
  switch (w.ext) {
    case kIq2xxs: pack<kIq2xxs>(w, r0, r1, dst); break;
    case kIq2xs: pack<kIq2xs>(w, r0, r1, dst); break;
    case kIq2s: pack<kIq2s>(w, r0, r1, dst); break;
    case kIq3xxs: pack<kIq3xxs>(w, r0, r1, dst); break;
    case kIq1s: pack<kIq1s>(w, r0, r1, dst); break;
    case kIq1m: lowbit_avx2_iq1m_pack(w, r0, r1, dst); break;
    default: pack<kIq3s>(w, r0, r1, dst); break;
  }
}

void lowbit_rows_q8_avx2_packed(const Q8Acts& xa, int64_t t0, int64_t n, const uint8_t* packed, int64_t cols, int64_t r0, int64_t r1, float* y,
                                int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  switch (static_cast<uint32_t>(xa.type)) {
    case kIq2xxs: rows<kIq2xxs>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    case kIq2xs: rows<kIq2xs>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    case kIq2s: rows<kIq2s>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    case kIq3xxs: rows<kIq3xxs>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    case kIq1s: rows<kIq1s>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    case kIq1m: lowbit_rows_q8_avx2_iq1m_packed(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
    default: rows<kIq3s>(xa, t0, n, packed, cols, r0, r1, y, ldy); break;
  }
}

}  // namespace hmoe::cpu::detail
