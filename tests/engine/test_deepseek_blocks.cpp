// DeepSeek-V3 building blocks on random data against plain scalar
// references: multi-head latent attention (both cache paths), yarn rope,
// group-limited sigmoid routing, the config fields and the latent KV layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "configs/error.h"
#include "engine/layers/deepseek_moe.h"
#include "engine/layers/mla_attention.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

ModelConfig small_mla_config(bool interleave, bool q_lora) {
  nlohmann::json j = {{"model_type", "deepseek_v3"},
                      {"vocab_size", 100},
                      {"hidden_size", 24},
                      {"intermediate_size", 40},
                      {"moe_intermediate_size", 8},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 3},
                      {"q_lora_rank", q_lora ? nlohmann::json(12) : nlohmann::json(nullptr)},
                      {"kv_lora_rank", 10},
                      {"qk_nope_head_dim", 6},
                      {"qk_rope_head_dim", 8},
                      {"v_head_dim", 5},
                      {"n_routed_experts", 8},
                      {"num_experts_per_tok", 2},
                      {"n_group", 4},
                      {"topk_group", 2},
                      {"first_k_dense_replace", 1},
                      {"rope_interleave", interleave},
                      {"max_position_embeddings", 16384},
                      {"rope_scaling",
                       {{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 4096}, {"mscale", 1.0}, {"mscale_all_dim", 0.7}}}};
  return ModelConfig::from_json(j, "test config");
}

struct RandomMla {
  std::vector<float> q_proj, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o_proj;
  MlaWeights w;
  RandomMla(const ModelConfig& c, uint64_t seed) {
    const MlaConfig& m = c.mla;
    const int64_t H = c.hidden_size, nh = c.num_attention_heads, qk = m.qk_head_dim();
    auto make = [&](std::vector<float>& v, int64_t rows, int64_t cols, float scale) {
      v = test::random_floats(static_cast<size_t>(rows * cols), seed++, scale);
      return cpu::Mat{DType::f32, v.data(), rows, cols};
    };
    auto norm = [&](std::vector<float>& v, int64_t n) {
      v = test::random_floats(static_cast<size_t>(n), seed++, 0.3f);
      for (auto& x : v) x += 1.0f;
      return cpu::Mat{DType::f32, v.data(), 1, n};
    };
    if (m.q_lora_rank > 0) {
      w.q_a = make(q_a, m.q_lora_rank, H, 0.3f);
      w.q_a_norm = norm(q_a_norm, m.q_lora_rank);
      w.q_b = make(q_b, nh * qk, m.q_lora_rank, 0.4f);
    } else {
      w.q_proj = make(q_proj, nh * qk, H, 0.3f);
    }
    w.kv_a = make(kv_a, m.kv_lora_rank + m.qk_rope_head_dim, H, 0.3f);
    w.kv_a_norm = norm(kv_a_norm, m.kv_lora_rank);
    w.kv_b = make(kv_b, nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, 0.4f);
    w.o_proj = make(o_proj, H, nh * m.v_head_dim, 0.3f);
  }
};

// y = W x in double, W row-major [rows, cols].
std::vector<double> matvec(const std::vector<float>& w, int64_t rows, int64_t cols, const double* x) {
  std::vector<double> y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) y[static_cast<size_t>(r)] += static_cast<double>(w[static_cast<size_t>(r * cols + k)]) * x[k];
  return y;
}

void rms(std::vector<double>& v, size_t n, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += v[i] * v[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) v[i] = v[i] * inv * w[i];
}

// Rotary embedding on consecutive pairs (2i, 2i+1) (interleaved) or halves
// (i, i+d/2), in the original element order, in double.
void rotate(double* x, int64_t d, bool interleave, const MlaRope& rope, int64_t pos) {
  for (int64_t i = 0; i < d / 2; ++i) {
    const double a = static_cast<double>(pos) * rope.inv_freq[static_cast<size_t>(i)];
    const double c = std::cos(a) * rope.attention_factor, s = std::sin(a) * rope.attention_factor;
    const int64_t i0 = interleave ? 2 * i : i, i1 = interleave ? 2 * i + 1 : i + d / 2;
    const double x0 = x[i0], x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x1 * c + x0 * s;
  }
}

