// Each CPU op against a plain scalar reference on random data.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <tuple>

#include "configs/error.h"

#include "engine/ops/cpu_ops.h"
#include "engine/serving/logits.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
std::vector<uint16_t> to_f16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_f16(v[i]);
  return o;
}

}  // namespace

TEST_CASE("gemm: every ISA and weight dtype against the scalar reference") {
  numa::ThreadPool pool(2);
  for (auto [n, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 37, 70}, {3, 64, 64}, {9, 130, 257}, {17, 16, 2048}}) {
    auto x = test::random_floats(static_cast<size_t>(n * cols), 1 + n);
    auto wf = test::random_floats(static_cast<size_t>(rows * cols), 2 + rows, 0.05f);
    auto wb = to_bf16(wf);
    auto wh = to_f16(wf);
    for (auto [dt, data] : {std::pair<DType, const void*>{DType::f32, wf.data()}, {DType::bf16, wb.data()}, {DType::f16, wh.data()}}) {
      cpu::Mat w{dt, data, rows, cols};
      std::vector<float> ref(static_cast<size_t>(n * rows)), got(ref.size());
      cpu::gemm_reference(x.data(), n, w, ref.data());
      for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
        cpu::Isa old = cpu::set_isa_for_testing(isa);
        std::fill(got.begin(), got.end(), NAN);
        cpu::gemm(x.data(), n, w, got.data(), &pool);
        cpu::set_isa_for_testing(old);
        for (size_t i = 0; i < ref.size(); ++i)
          REQUIRE_MESSAGE(std::fabs(got[i] - ref[i]) <= 1e-4f * (1.0f + std::fabs(ref[i])),
                          "isa " << cpu::isa_name(isa) << " dtype " << dtype_name(dt) << " n=" << n << " rows=" << rows << " cols=" << cols << " i=" << i);
      }
    }
  }
}

TEST_CASE("rms_norm against the formula") {
  const int64_t n = 3, d = 67;
  auto x = test::random_floats(static_cast<size_t>(n * d), 11);
  auto w = test::random_floats(static_cast<size_t>(d), 12);
  std::vector<float> y(x.size());
  ops::rms_norm(x.data(), n, d, cpu::Mat{DType::f32, w.data(), 1, d}, 1e-6, y.data());
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[static_cast<size_t>(t * d + i)] * x[static_cast<size_t>(t * d + i)];
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t i = 0; i < d; ++i) CHECK(y[static_cast<size_t>(t * d + i)] == doctest::Approx(w[static_cast<size_t>(i)] * x[static_cast<size_t>(t * d + i)] * inv).epsilon(1e-5));
  }
}

TEST_CASE("rope: rotate-half with theta, against the closed form") {
  const int64_t hd = 64, heads = 3;
  ops::Rope rope(hd, 1e6);
  for (int64_t pos : {0, 1, 17, 4000}) {
    auto x = test::random_floats(static_cast<size_t>(heads * hd), 20 + pos);
    auto y = x;
    rope.apply(y.data(), heads, pos);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double f = pos / std::pow(1e6, 2.0 * i / hd);
        const double a = x[static_cast<size_t>(h * hd + i)], b = x[static_cast<size_t>(h * hd + i + hd / 2)];
        CHECK(y[static_cast<size_t>(h * hd + i)] == doctest::Approx(a * std::cos(f) - b * std::sin(f)).epsilon(1e-3));
        CHECK(y[static_cast<size_t>(h * hd + i + hd / 2)] == doctest::Approx(b * std::cos(f) + a * std::sin(f)).epsilon(1e-3));
      }
  }
}

TEST_CASE("attention over the paged cache equals naive causal GQA") {
  const int64_t heads = 4, kvh = 2, hd = 16, len = 37;
  KvCache kv(KvLayout{1, kvh, hd}, 8, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, len);
  auto ks = test::random_floats(static_cast<size_t>(len * kvh * hd), 31);
  auto vs = test::random_floats(static_cast<size_t>(len * kvh * hd), 32);
  for (int64_t p = 0; p < len; ++p) kv.store(0, seq, p, ks.data() + p * kvh * hd, vs.data() + p * kvh * hd);
  const int64_t n = 5;
  auto q = test::random_floats(static_cast<size_t>(n * heads * hd), 33);
  std::vector<ops::TokenSlot> slots;
  for (int64_t t = 0; t < n; ++t) slots.push_back({seq, len - n + t});
  std::vector<float> out(q.size());
  numa::ThreadPool pool(2);
  const float scale = 0.25f;
  ops::attention(q.data(), n, heads, kvh, hd, slots.data(), kv, 0, scale, out.data(), &pool);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kvh), upto = slots[static_cast<size_t>(t)].pos;
      std::vector<double> s(static_cast<size_t>(upto + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= upto; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += q[static_cast<size_t>((t * heads + h) * hd + i)] * ks[static_cast<size_t>((j * kvh + g) * hd + i)];
        s[static_cast<size_t>(j)] = d * scale;
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (int64_t j = 0; j <= upto; ++j) o += s[static_cast<size_t>(j)] / sum * vs[static_cast<size_t>((j * kvh + g) * hd + i)];
        CHECK(out[static_cast<size_t>((t * heads + h) * hd + i)] == doctest::Approx(o).epsilon(1e-4));
      }
    }
}

