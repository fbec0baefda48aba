// AVX2 kernels of the integer GGUF path (numa/quant_gguf_q8.h), for CPUs
// without AVX-512 VNNI. v1: one row by NT tokens; per 32 codes vpmaddubsw
// (u8 x s8 -> s16) then vpmaddwd with the sub-block scale (K types) or with
// ones (32-blocks) into int32 lanes. Q8_0 multiplies |w| by x with w's sign
// (vpsignb) so that the s16 pairs cannot saturate; Q4_0/Q5_0 take their zero
// point off per block from the activation's block sums.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>

#include "configs/error.h"
#include "io/tensor/gguf_block_util.h"
#include "numa/quant_gguf_q8.h"

#define HMOE_V256 __attribute__((target("avx2,fma,f16c")))

namespace hmoe::cpu::detail {

namespace {

HMOE_V256 inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
HMOE_V256 inline __m256i ld32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
HMOE_V256 inline __m128i ld16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
HMOE_V256 inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
// 32 bytes of 16 where bit `bit` of qh[l] is set.
HMOE_V256 inline __m256i hbit(__m256i qh, int bit) {
  const __m256i b = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b), b), _mm256_set1_epi8(16));
}

// Q6_K: the two high bits (qh >> SH) & 3 of 32 codes, in place (<< 4).
template <int SH>
HMOE_V256 inline __m256i q6_high(__m256i qh, __m256i m3) {
  return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, SH), m3), 4);
}

// Where Q4_K/Q5_K sub-block sb sits in the activation (see Q8Acts::pos).
constexpr int kSlot[8] = {0, 2, 1, 3, 4, 6, 5, 7};

template <ExtType T, int NT>
HMOE_V256 void tile_k(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy) {
  constexpr int BB = T == ExtType::q4_k ? 144 : T == ExtType::q5_k ? 176 : 210;
  const int64_t nb = w.cols / 256;
  const uint8_t* row = w.row(r);
  __m256 acc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t bi = 0; bi < nb; ++bi) {
    const uint8_t* b = row + bi * BB;
    __m256i c[8];
    int16_t s[16];
    float d, dmin = 0;
    __m128i mn16 = _mm_setzero_si128();
    __m256i sc16 = _mm256_setzero_si256();
    if constexpr (T == ExtType::q4_k || T == ExtType::q5_k) {
      d = half_at(b);
      dmin = half_at(b + 2);
      uint64_t sc, mn;
      gguf_scales_mins_k4(b + 4, sc, mn);
      for (int j = 0; j < 8; ++j) s[j] = static_cast<int16_t>((sc >> (8 * j)) & 0xFF);
      mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn)));
      const uint8_t* qs = b + (T == ExtType::q4_k ? 16 : 48);
      for (int j = 0; j < 4; ++j) {  // chunk j: low nibbles sub-block 2j, high 2j + 1
        const __m256i q = ld32(qs + 32 * j);
        c[2 * j] = _mm256_and_si256(q, m4);
        c[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      }
      if constexpr (T == ExtType::q5_k) {
        const __m256i qh = ld32(b + 16);
        for (int sb = 0; sb < 8; ++sb) c[sb] = _mm256_or_si256(c[sb], hbit(qh, sb));
      }
    } else {  // q6_k: c[v] = elements 32v..32v+31
      d = half_at(b + 208);
      const auto* scp = reinterpret_cast<const int8_t*>(b + 192);
      for (int j = 0; j < 16; ++j) s[j] = scp[j];
      sc16 = _mm256_cvtepi8_epi16(ld16(b + 192));
      const __m256i m3 = _mm256_set1_epi8(3);
      for (int h = 0; h < 2; ++h) {
        const __m256i q0 = ld32(b + 64 * h), q1 = ld32(b + 64 * h + 32), qh = ld32(b + 128 + 32 * h);
        c[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(q0, m4), q6_high<0>(qh, m3));
        c[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(q1, m4), q6_high<2>(qh, m3));
        c[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4), q6_high<4>(qh, m3));
        c[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4), q6_high<6>(qh, m3));
      }
    }
    for (int j = 0; j < NT; ++j) {
      const int8_t* xq = xa.q.data() + (tx + j) * xa.cols + bi * 256;
      const int16_t* bs = xa.bsum.data() + ((tx + j) * nb + bi) * 16;
      const float dx = xa.d[static_cast<size_t>((tx + j) * nb + bi)];
      __m256i a = _mm256_setzero_si256();
      for (int v = 0; v < 8; ++v) {
        __m256i sv;
        const int8_t* xv;
        if constexpr (T == ExtType::q6_k) {
          sv = _mm256_set_m128i(_mm_set1_epi16(s[2 * v + 1]), _mm_set1_epi16(s[2 * v]));
          xv = xq + 32 * v;
        } else {
          sv = _mm256_set1_epi16(s[v]);
          xv = xq + 32 * kSlot[v];
        }
        a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(c[v], ld32(xv)), sv));
      }
      if constexpr (T == ExtType::q6_k) {
        a = _mm256_sub_epi32(a, _mm256_slli_epi32(_mm256_madd_epi16(sc16, ld32(bs)), 5));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(d * dx), acc[j]);
      } else {
        const __m128i ms = _mm_madd_epi16(mn16, ld16(bs));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(d * dx), acc[j]);
        acc[j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_zextsi128_si256(ms)), _mm256_set1_ps(dmin * dx), acc[j]);
      }
    }
  }
  for (int j = 0; j < NT; ++j) y[j * ldy + r] = hsum(acc[j]);
}