// Causal MLA over one sequence x[0..n) (positions 0..n-1), as written in the
// DeepSeek-V3 paper, with K and V expanded: out [n, hidden].
std::vector<double> reference_mla(const ModelConfig& c, const RandomMla& rw, const std::vector<float>& x, int64_t n) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nope = m.qk_nope_head_dim, rd = m.qk_rope_head_dim, vd = m.v_head_dim,
                qk = nope + rd, R = m.kv_lora_rank;
  const MlaRope rope(c);
  const double scale = mla_softmax_scale(c);
  std::vector<std::vector<double>> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    if (m.q_lora_rank > 0) {
      auto qa = matvec(rw.q_a, m.q_lora_rank, H, xt.data());
      rms(qa, qa.size(), rw.q_a_norm, c.rms_norm_eps);
      q[static_cast<size_t>(t)] = matvec(rw.q_b, nh * qk, m.q_lora_rank, qa.data());
    } else {
      q[static_cast<size_t>(t)] = matvec(rw.q_proj, nh * qk, H, xt.data());
    }
    auto ckv = matvec(rw.kv_a, R + rd, H, xt.data());
    rms(ckv, static_cast<size_t>(R), rw.kv_a_norm, c.rms_norm_eps);
    auto kvb = matvec(rw.kv_b, nh * (nope + vd), R, ckv.data());
    rotate(ckv.data() + R, rd, m.rope_interleave, rope, t);
    auto& kt = k[static_cast<size_t>(t)];
    auto& vt = v[static_cast<size_t>(t)];
    for (int64_t h = 0; h < nh; ++h) {
      rotate(q[static_cast<size_t>(t)].data() + h * qk + nope, rd, m.rope_interleave, rope, t);
      for (int64_t i = 0; i < nope; ++i) kt.push_back(kvb[static_cast<size_t>(h * (nope + vd) + i)]);
      for (int64_t i = 0; i < rd; ++i) kt.push_back(ckv[static_cast<size_t>(R + i)]);
      for (int64_t i = 0; i < vd; ++i) vt.push_back(kvb[static_cast<size_t>(h * (nope + vd) + nope + i)]);
    }
  }
  std::vector<double> out(static_cast<size_t>(n * H), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> attn(static_cast<size_t>(nh * vd), 0.0);
    for (int64_t h = 0; h < nh; ++h) {
      std::vector<double> s(static_cast<size_t>(t + 1));
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t i = 0; i < qk; ++i) d += q[static_cast<size_t>(t)][static_cast<size_t>(h * qk + i)] * k[static_cast<size_t>(j)][static_cast<size_t>(h * qk + i)];
        s[static_cast<size_t>(j)] = d * scale;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t i = 0; i < vd; ++i)
          attn[static_cast<size_t>(h * vd + i)] += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(j)][static_cast<size_t>(h * vd + i)];
    }
    auto o = matvec(rw.o_proj, H, nh * vd, attn.data());
    std::copy(o.begin(), o.end(), out.begin() + t * H);
  }
  return out;
}

