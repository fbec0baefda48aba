// The harness of the CPU emulations of the GPU's chunked delta rule
// (tests/engine/test_deltanet_v4_blocked.cpp, test_deltanet_v5_wy.cpp):
// shapes, groups and random inputs as deltanet_prepare leaves them, v4's
// phase-1 record per (chunk, value head) (gpu/deltanet_v4.cu: Tb by the
// 16 x 16 blocked inverse, the masked decayed q.k, the decay factors; only
// the tiles on and below the diagonal written), the token-by-token
// reference in double, and the checks an emulation runs: double within
// 1e-6 (the algebra), float within the GPU tests' (1e-4, 1e-3), groups of
// at most max_recurrent tokens left alone, one sequence in two launches.
// An emulator is called as emu(tag, shape, inputs, groups, ntok, max_rec,
// C, states, out) with tag a std::type_identity of float or double: states
// per group [nv][dk][dv] (updated; a fresh group's read as zero), out
// [token][nv dv] (only chunked groups' rows written). Launch, first_slots and
// the walk's state blocks are what both emulations share of the kernels' layout.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/delta_rule_heads.h"

namespace hmoe::test::blocked {

struct Shape {
  int64_t nk, nv, dk, dv;
  int64_t key_dim() const { return nk * dk; }
  int64_t value_dim() const { return nv * dv; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct Groups {
  std::vector<int32_t> start, count, fresh;
};

struct Inputs {
  std::vector<float> conv, gate, beta;  // [token][conv_dim], [token][nv] x 2
};

inline int64_t rec_floats(int64_t C) { return 2 * C * C + 2 * C + 8; }

// Phase 1 for one (chunk, value head): the record's Tb [C][C], QKm [C][C], factors [2C + 8].
template <class F>
void prep_record(const Shape& sh, const Inputs& in, int64_t t0, int64_t L, int64_t hv, int64_t C, F* rec) {
  const int64_t cd = sh.conv_dim(), K = sh.key_dim(), hk = hv / (sh.nv / sh.nk);
  auto q = [&](int64_t i, int64_t r) { return i < L ? static_cast<F>(in.conv[static_cast<size_t>((t0 + i) * cd + hk * sh.dk + r)]) : F(0); };
  auto k = [&](int64_t i, int64_t r) { return i < L ? static_cast<F>(in.conv[static_cast<size_t>((t0 + i) * cd + K + hk * sh.dk + r)]) : F(0); };
  std::vector<F> G(static_cast<size_t>(C)), B(static_cast<size_t>(C));
  F acc = 0;
  for (int64_t i = 0; i < C; ++i) {
    if (i < L) acc += static_cast<F>(in.gate[static_cast<size_t>((t0 + i) * sh.nv + hv)]);
    G[static_cast<size_t>(i)] = acc;
    B[static_cast<size_t>(i)] = i < L ? static_cast<F>(in.beta[static_cast<size_t>((t0 + i) * sh.nv + hv)]) : F(0);
  }
  const F glast = G[static_cast<size_t>(C - 1)];
  std::vector<F> A(static_cast<size_t>(C * C), 0), T(static_cast<size_t>(C * C), 0), X(static_cast<size_t>(C * C), 0);
  F* Tbg = rec;
  F* QKg = rec + C * C;
  F* Fg = QKg + C * C;
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = 0; j < C; ++j) {
      const bool on = j <= i && i < L;
      F kk = 0, qk = 0;
      for (int64_t r = 0; r < sh.dk; ++r) {
        kk += k(i, r) * k(j, r);
        qk += q(i, r) * k(j, r);
      }
      const F e = on ? std::exp(G[static_cast<size_t>(i)] - G[static_cast<size_t>(j)]) : F(0);
      if (j / 16 <= i / 16) QKg[i * C + j] = on ? e * qk : F(0);  // the 16 x 16 tiles on and below the diagonal only
      A[static_cast<size_t>(i * C + j)] = on && j < i ? B[static_cast<size_t>(i)] * e * kk : F(0);
    }
  for (int64_t i = 0; i < C; ++i) {
    Fg[i] = i < L ? std::exp(G[static_cast<size_t>(i)]) : F(0);
    Fg[C + i] = i < L ? std::exp(glast - G[static_cast<size_t>(i)]) : F(0);
  }
  for (int64_t i = 0; i < 8; ++i) Fg[2 * C + i] = i == 0 ? std::exp(glast) : F(0);
  auto a = [&](int64_t i, int64_t j) { return A[static_cast<size_t>(i * C + j)]; };
  auto t = [&](int64_t i, int64_t j) -> F& { return T[static_cast<size_t>(i * C + j)]; };
  const int64_t nb = C / 16;
  for (int64_t b = 0; b < nb; ++b)  // diagonal blocks: a column at a time, forward substitution
    for (int64_t j = 0; j < 16; ++j) {
      F col[16];
      for (int64_t i = 0; i < 16; ++i) col[i] = i == j ? F(1) : F(0);
      for (int64_t i = 1; i < 16; ++i) {
        F s = col[i];
        for (int64_t m = 0; m < i; ++m) s -= a(16 * b + i, 16 * b + m) * col[m];
        col[i] = s;
      }
      for (int64_t i = 0; i < 16; ++i) t(16 * b + i, 16 * b + j) = col[i];
    }
  for (int64_t dd = 1; dd < nb; ++dd) {  // T_ij = -T_ii sum_{m=j}^{i-1} A_im T_mj, one block diagonal at a time
    for (int64_t jb = 0; jb + dd < nb; ++jb) {
      const int64_t ib = jb + dd;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t c = 0; c < 16; ++c) {
          F s = 0;
          for (int64_t m = 16 * jb; m < 16 * ib; ++m) s += a(16 * ib + r, m) * t(m, 16 * jb + c);
          X[static_cast<size_t>((16 * ib + r) * C + 16 * jb + c)] = s;
        }
    }
    for (int64_t jb = 0; jb + dd < nb; ++jb) {
      const int64_t ib = jb + dd;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t c = 0; c < 16; ++c) {
          F s = 0;
          for (int64_t m = 0; m < 16; ++m) s += t(16 * ib + r, 16 * ib + m) * X[static_cast<size_t>((16 * ib + m) * C + 16 * jb + c)];
          t(16 * ib + r, 16 * jb + c) = -s;
        }
    }
  }
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = 0; j / 16 <= i / 16; ++j) Tbg[i * C + j] = t(i, j) * B[static_cast<size_t>(j)];
}

