// The GPU delta rule v5 (gpu/deltanet_v5.cu: v4's algebra in WY form),
// emulated step for step on the CPU against the token-by-token recurrence
// (ops::delta_rule_reference, double) on random data, so that its algebra
// is checked without a GPU. The emulation keeps the kernels' structure and
// buffers:
//  - phase 1: v4's record per (chunk slot, value head) (the same blocked
//    inverse, tests/delta_rule_blocked.h), then W = (Tb diag(exp G)) K into
//    the scratch and U = Tb V into `out`'s rows of the chunk, k up to the
//    diagonal tile (what is never written is NaN here, so reading it shows);
//  - the walk per (group, value head, 32 value columns, zero-padded): the
//    entering state to the scratch, u = U - W S with W S summed over the
//    two halves of dk apart (the two warps of a tile), u over U in `out`,
//    S = exp(G_last) S + K^T (exp(G_last - G) u); the fresh flag;
//  - phase 3 per (chunk slot, value head): o = (exp(G) Q) S_c + QKm u over
//    u in `out`, k of QKm u up to the diagonal tile.
// `out` is kept in the emulation's type F (the kernels' is fp32), so the
// double run checks the algebra to rounding and the float run the kernels'
// fp32 arithmetic within the GPU tests' tolerance.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "tests/delta_rule_blocked.h"

using namespace hmoe;
using namespace hmoe::test::blocked;