double max_abs_diff(const float* a, const double* b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace

TEST_CASE("MLA: both cache paths match a scalar reference (prefill, then decode)") {
  numa::ThreadPool pool(3);
  for (bool interleave : {true, false})
    for (bool q_lora : {true, false})
      for (MlaMode mode : {MlaMode::expanded, MlaMode::latent, MlaMode::expanded_prefill, MlaMode::automatic}) {
        CAPTURE(interleave);
        CAPTURE(q_lora);
        CAPTURE(static_cast<int>(mode));
        const ModelConfig c = small_mla_config(interleave, q_lora);
        const RandomMla rw(c, 1000 + (interleave ? 10 : 0) + (q_lora ? 1 : 0));
        const int64_t H = c.hidden_size, prefill = 7, total = 11;
        const auto x = test::random_floats(static_cast<size_t>(total * H), 77, 1.0f);
        const auto ref = reference_mla(c, rw, x, total);
        auto block = make_mla_attention(rw.w, c, 1, pool, mode);
        KvCache kv(mla_kv_layout(c), 2, 8);
        const int seq = kv.add_sequence();
        kv.reserve(seq, total);
        Workspace ws;
        std::vector<ops::TokenSlot> slots;
        for (int64_t t = 0; t < prefill; ++t) slots.push_back({seq, t});
        std::vector<float> out(static_cast<size_t>(prefill * H));
        block->forward(x.data(), prefill, slots.data(), kv, out.data(), ws);
        CHECK(max_abs_diff(out.data(), ref.data(), out.size()) < 2e-5);
        for (int64_t t = prefill; t < total; ++t) {
          const ops::TokenSlot s{seq, t};
          std::vector<float> o(static_cast<size_t>(H));
          block->forward(x.data() + t * H, 1, &s, kv, o.data(), ws);
          CHECK(max_abs_diff(o.data(), ref.data() + t * H, o.size()) < 2e-5);
        }
        // The cache holds exactly the normed latent and the rope key (kv_lora + rope floats).
        CHECK(kv.layout().k_floats() == c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
      }
}

TEST_CASE("MLA: latent and expanded paths agree on a mixed batch of two sequences") {
  numa::ThreadPool pool(2);
  const ModelConfig c = small_mla_config(true, true);
  const RandomMla rw(c, 4242);
  const int64_t H = c.hidden_size;
  const auto xa = test::random_floats(static_cast<size_t>(9 * H), 5, 1.0f);
  const auto xb = test::random_floats(static_cast<size_t>(4 * H), 6, 1.0f);
  std::vector<std::vector<float>> results;
  for (MlaMode mode : {MlaMode::expanded, MlaMode::latent, MlaMode::expanded_prefill}) {
    auto block = make_mla_attention(rw.w, c, 0, pool, mode);
    KvCache kv(mla_kv_layout(c), 4, 4);
    const int a = kv.add_sequence(), b = kv.add_sequence();
    kv.reserve(a, 9);
    kv.reserve(b, 4);
    Workspace ws;
    // Step 1: 6 tokens of a and 3 of b interleaved; step 2: one more of b
    // (decode) beside three more of a (prefill chunk).
    std::vector<float> x1, all;
    std::vector<ops::TokenSlot> s1;
    for (int64_t i = 0; i < 6; ++i) {
      x1.insert(x1.end(), xa.begin() + i * H, xa.begin() + (i + 1) * H);
      s1.push_back({a, i});
      if (i < 3) {
        x1.insert(x1.end(), xb.begin() + i * H, xb.begin() + (i + 1) * H);
        s1.push_back({b, i});
      }
    }
    std::vector<float> o1(x1.size());
    block->forward(x1.data(), static_cast<int64_t>(s1.size()), s1.data(), kv, o1.data(), ws);
    std::vector<float> x2(xb.begin() + 3 * H, xb.begin() + 4 * H);
    std::vector<ops::TokenSlot> s2{{b, 3}};
    for (int64_t i = 6; i < 9; ++i) {
      x2.insert(x2.end(), xa.begin() + i * H, xa.begin() + (i + 1) * H);
      s2.push_back({a, i});
    }
    std::vector<float> o2(x2.size());
    block->forward(x2.data(), static_cast<int64_t>(s2.size()), s2.data(), kv, o2.data(), ws);
    all = o1;
    all.insert(all.end(), o2.begin(), o2.end());
    results.push_back(all);
    // And against the reference, sequence by sequence.
    const auto ra = reference_mla(c, rw, xa, 9), rb = reference_mla(c, rw, xb, 4);
    size_t row = 0;
    for (const auto& s : s1) {
      const auto& r = s.seq == a ? ra : rb;
      CHECK(max_abs_diff(o1.data() + row * static_cast<size_t>(H), r.data() + s.pos * H, static_cast<size_t>(H)) < 2e-5);
      ++row;
    }
    row = 0;
    for (const auto& s : s2) {
      const auto& r = s.seq == a ? ra : rb;
      CHECK(max_abs_diff(o2.data() + row * static_cast<size_t>(H), r.data() + s.pos * H, static_cast<size_t>(H)) < 2e-5);
      ++row;
    }
  }
  double d = 0;
  for (size_t i = 0; i < results[0].size(); ++i) d = std::max(d, static_cast<double>(std::fabs(results[0][i] - results[1][i])));
  MESSAGE("max |expanded - latent| on the mixed batch: " << d);
  CHECK(d < 1e-5);
  CHECK(d > 0.0);  // two different computations, not one path twice
}

TEST_CASE("MLA: a KV cache of the wrong layout is refused") {
  numa::ThreadPool pool(1);
  const ModelConfig c = small_mla_config(true, true);
  const RandomMla rw(c, 9);
  auto block = make_mla_attention(rw.w, c, 0, pool, MlaMode::latent);
  KvCache kv(KvLayout{2, 3, 8}, 2, 8);  // plain K/V: 24 floats per token
  const int seq = kv.add_sequence();
  kv.reserve(seq, 1);
  const auto x = test::random_floats(static_cast<size_t>(c.hidden_size), 3);
  std::vector<float> out(static_cast<size_t>(c.hidden_size));
  const ops::TokenSlot s{seq, 0};
  Workspace ws;
  CHECK_THROWS_AS(block->forward(x.data(), 1, &s, kv, out.data(), ws), Error);
}

TEST_CASE("yarn rope: frequencies, attention factor and softmax scale of the tiny-deepseekv3 config") {
  nlohmann::json j = {{"model_type", "deepseek_v3"}, {"qk_rope_head_dim", 16}, {"max_position_embeddings", 163840},
                      {"rope_scaling",
                       {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1},
                        {"mscale", 1.0}, {"mscale_all_dim", 1.0}}},
                      {"qk_nope_head_dim", 32}};
  const ModelConfig c = ModelConfig::from_json(j, "t");
  const MlaRope rope(c);
  REQUIRE(rope.inv_freq.size() == 8);
  // Correction range for dim 16, base 1e4, 4096 positions: rotations 32 ->
  // dim 2.62 (floor 2), rotations 1 -> dim 5.63 (ceil 6). Below 2: the
  // original frequency; from 6: divided by the factor; between: a linear mix.
  auto base_freq = [](int i) { return 1.0 / std::pow(10000.0, 2.0 * i / 16.0); };
  for (int i = 0; i < 8; ++i) {
    const double ramp = std::clamp((i - 2.0) / 4.0, 0.0, 1.0);
    const double want = base_freq(i) * (1 - ramp) + base_freq(i) / 40.0 * ramp;
    CHECK(rope.inv_freq[static_cast<size_t>(i)] == doctest::Approx(want).epsilon(1e-6));
  }
  CHECK(rope.attention_factor == doctest::Approx(1.0));  // mscale == mscale_all_dim
  const double m = 0.1 * std::log(40.0) + 1.0;
  CHECK(mla_softmax_scale(c) == doctest::Approx(m * m / std::sqrt(48.0)).epsilon(1e-12));
  // Without rope_scaling: plain frequencies and 1/sqrt(qk_head_dim).
  j.erase("rope_scaling");
  const ModelConfig plain = ModelConfig::from_json(j, "t");
  const MlaRope r2(plain);
  for (int i = 0; i < 8; ++i) CHECK(r2.inv_freq[static_cast<size_t>(i)] == doctest::Approx(base_freq(i)).epsilon(1e-6));
  CHECK(mla_softmax_scale(plain) == doctest::Approx(1.0 / std::sqrt(48.0)));
}

TEST_CASE("rope: interleaved pairs come out in rotate-half order") {
  nlohmann::json j = {{"model_type", "deepseek_v3"}, {"qk_rope_head_dim", 8}};
  const ModelConfig c = ModelConfig::from_json(j, "t");
  const MlaRope rope(c);
  REQUIRE(rope.interleave);
  auto x = test::random_floats(16, 11);
  auto y = x;
  rope.apply(y.data(), 2, 8, 5);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      const double a = 5.0 * rope.inv_freq[static_cast<size_t>(i)];
      const double x0 = x[static_cast<size_t>(h * 8 + 2 * i)], x1 = x[static_cast<size_t>(h * 8 + 2 * i + 1)];
      CHECK(y[static_cast<size_t>(h * 8 + i)] == doctest::Approx(x0 * std::cos(a) - x1 * std::sin(a)).epsilon(1e-5));
      CHECK(y[static_cast<size_t>(h * 8 + 4 + i)] == doctest::Approx(x1 * std::cos(a) + x0 * std::sin(a)).epsilon(1e-5));
    }
}

