// Integer dot products for int8 / int4 weights on int8-quantized activations
// (numerics in numa/kernels.h, "integer dot products"): the activation
// quantizer, the scalar reference and the AVX512-VNNI kernel.
//
// Kernel: an R-row by T-token block walks the row 128 columns (one "unit")
// at a time. int8: two 64-byte loads per row, xor 0x80 (u8 codes), two
// vpdpbusd per token into fresh int32 lanes, converted and scaled by the
// token's group scale into fp32 lanes (one fma). int4: one 64-byte load per
// row gives 128 codes, low nibbles (and) and high nibbles (shift, and); the
// activation unit is stored in the same order (see QActs::q4), so both
// vpdpbusd land in the same int32 lanes, and lane l of the unit belongs to
// weight group l / (16 / groups per unit): one fma per unit with a vector of
// per-lane ws_g * xs_g. Zero points / the int8 offset are applied once per
// row and token at the end from the per-group sums of the codes.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "configs/error.h"
#include "numa/kernels.h"

#define HMOE_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace hmoe::cpu {

namespace {

constexpr int64_t kUnit = 128;
constexpr int64_t kPrefetch = 1024;

bool detect_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
}
const bool g_vnni = detect_vnni();

// Position of column k in the int4 activation order.
inline int64_t q4_pos(int64_t k) {
  const int64_t u = k / kUnit, kk = k % kUnit, c = kk / 32, i = kk % 32;
  return u * kUnit + (i < 16 ? 16 * c + i : 64 + 16 * c + (i - 16));
}

inline int64_t act_group(const Mat& w) { return w.quant == Quant::int4_group ? w.group : kUnit; }

inline int q4_code(const Mat& w, int64_t r, int64_t k) {
  const uint8_t byte = w.row(r)[(k >> 5) * 16 + (k & 15)];
  return (k & 16) ? (byte >> 4) : (byte & 15);
}

// ---- VNNI kernels --------------------------------------------------------------
template <int R, int T>
HMOE_VNNI void block_q8(const QActs& xa, int64_t t0, const Mat& w, int64_t r, int64_t tb, float* y, int64_t ldy) {
  const int64_t K = w.cols, U = K / kUnit, G = xa.groups;
  const uint8_t* wr[R];
  for (int i = 0; i < R; ++i) wr[i] = w.row(r + i);
  const int8_t* xq[T];
  const float* xs[T];
  for (int j = 0; j < T; ++j) {
    xq[j] = xa.q.data() + (t0 + tb + j) * K;
    xs[j] = xa.scale.data() + (t0 + tb + j) * G;
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t u = 0; u < U; ++u) {
    const int64_t k = u * kUnit;
    __m512i w0[R], w1[R];
    for (int i = 0; i < R; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k + kPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wr[i] + k + kPrefetch + 64), _MM_HINT_T0);
      w0[i] = _mm512_xor_si512(_mm512_loadu_si512(wr[i] + k), flip);
      w1[i] = _mm512_xor_si512(_mm512_loadu_si512(wr[i] + k + 64), flip);
    }
    for (int j = 0; j < T; ++j) {
      const __m512i x0 = _mm512_loadu_si512(xq[j] + k), x1 = _mm512_loadu_si512(xq[j] + k + 64);
      const __m512 s = _mm512_set1_ps(xs[j][u]);
      for (int i = 0; i < R; ++i) {
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w0[i], x0);
        d = _mm512_dpbusd_epi32(d, w1[i], x1);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[i][j]);
      }
    }
  }
  for (int j = 0; j < T; ++j) {
    // The +128 offset added 128 * sum_k xq_k per group: take xs_g * that off.
    const float* zs = xa.zsum.data() + (t0 + tb + j) * G;
    float off = 0;
    for (int64_t g = 0; g < G; ++g) off += zs[g];
    for (int i = 0; i < R; ++i) y[(tb + j) * ldy + r + i] = w.scales[r + i] * (_mm512_reduce_add_ps(acc[i][j]) - 128.0f * off);
  }
}

