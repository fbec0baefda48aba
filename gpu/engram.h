// CUDA kernels of the Engram n-gram memory modules (engine/layers/engram_gpu.h),
// as plain launchers on device pointers; fp32 arithmetic throughout (the
// key/value products themselves are gpu::Blas bf16 products). Each launcher
// is asynchronous on `s` and throws Error(device) when the launch fails; in a
// build without CUDA (engram_nocuda.cpp) each throws Error(unsupported).
// The CPU reference is EngramModules::apply (engine/engram.cpp).
#pragma once
#include <cstdint>

#include "gpu/memory.h"

namespace hmoe::gpu {

// Per row i < n of width h:
//   if d: x[i] += d[i] (stored);
//   k = RMSNorm(proj[i, 0:h] + key_b; key_norm, eps),
//   q = RMSNorm(x[i]; query_norm, eps),
//   s = <k, q> / sqrt(h), g = sigmoid(sign(s) sqrt(max(|s|, 1e-6))),
//   v[i] = g * (proj[i, h:2h] + value_b),  vn[i] = RMSNorm(v[i]; conv_norm, conv_eps).
// proj: [n, 2h] (key then value products, before bias); weights fp32 [h].
void engram_gate(float* x, const float* d, const float* proj, int64_t n, int64_t h, const float* key_b, const float* value_b,
                 const float* key_norm, const float* query_norm, const float* conv_norm, float eps, float conv_eps, float* v, float* vn,
                 Stream& s);

// Causal depthwise conv and residual: per row i < n and channel c < h,
//   a = sum_{j < k} conv_w[c * k + j] * in_j[c],   x[i, c] += v[i, c] + silu(a),
// where src[i * k + j] says where in_j is: >= 0 that row of vn (rows of h
// floats, any row, not only i < n), -1 zero, -2 - r row r of `hist` (rows
// hist_stride floats apart). v, x: [n, h].
void engram_conv(const float* v, const float* vn, const float* hist, int64_t hist_stride, const int32_t* src, const float* conv_w,
                 int64_t n, int64_t h, int64_t k, float* x, Stream& s);

// hist[dst[i] * hist_stride + m * h + c] = vn[(m * n + i) * h + c] for every
// module m < modules, row i < n with dst[i] >= 0, c < h (dst rows distinct).
void engram_store(const float* vn, int64_t n, int64_t h, int64_t modules, const int32_t* dst, float* hist, int64_t hist_stride,
                  Stream& s);

}  // namespace hmoe::gpu