namespace {

// Group-limited routing written out with full sorts.
void reference_route(const std::vector<float>& logits, const std::vector<float>& bias, const DeepseekRouting& r, std::vector<int>& ids,
                     std::vector<double>& w) {
  const int64_t E = r.experts, per = E / r.n_group;
  std::vector<double> s(static_cast<size_t>(E)), ch(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[static_cast<size_t>(e)])));
    ch[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + bias[static_cast<size_t>(e)];
  }
  std::vector<std::pair<double, int>> groups;
  for (int g = 0; g < r.n_group; ++g) {
    std::vector<double> v(ch.begin() + g * per, ch.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    groups.push_back({-(v[0] + v[1]), g});
  }
  std::sort(groups.begin(), groups.end());
  std::vector<std::pair<double, int>> cand;
  for (int64_t e = 0; e < E; ++e) {
    bool kept = false;
    for (int i = 0; i < r.topk_group; ++i) kept = kept || groups[static_cast<size_t>(i)].second == e / per;
    cand.push_back({-(kept ? ch[static_cast<size_t>(e)] : 0.0), static_cast<int>(e)});
  }
  std::sort(cand.begin(), cand.end());
  ids.clear();
  w.clear();
  double sum = 0;
  for (int i = 0; i < r.k; ++i) {
    ids.push_back(cand[static_cast<size_t>(i)].second);
    w.push_back(s[static_cast<size_t>(ids.back())]);
    sum += w.back();
  }
  for (auto& x : w) x = (r.norm_topk_prob ? x / sum : x) * r.routed_scaling_factor;
}

}  // namespace