TEST_CASE("attention: split chunks, GQA groups, paging and threads equal the scalar reference") {
  // Three sequences written interleaved (their pages are not contiguous),
  // contexts from 1 to 2100 (several chunks each), decode and prefill rows.
  // 16/2 heads of 256: Qwen3-Next's full attention.
  for (auto [heads, kvh, hd, bs] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{32, 4, 128, 16}, {16, 2, 256, 16}, {8, 2, 64, 32}, {6, 3, 24, 16}, {4, 4, 16, 16}}) {
    const std::vector<int64_t> lens = {2100, 1, 613};
    KvCache kv(KvLayout{2, kvh, hd}, 2100 / bs * 3 + 16, bs);
    std::vector<int> seqs;
    for (size_t s = 0; s < lens.size(); ++s) seqs.push_back(kv.add_sequence());
    const int64_t maxlen = 2100;
    for (int64_t p = 0; p < maxlen; p += bs)
      for (size_t s = 0; s < lens.size(); ++s)
        if (p < lens[s]) kv.reserve(seqs[s], std::min(lens[s], p + bs));
    for (size_t s = 0; s < lens.size(); ++s) {
      auto ks = test::random_floats(static_cast<size_t>(lens[s] * kvh * hd), 50 + s);
      auto vs = test::random_floats(static_cast<size_t>(lens[s] * kvh * hd), 60 + s);
      for (int64_t p = 0; p < lens[s]; ++p) kv.store(1, seqs[s], p, ks.data() + p * kvh * hd, vs.data() + p * kvh * hd);
    }
    for (int batch : {0, 1}) {
      std::vector<ops::TokenSlot> slots;
      if (batch == 0) slots = {{seqs[0], 2099}};                                           // decode at long context
      else slots = {{seqs[0], 2097}, {seqs[0], 2098}, {seqs[1], 0}, {seqs[2], 600}, {seqs[2], 612}};  // mixed
      const int64_t n = static_cast<int64_t>(slots.size());
      auto q = test::random_floats(static_cast<size_t>(n * heads * hd), 70 + static_cast<uint64_t>(batch));
      for (auto& v : q) v *= 3.0f;  // peaked softmax: the chunks' maxima differ widely
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> ref(q.size());
      ops::attention_reference(q.data(), n, heads, kvh, hd, slots.data(), kv, 1, scale, ref.data());
      for (int threads : {0, 1, 2, 3}) {
        std::unique_ptr<numa::ThreadPool> pool;
        if (threads) pool = std::make_unique<numa::ThreadPool>(threads, false);
        std::vector<float> out(q.size(), NAN);
        ops::attention(q.data(), n, heads, kvh, hd, slots.data(), kv, 1, scale, out.data(), pool.get());
        double worst = 0;
        for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(out[i] - ref[i])));
        INFO("heads " << heads << "/" << kvh << " hd " << hd << " block " << bs << " batch " << batch << " threads " << threads << " worst " << worst);
        CHECK(worst < 2e-5);
      }
    }
  }
}

TEST_CASE("softmax_topk and logits helpers") {
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  int32_t ids[3];
  float w[3];
  ops::softmax_topk(l.data(), 5, 3, false, ids, w);
  CHECK(ids[0] == 1);
  CHECK(ids[1] == 3);  // tie: lower index first
  CHECK(ids[2] == 4);
  double z = 0;
  for (float x : l) z += std::exp(x);
  CHECK(w[0] == doctest::Approx(std::exp(2.0) / z));
  ops::softmax_topk(l.data(), 5, 3, true, ids, w);
  CHECK(w[0] + w[1] + w[2] == doctest::Approx(1.0));
  CHECK(argmax(l.data(), 5) == 1);
  CHECK(logsumexp(l.data(), 5) == doctest::Approx(std::log(z)));
  std::vector<int32_t> tid;
  std::vector<float> tv;
  top_k(l.data(), 5, 2, tid, tv);
  CHECK(tid == std::vector<int32_t>{1, 3});
}