// Conv rows as deltanet_prepare leaves them (q, k l2-normalised per key head,
// q / sqrt(dk)); decays exp-spread from slow to `fast`; beta in (0, 1).
inline Inputs make_inputs(const Shape& sh, int64_t n, uint64_t seed, float fast) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  const int64_t cd = sh.conv_dim();
  Inputs in;
  in.conv.resize(static_cast<size_t>(n * cd));
  for (auto& x : in.conv) x = nd(rng);
  for (int64_t t = 0; t < n; ++t) normalize_qk(in.conv.data() + t * cd, sh.nk, sh.dk);
  in.gate.resize(static_cast<size_t>(n * sh.nv));
  in.beta.resize(in.gate.size());
  for (auto& g : in.gate) g = -0.005f - fast * ud(rng) * ud(rng);
  for (auto& b : in.beta) b = 0.02f + 0.96f * ud(rng);
  return in;
}

// The recurrence in double for the chunked groups (count > max_rec).
inline void reference(const Shape& sh, const Inputs& in, const Groups& gr, int64_t max_rec, std::vector<float>& states, std::vector<float>& out) {
  const int64_t HS = sh.dk * sh.dv;
  for (size_t g = 0; g < gr.start.size(); ++g) {
    if (gr.count[g] <= max_rec) continue;
    float* s = states.data() + static_cast<int64_t>(g) * sh.nv * HS;
    if (gr.fresh[g]) std::fill(s, s + sh.nv * HS, 0.0f);
    delta_rule_heads(sh.nk, sh.nv, sh.dk, sh.dv, in.conv.data(), in.gate.data(), in.beta.data(), gr.start[g], gr.count[g], out.data(), s);
  }
}

// max over elements of |a - b| / (abs + rel |b|); infinite where either is not finite
inline double tol_ratio(const std::vector<float>& a, const std::vector<float>& b, double abs, double rel) {
  double r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    r = std::max(r, std::fabs(static_cast<double>(a[i]) - b[i]) / (abs + rel * std::fabs(static_cast<double>(b[i]))));
  }
  return r;
}

inline Groups groups_of(const std::vector<int32_t>& counts, const std::vector<int32_t>& fresh) {
  Groups g;
  int32_t s = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    g.start.push_back(s);
    g.count.push_back(counts[i]);
    g.fresh.push_back(fresh[i]);
    s += counts[i];
  }
  return g;
}