namespace {

template <class F>
void v5_emulate(const Shape& sh, const Inputs& in, const Groups& gr, int64_t ntok, int64_t max_rec, int64_t C, std::vector<float>& states,
                std::vector<float>& out) {
  const Launch lc(sh, gr, ntok, max_rec, C);
  const int64_t gn = lc.gn, slots = lc.slots, R = lc.R, cd = lc.cd, K = lc.K, V = lc.V, HS = lc.HS;
  const std::vector<int64_t>& first = lc.first;
  const F nan = std::numeric_limits<F>::quiet_NaN();
  std::vector<F> recs(static_cast<size_t>(slots * sh.nv * R), nan), W(static_cast<size_t>(slots * sh.nv * C * sh.dk), nan),
      Sc(static_cast<size_t>(slots * sh.nv * HS), nan), o(out.begin(), out.end());  // o: the kernels' `out`
  auto conv = [&](int64_t t0, int64_t L, int64_t i, int64_t col) { return i < L ? static_cast<F>(in.conv[static_cast<size_t>((t0 + i) * cd + col)]) : F(0); };
  // Phase 1: records, W and U.
  for (int64_t g = 0; g < gn; ++g) {
    const int64_t cnt = gr.count[static_cast<size_t>(g)];
    if (cnt <= max_rec) continue;
    for (int64_t ci = 0; ci * C < cnt; ++ci) {
      const int64_t slot = first[static_cast<size_t>(g)] + ci, t0 = gr.start[static_cast<size_t>(g)] + ci * C, L = std::min(C, cnt - ci * C);
      REQUIRE(slot < slots);
      for (int64_t hv = 0; hv < sh.nv; ++hv) {
        const int64_t hk = hv / (sh.nv / sh.nk);
        F* rec = recs.data() + (slot * sh.nv + hv) * R;
        prep_record<F>(sh, in, t0, L, hv, C, rec);
        const F* Tb = rec;
        const F* eg = rec + 2 * C * C;
        F* Wc = W.data() + (slot * sh.nv + hv) * C * sh.dk;
        for (int64_t i = 0; i < C; ++i) {
          const int64_t kend = 16 * (i / 16 + 1);
          for (int64_t c = 0; c < sh.dk; ++c) {
            F w = 0;
            for (int64_t m = 0; m < kend; ++m) w += (Tb[i * C + m] * eg[m]) * conv(t0, L, m, K + hk * sh.dk + c);
            Wc[i * sh.dk + c] = w;
          }
          if (i < L)
            for (int64_t c = 0; c < sh.dv; ++c) {
              F u = 0;
              for (int64_t m = 0; m < kend; ++m) u += Tb[i * C + m] * conv(t0, L, m, 2 * K + hv * sh.dv + c);
              o[static_cast<size_t>((t0 + i) * V + hv * sh.dv + c)] = u;
            }
        }
      }
    }
  }
  // Phase 2: the walk.
  for_each_walk_block<F>(sh, gr, max_rec, states, [&](int64_t g, int64_t hv, int64_t c0, int64_t nc, std::vector<F>& S) {
    const int64_t cnt = gr.count[static_cast<size_t>(g)], st = gr.start[static_cast<size_t>(g)], hk = hv / (sh.nv / sh.nk);
    std::vector<F> Uo(static_cast<size_t>(C * kWalkCols)), Un(Uo.size());
    auto s = [&](int64_t r, int64_t c) -> F& { return S[static_cast<size_t>(r * kWalkCols + c)]; };
    for (int64_t ci = 0; ci * C < cnt; ++ci) {
      const int64_t slot = first[static_cast<size_t>(g)] + ci, t0 = st + ci * C, L = std::min(C, cnt - ci * C);
      const F* Wc = W.data() + (slot * sh.nv + hv) * C * sh.dk;
      const F* fl = recs.data() + (slot * sh.nv + hv) * R + 2 * C * C + C;  // exp(G_last - G_i), exp(G_last)
      F* Scc = Sc.data() + (slot * sh.nv + hv) * HS;
      for (int64_t r = 0; r < sh.dk; ++r)
        for (int64_t c = 0; c < nc; ++c) Scc[r * sh.dv + c0 + c] = s(r, c);
      for (int64_t i = 0; i < C; ++i)
        for (int64_t c = 0; c < kWalkCols; ++c) {
          F part[2] = {0, 0};
          for (int64_t r = 0; r < sh.dk; ++r) part[2 * r / sh.dk] += Wc[i * sh.dk + r] * s(r, c);
          const F U = i < L && c < nc ? o[static_cast<size_t>((t0 + i) * V + hv * sh.dv + c0 + c)] : F(0);
          const F u = U - (part[0] + part[1]);
          Uo[static_cast<size_t>(i * kWalkCols + c)] = u;
          Un[static_cast<size_t>(i * kWalkCols + c)] = fl[i] * u;
        }
      for (int64_t i = 0; i < L; ++i)
        for (int64_t c = 0; c < nc; ++c) o[static_cast<size_t>((t0 + i) * V + hv * sh.dv + c0 + c)] = Uo[static_cast<size_t>(i * kWalkCols + c)];
      for (int64_t r = 0; r < sh.dk; ++r)
        for (int64_t c = 0; c < kWalkCols; ++c) {
          F x = fl[C] * s(r, c);
          for (int64_t m = 0; m < C; ++m) x += conv(t0, L, m, K + hk * sh.dk + r) * Un[static_cast<size_t>(m * kWalkCols + c)];
          s(r, c) = x;
        }
    }
  });
  // Phase 3: every chunk's outputs, over u.
  for (int64_t g = 0; g < gn; ++g) {
    const int64_t cnt = gr.count[static_cast<size_t>(g)];
    if (cnt <= max_rec) continue;
    for (int64_t ci = 0; ci * C < cnt; ++ci) {
      const int64_t slot = first[static_cast<size_t>(g)] + ci, t0 = gr.start[static_cast<size_t>(g)] + ci * C, L = std::min(C, cnt - ci * C);
      for (int64_t hv = 0; hv < sh.nv; ++hv) {
        const int64_t hk = hv / (sh.nv / sh.nk);
        const F* rec = recs.data() + (slot * sh.nv + hv) * R;
        const F* QK = rec + C * C;
        const F* eg = rec + 2 * C * C;
        const F* Scc = Sc.data() + (slot * sh.nv + hv) * HS;
        auto u = [&](int64_t m, int64_t c) { return m < L ? o[static_cast<size_t>((t0 + m) * V + hv * sh.dv + c)] : F(0); };
        std::vector<F> res(static_cast<size_t>(L * sh.dv));
        for (int64_t i = 0; i < L; ++i)
          for (int64_t c = 0; c < sh.dv; ++c) {
            F x = 0;
            for (int64_t r = 0; r < sh.dk; ++r) x += (eg[i] * conv(t0, L, i, hk * sh.dk + r)) * Scc[r * sh.dv + c];
            for (int64_t m = 0; m < 16 * (i / 16 + 1); ++m) x += QK[i * C + m] * u(m, c);
            res[static_cast<size_t>(i * sh.dv + c)] = x;
          }
        for (int64_t i = 0; i < L; ++i)
          for (int64_t c = 0; c < sh.dv; ++c) o[static_cast<size_t>((t0 + i) * V + hv * sh.dv + c)] = res[static_cast<size_t>(i * sh.dv + c)];
      }
    }
  }
  for (int64_t g = 0; g < gn; ++g) {
    const int64_t cnt = gr.count[static_cast<size_t>(g)], st = gr.start[static_cast<size_t>(g)];
    if (cnt <= max_rec) continue;
    for (int64_t x = st * V; x < (st + cnt) * V; ++x) out[static_cast<size_t>(x)] = static_cast<float>(o[static_cast<size_t>(x)]);
  }
}

const auto v5_emu = [](auto tag, auto&&... args) { v5_emulate<typename decltype(tag)::type>(args...); };

}  // namespace

TEST_CASE("delta rule v5's WY algorithm (emulated) matches the recurrence: ragged chunks, several groups, fresh and continued states") {
  check_all("v5 WY", v5_emu);
}

TEST_CASE("delta rule v5's WY algorithm (emulated): a sequence in two launches gives the one-launch result") { check_two_launches(v5_emu); }
