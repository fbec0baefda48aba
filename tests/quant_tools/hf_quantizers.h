// Quantizers for Hugging Face quantized layouts, written from the formats'
// published descriptions (AutoGPTQ qweight/qzeros/scales/g_idx, AutoAWQ GEMM
// packing, compressed-tensors pack-quantized, DeepSeek-V3 FP8 block scales).
// Each returns the tensors as the checkpoint stores them plus the exact
// dequantized weights the loader must reproduce. Header-only (tests).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/safetensors_writer.h"
#include "tests/quant_tools/quantizers.h"

namespace hmoe::qtools {

struct HfQuantized {
  std::vector<io::TensorToWrite> tensors;  // named base + ".qweight" etc.
  std::vector<float> deq;                  // [out, in]
};

template <class T>
io::TensorToWrite tensor(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  io::TensorToWrite t{name, dt, std::move(shape), {}};
  t.bytes.resize(v.size() * sizeof(T));
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

inline float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }
inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// GPTQ (v1 "gptq" checkpoint format: zeros stored minus one).
inline HfQuantized quantize_gptq(const std::string& base, const float* w, int64_t out, int64_t in, int bits, int group, bool sym,
                                 bool desc_act, uint32_t seed) {
  const int per = 32 / bits, top = (1 << bits) - 1;
  const int64_t gs = group > 0 ? group : in, G = (in + gs - 1) / gs;
  std::vector<int32_t> g_idx(static_cast<size_t>(in));
  std::vector<int64_t> perm(static_cast<size_t>(in));
  std::iota(perm.begin(), perm.end(), 0);
  if (desc_act) std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  for (int64_t i = 0; i < in; ++i) g_idx[static_cast<size_t>(perm[static_cast<size_t>(i)])] = static_cast<int32_t>(i / gs);
  std::vector<uint16_t> scales(static_cast<size_t>(G * out));
  std::vector<int> zeros(static_cast<size_t>(G * out));
  for (int64_t n = 0; n < out; ++n)
    for (int64_t g = 0; g < G; ++g) {
      float lo = 0, hi = 0, amax = 0;
      for (int64_t k = 0; k < in; ++k)
        if (g_idx[static_cast<size_t>(k)] == g) {
          const float v = w[n * in + k];
          lo = std::min(lo, v), hi = std::max(hi, v), amax = std::max(amax, std::fabs(v));
        }
      float s;
      int z;
      if (sym) {
        s = round_f16(amax > 0 ? amax / static_cast<float>((top - 1) / 2) : 1.0f);
        z = (top + 1) / 2;
      } else {
        s = round_f16(hi > lo ? (hi - lo) / static_cast<float>(top) : 1.0f);
        z = std::clamp(rnd(-lo / s), 1, top);  // v1 stores z - 1 >= 0
      }
      scales[static_cast<size_t>(g * out + n)] = f32_to_f16(s);
      zeros[static_cast<size_t>(g * out + n)] = z;
    }
  HfQuantized r;
  r.deq.resize(static_cast<size_t>(out * in));
  std::vector<int32_t> qweight(static_cast<size_t>(in / per * out), 0), qzeros(static_cast<size_t>(G * out / per), 0);
  for (int64_t n = 0; n < out; ++n)
    for (int64_t k = 0; k < in; ++k) {
      const int64_t g = g_idx[static_cast<size_t>(k)];
      const float s = f16_to_f32(scales[static_cast<size_t>(g * out + n)]);
      const int z = zeros[static_cast<size_t>(g * out + n)];
      const int q = std::clamp(rnd(w[n * in + k] / s) + z, 0, top);
      qweight[static_cast<size_t>((k / per) * out + n)] |= static_cast<int32_t>(static_cast<uint32_t>(q) << (bits * (k % per)));
      r.deq[static_cast<size_t>(n * in + k)] = static_cast<float>(q - z) * s;
    }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n = 0; n < out; ++n)
      qzeros[static_cast<size_t>(g * (out / per) + n / per)] |=
          static_cast<int32_t>(static_cast<uint32_t>(zeros[static_cast<size_t>(g * out + n)] - 1) << (bits * (n % per)));
  r.tensors.push_back(tensor(base + ".qweight", DType::i32, {in / per, out}, qweight));
  r.tensors.push_back(tensor(base + ".qzeros", DType::i32, {G, out / per}, qzeros));
  r.tensors.push_back(tensor(base + ".scales", DType::f16, {G, out}, scales));
  r.tensors.push_back(tensor(base + ".g_idx", DType::i32, {in}, g_idx));
  return r;
}