// One launch of emulator `emu` (double and float) against the reference; states from S0 (garbage for fresh groups).
template <class Emu>
void check(const std::string& name, Emu emu, const Shape& sh, const std::vector<int32_t>& counts, const std::vector<int32_t>& fresh, int64_t max_rec,
           int64_t C, float fast, uint64_t seed) {
  const Groups gr = groups_of(counts, fresh);
  int64_t n = 0;
  for (int32_t c : counts) n += c;
  const Inputs in = make_inputs(sh, n, seed, fast);
  const int64_t G = static_cast<int64_t>(counts.size()), HS = sh.dk * sh.dv, V = sh.value_dim();
  std::mt19937_64 rng(seed + 7);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<float> S0(static_cast<size_t>(G * sh.nv * HS));
  for (auto& x : S0) x = nd(rng);
  for (int64_t g = 0; g < G; ++g)
    if (fresh[static_cast<size_t>(g)]) std::fill(S0.begin() + g * sh.nv * HS, S0.begin() + (g + 1) * sh.nv * HS, 1e3f);
  const std::vector<float> out0(static_cast<size_t>(n * V), -7.0f);
  std::vector<float> s_ref = S0, o_ref = out0, s_d = S0, o_d = out0, s_f = S0, o_f = out0;
  reference(sh, in, gr, max_rec, s_ref, o_ref);
  emu(std::type_identity<double>{}, sh, in, gr, n, max_rec, C, s_d, o_d);
  emu(std::type_identity<float>{}, sh, in, gr, n, max_rec, C, s_f, o_f);
  CAPTURE(name);
  CAPTURE(sh.dk);
  CAPTURE(sh.dv);
  CAPTURE(C);
  CAPTURE(max_rec);
  CAPTURE(fast);
  const double od = tol_ratio(o_d, o_ref, 1e-6, 1e-6), sd = tol_ratio(s_d, s_ref, 1e-6, 1e-6);
  const double of = tol_ratio(o_f, o_ref, 1e-4, 1e-3), sf = tol_ratio(s_f, s_ref, 1e-4, 1e-3);
  MESSAGE(name << " emulation, dk " << sh.dk << " dv " << sh.dv << " chunk " << C << " max_rec " << max_rec << " decay to -" << fast
               << ": double within " << od << " / " << sd << " of 1e-6, float within " << of << " / " << sf << " of (1e-4, 1e-3) (outputs / states)");
  CHECK(od <= 1);
  CHECK(sd <= 1);
  CHECK(of <= 1);
  CHECK(sf <= 1);
  // Groups of at most max_rec tokens are left alone (their rows and state), as are other groups' rows.
  for (int64_t g = 0; g < G; ++g)
    if (counts[static_cast<size_t>(g)] <= max_rec) {
      CHECK(std::equal(s_f.begin() + g * sh.nv * HS, s_f.begin() + (g + 1) * sh.nv * HS, S0.begin() + g * sh.nv * HS));
      CHECK(std::all_of(o_f.begin() + gr.start[static_cast<size_t>(g)] * V,
                        o_f.begin() + (gr.start[static_cast<size_t>(g)] + counts[static_cast<size_t>(g)]) * V, [](float x) { return x == -7.0f; }));
    }
}

// The shapes, lengths, chunks and decays every emulation is checked on.
template <class Emu>
void check_all(const std::string& name, Emu emu) {
  // A partial 32-column slice (dv 48), two value heads per key head; lengths around the chunk sizes.
  const Shape small{2, 4, 32, 48};
  const std::vector<int32_t> counts = {70, 1, 5, 64, 63, 130, 2}, fresh = {0, 1, 0, 1, 0, 1, 0};
  for (int64_t C : {16, 32, 64}) {
    check(name, emu, small, counts, fresh, 1, C, 1.5f, 41);
    check(name, emu, small, counts, fresh, 0, C, 1.5f, 42);
  }
  // Chunk larger than dk (phase 1 keeps T apart from q then), and fast decays (exp(G) underflowing within a chunk).
  const Shape narrow{1, 2, 16, 32};
  check(name, emu, narrow, {100, 3, 64}, {1, 0, 0}, 2, 64, 1.5f, 43);
  check(name, emu, narrow, {200, 17}, {0, 1}, 1, 64, 12.0f, 44);
  // Head dims 128 as Qwen3-Next's, a few chunks.
  const Shape wide{1, 2, 128, 128};
  check(name, emu, wide, {150, 64}, {0, 1}, 1, 64, 1.5f, 45);
}