TEST_CASE("deepseek routing: group-limited top-k with bias for selection, unbiased weights") {
  const DeepseekRouting r{16, 4, 4, 2, true, 2.5};
  int checked = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const auto logits = test::random_floats(16, seed, 2.0f);
    auto bias = test::random_floats(16, seed + 10000, 0.5f);
    // Some tokens with strongly negative biases: masked experts (choice 0.0)
    // then outrank kept ones, as in transformers.
    if (seed % 5 == 0)
      for (auto& b : bias) b -= 1.5f;
    std::vector<int32_t> ids(4);
    std::vector<float> w(4);
    deepseek_route(logits.data(), bias.data(), r, ids.data(), w.data());
    std::vector<int> rid;
    std::vector<double> rw;
    reference_route(logits, bias, r, rid, rw);
    for (int i = 0; i < 4; ++i) {
      CHECK(ids[static_cast<size_t>(i)] == rid[static_cast<size_t>(i)]);
      CHECK(w[static_cast<size_t>(i)] == doctest::Approx(rw[static_cast<size_t>(i)]).epsilon(1e-5));
    }
    double sum = 0;
    for (float x : w) sum += x;
    CHECK(sum == doctest::Approx(2.5).epsilon(1e-5));
    ++checked;
  }
  CHECK(checked == 200);
  // Without normalisation the weights are the sigmoid scores times the factor.
  const DeepseekRouting raw{8, 2, 1, 1, false, 1.5};
  const auto logits = test::random_floats(8, 99, 1.0f);
  std::vector<float> zero(8, 0.0f);
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  deepseek_route(logits.data(), zero.data(), raw, ids.data(), w.data());
  CHECK(w[0] == doctest::Approx(1.5 / (1.0 + std::exp(-static_cast<double>(logits[static_cast<size_t>(ids[0])])))));
}

TEST_CASE("deepseek routing: the bias changes the choice, not the weights") {
  const DeepseekRouting r{8, 2, 1, 1, true, 1.0};
  std::vector<float> logits{3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, -3.0f, -4.0f};
  std::vector<float> bias(8, 0.0f);
  bias[7] = 5.0f;  // expert 7 has the lowest score but wins the selection
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  deepseek_route(logits.data(), bias.data(), r, ids.data(), w.data());
  CHECK(ids[0] == 7);
  CHECK(ids[1] == 0);
  const double s7 = 1 / (1 + std::exp(4.0)), s0 = 1 / (1 + std::exp(-3.0));
  CHECK(w[0] == doctest::Approx(s7 / (s7 + s0)));
  CHECK(w[1] == doctest::Approx(s0 / (s7 + s0)));
}

TEST_CASE("deepseek routing: inconsistent settings throw") {
  std::vector<float> l(16, 0.5f), b(16, 0.0f);
  std::vector<int32_t> ids(16);
  std::vector<float> w(16);
  CHECK_THROWS_AS(deepseek_route(l.data(), b.data(), DeepseekRouting{16, 4, 3, 2, true, 1.0}, ids.data(), w.data()), Error);  // 3 !| 16
  CHECK_THROWS_AS(deepseek_route(l.data(), b.data(), DeepseekRouting{16, 4, 4, 5, true, 1.0}, ids.data(), w.data()), Error);  // topk_group > n_group
  CHECK_THROWS_AS(deepseek_route(l.data(), b.data(), DeepseekRouting{16, 9, 4, 2, true, 1.0}, ids.data(), w.data()), Error);  // k > 8 kept
  CHECK_THROWS_AS(deepseek_route(l.data(), b.data(), DeepseekRouting{16, 0, 4, 2, true, 1.0}, ids.data(), w.data()), Error);
}

