// The gated delta rule in double for one sequence's tokens, every value head
// (ops::delta_rule_reference per head): the tests' reference for the GPU's
// chunked kernels and for v4's CPU emulation.
#pragma once
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

}  // namespace hmoe::test
