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

// C[m x n] += A[m x k] B[k x n] (row-major with leading dimensions), four
// rows of C at a time so that each loaded vector of B feeds four FMAs.
template <class V, int W>
HMOE_DR_INLINE void mm_acc(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t m, int64_t n, int64_t k) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const float* a0 = A + i * lda;
    const float* a1 = a0 + lda;
    const float* a2 = a1 + lda;
    const float* a3 = a2 + lda;
    float* c0 = C + i * ldc;
    int64_t j = 0;
    for (; j + W <= n; j += W) {
      V s0 = load<V>(c0 + j), s1 = load<V>(c0 + ldc + j), s2 = load<V>(c0 + 2 * ldc + j), s3 = load<V>(c0 + 3 * ldc + j);
      for (int64_t r = 0; r < k; ++r) {
        const V b = load<V>(B + r * ldb + j);
        s0 += a0[r] * b;
        s1 += a1[r] * b;
        s2 += a2[r] * b;
        s3 += a3[r] * b;
      }
      store<V>(c0 + j, s0);
      store<V>(c0 + ldc + j, s1);
      store<V>(c0 + 2 * ldc + j, s2);
      store<V>(c0 + 3 * ldc + j, s3);
    }
    for (; j < n; ++j)
      for (int64_t r = 0; r < k; ++r) {
        const float b = B[r * ldb + j];
        c0[j] += a0[r] * b;
        c0[ldc + j] += a1[r] * b;
        c0[2 * ldc + j] += a2[r] * b;
        c0[3 * ldc + j] += a3[r] * b;
      }
  }
  for (; i < m; ++i)
    for (int64_t r = 0; r < k; ++r) axpy<V, W>(C + i * ldc, A[i * lda + r], B + r * ldb, n);
}

template <class V, int W>
HMOE_DR_INLINE void chunked_impl(const DeltaRuleArgs& a, float* S, int64_t chunk) {
  const int64_t dk = a.dk, dv = a.dv, C = std::max<int64_t>(chunk, 1);
  thread_local std::vector<float> buf;
  const size_t need = static_cast<size_t>(C + 3 * C * C + 2 * C * dk + 2 * C * dv + dk * C);
  if (buf.size() < need) buf.resize(need);
  float* G = buf.data();      // [C] running sum of g
  float* KK = G + C;          // [C][C] k_i.k_j, then beta_i exp(G_i - G_j) k_i.k_j (j < i)
  float* QK = KK + C * C;     // [C][C] q_i.k_j, then exp(G_i - G_j) q_i.k_j (j <= i, 0 above)
  float* Kt = QK + C * C;     // [dk][C] k transposed; later exp(G_last - G_j) k_j transposed
  float* Kc = Kt + dk * C;    // [C][dk] the chunk's k rows, packed
  float* Qc = Kc + C * dk;    // [C][dk] the chunk's q rows, packed
  float* U = Qc + C * dk;     // [C][dv] k_i^T S0, then u_i
  float* O = U + C * dv;      // [C][dv] q_i^T S0, then the outputs
  for (int64_t t0 = 0; t0 < a.tokens; t0 += C) {
    const int64_t c = std::min(C, a.tokens - t0);
    float acc = 0;
    for (int64_t i = 0; i < c; ++i) G[i] = acc += a.g[(t0 + i) * a.ld_gb];
    for (int64_t i = 0; i < c; ++i) {
      std::memcpy(Kc + i * dk, a.k + (t0 + i) * a.ld_qk, static_cast<size_t>(dk) * sizeof(float));
      std::memcpy(Qc + i * dk, a.q + (t0 + i) * a.ld_qk, static_cast<size_t>(dk) * sizeof(float));
      for (int64_t r = 0; r < dk; ++r) Kt[r * C + i] = Kc[i * dk + r];
    }
    // k_i^T S0, q_i^T S0, k_i.k_j, q_i.k_j as small matrix products.
    std::fill(U, U + c * dv, 0.0f);
    std::fill(O, O + c * dv, 0.0f);
    std::fill(KK, KK + c * C, 0.0f);
    std::fill(QK, QK + c * C, 0.0f);
    mm_acc<V, W>(Kc, dk, S, dv, U, dv, c, dv, dk);
    mm_acc<V, W>(Qc, dk, S, dv, O, dv, c, dv, dk);
    mm_acc<V, W>(Kc, dk, Kt, C, KK, C, c, c, dk);
    mm_acc<V, W>(Qc, dk, Kt, C, QK, C, c, c, dk);
    for (int64_t i = 0; i < c; ++i) {
      const float bi = a.beta[(t0 + i) * a.ld_gb];
      for (int64_t j = 0; j < c; ++j) {
        const float d = j <= i ? std::exp(G[i] - G[j]) : 0.0f;
        KK[i * C + j] *= j < i ? bi * d : 0.0f;
        QK[i * C + j] *= d;
      }
    }
    // u_i = beta_i (v_i - exp(G_i) k_i^T S0) - sum_{j<i} KK[i][j] u_j (forward substitution, in U)
    for (int64_t i = 0; i < c; ++i) {
      const float* vi = a.v + (t0 + i) * a.ld_v;
      const float bi = a.beta[(t0 + i) * a.ld_gb], gi = std::exp(G[i]);
      float* u = U + i * dv;
      for (int64_t j = 0; j < dv; ++j) u[j] = bi * (vi[j] - gi * u[j]);
      for (int64_t j = 0; j < i; ++j) axpy<V, W>(u, -KK[i * C + j], U + j * dv, dv);
    }
    // o_i = exp(G_i) q_i^T S0 + sum_{j<=i} QK[i][j] u_j
    for (int64_t i = 0; i < c; ++i) scale<V, W>(O + i * dv, std::exp(G[i]), dv);
    mm_acc<V, W>(QK, C, U, dv, O, dv, c, dv, c);
    for (int64_t i = 0; i < c; ++i) std::memcpy(a.out + (t0 + i) * a.ld_o, O + i * dv, static_cast<size_t>(dv) * sizeof(float));
    // S = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j u_j^T
    const float gl = G[c - 1];
    for (int64_t j = 0; j < c; ++j) {
      const float d = std::exp(gl - G[j]);
      for (int64_t r = 0; r < dk; ++r) Kt[r * C + j] *= d;
    }
    scale<V, W>(S, std::exp(gl), dk * dv);
    mm_acc<V, W>(Kt, C, U, dv, S, dv, dk, dv, c);
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
