// The MLA and DeepSeek routing kernels (gpu/mla.h) against plain scalar
// references on random data: rms_norm_rows, mla_rope and mla_kv_store
// against MlaRope (engine/layers/mla_attention.h), head_matmul, both attention paths
// over a paged latent cache with scattered slots and contexts that cross key
// chunks, gather_rows, and deepseek_topk against deepseek_route. Inputs the
// GPU takes as bf16 are rounded for the reference too. Skips without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "configs/error.h"
#include "engine/layers/deepseek_moe.h"
#include "engine/layers/mla_attention.h"
#include "engine/ops/cpu_ops.h"
#include "gpu/mla.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;
using test::bf16_of;
using test::bf16_round;

namespace {

ModelConfig yarn_config(int64_t rope_dim) {
  ModelConfig c;
  c.arch = Arch::deepseek_v3;
  c.rope_theta = 10000;
  c.mla.qk_rope_head_dim = rope_dim;
  c.mla.rope_scaling_type = "yarn";
  c.mla.yarn_factor = 40;
  c.mla.yarn_mscale = 1.0;
  c.mla.yarn_mscale_all_dim = 0.707;  // attention factor != 1
  return c;
}

// Scattered slots: a permutation of [0, total).
std::vector<int32_t> shuffled_slots(int64_t total, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(total));
  std::iota(v.begin(), v.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Latent attention in double precision: token t, head h attends with query
// [q_lat[(t*heads + h)*r ..], q_pe[t*ldpe + h*hpe ..]] over the cache rows
// lists[offs[t] + j], j < lens[t] (rows of r + rope floats), values their
// first r floats. Tokens with skip[t] (skip may be empty) and empty contexts: zeros.
std::vector<float> latent_reference(const std::vector<float>& qlat, const std::vector<float>& qpe, int64_t ldpe, int64_t hpe, int64_t heads,
                                    int64_t r, int64_t rope, const std::vector<float>& cf, const std::vector<int32_t>& lists,
                                    const std::vector<int32_t>& offs, const std::vector<int32_t>& lens, const std::vector<int32_t>& skip, float scale) {
  const int64_t n = static_cast<int64_t>(lens.size()), lw = r + rope;
  std::vector<float> ref(static_cast<size_t>(n * heads * r), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t len = lens[static_cast<size_t>(t)];
    if ((!skip.empty() && skip[static_cast<size_t>(t)]) || len == 0) continue;
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<double> p(static_cast<size_t>(len));
      double mx = -1e300;
      for (int64_t j = 0; j < len; ++j) {
        const float* c = cf.data() + lists[static_cast<size_t>(offs[static_cast<size_t>(t)] + j)] * lw;
        double sc = 0;
        for (int64_t i = 0; i < r; ++i) sc += static_cast<double>(qlat[static_cast<size_t>((t * heads + h) * r + i)]) * c[i];
        for (int64_t i = 0; i < rope; ++i) sc += static_cast<double>(qpe[static_cast<size_t>(t * ldpe + h * hpe + i)]) * c[r + i];
        p[static_cast<size_t>(j)] = sc * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (auto& v : p) sum += (v = std::exp(v - mx));
      std::vector<double> o(static_cast<size_t>(r), 0.0);
      for (int64_t j = 0; j < len; ++j) {
        const float* c = cf.data() + lists[static_cast<size_t>(offs[static_cast<size_t>(t)] + j)] * lw;
        for (int64_t i = 0; i < r; ++i) o[static_cast<size_t>(i)] += p[static_cast<size_t>(j)] * c[i];
      }
      for (int64_t i = 0; i < r; ++i) ref[static_cast<size_t>((t * heads + h) * r + i)] = static_cast<float>(o[static_cast<size_t>(i)] / sum);
    }
  }
  return ref;
}

}  // namespace

TEST_CASE("gpu rms_norm_rows, mla_rope and mla_kv_store match the CPU (yarn, interleaved and not)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (bool interleave : {true, false}) {
    CAPTURE(interleave);
    ModelConfig c = yarn_config(16);
    c.mla.rope_interleave = interleave;
    const MlaRope rope(c);
    auto dfreq = test::to_device(rope.inv_freq, s);
    const gpu::MlaRopeArgs ra{dfreq.as<float>(), rope.dim, rope.attention_factor, rope.interleave};
    const int64_t n = 5, heads = 3, hx = 40, ldx = heads * hx + 7;
    std::vector<int32_t> pos = {0, 1, 33, 1000, 70000};
    auto dp = test::to_device(pos, s);

    // Rope on q heads at offset 24 of each 40-float head.
    auto x = test::random_floats(static_cast<size_t>(n * ldx), 101);
    std::vector<float> ref(x);
    for (int64_t t = 0; t < n; ++t) rope.apply(ref.data() + t * ldx + 24, heads, hx, pos[static_cast<size_t>(t)]);
    auto dx = test::to_device(x, s);
    gpu::mla_rope(dx.as<float>() + 24, ldx, hx, n, heads, ra, dp.as<int32_t>(), s);
    CHECK(test::tol_ratio(test::to_host<float>(dx, x.size(), s), ref, 1e-5, 1e-4) <= 1);

    // Latent store: r = 32 latent values then 16 rope values, source rows ldkv apart.
    const int64_t r = 32, lw = r + 16, ldkv = 60, slots_total = 11;
    auto kvsrc = test::random_floats(static_cast<size_t>(n * ldkv), 102);
    auto nw = bf16_of(test::random_floats(static_cast<size_t>(r), 103, 0.5f));
    std::vector<int32_t> slots = {7, 0, 10, 3, 5};
    std::vector<float> cref(static_cast<size_t>(slots_total * lw), 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> row(kvsrc.begin() + t * ldkv, kvsrc.begin() + t * ldkv + lw);
      ops::rms_norm(row.data(), 1, r, cpu::Mat{DType::bf16, nw.data(), 1, r}, 1e-6, row.data());
      rope.apply(row.data() + r, 1, lw, pos[static_cast<size_t>(t)]);
      std::copy(row.begin(), row.end(), cref.begin() + slots[static_cast<size_t>(t)] * lw);
    }
    auto dkv = test::to_device(kvsrc, s), dnw = test::to_device(nw, s), dsl = test::to_device(slots, s);
    gpu::DeviceBuffer dc(static_cast<size_t>(slots_total * lw) * 2);
    gpu::memset_device(dc.data(), 0, dc.bytes(), s);
    gpu::mla_kv_store(dkv.as<float>(), ldkv, n, r, dnw.as<uint16_t>(), 1e-6f, ra, dp.as<int32_t>(), dsl.as<int32_t>(), dc.as<uint16_t>(), s);
    CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(dc, cref.size(), s)), cref, 1e-3, 8e-3) <= 1);

    // q_a norm: rows of 24 values ldx apart, to bf16.
    std::vector<float> nref(static_cast<size_t>(n * 24));
    auto qw = bf16_of(test::random_floats(24, 104, 0.5f));
    for (int64_t t = 0; t < n; ++t) ops::rms_norm(x.data() + t * ldx, 1, 24, cpu::Mat{DType::bf16, qw.data(), 1, 24}, 1e-6, nref.data() + t * 24);
    auto dx2 = test::to_device(x, s), dqw = test::to_device(qw, s);
    gpu::DeviceBuffer dy(static_cast<size_t>(n * 24) * 2);
    gpu::rms_norm_rows(dx2.as<float>(), ldx, n, 24, dqw.as<uint16_t>(), 1e-6f, dy.as<uint16_t>(), nullptr, s);
    const auto y_hi = test::to_host<uint16_t>(dy, nref.size(), s);
    CHECK(test::tol_ratio(test::f32_of(y_hi), nref, 1e-3, 8e-3) <= 1);
    gpu::DeviceBuffer dy_lo(static_cast<size_t>(n * 24) * 2);  // split input: same hi, hi + lo to about 16 bits
    gpu::rms_norm_rows(dx2.as<float>(), ldx, n, 24, dqw.as<uint16_t>(), 1e-6f, dy.as<uint16_t>(), dy_lo.as<uint16_t>(), s);
    CHECK(test::to_host<uint16_t>(dy, nref.size(), s) == y_hi);
    CHECK(test::tol_ratio(test::bf16_pair_sum(y_hi, test::to_host<uint16_t>(dy_lo, nref.size(), s)), nref, 1e-6, 3e-5) <= 1);
  }
}

