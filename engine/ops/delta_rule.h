// The gated delta rule of Gated DeltaNet (Qwen3-Next's linear attention),
// one head at a time, on the CPU. Per token t, with the head's state S
// [dk][dv] (fp32, kept by the caller across calls):
//   S    = exp(g_t) * S
//   u_t  = beta_t * (v_t - S^T k_t)
//   S    = S + k_t u_t^T
//   o_t  = S^T q_t
// q and k come l2-normalised (q also scaled by 1/sqrt(dk)) and the decay
// g_t <= 0; that is the caller's job (engine/layers/gated_deltanet.h).
//
// Three ways to compute it, same meaning:
//  - recurrent: token by token (decode: one token per sequence);
//  - chunked: prefill. Within a chunk of C tokens the updates are solved at
//    once (u = (I + A)^-1 rhs, A strictly lower triangular with
//    A[i][j] = beta_i exp(G_i - G_j) k_i.k_j, G the running sum of g), the
//    outputs and the end-of-chunk state follow from u with matrix products;
//    chunks run one after the other;
//  - reference: the recurrence in double precision, for tests.
// Rows: token t's q/k at q + t*ld_qk, v at v + t*ld_v, out at out + t*ld_o,
// g and beta at g[t*ld_gb], beta[t*ld_gb]. The vector loops use AVX2/FMA or
// AVX-512 when the CPU has them (chosen at run time), else plain code.
// Thread safety: none needed; distinct heads may run concurrently.
#pragma once
#include <cstdint>

namespace hmoe::ops {

struct DeltaRuleArgs {
  const float* q = nullptr;
  const float* k = nullptr;
  int64_t ld_qk = 0;
  const float* v = nullptr;
  int64_t ld_v = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t ld_gb = 1;
  float* out = nullptr;
  int64_t ld_o = 0;
  int64_t tokens = 0, dk = 0, dv = 0;
};

// S: [dk][dv], updated in place to the state after the last token.
void delta_rule_recurrent(const DeltaRuleArgs& a, float* S);
// chunk: tokens per chunk (>= 1; 64 is the usual choice).
void delta_rule_chunked(const DeltaRuleArgs& a, float* S, int64_t chunk = 64);
// S: double state [dk][dv]; outputs rounded to float.
void delta_rule_reference(const DeltaRuleArgs& a, double* S);

// The vector width the dispatch chose ("avx512", "avx2" or "scalar").
const char* delta_rule_isa();

}  // namespace hmoe::ops