// A 300-token sequence in two launches (130 + 170 tokens, the second continuing the first's state) against the recurrence.
template <class Emu>
void check_two_launches(Emu emu) {
  const Shape sh{2, 4, 32, 32};
  const Inputs in = make_inputs(sh, 300, 51, 1.5f);
  const int64_t HS = sh.dk * sh.dv, V = sh.value_dim(), cd = sh.conv_dim();
  std::mt19937_64 rng(52);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<float> S0(static_cast<size_t>(sh.nv * HS));
  for (auto& x : S0) x = nd(rng);
  std::vector<float> s_ref = S0, o_ref(static_cast<size_t>(300 * V), 0.0f);
  reference(sh, in, groups_of({300}, {0}), 0, s_ref, o_ref);
  Inputs second;  // the second launch's inputs are the rows from 130 on
  second.conv.assign(in.conv.begin() + 130 * cd, in.conv.end());
  second.gate.assign(in.gate.begin() + 130 * sh.nv, in.gate.end());
  second.beta.assign(in.beta.begin() + 130 * sh.nv, in.beta.end());
  std::vector<float> s = S0, o1(static_cast<size_t>(130 * V)), o2(static_cast<size_t>(170 * V));
  emu(std::type_identity<float>{}, sh, in, groups_of({130}, {0}), 130, 0, 64, s, o1);
  emu(std::type_identity<float>{}, sh, second, groups_of({170}, {0}), 170, 0, 64, s, o2);
  o1.insert(o1.end(), o2.begin(), o2.end());
  CHECK(tol_ratio(o1, o_ref, 1e-4, 1e-3) <= 1);
  CHECK(tol_ratio(s, s_ref, 1e-4, 1e-3) <= 1);
}

// The first chunk slot of each group: slots number the chunks of the groups of more than max_rec tokens in order.
inline std::vector<int64_t> first_slots(const Groups& gr, int64_t max_rec, int64_t C) {
  std::vector<int64_t> first;
  int64_t slot = 0;
  for (size_t g = 0; g < gr.start.size(); ++g) {
    first.push_back(slot);
    if (gr.count[g] > max_rec) slot += (gr.count[g] + C - 1) / C;
  }
  return first;
}

// What an emulation derives from one launch (groups gr over ntok tokens, chunk C): gn groups, the kernels' chunk
// slots (ntok / C + gn), R floats a record, the rows' widths (conv cd, keys K, values V), HS floats a head's state,
// and each group's first slot.
struct Launch {
  int64_t gn, slots, R, cd, K, V, HS;
  std::vector<int64_t> first;
  Launch(const Shape& sh, const Groups& gr, int64_t ntok, int64_t max_rec, int64_t C)
      : gn(static_cast<int64_t>(gr.start.size())),
        slots(ntok / C + gn),
        R(rec_floats(C)),
        cd(sh.conv_dim()),
        K(sh.key_dim()),
        V(sh.value_dim()),
        HS(sh.dk * sh.dv),
        first(first_slots(gr, max_rec, C)) {}
};

constexpr int64_t kWalkCols = 32;  // the walk's value columns per block

// The walk's block of a head's state Sg ([dk][dv] fp32): value columns [c0, c0 + nc) as [dk][kWalkCols] in F,
// zero-padded; all zero where the group is fresh.
template <class F>
std::vector<F> load_walk_block(const Shape& sh, const float* Sg, int64_t c0, int64_t nc, bool fresh) {
  std::vector<F> S(static_cast<size_t>(sh.dk * kWalkCols), F(0));
  if (!fresh)
    for (int64_t r = 0; r < sh.dk; ++r)
      for (int64_t c = 0; c < nc; ++c) S[static_cast<size_t>(r * kWalkCols + c)] = static_cast<F>(Sg[r * sh.dv + c0 + c]);
  return S;
}

// The block back into Sg's columns [c0, c0 + nc), in fp32.
template <class F>
void store_walk_block(const Shape& sh, const std::vector<F>& S, float* Sg, int64_t c0, int64_t nc) {
  for (int64_t r = 0; r < sh.dk; ++r)
    for (int64_t c = 0; c < nc; ++c) Sg[r * sh.dv + c0 + c] = static_cast<float>(S[static_cast<size_t>(r * kWalkCols + c)]);
}

// The walk in the kernels' order: for each group of more than max_rec tokens, value head hv and block of
// kWalkCols value columns from c0 (nc of them real), fn(g, hv, c0, nc, S) on the block of the group's state for hv
// (load_walk_block), stored back after.
template <class F, class Fn>
void for_each_walk_block(const Shape& sh, const Groups& gr, int64_t max_rec, std::vector<float>& states, Fn fn) {
  const int64_t HS = sh.dk * sh.dv;
  for (int64_t g = 0; g < static_cast<int64_t>(gr.start.size()); ++g) {
    if (gr.count[static_cast<size_t>(g)] <= max_rec) continue;
    for (int64_t hv = 0; hv < sh.nv; ++hv) {
      float* Sg = states.data() + (g * sh.nv + hv) * HS;
      for (int64_t c0 = 0; c0 < sh.dv; c0 += kWalkCols) {
        const int64_t nc = std::min(kWalkCols, sh.dv - c0);
        std::vector<F> S = load_walk_block<F>(sh, Sg, c0, nc, gr.fresh[static_cast<size_t>(g)] != 0);
        fn(g, hv, c0, nc, S);
        store_walk_block(sh, S, Sg, c0, nc);
      }
    }
  }
}

}  // namespace hmoe::test::blocked