TEST_CASE("gpu head_matmul matches a scalar per-head product (fp32 and bf16 outputs, token tiles)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t n = 6, heads = 3, in = 40, out = 13, hx = 48, ldx = heads * hx + 5, hw = out * in + 8, ldy = heads * 16 + 3, hy = 16;
  auto x = test::random_floats(static_cast<size_t>(n * ldx), 201);
  auto w = bf16_of(test::random_floats(static_cast<size_t>(heads * hw), 202, 0.2f));
  const auto& xr = x;  // fp32 inputs, not rounded
  std::vector<float> ref(static_cast<size_t>(n * ldy), 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i)
          acc += static_cast<double>(xr[static_cast<size_t>(t * ldx + h * hx + i)]) * bf16_to_f32(w[static_cast<size_t>(h * hw + o * in + i)]);
        ref[static_cast<size_t>(t * ldy + h * hy + o)] = static_cast<float>(acc);
      }
  auto dx = test::to_device(x, s), dw = test::to_device(w, s);
  gpu::DeviceBuffer dy(static_cast<size_t>(n * ldy) * 4), dyb(static_cast<size_t>(n * ldy) * 2);
  gpu::memset_device(dy.data(), 0, dy.bytes(), s);
  gpu::memset_device(dyb.data(), 0, dyb.bytes(), s);
  gpu::head_matmul(dx.as<float>(), ldx, hx, n, heads, in, out, dw.as<uint16_t>(), hw, dy.as<float>(), nullptr, ldy, hy, s);
  gpu::head_matmul(dx.as<float>(), ldx, hx, n, heads, in, out, dw.as<uint16_t>(), hw, nullptr, dyb.as<uint16_t>(), ldy, hy, s);
  CHECK(test::tol_ratio(test::to_host<float>(dy, ref.size(), s), ref, 1e-4, 1e-4) <= 1);
  CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(dyb, ref.size(), s)), ref, 1e-3, 8e-3) <= 1);
  CHECK_THROWS_AS(gpu::head_matmul(dx.as<float>(), ldx, hx, n, heads, 36, out, dw.as<uint16_t>(), hw, dy.as<float>(), nullptr, ldy, hy, s), Error);
}