TEST_CASE("deepseek_v3 config: published defaults, fields and validation") {
  const ModelConfig d = ModelConfig::from_json(nlohmann::json{{"model_type", "deepseek_v3"}}, "t");
  CHECK(d.arch == Arch::deepseek_v3);
  CHECK(d.vocab_size == 129280);
  CHECK(d.hidden_size == 7168);
  CHECK(d.num_hidden_layers == 61);
  CHECK(d.num_attention_heads == 128);
  CHECK(d.num_experts == 256);
  CHECK(d.num_experts_per_tok == 8);
  CHECK(d.norm_topk_prob);
  CHECK(d.mla.q_lora_rank == 1536);
  CHECK(d.mla.kv_lora_rank == 512);
  CHECK(d.mla.qk_rope_head_dim == 64);
  CHECK(d.mla.kv_token_floats() == 576);
  CHECK(d.mla.n_group == 8);
  CHECK(d.mla.topk_group == 4);
  CHECK(d.mla.routed_scaling_factor == 2.5);
  CHECK(d.mla.first_k_dense_replace == 3);
  CHECK(d.mla.rope_interleave);
  CHECK(d.mla.rope_scaling_type.empty());
  CHECK_FALSE(d.is_moe_layer(2));
  CHECK(d.is_moe_layer(3));
  CHECK(d.is_moe_layer(60));

  // The fixture's config.
  const std::string text = test::read_file(test::fixture_ref("tiny-deepseekv3/config.json"));
  REQUIRE_FALSE(text.empty());
  const ModelConfig t = ModelConfig::from_json(nlohmann::json::parse(text), "tiny");
  CHECK(t.mla.q_lora_rank == 48);
  CHECK(t.mla.kv_lora_rank == 32);
  CHECK(t.mla.qk_nope_head_dim == 32);
  CHECK(t.mla.v_head_dim == 32);
  CHECK(t.num_experts == 16);
  CHECK(t.mla.rope_scaling_type == "yarn");
  CHECK(t.mla.yarn_factor == 40);
  CHECK(t.mla.yarn_original_max_position_embeddings == 4096);
  CHECK_FALSE(t.is_moe_layer(0));
  CHECK(t.is_moe_layer(1));

  // Kimi-K2 uses the same graph; q_lora_rank null means a plain q_proj.
  const ModelConfig k = ModelConfig::from_json(nlohmann::json{{"model_type", "kimi_k2"}, {"q_lora_rank", nullptr}, {"n_group", 1}, {"topk_group", 1}}, "t");
  CHECK(k.arch == Arch::deepseek_v3);
  CHECK(k.mla.q_lora_rank == 0);

  // transformers 5 writes rope_parameters instead of rope_scaling.
  const ModelConfig v5 = ModelConfig::from_json(
      nlohmann::json{{"model_type", "deepseek_v3"},
                     {"max_position_embeddings", 163840},
                     {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 10000}, {"factor", 40}, {"original_max_position_embeddings", 4096}}}},
      "t");
  CHECK(v5.mla.rope_scaling_type == "yarn");
  CHECK(v5.mla.yarn_factor == 40);

  auto bad = [](nlohmann::json extra) {
    nlohmann::json j{{"model_type", "deepseek_v3"}};
    for (auto& [key, v] : extra.items()) j[key] = v;
    return ModelConfig::from_json(j, "t");
  };
  CHECK_THROWS_AS(bad({{"n_group", 7}}), Error);                        // does not divide 256
  CHECK_THROWS_AS(bad({{"topk_group", 9}}), Error);                     // > n_group
  CHECK_THROWS_AS(bad({{"num_experts_per_tok", 200}}), Error);          // more than the kept groups hold
  CHECK_THROWS_AS(bad({{"qk_rope_head_dim", 63}}), Error);              // odd
  CHECK_THROWS_AS(bad({{"num_key_value_heads", 8}}), Error);            // MLA: one KV per head
  CHECK_THROWS_AS(bad({{"kv_lora_rank", 0}}), Error);
  CHECK_THROWS_AS(bad({{"routed_scaling_factor", -1.0}}), Error);
  CHECK_THROWS_AS(bad({{"first_k_dense_replace", 62}}), Error);
  CHECK_THROWS_AS(bad({{"scoring_func", "softmax"}}), Error);           // DeepSeek-V2 routing: not implemented
  CHECK_THROWS_AS(bad({{"topk_method", "greedy"}}), Error);
  CHECK_THROWS_AS(bad({{"rope_scaling", {{"type", "linear"}, {"factor", 2}}}}), Error);
  CHECK_THROWS_AS(bad({{"rope_scaling", {{"type", "yarn"}, {"factor", -2}}}}), Error);
  CHECK_THROWS_AS(bad({{"rope_scaling", "yarn"}}), Error);
  CHECK_THROWS_AS(bad({{"rope_interleave", "yes"}}), Error);
}

