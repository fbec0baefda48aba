// The gated delta rule in double for one sequence's tokens, every value head
// (ops::delta_rule_reference per head): the tests' reference for the GPU's
// chunked kernels and for v4's CPU emulation; and the q/k normalisation of a
// conv row as deltanet_prepare leaves it, which the tests' inputs share.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/ops/delta_rule.h"

namespace hmoe::test {

// Tokens [st, st + tokens) of conv ([token][2 nk dk + nv dv]: q heads, k heads, v heads; a key head serves nv / nk
// value heads), gate and beta ([token][nv]): out rows [st, st + tokens) of [token][nv dv], state [nv][dk][dv] fp32
// read as it is (zero it for a new sequence) and updated.
inline void delta_rule_heads(int64_t nk, int64_t nv, int64_t dk, int64_t dv, const float* conv, const float* gate, const float* beta, int64_t st,
                             int64_t tokens, float* out, float* state) {
  const int64_t K = nk * dk, V = nv * dv, cd = 2 * K + V, hs = dk * dv;
  for (int64_t hv = 0; hv < nv; ++hv) {
    ops::DeltaRuleArgs a;
    a.q = conv + st * cd + hv / (nv / nk) * dk;
    a.k = a.q + K;
    a.ld_qk = cd;
    a.v = conv + st * cd + 2 * K + hv * dv;
    a.ld_v = cd;
    a.g = gate + st * nv + hv;
    a.beta = beta + st * nv + hv;
    a.ld_gb = nv;
    a.out = out + st * V + hv * dv;
    a.ld_o = V;
    a.tokens = tokens;
    a.dk = dk;
    a.dv = dv;
    float* s = state + hv * hs;
    std::vector<double> sd(s, s + hs);
    ops::delta_rule_reference(a, sd.data());
    for (int64_t i = 0; i < hs; ++i) s[i] = static_cast<float>(sd[static_cast<size_t>(i)]);
  }
}

// One token's conv row ([2 nk dk + ...]: q heads, k heads, ...) as deltanet_prepare leaves it: each of the 2 nk
// heads of dk values x / sqrt(sum x^2 + 1e-6) (the sum in double), q heads also / sqrt(dk); in place.
inline void normalize_qk(float* row, int64_t nk, int64_t dk) {
  for (int64_t h = 0; h < 2 * nk; ++h) {
    float* x = row + h * dk;
    double ss = 0;
    for (int64_t j = 0; j < dk; ++j) ss += static_cast<double>(x[j]) * x[j];
    const double inv = 1.0 / std::sqrt(ss + 1e-6) * (h < nk ? 1.0 / std::sqrt(static_cast<double>(dk)) : 1.0);
    for (int64_t j = 0; j < dk; ++j) x[j] = static_cast<float>(x[j] * inv);
  }
}

}  // namespace hmoe::test