template <ExtType T, int NT>
HMOE_V256 void tile_b(const Q8Acts& xa, int64_t tx, const Mat& w, int64_t r, float* y, int64_t ldy) {
  constexpr int BB = T == ExtType::q8_0 ? 34 : T == ExtType::q4_0 ? 18 : 22;
  const int64_t nblk = w.cols / 32, np = w.cols / 64;
  const uint8_t* row = w.row(r);
  __m256 acc[NT];
  float zacc[NT];
  for (int j = 0; j < NT; ++j) acc[j] = _mm256_setzero_ps(), zacc[j] = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const uint8_t* b = row + blk * BB;
    const float dw = half_at(b);
    const int64_t p = blk / 2, half = blk % 2;
    __m256i c;
    if constexpr (T == ExtType::q8_0) {
      c = ld32(b + 2);
    } else {
      constexpr int off = T == ExtType::q4_0 ? 2 : 6;
      const __m128i v = ld16(b + off);
      c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
      if constexpr (T == ExtType::q5_0) {
        uint32_t qh;
        std::memcpy(&qh, b + 2, 4);
        // byte l gets bit l of qh: spread the 32 bits over 32 bytes
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                                  _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
        c = _mm256_or_si256(c, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel), _mm256_set1_epi8(16)));
      }
    }
    for (int j = 0; j < NT; ++j) {
      const int8_t* xq = xa.q.data() + (tx + j) * xa.cols + 64 * p;
      const float dx = xa.d[static_cast<size_t>((tx + j) * nblk + blk)];
      __m256i prod;
      if constexpr (T == ExtType::q8_0) {
        const __m256i x = ld32(xq + 32 * half);
        prod = _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c));
      } else {  // activation order per pair: a.lo, b.lo, a.hi, b.hi
        const __m256i x = _mm256_set_m128i(ld16(xq + 32 + 16 * half), ld16(xq + 16 * half));
        prod = _mm256_maddubs_epi16(c, x);
        // -zero * sum(x) of this block: the seed of its first lane in the pair's init
        const int32_t seed = xa.init[static_cast<size_t>(((tx + j) * np + p) * 16 + 4 * half)];
        zacc[j] += dw * dx * static_cast<float>(seed);
      }
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones)), _mm256_set1_ps(dw * dx), acc[j]);
    }
  }
  for (int j = 0; j < NT; ++j) y[j * ldy + r] = hsum(acc[j]) + zacc[j];
}

template <ExtType T>
HMOE_V256 void rows(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr bool k = T == ExtType::q4_k || T == ExtType::q5_k || T == ExtType::q6_k;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
      if constexpr (k) tile_k<T, 4>(xa, t0 + t, w, r, y + t * ldy, ldy);
      else tile_b<T, 4>(xa, t0 + t, w, r, y + t * ldy, ldy);
    }
    for (; t < n; ++t) {
      if constexpr (k) tile_k<T, 1>(xa, t0 + t, w, r, y + t * ldy, ldy);
      else tile_b<T, 1>(xa, t0 + t, w, r, y + t * ldy, ldy);
    }
  }
}

}  // namespace

void q8_rows_avx2(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (static_cast<ExtType>(w.ext)) {
    case ExtType::q4_k: return rows<ExtType::q4_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_k: return rows<ExtType::q5_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q6_k: return rows<ExtType::q6_k>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q8_0: return rows<ExtType::q8_0>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q4_0: return rows<ExtType::q4_0>(xa, t0, n, w, r0, r1, y, ldy);
    case ExtType::q5_0: return rows<ExtType::q5_0>(xa, t0, n, w, r0, r1, y, ldy);
    default: break;
  }
  fail(ErrorKind::internal, "q8_rows_avx2: type " + std::to_string(w.ext) + " has no integer kernel");
}

}  // namespace hmoe::cpu::detail