// GPU = weight groups per 128-column unit (1, 2 or 4).
template <int R, int T, int GPU>
HMOE_VNNI void block_q4(const QActs& xa, int64_t t0, const Mat& w, int64_t r, int64_t tb, float* y, int64_t ldy) {
  const int64_t K = w.cols, U = K / kUnit, G = xa.groups;
  const uint8_t* wr[R];
  const float* ws[R];
  for (int i = 0; i < R; ++i) {
    wr[i] = w.row(r + i);
    ws[i] = w.scales + (r + i) * G;
  }
  const int8_t* xq[T];
  const float* xs[T];
  for (int j = 0; j < T; ++j) {
    xq[j] = xa.q.data() + (t0 + tb + j) * K;
    xs[j] = xa.scale.data() + (t0 + tb + j) * G;
  }
  const __m512i nib = _mm512_set1_epi8(0x0F);
  // Lane l of a unit's int32 sums belongs to group l / (16 / GPU) of the unit.
  const __m512i lane_group = _mm512_set_epi32(15 * GPU / 16, 14 * GPU / 16, 13 * GPU / 16, 12 * GPU / 16, 11 * GPU / 16, 10 * GPU / 16,
                                              9 * GPU / 16, 8 * GPU / 16, 7 * GPU / 16, 6 * GPU / 16, 5 * GPU / 16, 4 * GPU / 16,
                                              3 * GPU / 16, 2 * GPU / 16, 1 * GPU / 16, 0);
  constexpr __mmask16 gmask = static_cast<__mmask16>((1u << GPU) - 1);
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t u = 0; u < U; ++u) {
    const int64_t kb = u * (kUnit / 2);
    __m512i lo[R], hi[R];
    for (int i = 0; i < R; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(wr[i] + kb + kPrefetch), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(wr[i] + kb);
      lo[i] = _mm512_and_si512(v, nib);
      hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    }
    for (int j = 0; j < T; ++j) {
      const __m512i xl = _mm512_loadu_si512(xq[j] + u * kUnit), xh = _mm512_loadu_si512(xq[j] + u * kUnit + 64);
      __m512 xsv;
      if constexpr (GPU == 1) xsv = _mm512_set1_ps(xs[j][u]);
      else xsv = _mm512_maskz_loadu_ps(gmask, xs[j] + u * GPU);
      for (int i = 0; i < R; ++i) {
        __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], xl);
        d = _mm512_dpbusd_epi32(d, hi[i], xh);
        __m512 s;
        if constexpr (GPU == 1) s = _mm512_mul_ps(_mm512_set1_ps(ws[i][u]), xsv);
        else s = _mm512_permutexvar_ps(lane_group, _mm512_mul_ps(_mm512_maskz_loadu_ps(gmask, ws[i] + u * GPU), xsv));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    const float* zr = w.zeros ? w.zeros + (r + i) * G : nullptr;
    for (int j = 0; j < T; ++j) {
      const float* zs = xa.zsum.data() + (t0 + tb + j) * G;
      float off = 0;
      for (int64_t g = 0; g < G; ++g) off += ws[i][g] * (zr ? zr[g] : 8.0f) * zs[g];
      y[(tb + j) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][j]) - off;
    }
  }
}

template <int R, int T>
HMOE_VNNI void block_q(const QActs& xa, int64_t t0, const Mat& w, int64_t r, int64_t tb, float* y, int64_t ldy) {
  if (w.quant == Quant::int8_channel) return block_q8<R, T>(xa, t0, w, r, tb, y, ldy);
  switch (w.group) {
    case 128: return block_q4<R, T, 1>(xa, t0, w, r, tb, y, ldy);
    case 64: return block_q4<R, T, 2>(xa, t0, w, r, tb, y, ldy);
    default: return block_q4<R, T, 4>(xa, t0, w, r, tb, y, ldy);
  }
}

template <int R>
HMOE_VNNI void rows_tokens_q(const QActs& xa, int64_t t0, int64_t n, const Mat& w, int64_t r, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) block_q<R, 4>(xa, t0, w, r, t, y, ldy);
  switch (n - t) {
    case 3: block_q<R, 3>(xa, t0, w, r, t, y, ldy); break;
    case 2: block_q<R, 2>(xa, t0, w, r, t, y, ldy); break;
    case 1: block_q<R, 1>(xa, t0, w, r, t, y, ldy); break;
    default: break;
  }
}

// Tokens 16 at a time (their int8 activations stay in L1/L2 while the rows pass).
HMOE_VNNI void rows_q_vnni(const QActs& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  constexpr int64_t kTokens = 16;
  for (int64_t tb = 0; tb < n; tb += kTokens) {
    const int64_t nt = std::min(kTokens, n - tb);
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) rows_tokens_q<4>(xa, t0 + tb, nt, w, r, y + tb * ldy, ldy);
    for (; r < r1; ++r) rows_tokens_q<1>(xa, t0 + tb, nt, w, r, y + tb * ldy, ldy);
  }
}

}  // namespace

bool has_vnni() { return g_vnni; }

bool int8_act_applies(const Mat& w) {
  if (!g_vnni || best_isa() != Isa::avx512) return false;
  if (w.cols % kUnit != 0) return false;
  return w.quant == Quant::int8_channel || (w.quant == Quant::int4_group && (w.group == 32 || w.group == 64 || w.group == 128));
}

