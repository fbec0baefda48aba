// Dispatch, scalar paths, weight-view checks and quantization. The SIMD
// micro-kernels live in kernels_avx512.cpp and kernels_avx2.cpp.
#include "numa/kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "configs/error.h"
#include "numa/detail/kernels_impl.h"
#include "numa/quant_gguf.h"
#include "numa/quant_gguf_amx.h"
#include "numa/quant_gguf_q8.h"

namespace hmoe::cpu {

namespace {

Isa detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return Isa::avx2;
  return Isa::scalar;
}
Isa g_isa = detect();

bool detect_bf16() {
  // CPUID.(EAX=7,ECX=1):EAX bit 5 = AVX512_BF16 (gcc 12's __builtin_cpu_supports does not know it).
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  return detect() == Isa::avx512 && (a & (1u << 5)) != 0;
}
const bool g_has_bf16 = detect_bf16();

inline float plain_at(DType t, const uint8_t* p, int64_t k) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
    case DType::f16: return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
    default: return reinterpret_cast<const float*>(p)[k];
  }
}

}  // namespace

namespace detail {

// Any view, one row dequantized to fp32 at a time (the scalar path; row_to_f32).
void rows_scalar(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    row_to_f32(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * ldx;
      float s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += xt[k] * row[static_cast<size_t>(k)];
      y[t * ldy + r] = s;
    }
  }
}


Fmt fmt_of(const Mat& w) {
  if (w.quant == Quant::int8_channel) return Fmt::q8;
  if (w.quant == Quant::int4_group) return Fmt::q4;
  if (w.dtype == DType::bf16) return Fmt::bf16;
  if (w.dtype == DType::f16) return Fmt::f16;
  return Fmt::f32;
}

float weight_at(const Mat& w, int64_t r, int64_t k) {
  const uint8_t* p = w.row(r);
  switch (w.quant) {
    case Quant::int8_channel: return static_cast<float>(reinterpret_cast<const int8_t*>(p)[k]) * w.scales[r];
    case Quant::int4_group: {
      const uint8_t byte = p[(k >> 5) * 16 + (k & 15)];
      const float q = static_cast<float>((k & 16) ? (byte >> 4) : (byte & 15));
      const int64_t g = r * w.groups() + k / w.group;
      const float z = w.zeros ? w.zeros[g] : 8.0f;
      return (q - z) * w.scales[g];
    }
    case Quant::ext: return ext_weight_at(w, r, k);
    default: return plain_at(w.dtype, p, k);
  }
}

}  // namespace detail

Isa best_isa() { return g_isa; }
const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512" : isa == Isa::avx2 ? "avx2" : "scalar"; }
Isa set_isa_for_testing(Isa isa) {
  Isa old = g_isa;
  g_isa = std::min(isa, detect());
  return old;
}
bool has_bf16_dot() { return g_has_bf16; }

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t k = 0; k < n; ++k) dst[k] = plain_at(t, p, k);
}

void row_to_f32(const Mat& w, int64_t r, float* dst) {
  if (w.quant == Quant::none) return to_f32(w.dtype, w.row(r), dst, w.cols);
  if (w.quant == Quant::ext) return ext_row_to_f32(w, r, dst);
  for (int64_t k = 0; k < w.cols; ++k) dst[k] = detail::weight_at(w, r, k);
}

void gemm_rows(const float* x, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  if (w.quant == Quant::ext) return ext_gemm_rows(x, ldx, n, w, r0, r1, y, ldy);
  switch (g_isa) {
    case Isa::avx512: detail::rows_avx512(x, ldx, n, w, r0, r1, y, ldy); break;
    case Isa::avx2: detail::rows_avx2(x, ldx, n, w, r0, r1, y, ldy); break;
    default: detail::rows_scalar(x, ldx, n, w, r0, r1, y, ldy); break;
  }
}

void gemm_rows_bf16dot(const uint16_t* xb, int64_t ldx, int64_t n, const Mat& w, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  if (r1 <= r0 || n <= 0) return;
  if (g_has_bf16 && g_isa == Isa::avx512 && w.quant == Quant::none && w.dtype == DType::bf16) {
    detail::rows_bf16dot_avx512(xb, ldx, n, w, r0, r1, y, ldy);
    return;
  }
  std::vector<float> xf(static_cast<size_t>(n * w.cols));
  for (int64_t t = 0; t < n; ++t) to_f32(DType::bf16, xb + t * ldx, xf.data() + t * w.cols, w.cols);
  gemm_rows(xf.data(), w.cols, n, w, r0, r1, y, ldy);
}