TEST_CASE("gpu MLA attention, latent and expanded paths, match scalar references over a scattered paged cache") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t heads = 3, r = 64, rope = 16, lw = r + 16, nope = 32, vd = 32, qk = nope + rope, ew = nope + vd, total = 400;
  // Three tokens: two of one sequence (lengths 150, 151: past two key chunks), one of another (length 37).
  const std::vector<int32_t> lens = {150, 151, 37}, offs = {0, 0, 151};
  const auto slot_perm = shuffled_slots(total, 301);
  std::vector<int32_t> lists(slot_perm.begin(), slot_perm.begin() + 151 + 37);
  const int64_t n = 3, list_len = static_cast<int64_t>(lists.size());
  auto cache = bf16_of(test::random_floats(static_cast<size_t>(total * lw), 302));
  const auto cf = test::f32_of(cache);
  const float scale = 0.11f;
  auto dcache = test::to_device(cache, s), dl = test::to_device(lists, s), doff = test::to_device(offs, s), dlen = test::to_device(lens, s);

  SUBCASE("latent") {
    const int64_t ldpe = heads * 20 + 3, hpe = 20;
    auto qlat = test::random_floats(static_cast<size_t>(n * heads * r), 303, 0.3f);
    auto qpe = test::random_floats(static_cast<size_t>(n * ldpe), 304, 0.3f);
    std::vector<int32_t> skip = {0, 1, 0};
    const std::vector<float> ref = latent_reference(qlat, qpe, ldpe, hpe, heads, r, rope, cf, lists, offs, lens, skip, scale);
    auto dq = test::to_device(qlat, s), dpe = test::to_device(qpe, s), dskip = test::to_device(skip, s);
    gpu::DeviceBuffer dout(ref.size() * 4);
    gpu::memset_device(dout.data(), 0x7f, dout.bytes(), s);  // skipped tokens must be written (zeros)
    gpu::mla_attention_latent(dq.as<float>(), dpe.as<float>(), ldpe, hpe, n, heads, r, rope, dcache.as<uint16_t>(), dl.as<int32_t>(),
                              doff.as<int32_t>(), dlen.as<int32_t>(), dskip.as<int32_t>(), scale, dout.as<float>(), nullptr, s);
    CHECK(test::tol_ratio(test::to_host<float>(dout, ref.size(), s), ref, 1e-5, 1e-4) <= 1);
    // With a workspace: split-K partials and their combination.
    gpu::DeviceBuffer work(static_cast<size_t>(std::max<int64_t>(1, gpu::mla_attention_latent_workspace(n, heads, r, rope))) * 4);
    gpu::memset_device(dout.data(), 0x7f, dout.bytes(), s);
    gpu::mla_attention_latent(dq.as<float>(), dpe.as<float>(), ldpe, hpe, n, heads, r, rope, dcache.as<uint16_t>(), dl.as<int32_t>(),
                              doff.as<int32_t>(), dlen.as<int32_t>(), dskip.as<int32_t>(), scale, dout.as<float>(), work.as<float>(), s);
    CHECK(test::tol_ratio(test::to_host<float>(dout, ref.size(), s), ref, 1e-5, 1e-4) <= 1);
  }

  SUBCASE("gather_rows and expanded") {
    gpu::DeviceBuffer dg(static_cast<size_t>(list_len * r) * 2);
    gpu::gather_rows(dcache.as<uint16_t>(), lw, dl.as<int32_t>(), list_len, r, dg.as<uint16_t>(), s);
    const auto g = test::to_host<uint16_t>(dg, static_cast<size_t>(list_len * r), s);
    for (int64_t i = 0; i < list_len; ++i)
      for (int64_t c = 0; c < r; ++c)
        REQUIRE(g[static_cast<size_t>(i * r + c)] == cache[static_cast<size_t>(lists[static_cast<size_t>(i)] * lw + c)]);

    const int64_t ldq = heads * qk + 5;
    auto q = test::random_floats(static_cast<size_t>(n * ldq), 305, 0.3f);
    auto kvx = test::random_floats(static_cast<size_t>(list_len * heads * ew), 306);
    std::vector<int32_t> only = {1, 1, 0};
    std::vector<float> ref(static_cast<size_t>(n * heads * vd), 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      if (!only[static_cast<size_t>(t)]) continue;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t len = lens[static_cast<size_t>(t)], off = offs[static_cast<size_t>(t)];
        std::vector<double> p(static_cast<size_t>(len));
        double mx = -1e30;
        for (int64_t j = 0; j < len; ++j) {
          const float* kn = kvx.data() + (off + j) * heads * ew + h * ew;
          const float* kr = cf.data() + lists[static_cast<size_t>(off + j)] * lw + r;
          double sc = 0;
          for (int64_t i = 0; i < nope; ++i) sc += static_cast<double>(q[static_cast<size_t>(t * ldq + h * qk + i)]) * kn[i];
          for (int64_t i = 0; i < rope; ++i) sc += static_cast<double>(q[static_cast<size_t>(t * ldq + h * qk + nope + i)]) * kr[i];
          p[static_cast<size_t>(j)] = sc * scale;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (auto& v : p) sum += (v = std::exp(v - mx));
        for (int64_t i = 0; i < vd; ++i) {
          double o = 0;
          for (int64_t j = 0; j < len; ++j) o += p[static_cast<size_t>(j)] * kvx[static_cast<size_t>((off + j) * heads * ew + h * ew + nope + i)];
          ref[static_cast<size_t>((t * heads + h) * vd + i)] = static_cast<float>(o / sum);
        }
      }
    }
    auto dq = test::to_device(q, s), dkv = test::to_device(kvx, s), donly = test::to_device(only, s);
    gpu::DeviceBuffer dout(ref.size() * 2), dlo(ref.size() * 2);
    gpu::memset_device(dout.data(), 0, dout.bytes(), s);  // token 2 is not written: stays 0 as in ref
    gpu::memset_device(dlo.data(), 0, dlo.bytes(), s);
    gpu::mla_attention_expanded(dq.as<float>(), ldq, n, heads, nope, rope, vd, dkv.as<float>(), dcache.as<uint16_t>(), lw, r, dl.as<int32_t>(),
                                doff.as<int32_t>(), dlen.as<int32_t>(), donly.as<int32_t>(), scale, dout.as<uint16_t>(), nullptr, s);
    const auto hi = test::to_host<uint16_t>(dout, ref.size(), s);
    CHECK(test::tol_ratio(test::f32_of(hi), ref, 1e-3, 8e-3) <= 1);
    // Split output (o_proj's input): the same hi, hi + lo within fp32 summation-order noise.
    gpu::mla_attention_expanded(dq.as<float>(), ldq, n, heads, nope, rope, vd, dkv.as<float>(), dcache.as<uint16_t>(), lw, r, dl.as<int32_t>(),
                                doff.as<int32_t>(), dlen.as<int32_t>(), donly.as<int32_t>(), scale, dout.as<uint16_t>(), dlo.as<uint16_t>(), s);
    CHECK(test::to_host<uint16_t>(dout, ref.size(), s) == hi);
    CHECK(test::tol_ratio(test::bf16_pair_sum(hi, test::to_host<uint16_t>(dlo, ref.size(), s)), ref, 1e-5, 1e-4) <= 1);
  }
}

