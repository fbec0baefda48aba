// Private to numa/: the lane layout shared by the AVX2 kernels of the grid IQ
// types (quant_gguf_lowbit_avx2_grid.cpp on the file's blocks,
// quant_gguf_lowbit_avx2_packed.cpp on the rows repacked at load), and the
// two vector helpers both kernels use (scale_set, hsum8; callers compiled
// for avx2, fma, f16c and bmi2, as these two are).
//
// A 256-weight group is 32 chunks of 8 weights (IQ3: two 4-weight grid
// rows) in 8 vectors of 4 qwords, so that qword Q of every vector holds one
// scale block:
//  - 32-weight blocks (IQ2_XXS, IQ3_XXS, IQ3_S): vector j, qword Q = chunk
//    4 (Q + 4 (j / 4)) + j % 4 (block Q + 4 (j / 4));
//  - 16-weight blocks (IQ2_XS, IQ2_S): chunk 2 (Q + 4 (j / 2)) + j % 2.
// Vectors 2k and 2k + 1 share their blocks lane for lane (pair k: the
// blocks of set k / 2, or k for 16-weight blocks).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace hmoe::cpu::detail::lowbit_avx2 {

constexpr uint32_t kIq2xxs = 16, kIq2xs = 17, kIq3xxs = 18, kIq1s = 19, kIq3s = 21, kIq2s = 22, kIq1m = 29;

template <uint32_t T> constexpr bool kBlocks16 = T == kIq2xs || T == kIq2s;
// fp32 factor of the odd scale (2 s + 1)
template <uint32_t T> constexpr float kDScale = T == kIq3xxs ? 0.25f : T == kIq3s ? 1.0f : 0.125f;

// Chunk (8 weights) of vector j, qword q.
constexpr int chunk(bool blocks16, int j, int q) { return blocks16 ? 2 * (q + 4 * (j / 2)) + j % 2 : 4 * (q + 4 * (j / 4)) + j % 4; }

struct Layout {
  uint8_t xperm[2][256];             // [blocks16] vector byte -> column of the group
  alignas(32) uint8_t ctl32[2][32];  // 32-weight blocks, set s: the words of qword Q <- byte 8 s + 4 (Q % 2) of the lane
  alignas(32) uint8_t ctl16[4][32];  // 16-weight blocks, set k: qword Q <- byte 4 k + Q of the lane
  alignas(32) uint8_t ctl32w[2][32];  // as ctl32, the word at byte 8 s + 4 (Q % 2) (an int32 lane's low half)
};

constexpr Layout make_layout() {
  Layout t{};
  for (int b16 = 0; b16 < 2; ++b16)
    for (int p = 0; p < 256; ++p) t.xperm[b16][p] = static_cast<uint8_t>(8 * chunk(b16 != 0, p / 32, (p / 8) % 4) + p % 8);
  for (int p = 0; p < 32; ++p) {
    const int w = (p % 16) / 2, q = 2 * (p / 16) + w / 4;  // word w of the lane, qword q of the vector
    for (int s = 0; s < 2; ++s) t.ctl32[s][p] = p % 2 ? 0x80 : static_cast<uint8_t>(8 * s + 4 * (q % 2));
    for (int k = 0; k < 4; ++k) t.ctl16[k][p] = p % 2 ? 0x80 : static_cast<uint8_t>(4 * k + q);
    for (int s = 0; s < 2; ++s) t.ctl32w[s][p] = static_cast<uint8_t>(8 * s + 4 * (q % 2) + p % 2);
  }
  return t;
}
inline constexpr Layout kLayout = make_layout();

// Pair k's odd scales as the int16 words vpmaddwd multiplies the pair's
// sums by: the group's odd-scale bytes (each kernel's odd_scales) shuffled
// by ctl32 / ctl16.
template <uint32_t T>
__attribute__((target("avx2,fma,f16c,bmi2"))) inline __m256i scale_set(__m256i odd, int k) {
  if constexpr (kBlocks16<T>) return _mm256_shuffle_epi8(odd, _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.ctl16[k])));
  else return _mm256_shuffle_epi8(odd, _mm256_load_si256(reinterpret_cast<const __m256i*>(kLayout.ctl32[k / 2])));
}

// The sum of v's eight floats (AVX2 without BMI2, so that every AVX2 kernel can inline it).
__attribute__((target("avx2,fma,f16c"))) inline float hsum8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace hmoe::cpu::detail::lowbit_avx2