void QActs::reset(int64_t rows, const Mat& w) {
  if (w.quant != Quant::int8_channel && w.quant != Quant::int4_group)
    fail(ErrorKind::invalid_argument, "QActs: weights " + mat_type_name(w) + " are not int8 or int4");
  if (w.cols % kUnit != 0) fail(ErrorKind::invalid_argument, "QActs: " + std::to_string(w.cols) + " columns are not a multiple of 128");
  n = rows;
  cols = w.cols;
  group = act_group(w);
  groups = cols / group;
  q4 = w.quant == Quant::int4_group;
  if (q.size() < static_cast<size_t>(n * cols)) q.resize(static_cast<size_t>(n * cols));
  if (scale.size() < static_cast<size_t>(n * groups)) {
    scale.resize(static_cast<size_t>(n * groups));
    zsum.resize(static_cast<size_t>(n * groups));
  }
}

namespace {

// One group (a multiple of 16 columns starting at column k0) quantized with
// AVX-512: vcvtps2dq rounds half to even as nearbyint does, so the codes equal
// the scalar loop's.
HMOE_VNNI void quantize_group_avx512(const float* src, int64_t k0, int64_t group, bool q4, int8_t* dst, float* scale, float* zsum) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < group; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(src + i)));
  const float amax = _mm512_reduce_max_ps(m);
  const float s = amax > 0 ? amax / 127.0f : 1.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
  const __m512 vinv = _mm512_set1_ps(inv);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t i = 0; i < group; i += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + i), vinv));
    sum = _mm512_add_epi32(sum, v);
    const int64_t k = k0 + i;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (q4 ? q4_pos(k) : k)), _mm512_cvtepi32_epi8(v));
  }
  *scale = s;
  *zsum = s * static_cast<float>(_mm512_reduce_add_epi32(sum));
}

}  // namespace

void QActs::quantize(int64_t t, const float* x) {
  int8_t* dst = q.data() + t * cols;
  if (g_vnni && best_isa() == Isa::avx512) {
    for (int64_t g = 0; g < groups; ++g)
      quantize_group_avx512(x + g * group, g * group, group, q4, dst, &scale[static_cast<size_t>(t * groups + g)],
                            &zsum[static_cast<size_t>(t * groups + g)]);
    return;
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float* src = x + g * group;
    float amax = 0;
    for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float s = amax > 0 ? amax / 127.0f : 1.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < group; ++i) {
      const int v = static_cast<int>(std::nearbyint(std::clamp(src[i] * inv, -127.0f, 127.0f)));
      sum += v;
      const int64_t k = g * group + i;
      dst[q4 ? q4_pos(k) : k] = static_cast<int8_t>(v);
    }
    scale[static_cast<size_t>(t * groups + g)] = s;
    zsum[static_cast<size_t>(t * groups + g)] = s * static_cast<float>(sum);
  }
}

void QActs::copy_row(int64_t t, const QActs& src, int64_t ts) {
  std::copy_n(src.q.data() + ts * cols, cols, q.data() + t * cols);
  std::copy_n(src.scale.data() + ts * groups, groups, scale.data() + t * groups);
  std::copy_n(src.zsum.data() + ts * groups, groups, zsum.data() + t * groups);
}

int8_t QActs::at(int64_t t, int64_t k) const { return q[static_cast<size_t>(t * cols + (q4 ? q4_pos(k) : k))]; }

void gemm_rows_q_reference(const QActs& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int64_t G = xa.groups, gs = xa.group;
  const bool q8 = w.quant == Quant::int8_channel;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = t0 + t;
      double s = 0;
      for (int64_t g = 0; g < G; ++g) {
        int64_t isum = 0, qsum = 0;
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
          const int xq = xa.at(row, k);
          const int wq = q8 ? reinterpret_cast<const int8_t*>(w.row(r))[k] : q4_code(w, r, k);
          isum += static_cast<int64_t>(wq) * xq;
          qsum += xq;
        }
        const double xs = xa.scale[static_cast<size_t>(row * G + g)];
        if (q8) {
          s += xs * static_cast<double>(isum);
        } else {
          const int64_t wg = r * w.groups() + g;
          const double z = w.zeros ? w.zeros[wg] : 8.0;
          s += static_cast<double>(w.scales[wg]) * xs * (static_cast<double>(isum) - z * static_cast<double>(qsum));
        }
      }
      if (q8) s *= w.scales[r];
      y[t * ldy + r] = static_cast<float>(s);
    }
}

void gemm_rows_q(const QActs& xa, int64_t t0, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  if (xa.cols != w.cols || xa.group != act_group(w) || xa.q4 != (w.quant == Quant::int4_group))
    fail(ErrorKind::invalid_argument, "gemm_rows_q: activations quantized for other weights than " + mat_type_name(w));
  if (int8_act_applies(w)) rows_q_vnni(xa, t0, n, w, r0, r1, y, ldy);
  else gemm_rows_q_reference(xa, t0, n, w, r0, r1, y, ldy);
}

}  // namespace hmoe::cpu
