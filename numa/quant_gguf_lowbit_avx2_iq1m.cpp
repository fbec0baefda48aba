// AVX2 int8 kernel of IQ1_M on the file's blocks: "avx2 v2" for it, for CPUs
// without AVX-512 (v1 in quant_gguf_lowbit_avx2.cpp decodes every group
// through the scalar reference). Where the caller holds the rows repacked at
// load (numa::ExpertEngine, cpu_lowbit_repack) AVX2 v3 runs instead
// (quant_gguf_lowbit_avx2_iq1m_packed.cpp); this one serves the rest.
//
// A block is 32 chunks of 8 weights, chunk i a row of kIq1sGrid (bytes
// grid + 1 in 0..2) picked by qs[i] and 3 bits of qh, and the delta's sign
// (bit 3 of the chunk's qh nibble). The code is 8 (grid + 1) - 8 + delta
// (-9..9, as the scalar reference folds it): the rows by table loads
// (vmovq / vpinsrq), times 8 (vpsllw), plus -7 or -9 per chunk. Vector v
// holds chunks 4v..4v+3 (weights 32v..32v+31, runs 2v and 2v + 1 in its two
// lanes): |code| times the activation with the code's sign (vpmaddubsw,
// pairs <= 2 * 9 * 127) and vpmaddwd with the odd scales 2 s + 1 (the 16
// 3-bit scales spread to bytes by pdep) give one int32 sum per block and
// token, times d / 8 and the activation scale in fp32. Exact integer sums
// per block as the reference's codes and scales (lowbit_block_codes); equal
// to it up to the order of the fp32 sums. Tiles of 4, 2, 1 tokens.
#include <immintrin.h>

#include <cstdint>

#include "io/tensor/gguf_iq_grids.h"
#include "numa/detail/lowbit_bytes.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/detail/lowbit_avx2_layout.h"

#define HMOE_A1 __attribute__((target("avx2,fma,f16c,bmi2")))

namespace hmoe::cpu::detail {

namespace {
using lowbit_avx2::hsum8;

using lowbit_bytes::prefetch;
using lowbit_bytes::u16;
using lowbit_bytes::u64;

constexpr int kBlockBytes = 56;

// vpshufb control of run pair v: byte 2 v + lane as every word's low byte.
struct Ctl {
  alignas(32) uint8_t lo[8][32];
};
constexpr Ctl make_ctl() {
  Ctl c{};
  for (int k = 0; k < 8; ++k)
    for (int p = 0; p < 32; ++p) c.lo[k][p] = p % 2 ? 0x80 : static_cast<uint8_t>(2 * k + p / 16);
  return c;
}
constexpr Ctl kCtl = make_ctl();

// Grid row of chunk i (qh nibble h).
inline uint64_t row(const uint8_t* qs, int i, uint32_t h) { return kIq1sGrid[qs[i] | ((h & 7) << 8)]; }

// The codes of vector v of the block at b.
HMOE_A1 inline __m256i codes(const uint8_t* b, int v) {
  const uint32_t q = u16(b + 32 + 2 * v);
  const __m256i g = _mm256_set_epi64x(static_cast<long long>(row(b, 4 * v + 3, q >> 12)), static_cast<long long>(row(b, 4 * v + 2, q >> 8)),
                                      static_cast<long long>(row(b, 4 * v + 1, q >> 4)), static_cast<long long>(row(b, 4 * v, q)));
  // qword k: the delta's sign (bit 4 k + 3 of q) as all ones when set
  const __m256i sgn = _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(q), _mm256_setr_epi64x(3, 7, 11, 15)), _mm256_set1_epi64x(1)),
                                         _mm256_set1_epi64x(1));
  const __m256i off = _mm256_sub_epi8(_mm256_set1_epi8(-7), _mm256_and_si256(sgn, _mm256_set1_epi8(2)));
  return _mm256_add_epi8(_mm256_slli_epi16(g, 3), off);
}

// Row at a times NT tokens: x the activations of token 0 (token t at x + t * cols), dx their scales (token t at dx + t * ng).
template <int NT>
HMOE_A1 void tile(const uint8_t* a, int64_t rb, const int8_t* x, int64_t cols, const float* dx, int64_t ng, float* y, int64_t ldy) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t ahead = rb * ((2048 + rb - 1) / rb) > 4096 ? 4096 : rb * ((2048 + rb - 1) / rb);
  for (int64_t g = 0; g < ng; ++g, a += kBlockBytes) {
    prefetch(a, ahead, kBlockBytes);
    const uint64_t sc = u64(a + 48);
    const uint64_t lo = (sc & 0xFFF) | ((sc >> 4) & 0xFFF000), hi = ((sc >> 32) & 0xFFF) | ((sc >> 36) & 0xFFF000);
    const __m128i s8 = _mm_set_epi64x(static_cast<long long>(_pdep_u64(hi, 0x0707070707070707ull)), static_cast<long long>(_pdep_u64(lo, 0x0707070707070707ull)));
    const __m256i odd = _mm256_broadcastsi128_si256(_mm_or_si128(_mm_add_epi8(s8, s8), _mm_set1_epi8(1)));
    const uint16_t dbits = static_cast<uint16_t>(((sc >> 12) & 0xF) | ((sc >> 24) & 0xF0) | ((sc >> 36) & 0xF00) | ((sc >> 48) & 0xF000));
    const float d = _cvtsh_ss(dbits) * 0.125f;
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
      const __m256i c = codes(a, v), ac = _mm256_sign_epi8(c, c);
      const __m256i s = _mm256_shuffle_epi8(odd, _mm256_load_si256(reinterpret_cast<const __m256i*>(kCtl.lo[v])));
      for (int t = 0; t < NT; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + t * cols + 256 * g + 32 * v));
        sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ac, _mm256_sign_epi8(xv, c)), s));
      }
    }
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_set1_ps(d * dx[t * ng + g]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) y[t * ldy] = hsum8(acc[t]);
}

}  // namespace

bool lowbit_rows_q8_avx2_iq1m(const Q8Acts& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  static const bool isa = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  }();
  if (!isa || w.ext != static_cast<uint32_t>(lowbit::iq1_m)) return false;
  const int64_t ng = w.cols / 256, rb = static_cast<int64_t>(w.row_bytes()), cols = xa.cols;
  const int8_t* x = xa.q.data() + t0 * cols;
  const float* dx = xa.d.data() + t0 * ng;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* a = w.row(r);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) tile<4>(a, rb, x + t * cols, cols, dx + t * ng, ng, y + t * ldy + r, ldy);
    for (; t + 2 <= n; t += 2) tile<2>(a, rb, x + t * cols, cols, dx + t * ng, ng, y + t * ldy + r, ldy);
    for (; t < n; ++t) tile<1>(a, rb, x + t * cols, cols, dx + t * ng, ng, y + t * ldy + r, ldy);
  }
  return true;
}

}  // namespace hmoe::cpu::detail