// AutoAWQ GEMM: asymmetric 4-bit, packed along out in the order 0,2,4,6,1,3,5,7.
inline HfQuantized quantize_awq(const std::string& base, const float* w, int64_t out, int64_t in, int group) {
  static constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  const int64_t G = in / group;
  std::vector<uint16_t> scales(static_cast<size_t>(G * out));
  std::vector<int> zeros(static_cast<size_t>(G * out)), q(static_cast<size_t>(in * out));
  HfQuantized r;
  r.deq.resize(static_cast<size_t>(out * in));
  for (int64_t n = 0; n < out; ++n)
    for (int64_t g = 0; g < G; ++g) {
      float lo = 0, hi = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) lo = std::min(lo, w[n * in + k]), hi = std::max(hi, w[n * in + k]);
      const float s = round_f16(hi > lo ? (hi - lo) / 15.0f : 1.0f);
      const int z = std::clamp(rnd(-lo / s), 0, 15);
      scales[static_cast<size_t>(g * out + n)] = f32_to_f16(s);
      zeros[static_cast<size_t>(g * out + n)] = z;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) {
        const int v = std::clamp(rnd(w[n * in + k] / s) + z, 0, 15);
        q[static_cast<size_t>(k * out + n)] = v;
        r.deq[static_cast<size_t>(n * in + k)] = static_cast<float>(v - z) * s;
      }
    }
  auto pack = [&](const std::vector<int>& v, int64_t rows) {
    std::vector<int32_t> p(static_cast<size_t>(rows * out / 8), 0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < out / 8; ++c)
        for (int j = 0; j < 8; ++j)
          p[static_cast<size_t>(i * (out / 8) + c)] |=
              static_cast<int32_t>(static_cast<uint32_t>(v[static_cast<size_t>(i * out + c * 8 + kOrder[j])]) << (4 * j));
    return p;
  };
  r.tensors.push_back(tensor(base + ".qweight", DType::i32, {in, out / 8}, pack(q, in)));
  r.tensors.push_back(tensor(base + ".qzeros", DType::i32, {G, out / 8}, pack(zeros, G)));
  r.tensors.push_back(tensor(base + ".scales", DType::f16, {G, out}, scales));
  return r;
}

// compressed-tensors pack-quantized, symmetric; group -1 = channel strategy.
inline HfQuantized quantize_ct(const std::string& base, const float* w, int64_t out, int64_t in, int bits, int group) {
  const int per = 32 / bits, qmax = (1 << (bits - 1)) - 1, off = 1 << (bits - 1);
  const int64_t gs = group > 0 ? group : in, G = (in + gs - 1) / gs;
  std::vector<uint16_t> scales(static_cast<size_t>(out * G));
  std::vector<int32_t> packed(static_cast<size_t>(out * ((in + per - 1) / per)), 0);
  HfQuantized r;
  r.deq.resize(static_cast<size_t>(out * in));
  for (int64_t n = 0; n < out; ++n)
    for (int64_t g = 0; g < G; ++g) {
      float amax = 0;
      for (int64_t k = g * gs; k < std::min(in, (g + 1) * gs); ++k) amax = std::max(amax, std::fabs(w[n * in + k]));
      const float s = round_bf16(amax > 0 ? amax / static_cast<float>(qmax) : 1.0f);
      scales[static_cast<size_t>(n * G + g)] = f32_to_bf16(s);
      for (int64_t k = g * gs; k < std::min(in, (g + 1) * gs); ++k) {
        const int v = std::clamp(rnd(w[n * in + k] / s), -off, qmax);
        packed[static_cast<size_t>(n * ((in + per - 1) / per) + k / per)] |=
            static_cast<int32_t>(static_cast<uint32_t>(v + off) << (bits * (k % per)));
        r.deq[static_cast<size_t>(n * in + k)] = static_cast<float>(v) * s;
      }
    }
  r.tensors.push_back(tensor(base + ".weight_packed", DType::i32, {out, (in + per - 1) / per}, packed));
  r.tensors.push_back(tensor(base + ".weight_scale", DType::bf16, {out, G}, scales));
  r.tensors.push_back(tensor(base + ".weight_shape", DType::i64, {2}, std::vector<int64_t>{out, in}));
  return r;
}

// FP8 e4m3 with [bo, bi] block scales (weight_scale_inv multiplies).
inline HfQuantized quantize_fp8(const std::string& base, const float* w, int64_t out, int64_t in, int bo, int bi) {
  const int64_t RB = (out + bo - 1) / bo, CB = (in + bi - 1) / bi;
  std::vector<float> sinv(static_cast<size_t>(RB * CB));
  std::vector<uint8_t> q(static_cast<size_t>(out * in));
  HfQuantized r;
  r.deq.resize(static_cast<size_t>(out * in));
  for (int64_t rb = 0; rb < RB; ++rb)
    for (int64_t cb = 0; cb < CB; ++cb) {
      float amax = 0;
      for (int64_t n = rb * bo; n < std::min(out, (rb + 1) * bo); ++n)
        for (int64_t k = cb * bi; k < std::min(in, (cb + 1) * bi); ++k) amax = std::max(amax, std::fabs(w[n * in + k]));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      sinv[static_cast<size_t>(rb * CB + cb)] = s;
      for (int64_t n = rb * bo; n < std::min(out, (rb + 1) * bo); ++n)
        for (int64_t k = cb * bi; k < std::min(in, (cb + 1) * bi); ++k) {
          const uint8_t b = f32_to_fp8_e4m3(w[n * in + k] / s);
          q[static_cast<size_t>(n * in + k)] = b;
          r.deq[static_cast<size_t>(n * in + k)] = cpu::fp8_e4m3_to_f32(b) * s;
        }
    }
  r.tensors.push_back(tensor(base + ".weight", DType::f8_e4m3, {out, in}, q));
  r.tensors.push_back(tensor(base + ".weight_scale_inv", DType::f32, {RB, CB}, sinv));
  return r;
}

}  // namespace hmoe::qtools