// Latent attention at the shapes the kernel specialises on: DeepSeek-V3's
// kv_lora 512 + rope 64 (16 heads per block) with a head count that is not a
// multiple of 16, a long context (many splits) next to a short and an empty
// one; and kv_lora 768 (8 heads per block, the narrow variant).
TEST_CASE("gpu mla_attention_latent: head groups, split-K and long contexts match a scalar reference") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  struct Shape {
    int64_t heads, r, rope;
  };
  for (const Shape& sh : {Shape{20, 512, 64}, Shape{9, 768, 64}}) {
    CAPTURE(sh.heads);
    CAPTURE(sh.r);
    const int64_t heads = sh.heads, r = sh.r, rope = sh.rope, lw = r + rope, total = 2100;
    const std::vector<int32_t> lens = {1777, 45, 0, 1}, offs = {0, 1777, 0, 1822};
    const int64_t n = static_cast<int64_t>(lens.size());
    const auto perm = shuffled_slots(total, 401);
    std::vector<int32_t> lists(perm.begin(), perm.begin() + 1823);
    auto cache = bf16_of(test::random_floats(static_cast<size_t>(total * lw), 402));
    const auto cf = test::f32_of(cache);
    const int64_t ldpe = heads * rope, hpe = rope;
    auto qlat = test::random_floats(static_cast<size_t>(n * heads * r), 403, 0.05f);
    auto qpe = test::random_floats(static_cast<size_t>(n * ldpe), 404, 0.05f);
    const float scale = 0.08f;
    const std::vector<float> ref = latent_reference(qlat, qpe, ldpe, hpe, heads, r, rope, cf, lists, offs, lens, {}, scale);
    auto dcache = test::to_device(cache, s), dl = test::to_device(lists, s), doff = test::to_device(offs, s), dlen = test::to_device(lens, s);
    auto dq = test::to_device(qlat, s), dpe = test::to_device(qpe, s);
    gpu::DeviceBuffer dout(ref.size() * 4);
    const int64_t wf = gpu::mla_attention_latent_workspace(n, heads, r, rope);
    CHECK(wf > 0);  // 4 tokens do not fill the GPU: the contexts are split
    gpu::DeviceBuffer work(static_cast<size_t>(std::max<int64_t>(wf, 1)) * 4);
    for (bool split : {true, false}) {
      CAPTURE(split);
      gpu::memset_device(dout.data(), 0x7f, dout.bytes(), s);  // every output must be written (the empty context: zeros)
      gpu::mla_attention_latent(dq.as<float>(), dpe.as<float>(), ldpe, hpe, n, heads, r, rope, dcache.as<uint16_t>(), dl.as<int32_t>(),
                                doff.as<int32_t>(), dlen.as<int32_t>(), nullptr, scale, dout.as<float>(), split ? work.as<float>() : nullptr, s);
      CHECK(test::tol_ratio(test::to_host<float>(dout, ref.size(), s), ref, 1e-5, 1e-4) <= 1);
    }
  }
  gpu::DeviceBuffer dummy(64);
  CHECK_THROWS_AS(gpu::mla_attention_latent(nullptr, nullptr, 0, 0, 1, 4, 1032, 64, nullptr, nullptr, nullptr, nullptr, nullptr, 1.0f,
                                            dummy.as<float>(), nullptr, s),
                  Error);
}

