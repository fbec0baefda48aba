// The gated delta rule (see delta_rule.h). One body per way of computing
// it, written over a vector type of W floats (GCC vector extensions) and
// instantiated three times: in AVX-512 and AVX2/FMA functions (the bodies are
// always inlined, so they compile to those instructions) and in plain code.
#include "engine/ops/delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// The vector helpers are always inlined into their ISA-specific callers, so
// no vector value crosses a function boundary (the ABI note is moot).
#pragma GCC diagnostic ignored "-Wpsabi"

#define HMOE_DR_INLINE inline __attribute__((always_inline))
#define HMOE_DR_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,fma")))
#define HMOE_DR_AVX2 __attribute__((target("avx2,fma")))

namespace hmoe::ops {

namespace {

typedef float v4 __attribute__((vector_size(16)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v16 __attribute__((vector_size(64)));

template <class V>
HMOE_DR_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
HMOE_DR_INLINE void store(float* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// y[0..n) += a * x[0..n)
template <class V, int W>
HMOE_DR_INLINE void axpy(float* y, float a, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store<V>(y + i, load<V>(y + i) + a * load<V>(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}
// y[0..n) *= a
template <class V, int W>
HMOE_DR_INLINE void scale(float* y, float a, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) store<V>(y + i, load<V>(y + i) * a);
  for (; i < n; ++i) y[i] *= a;
}
// sum x[i] * y[i]
template <class V, int W>
HMOE_DR_INLINE float dot(const float* x, const float* y, int64_t n) {
  V acc = {};
  int64_t i = 0;
  for (; i + W <= n; i += W) acc += load<V>(x + i) * load<V>(y + i);
  float s = 0;
  for (int l = 0; l < W; ++l) s += acc[l];
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

template <class V, int W>
HMOE_DR_INLINE void recurrent_impl(const DeltaRuleArgs& a, float* S) {
  const int64_t dk = a.dk, dv = a.dv;
  thread_local std::vector<float> scratch;
  scratch.resize(static_cast<size_t>(dv));
  float* u = scratch.data();
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* q = a.q + t * a.ld_qk;
    const float* k = a.k + t * a.ld_qk;
    const float* v = a.v + t * a.ld_v;
    float* o = a.out + t * a.ld_o;
    const float decay = std::exp(a.g[t * a.ld_gb]), beta = a.beta[t * a.ld_gb];
    // u = S'^T k with S' = decay * S (S scaled on the way)
    std::fill(u, u + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      scale<V, W>(row, decay, dv);
      axpy<V, W>(u, k[i], row, dv);
    }
    for (int64_t j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
    std::fill(o, o + dv, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      axpy<V, W>(row, k[i], u, dv);
      axpy<V, W>(o, q[i], row, dv);
    }
  }
}

template <class V, int W>
HMOE_DR_INLINE void chunked_impl(const DeltaRuleArgs& a, float* S, int64_t chunk) {
  const int64_t dk = a.dk, dv = a.dv, C = std::max<int64_t>(chunk, 1);
  thread_local std::vector<float> buf;
  const size_t need = static_cast<size_t>(C + 2 * C * C + 3 * C * dv);
  if (buf.size() < need) buf.resize(need);
  float* G = buf.data();      // [C] running sum of g
  float* KK = G + C;          // [C][C] beta_i exp(G_i - G_j) k_i.k_j, j < i
  float* QK = KK + C * C;     // [C][C] exp(G_i - G_j) q_i.k_j, j <= i
  float* KS = QK + C * C;     // [C][dv] k_i^T S0, then u_i
  float* QS = KS + C * dv;    // [C][dv] q_i^T S0
  float* O = QS + C * dv;     // [C][dv] outputs of the chunk
  for (int64_t t0 = 0; t0 < a.tokens; t0 += C) {
    const int64_t c = std::min(C, a.tokens - t0);
    const float* q = a.q + t0 * a.ld_qk;
    const float* k = a.k + t0 * a.ld_qk;
    float acc = 0;
    for (int64_t i = 0; i < c; ++i) G[i] = acc += a.g[(t0 + i) * a.ld_gb];
    // k_i^T S0 and q_i^T S0
    std::fill(KS, KS + c * dv, 0.0f);
    std::fill(QS, QS + c * dv, 0.0f);
    for (int64_t i = 0; i < c; ++i) {
      const float* ki = k + i * a.ld_qk;
      const float* qi = q + i * a.ld_qk;
      float* ks = KS + i * dv;
      float* qs = QS + i * dv;
      for (int64_t r = 0; r < dk; ++r) {
        axpy<V, W>(ks, ki[r], S + r * dv, dv);
        axpy<V, W>(qs, qi[r], S + r * dv, dv);
      }
    }
    for (int64_t i = 0; i < c; ++i) {
      const float* ki = k + i * a.ld_qk;
      const float* qi = q + i * a.ld_qk;
      const float bi = a.beta[(t0 + i) * a.ld_gb];
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = k + j * a.ld_qk;
        const float d = std::exp(G[i] - G[j]);
        if (j < i) KK[i * C + j] = bi * d * dot<V, W>(ki, kj, dk);
        QK[i * C + j] = d * dot<V, W>(qi, kj, dk);
      }
    }
    // u_i = beta_i (v_i - exp(G_i) k_i^T S0) - sum_{j<i} KK[i][j] u_j (forward substitution, in KS)
    for (int64_t i = 0; i < c; ++i) {
      const float* vi = a.v + (t0 + i) * a.ld_v;
      const float bi = a.beta[(t0 + i) * a.ld_gb], gi = std::exp(G[i]);
      float* u = KS + i * dv;
      for (int64_t j = 0; j < dv; ++j) u[j] = bi * (vi[j] - gi * u[j]);
      for (int64_t j = 0; j < i; ++j) axpy<V, W>(u, -KK[i * C + j], KS + j * dv, dv);
    }
    // o_i = exp(G_i) q_i^T S0 + sum_{j<=i} QK[i][j] u_j
    for (int64_t i = 0; i < c; ++i) {
      float* o = O + i * dv;
      const float gi = std::exp(G[i]);
      const float* qs = QS + i * dv;
      for (int64_t j = 0; j < dv; ++j) o[j] = gi * qs[j];
      for (int64_t j = 0; j <= i; ++j) axpy<V, W>(o, QK[i * C + j], KS + j * dv, dv);
      std::memcpy(a.out + (t0 + i) * a.ld_o, o, static_cast<size_t>(dv) * sizeof(float));
    }
    // S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j u_j^T
    const float gl = G[c - 1];
    for (int64_t r = 0; r < dk; ++r) {
      float* row = S + r * dv;
      scale<V, W>(row, std::exp(gl), dv);
      for (int64_t j = 0; j < c; ++j) axpy<V, W>(row, std::exp(gl - G[j]) * k[j * a.ld_qk + r], KS + j * dv, dv);
    }
  }
}

HMOE_DR_AVX512 void recurrent_avx512(const DeltaRuleArgs& a, float* S) { recurrent_impl<v16, 16>(a, S); }
HMOE_DR_AVX2 void recurrent_avx2(const DeltaRuleArgs& a, float* S) { recurrent_impl<v8, 8>(a, S); }
void recurrent_plain(const DeltaRuleArgs& a, float* S) { recurrent_impl<v4, 4>(a, S); }
HMOE_DR_AVX512 void chunked_avx512(const DeltaRuleArgs& a, float* S, int64_t c) { chunked_impl<v16, 16>(a, S, c); }
HMOE_DR_AVX2 void chunked_avx2(const DeltaRuleArgs& a, float* S, int64_t c) { chunked_impl<v8, 8>(a, S, c); }
void chunked_plain(const DeltaRuleArgs& a, float* S, int64_t c) { chunked_impl<v4, 4>(a, S, c); }

enum class Isa { avx512, avx2, plain };
Isa isa() {
  static const Isa i = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") ? Isa::avx512
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")     ? Isa::avx2
                                                                                              : Isa::plain;
  return i;
}

}  // namespace

void delta_rule_recurrent(const DeltaRuleArgs& a, float* S) {
  switch (isa()) {
    case Isa::avx512: return recurrent_avx512(a, S);
    case Isa::avx2: return recurrent_avx2(a, S);
    case Isa::plain: return recurrent_plain(a, S);
  }
}

void delta_rule_chunked(const DeltaRuleArgs& a, float* S, int64_t chunk) {
  switch (isa()) {
    case Isa::avx512: return chunked_avx512(a, S, chunk);
    case Isa::avx2: return chunked_avx2(a, S, chunk);
    case Isa::plain: return chunked_plain(a, S, chunk);
  }
}

const char* delta_rule_isa() {
  switch (isa()) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::plain: return "scalar";
  }
  return "scalar";
}

void delta_rule_reference(const DeltaRuleArgs& a, double* S) {
  const int64_t dk = a.dk, dv = a.dv;
  std::vector<double> u(static_cast<size_t>(dv));
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float* q = a.q + t * a.ld_qk;
    const float* k = a.k + t * a.ld_qk;
    const float* v = a.v + t * a.ld_v;
    const double decay = std::exp(static_cast<double>(a.g[t * a.ld_gb])), beta = a.beta[t * a.ld_gb];
    for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
    for (int64_t j = 0; j < dv; ++j) {
      double m = 0;
      for (int64_t i = 0; i < dk; ++i) m += S[i * dv + j] * k[i];
      u[static_cast<size_t>(j)] = beta * (v[j] - m);
    }
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * u[static_cast<size_t>(j)];
    for (int64_t j = 0; j < dv; ++j) {
      double o = 0;
      for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
      a.out[t * a.ld_o + j] = static_cast<float>(o);
    }
  }
}

}  // namespace hmoe::ops