void gemm_split_input(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool, const GemmOptions& o) {
  if (!o.round_bf16 || !o.split_inputs) {
    gemm(x, n, w, y, pool, o);
    return;
  }
  const size_t count = static_cast<size_t>(n * w.cols);
  std::vector<float> hi(count), lo(count), y_lo(static_cast<size_t>(n * w.rows));
  for (size_t i = 0; i < count; ++i) {
    hi[i] = round_bf16(x[i]);
    lo[i] = round_bf16(x[i] - hi[i]);
  }
  gemm_exact(hi.data(), n, w, y, pool);
  gemm_exact(lo.data(), n, w, y_lo.data(), pool);
  for (size_t i = 0; i < y_lo.size(); ++i) y[i] += y_lo[i];
}

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

void gemm(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool, const GemmOptions& o) {
  if (o.round_bf16) {
    std::vector<float> xr(static_cast<size_t>(n * w.cols));
    for (size_t i = 0; i < xr.size(); ++i) xr[i] = round_bf16(x[i]);
    gemm_exact(xr.data(), n, w, y, pool);
    return;
  }
  if (o.gguf_int8 && gguf_q8_applies(w)) {
    if (o.amx_min_tokens > 0 && n >= o.amx_min_tokens && amx_applies(w)) gemm_amx(x, n, w, y, pool);
    else gemm_q8(x, n, w, y, pool);
    return;
  }
  gemm_exact(x, n, w, y, pool);
}

void gemm_exact(const float* x, int64_t n, const Mat& w, float* y, numa::ThreadPool* pool) {
  // Row blocks of 16 keep the 4-row micro-kernel busy and give enough chunks.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (w.rows + kBlock - 1) / kBlock;
  auto body = [&](int64_t b0, int64_t b1, int) {
    gemm_rows(x, w.cols, n, w, b0 * kBlock, std::min(w.rows, b1 * kBlock), y, w.rows);
  };
  if (pool && w.rows * w.cols * n >= 32768) pool->parallel_for(blocks, body);
  else body(0, blocks, 0);
}

void gemm_reference(const float* x, int64_t n, const Mat& w, float* y) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(x[t * w.cols + k]) * detail::weight_at(w, r, k);
      y[t * w.rows + r] = static_cast<float>(s);
    }
}

// ---- quantization -----------------------------------------------------------
QuantMat quantize_int8(const float* w, int64_t rows, int64_t cols) {
  QuantMat q;
  q.data.resize(static_cast<size_t>(rows * cols));
  q.scales.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(w[r * cols + k]));
    const float s = amax > 0 ? amax / 127.0f : 1.0f;
    q.scales[static_cast<size_t>(r)] = s;
    for (int64_t k = 0; k < cols; ++k) {
      const float v = std::nearbyint(w[r * cols + k] / s);
      q.data[static_cast<size_t>(r * cols + k)] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f)));
    }
  }
  q.view = Mat{DType::i8, q.data.data(), rows, cols, Quant::int8_channel, q.scales.data(), nullptr, 0};
  return q;
}

QuantMat quantize_int4(const float* w, int64_t rows, int64_t cols, int group, bool asymmetric) {
  QuantMat q;
  Mat probe{DType::u8, nullptr, rows, cols, Quant::int4_group, nullptr, nullptr, group};
  if (group != 32 && group != 64 && group != 128) check_mat(probe, "quantize_int4");
  if (cols % group != 0) check_mat(probe, "quantize_int4");
  const int64_t G = cols / group;
  q.data.assign(static_cast<size_t>(rows * cols / 2), 0);
  q.scales.resize(static_cast<size_t>(rows * G));
  if (asymmetric) q.zeros.resize(static_cast<size_t>(rows * G));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const float* src = w + r * cols + g * group;
      float lo = src[0], hi = src[0], amax = 0;
      for (int i = 0; i < group; ++i) {
        lo = std::min(lo, src[i]);
        hi = std::max(hi, src[i]);
        amax = std::max(amax, std::fabs(src[i]));
      }
      float s, z;
      if (asymmetric) {
        s = hi > lo ? (hi - lo) / 15.0f : 1.0f;
        z = std::clamp(std::nearbyint(-lo / s), 0.0f, 15.0f);
        q.zeros[static_cast<size_t>(r * G + g)] = z;
      } else {
        s = amax > 0 ? amax / 7.0f : 1.0f;
        z = 8.0f;
      }
      q.scales[static_cast<size_t>(r * G + g)] = s;
      for (int i = 0; i < group; ++i) {
        const int64_t k = g * group + i;
        const int v = static_cast<int>(std::clamp(std::nearbyint(src[i] / s + z), 0.0f, 15.0f));
        uint8_t& byte = q.data[static_cast<size_t>(r * cols / 2 + (k >> 5) * 16 + (k & 15))];
        byte = static_cast<uint8_t>((k & 16) ? (byte | (v << 4)) : (byte | v));
      }
    }
  q.view = Mat{DType::u8, q.data.data(), rows, cols, Quant::int4_group, q.scales.data(), asymmetric ? q.zeros.data() : nullptr, group};
  return q;
}

}  // namespace hmoe::cpu
