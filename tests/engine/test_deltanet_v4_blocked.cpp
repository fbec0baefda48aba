// The GPU delta rule v4's blocked algorithm (gpu/deltanet_v4.cu), emulated
// step for step on the CPU, against the token-by-token recurrence
// (ops::delta_rule_reference, double) on random data. The emulation keeps
// the kernels' structure: chunk slots numbered over the groups' chunks in
// order (groups of at most max_recurrent tokens skipped), phase 1's record
// per (slot, value head) (Tb = (I + A)^-1 diag(beta) by the same 16 x 16
// blocked inverse, the masked decayed q.k, both written only in their tiles
// on and below the diagonal (the rest NaN here), the factors, zero on padded
// rows),
// then the walk per (group, value head, 32 value columns, zero-padded) with
// its three steps, the triangular products' k ranges and the fresh flag
// (K S and Q S summed over the two halves of the state rows apart, as the
// default, 16-warp walk does).
// Run in double (the algebra: agreement to rounding) and in float (the
// kernel's fp32 arithmetic: within the GPU tests' 1e-4 + 1e-3 relative);
// the harness and phase 1's record: tests/delta_rule_blocked.h.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "tests/delta_rule_blocked.h"

using namespace hmoe;
using namespace hmoe::test::blocked;

namespace {

// The v4 kernels' meaning for groups [0, gn) of ntok ordered tokens in one
// launch: states per group [nv][dk][dv] (updated; a fresh group's is read as
// zero), out [token][nv * dv] (only chunked groups' rows written).
template <class F>
void v4_emulate(const Shape& sh, const Inputs& in, const Groups& gr, int64_t ntok, int64_t max_rec, int64_t C, std::vector<float>& states,
                std::vector<float>& out) {
  const Launch lc(sh, gr, ntok, max_rec, C);
  const int64_t gn = lc.gn, slots = lc.slots, R = lc.R, cd = lc.cd, K = lc.K, V = lc.V;
  const std::vector<int64_t>& first = lc.first;
  std::vector<F> recs(static_cast<size_t>(slots * sh.nv * R), std::numeric_limits<F>::quiet_NaN());  // what is never written is never read
  for (int64_t g = 0; g < gn; ++g) {
    const int64_t cnt = gr.count[static_cast<size_t>(g)];
    if (cnt <= max_rec) continue;
    for (int64_t ci = 0; ci * C < cnt; ++ci) {
      const int64_t slot = first[static_cast<size_t>(g)] + ci;
      REQUIRE(slot < slots);
      for (int64_t hv = 0; hv < sh.nv; ++hv)
        prep_record<F>(sh, in, gr.start[static_cast<size_t>(g)] + ci * C, std::min(C, cnt - ci * C), hv, C, recs.data() + (slot * sh.nv + hv) * R);
    }
  }
  for_each_walk_block<F>(sh, gr, max_rec, states, [&](int64_t g, int64_t hv, int64_t c0, int64_t nc, std::vector<F>& S) {
    const int64_t cnt = gr.count[static_cast<size_t>(g)], st = gr.start[static_cast<size_t>(g)], hk = hv / (sh.nv / sh.nk);
    std::vector<F> Rm(static_cast<size_t>(C * kWalkCols)), U(Rm.size()), U2(Rm.size()), O(Rm.size());
    auto s = [&](int64_t r, int64_t c) -> F& { return S[static_cast<size_t>(r * kWalkCols + c)]; };
    for (int64_t ci = 0; ci * C < cnt; ++ci) {
      const int64_t t0 = st + ci * C, L = std::min(C, cnt - ci * C);
      const F* rec = recs.data() + ((first[static_cast<size_t>(g)] + ci) * sh.nv + hv) * R;
      const F* Tb = rec;
      const F* QK = rec + C * C;
      const F* Fc = QK + C * C;
      auto row = [&](int64_t i, int64_t off, int64_t r) {
        return i < L ? static_cast<F>(in.conv[static_cast<size_t>((t0 + i) * cd + off + hk * sh.dk + r)]) : F(0);
      };
      auto v = [&](int64_t i, int64_t c) {
        return i < L && c < nc ? static_cast<F>(in.conv[static_cast<size_t>((t0 + i) * cd + 2 * K + hv * sh.dv + c0 + c)]) : F(0);
      };
      // A: R = V - exp(G) K S, O = exp(G) Q S; K S and Q S as the 16-warp walk sums them, over each half of the
      // state rows apart (gpu/deltanet_v4_walk.cu; Q S in its step B).
      for (int64_t i = 0; i < C; ++i)
        for (int64_t c = 0; c < kWalkCols; ++c) {
          F ks[2] = {0, 0}, qs[2] = {0, 0};
          for (int64_t r = 0; r < sh.dk; ++r) {
            ks[2 * r / sh.dk] += row(i, K, r) * s(r, c);
            qs[2 * r / sh.dk] += row(i, 0, r) * s(r, c);
          }
          Rm[static_cast<size_t>(i * kWalkCols + c)] = v(i, c) - Fc[i] * (ks[0] + ks[1]);
          O[static_cast<size_t>(i * kWalkCols + c)] = Fc[i] * (qs[0] + qs[1]);
        }
      // B: u = Tb R over k < 16 (strip + 1); u2 = exp(G_last - G) u.
      for (int64_t i = 0; i < C; ++i)
        for (int64_t c = 0; c < kWalkCols; ++c) {
          F u = 0;
          for (int64_t m = 0; m < 16 * (i / 16 + 1); ++m) u += Tb[i * C + m] * Rm[static_cast<size_t>(m * kWalkCols + c)];
          U[static_cast<size_t>(i * kWalkCols + c)] = u;
          U2[static_cast<size_t>(i * kWalkCols + c)] = Fc[C + i] * u;
        }
      // C: S = exp(G_last) S + K^T u2; O += QKm u.
      for (int64_t r = 0; r < sh.dk; ++r)
        for (int64_t c = 0; c < kWalkCols; ++c) {
          F x = Fc[2 * C] * s(r, c);
          for (int64_t m = 0; m < C; ++m) x += row(m, K, r) * U2[static_cast<size_t>(m * kWalkCols + c)];
          s(r, c) = x;
        }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < nc; ++c) {
          F o = O[static_cast<size_t>(i * kWalkCols + c)];
          for (int64_t m = 0; m < 16 * (i / 16 + 1); ++m) o += QK[i * C + m] * U[static_cast<size_t>(m * kWalkCols + c)];
          out[static_cast<size_t>((t0 + i) * V + hv * sh.dv + c0 + c)] = static_cast<float>(o);
        }
    }
  });
}

const auto v4_emu = [](auto tag, auto&&... args) { v4_emulate<typename decltype(tag)::type>(args...); };

}  // namespace

TEST_CASE("delta rule v4's blocked algorithm (emulated) matches the recurrence: ragged chunks, several groups, fresh and continued states") {
  check_all("v4 blocked", v4_emu);
}

TEST_CASE("delta rule v4's blocked algorithm (emulated): a sequence in two launches gives the one-launch result") { check_two_launches(v4_emu); }