TEST_CASE("moe_forward equals the per-token sum of SwiGLU experts") {
  const int64_t H = 48, I = 20, E = 6, K = 2, n = 7;
  std::vector<std::vector<uint16_t>> store;
  std::vector<numa::ExpertWeights> experts;
  for (int64_t e = 0; e < E; ++e) {
    store.push_back(to_bf16(test::random_floats(static_cast<size_t>(I * H), 100 + e, 0.2f)));
    store.push_back(to_bf16(test::random_floats(static_cast<size_t>(I * H), 200 + e, 0.2f)));
    store.push_back(to_bf16(test::random_floats(static_cast<size_t>(H * I), 300 + e, 0.2f)));
  }
  for (int64_t e = 0; e < E; ++e)
    experts.push_back({cpu::Mat{DType::bf16, store[static_cast<size_t>(3 * e)].data(), I, H}, cpu::Mat{DType::bf16, store[static_cast<size_t>(3 * e + 1)].data(), I, H},
                       cpu::Mat{DType::bf16, store[static_cast<size_t>(3 * e + 2)].data(), H, I}});
  auto x = test::random_floats(static_cast<size_t>(n * H), 5);
  std::vector<int32_t> ids = {0, 5, 1, 2, 3, 0, 4, 5, 5, 2, 1, 0, 3, 4};
  auto wts = test::random_floats(static_cast<size_t>(n * K), 6);
  std::vector<float> out(static_cast<size_t>(n * H), 0.0f);
  numa::ThreadPool pool(2);
  numa::moe_forward(x.data(), n, H, ids.data(), wts.data(), K, experts, out.data(), &pool);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> ref(static_cast<size_t>(H), 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const auto& w = experts[static_cast<size_t>(ids[static_cast<size_t>(t * K + j)])];
      std::vector<double> h(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t k = 0; k < H; ++k) {
          g += x[static_cast<size_t>(t * H + k)] * bf16_to_f32(static_cast<const uint16_t*>(w.gate.data)[i * H + k]);
          u += x[static_cast<size_t>(t * H + k)] * bf16_to_f32(static_cast<const uint16_t*>(w.up.data)[i * H + k]);
        }
        h[static_cast<size_t>(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t o = 0; o < H; ++o) {
        double d = 0;
        for (int64_t i = 0; i < I; ++i) d += h[static_cast<size_t>(i)] * bf16_to_f32(static_cast<const uint16_t*>(w.down.data)[o * I + i]);
        ref[static_cast<size_t>(o)] += wts[static_cast<size_t>(t * K + j)] * d;
      }
    }
    // Absolute floor 1e-6 (scale 1e-2 at epsilon 1e-4): outputs near zero differ from the double reference by the
    // fp32 sums' order, which the AVX-512 and AVX2 kernels choose differently (3.8e-7 seen on an AVX2-only EPYC).
    for (int64_t o = 0; o < H; ++o) CHECK(out[static_cast<size_t>(t * H + o)] == doctest::Approx(ref[static_cast<size_t>(o)]).epsilon(1e-4).scale(1e-2));
  }
}

TEST_CASE("thread pool: every index once, exceptions propagate, many start/stop cycles") {
  for (int round = 0; round < 50; ++round) {
    numa::ThreadPool pool(3, round % 2 == 0);
    std::vector<std::atomic<int>> hit(1000);
    pool.parallel_for(1000, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hit[static_cast<size_t>(i)]++;
    });
    for (auto& h : hit) REQUIRE(h.load() == 1);
  }
  numa::ThreadPool pool(2);
  CHECK_THROWS_AS(pool.parallel_for(100, [](int64_t b, int64_t, int) { if (b >= 0) throw std::runtime_error("boom"); }), std::runtime_error);
  int sum = 0;
  pool.parallel_for(1, [&](int64_t, int64_t, int) { sum = 1; });
  CHECK(sum == 1);
}

TEST_CASE("kv cache: blocks are handed out and returned") {
  KvCache kv(KvLayout{2, 1, 4}, 3, 16);
  int a = kv.add_sequence(), b = kv.add_sequence();
  kv.reserve(a, 20);
  CHECK(kv.free_blocks() == 1);
  CHECK_THROWS_AS(kv.reserve(b, 40), Error);
  CHECK(kv.capacity(b) == 0);
  kv.reserve(b, 16);
  CHECK(kv.free_blocks() == 0);
  kv.free_sequence(a);
  CHECK(kv.free_blocks() == 2);
  const float k[4] = {1.0f, -2.0f, 2.5f, 4.0f}, v[4] = {0.5f, 0.25f, -8.0f, 3.0f};
  kv.store(1, b, 15, k, v);
  float kb[4], vb[4];
  kv.load(1, b, 15, kb, vb);
  CHECK(std::equal(k, k + 4, kb));
  CHECK(std::equal(v, v + 4, vb));
  // GQA layouts are head-major (rows not contiguous): the row pointers refuse
  CHECK_THROWS_AS(kv.k(1, b, 15), Error);
}
