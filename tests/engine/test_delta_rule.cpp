// The gated delta rule kernels (engine/ops/delta_rule.h) against the plain
// double-precision recurrence, on random data: the chunked kernel (several
// chunk sizes, sequences that end mid-chunk) and the one-step recurrence,
// from a zero and from a random state, for head sizes on and off the vector
// width; outputs and final states.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/ops/delta_rule.h"

using namespace hmoe;

namespace {

struct Case {
  int64_t T, dk, dv, ld_qk, ld_v, ld_gb;
  std::vector<float> q, k, v, g, beta, S0;
};

// Token-major rows with padding between them (the layer's layout); q and k
// l2-normalised, q / sqrt(dk); g in [-1.5, -0.005]; beta in (0, 1).
Case make_case(int64_t T, int64_t dk, int64_t dv, uint64_t seed, bool random_state) {
  Case c{T, dk, dv, dk + 3, dv + 5, 2, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  c.q.resize(static_cast<size_t>(T * c.ld_qk));
  c.k.resize(c.q.size());
  c.v.resize(static_cast<size_t>(T * c.ld_v));
  c.g.resize(static_cast<size_t>(T * c.ld_gb));
  c.beta.resize(c.g.size());
  for (auto& x : c.v) x = nd(rng);
  for (int64_t t = 0; t < T; ++t) {
    for (auto* m : {&c.q, &c.k}) {
      float* r = m->data() + t * c.ld_qk;
      double ss = 0;
      for (int64_t i = 0; i < dk; ++i) ss += (r[i] = nd(rng)) * static_cast<double>(r[i]);
      const float s = static_cast<float>(1.0 / std::sqrt(ss)) * (m == &c.q ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk))) : 1.0f);
      for (int64_t i = 0; i < dk; ++i) r[i] *= s;
    }
    c.g[static_cast<size_t>(t * c.ld_gb)] = -0.005f - 1.5f * ud(rng) * ud(rng);
    c.beta[static_cast<size_t>(t * c.ld_gb)] = 0.02f + 0.96f * ud(rng);
  }
  c.S0.assign(static_cast<size_t>(dk * dv), 0.0f);
  if (random_state)
    for (auto& x : c.S0) x = 0.3f * nd(rng);
  return c;
}

ops::DeltaRuleArgs args(const Case& c, float* out) {
  ops::DeltaRuleArgs a;
  a.q = c.q.data();
  a.k = c.k.data();
  a.ld_qk = c.ld_qk;
  a.v = c.v.data();
  a.ld_v = c.ld_v;
  a.g = c.g.data();
  a.beta = c.beta.data();
  a.ld_gb = c.ld_gb;
  a.out = out;
  a.ld_o = c.dv;
  a.tokens = c.T;
  a.dk = c.dk;
  a.dv = c.dv;
  return a;
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace

TEST_CASE("gated delta rule: chunked and recurrent kernels match the double-precision recurrence") {
  MESSAGE("vector code: " << std::string(ops::delta_rule_isa()));
  struct Shape {
    int64_t T, dk, dv;
  };
  for (const Shape sh : {Shape{1, 32, 16}, Shape{7, 32, 16}, Shape{64, 128, 128}, Shape{150, 128, 128}, Shape{200, 20, 12}, Shape{97, 64, 48}}) {
    for (bool random_state : {false, true}) {
      const Case c = make_case(sh.T, sh.dk, sh.dv, static_cast<uint64_t>(sh.T * 1000 + sh.dk + random_state), random_state);
      // Reference.
      std::vector<double> S_ref(c.S0.begin(), c.S0.end());
      std::vector<float> out_ref_f(static_cast<size_t>(c.T * c.dv));
      ops::delta_rule_reference(args(c, out_ref_f.data()), S_ref.data());
      const std::vector<double> out_ref(out_ref_f.begin(), out_ref_f.end());
      double scale = 0;
      for (double x : out_ref) scale = std::max(scale, std::fabs(x));
      const double tol = 2e-5 * std::max(1.0, scale) * std::sqrt(static_cast<double>(c.T));
      INFO("T " << c.T << " dk " << c.dk << " dv " << c.dv << (random_state ? ", random state" : ", zero state") << ", tol " << tol);
      // Recurrent.
      {
        std::vector<float> S = c.S0, out(static_cast<size_t>(c.T * c.dv));
        ops::delta_rule_recurrent(args(c, out.data()), S.data());
        CHECK(max_diff(out, out_ref) <= tol);
        CHECK(max_diff(S, S_ref) <= tol);
      }
      // Chunked, chunks of 64 (the layer's), 16 and 5 (ends mid-chunk).
      for (int64_t chunk : {64, 16, 5}) {
        std::vector<float> S = c.S0, out(static_cast<size_t>(c.T * c.dv));
        ops::delta_rule_chunked(args(c, out.data()), S.data(), chunk);
        INFO("chunk " << chunk);
        CHECK(max_diff(out, out_ref) <= tol);
        CHECK(max_diff(S, S_ref) <= tol);
      }
      // Half chunked, the rest recurrent (prefill, then decode): the state carries over.
      if (c.T > 2) {
        std::vector<float> S = c.S0, out(static_cast<size_t>(c.T * c.dv));
        ops::DeltaRuleArgs a = args(c, out.data());
        a.tokens = c.T / 2;
        ops::delta_rule_chunked(a, S.data(), 64);
        a.q += a.tokens * c.ld_qk;
        a.k += a.tokens * c.ld_qk;
        a.v += a.tokens * c.ld_v;
        a.g += a.tokens * c.ld_gb;
        a.beta += a.tokens * c.ld_gb;
        a.out += a.tokens * c.dv;
        a.tokens = c.T - c.T / 2;
        ops::delta_rule_recurrent(a, S.data());
        CHECK(max_diff(out, out_ref) <= tol);
        CHECK(max_diff(S, S_ref) <= tol);
      }
    }
  }
}