TEST_CASE("KV cache: per-layer token widths for the latent layout") {
  const ModelConfig c = small_mla_config(true, true);
  const KvLayout l = mla_kv_layout(c);
  CHECK(l.k_floats() == 18);
  CHECK(l.v_floats() == 0);
  CHECK(KvCache::bytes_per_block(l, 16) == 2 * 16 * 18 * 4);
  // The plain layout keeps its meaning.
  const KvLayout plain{2, 3, 8};
  CHECK(plain.k_floats() == 24);
  CHECK(plain.v_floats() == 24);
  CHECK(KvCache::bytes_per_block(plain, 16) == 2 * 2 * 16 * 24 * 4);

  KvCache kv(l, 4, 4);
  const int a = kv.add_sequence(), b = kv.add_sequence();
  kv.reserve(a, 6);
  kv.reserve(b, 5);
  // Write a distinct pattern into every (layer, seq, pos) slot, then read all back.
  auto value = [](int64_t layer, int seq, int64_t pos, int64_t i) { return static_cast<float>(layer * 10000 + seq * 1000 + pos * 100 + i); };
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int seq : {a, b})
      for (int64_t pos = 0; pos < (seq == a ? 6 : 5); ++pos)
        for (int64_t i = 0; i < 18; ++i) kv.k(layer, seq, pos)[i] = value(layer, seq, pos, i);
  for (int64_t layer = 0; layer < 2; ++layer)
    for (int seq : {a, b})
      for (int64_t pos = 0; pos < (seq == a ? 6 : 5); ++pos)
        for (int64_t i = 0; i < 18; ++i) CHECK(kv.k(layer, seq, pos)[i] == value(layer, seq, pos, i));
  KvLayout negative = l;
  negative.k_token_floats = -2;
  negative.kv_heads = -1;
  CHECK_THROWS_AS(KvCache(negative, 2, 4), Error);
}

TEST_CASE("MLA: the latent path on the scalar kernels matches the reference too") {
  numa::ThreadPool pool(2);
  const cpu::Isa before = cpu::set_isa_for_testing(cpu::Isa::scalar);
  const ModelConfig c = small_mla_config(true, true);
  const RandomMla rw(c, 31337);
  const int64_t H = c.hidden_size, total = 20;
  const auto x = test::random_floats(static_cast<size_t>(total * H), 8, 1.0f);
  const auto ref = reference_mla(c, rw, x, total);
  auto block = make_mla_attention(rw.w, c, 0, pool, MlaMode::latent);
  KvCache kv(mla_kv_layout(c), 3, 8);  // the context spans three cache blocks
  const int seq = kv.add_sequence();
  kv.reserve(seq, total);
  Workspace ws;
  double worst = 0;
  for (int64_t t = 0; t < total; ++t) {
    const ops::TokenSlot s{seq, t};
    std::vector<float> o(static_cast<size_t>(H));
    block->forward(x.data() + t * H, 1, &s, kv, o.data(), ws);
    worst = std::max(worst, max_abs_diff(o.data(), ref.data() + t * H, o.size()));
  }
  cpu::set_isa_for_testing(before);
  CHECK(worst < 2e-5);
}

TEST_CASE("mla_attention setting values") {
  CHECK(parse_mla_mode("auto") == MlaMode::automatic);
  CHECK(parse_mla_mode("latent") == MlaMode::latent);
  CHECK(parse_mla_mode("expanded") == MlaMode::expanded);
  CHECK(parse_mla_mode("expanded_prefill") == MlaMode::expanded_prefill);
  CHECK_THROWS_AS(parse_mla_mode(""), Error);
  CHECK_THROWS_AS(parse_mla_mode("Latent"), Error);
}