TEST_CASE("gpu deepseek_topk matches deepseek_route (group-limited sigmoid routing with bias)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  struct Case {
    int64_t experts, k, n_group, topk_group;
    bool norm;
    double scaling;
  };
  for (const Case cs : {Case{16, 4, 4, 2, true, 2.5}, Case{64, 6, 8, 3, false, 1.0}, Case{256, 8, 8, 4, true, 2.5}, Case{96, 5, 1, 1, true, 1.5}}) {
    CAPTURE(cs.experts);
    const int64_t n = 37;
    auto logits = test::random_floats(static_cast<size_t>(n * cs.experts), 400 + static_cast<uint64_t>(cs.experts), 2.0f);
    auto bias = test::random_floats(static_cast<size_t>(cs.experts), 401, 0.3f);
    const DeepseekRouting rt{cs.experts, cs.k, cs.n_group, cs.topk_group, cs.norm, cs.scaling};
    std::vector<int32_t> rid(static_cast<size_t>(n * cs.k));
    std::vector<float> rw(static_cast<size_t>(n * cs.k));
    for (int64_t t = 0; t < n; ++t) deepseek_route(logits.data() + t * cs.experts, bias.data(), rt, rid.data() + t * cs.k, rw.data() + t * cs.k);
    auto dl = test::to_device(logits, s), db = test::to_device(bias, s);
    gpu::DeviceBuffer di(rid.size() * 4), dw(rw.size() * 4);
    gpu::deepseek_topk(dl.as<float>(), db.as<float>(), n, cs.experts, cs.k, cs.n_group, cs.topk_group, cs.norm, static_cast<float>(cs.scaling),
                       di.as<int32_t>(), dw.as<float>(), s);
    const auto gid = test::to_host<int32_t>(di, rid.size(), s);
    const auto gw = test::to_host<float>(dw, rw.size(), s);
    CHECK(gid == rid);
    CHECK(test::tol_ratio(gw, rw, 1e-6, 1e-5) <= 1);
  }
  gpu::DeviceBuffer d(64);
  CHECK_THROWS_AS(gpu::deepseek_topk(d.as<float>(), d.as<float>(), 1, 16, 4, 3, 2, true, 1.0f, d.as<int32_t>(), d.as<float>(), s), Error);
}
