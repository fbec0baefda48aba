// The decode step as launched on the GPU: the one-launch router
// (gpu::router_gemv_topk) against a scalar reference; the fused launches of
// gpu/decode_fused.h against the unfused ones they replace (bit for bit);
// and a GGUF model's decode steps with programmatic dependent launch on and
// off and with and without CUDA graphs (the same kernels, so the same
// logits bit for bit), fused against unfused (the same clear top-1), and at
// one and eight sequences one captured graph per step holding only hmoe's
// own kernels, with the fused router and attention once per layer (no
// cuBLAS call, no host round trip inside the step). Skips without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "gpu/decode_fused.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

// Softmax over fp64 logits, then the k largest (ties: lower index), renormalised when asked.
void reference_topk(const std::vector<double>& lg, int64_t k, bool norm, std::vector<int32_t>& ids, std::vector<double>& w) {
  const int64_t E = static_cast<int64_t>(lg.size());
  const double mx = *std::max_element(lg.begin(), lg.end());
  std::vector<double> p(lg.size());
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += p[static_cast<size_t>(e)] = std::exp(lg[static_cast<size_t>(e)] - mx);
  for (double& x : p) x /= sum;
  std::vector<int32_t> order(lg.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  ids.assign(order.begin(), order.begin() + k);
  w.clear();
  double chosen = 0;
  for (int32_t e : ids) chosen += p[static_cast<size_t>(e)], w.push_back(p[static_cast<size_t>(e)]);
  if (norm)
    for (double& x : w) x /= chosen;
}

}  // namespace

TEST_CASE("gpu router_gemv_topk matches a scalar product + softmax top-k (repeated launches, plain and programmatic streams)") {
  if (!test::have_gpu()) return;
  for (const bool pdl : {false, true}) {
    gpu::Stream s;
    s.set_programmatic_launch(pdl);
    gpu::DeviceBuffer counter(16);
    gpu::memset_device(counter.data(), 0, 16, s);
    for (auto [n, E, H, K, norm] : {std::tuple<int64_t, int64_t, int64_t, int64_t, bool>{1, 128, 2048, 8, true},
                                    {8, 128, 2048, 8, true},
                                    {3, 60, 512, 4, false},
                                    {5, 1024, 256, 8, true},
                                    {2, 16, 4096, 2, true}}) {
      const auto x = test::bf16_of(test::random_floats(static_cast<size_t>(n * H), 91 + n + H, 1.0f));
      const auto w = test::bf16_of(test::random_floats(static_cast<size_t>(E * H), 92 + E, 0.05f));
      auto dx = test::to_device(x, s), dw = test::to_device(w, s);
      gpu::DeviceBuffer dl(static_cast<size_t>(n * E) * 4), di(static_cast<size_t>(n * K) * 4), dwt(static_cast<size_t>(n * K) * 4);
      for (int rep = 0; rep < 3; ++rep) {  // the block counter must be back at 0 after every launch
        gpu::memset_device(di.data(), 0xff, di.bytes(), s);
        gpu::router_gemv_topk(dx.as<gpu::bf16_t>(), n, dw.as<gpu::bf16_t>(), E, H, K, norm, dl.as<float>(), counter.as<int32_t>(), di.as<int32_t>(),
                              dwt.as<float>(), s);
        const auto ids = test::to_host<int32_t>(di, static_cast<size_t>(n * K), s);
        const auto wts = test::to_host<float>(dwt, static_cast<size_t>(n * K), s);
        const auto lg = test::to_host<float>(dl, static_cast<size_t>(n * E), s);
        int64_t wrong_ids = 0, checked = 0;
        double worst_logit = 0, worst_w = 0;
        for (int64_t t = 0; t < n; ++t) {
          std::vector<double> ref(static_cast<size_t>(E));
          for (int64_t e = 0; e < E; ++e) {
            double acc = 0;
            for (int64_t c = 0; c < H; ++c) acc += static_cast<double>(bf16_to_f32(x[static_cast<size_t>(t * H + c)])) * bf16_to_f32(w[static_cast<size_t>(e * H + c)]);
            ref[static_cast<size_t>(e)] = acc;
            worst_logit = std::max(worst_logit, std::fabs(lg[static_cast<size_t>(t * E + e)] - acc) / (1e-4 + 1e-4 * std::fabs(acc)));
          }
          std::vector<int32_t> rid;
          std::vector<double> rw;
          reference_topk(ref, K, norm, rid, rw);
          // Selection is checked where the k-th and (k+1)-th logits are apart (random data: nearly always).
          std::vector<double> sorted = ref;
          std::sort(sorted.begin(), sorted.end(), std::greater<>());
          if (K < E && sorted[static_cast<size_t>(K - 1)] - sorted[static_cast<size_t>(K)] < 1e-3) continue;
          ++checked;
          for (int64_t j = 0; j < K; ++j) {
            wrong_ids += ids[static_cast<size_t>(t * K + j)] != rid[static_cast<size_t>(j)];
            worst_w = std::max(worst_w, std::fabs(wts[static_cast<size_t>(t * K + j)] - rw[static_cast<size_t>(j)]) / (1e-6 + 1e-4 * rw[static_cast<size_t>(j)]));
          }
        }
        CHECK_MESSAGE(worst_logit <= 1, "n=" << n << " E=" << E << " H=" << H);
        CHECK(checked > 0);
        CHECK_MESSAGE(wrong_ids == 0, "n=" << n << " E=" << E << " K=" << K << " rep " << rep);
        CHECK(worst_w <= 1);
      }
    }
    CHECK(test::to_host<int32_t>(counter, 1, s)[0] == 0);
    CHECK_THROWS_AS(gpu::router_gemv_topk(nullptr, 9, nullptr, 128, 2048, 8, true, nullptr, nullptr, nullptr, nullptr, s), Error);
    CHECK_THROWS_AS(gpu::router_gemv_topk(nullptr, 1, nullptr, 8, 2048, 9, true, nullptr, nullptr, nullptr, nullptr, s), Error);
    CHECK_THROWS_AS(gpu::router_gemv_topk(nullptr, 1, nullptr, 2048, 2048, 8, true, nullptr, nullptr, nullptr, nullptr, s), Error);
    CHECK_THROWS_AS(gpu::router_gemv_topk(nullptr, 1, nullptr, 128, 2050, 8, true, nullptr, nullptr, nullptr, nullptr, s), Error);
  }
}

TEST_CASE("gpu add_rms_norm_router_topk equals add_rms_norm + router_gemv_topk (residual, normed rows, routing)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  s.set_programmatic_launch(true);
  gpu::DeviceBuffer counter(16);
  gpu::memset_device(counter.data(), 0, 16, s);
  for (auto [n, H, E, K, with_delta, with_hf] : {std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool>{1, 2048, 128, 8, true, false},
                                                 {8, 2048, 128, 8, true, true},
                                                 {3, 512, 60, 4, false, true},
                                                 {2, 4096, 128, 8, true, false},
                                                 {1, 7168, 256, 8, true, true},
                                                 {5, 1000, 16, 2, true, true}}) {
    const auto x = test::random_floats(static_cast<size_t>(n * H), 101 + n, 2.0f);
    const auto d = test::random_floats(static_cast<size_t>(n * H), 102 + n, 1.0f);
    const auto nw = test::bf16_of(test::random_floats(static_cast<size_t>(H), 103, 0.5f));
    const auto w = test::bf16_of(test::random_floats(static_cast<size_t>(E * H), 104 + E, 0.05f));
    auto xa = test::to_device(x, s), xb = test::to_device(x, s), dd = test::to_device(d, s), dn = test::to_device(nw, s), dw = test::to_device(w, s);
    const size_t nh = static_cast<size_t>(n * H), nk = static_cast<size_t>(n * K), ne = static_cast<size_t>(n * E);
    gpu::DeviceBuffer hba(nh * 2), hbb(nh * 2), hfa(nh * 4), hfb(nh * 4), la(ne * 4), lb(ne * 4), ia(nk * 4), ib(nk * 4), wa(nk * 4), wb(nk * 4);
    const float* delta = with_delta ? dd.as<float>() : nullptr;
    gpu::add_rms_norm(xa.as<float>(), delta, nullptr, n, H, dn.as<gpu::bf16_t>(), 1e-6f, hba.as<gpu::bf16_t>(), with_hf ? hfa.as<float>() : nullptr, s);
    gpu::router_gemv_topk(hba.as<gpu::bf16_t>(), n, dw.as<gpu::bf16_t>(), E, H, K, true, la.as<float>(), counter.as<int32_t>(), ia.as<int32_t>(),
                          wa.as<float>(), s);
    REQUIRE(gpu::norm_router_fits(n, H, E));
    for (int rep = 0; rep < 2; ++rep) {
      if (rep == 1) gpu::copy_to_device(xb.data(), x.data(), nh * 4, s);
      gpu::add_rms_norm_router_topk(xb.as<float>(), delta, n, H, dn.as<gpu::bf16_t>(), 1e-6f, hbb.as<gpu::bf16_t>(), with_hf ? hfb.as<float>() : nullptr,
                                    dw.as<gpu::bf16_t>(), E, K, true, lb.as<float>(), counter.as<int32_t>(), ib.as<int32_t>(), wb.as<float>(), s);
      const std::string what = "n=" + std::to_string(n) + " H=" + std::to_string(H) + " E=" + std::to_string(E) + " rep " + std::to_string(rep);
      CHECK_MESSAGE(test::to_host<float>(xa, nh, s) == test::to_host<float>(xb, nh, s), what);
      // The norm's sums in add_rms_norm's order: bit for bit, and so the logits and the routing.
      CHECK_MESSAGE(test::to_host<uint16_t>(hba, nh, s) == test::to_host<uint16_t>(hbb, nh, s), what);
      if (with_hf) CHECK_MESSAGE(test::to_host<float>(hfa, nh, s) == test::to_host<float>(hfb, nh, s), what);
      CHECK_MESSAGE(test::to_host<float>(la, ne, s) == test::to_host<float>(lb, ne, s), what);
      CHECK_MESSAGE(test::to_host<int32_t>(ia, nk, s) == test::to_host<int32_t>(ib, nk, s), what);
      CHECK_MESSAGE(test::to_host<float>(wa, nk, s) == test::to_host<float>(wb, nk, s), what);
    }
  }
  CHECK(test::to_host<int32_t>(counter, 1, s)[0] == 0);
  CHECK_FALSE(gpu::norm_router_fits(9, 2048, 128));
  CHECK_FALSE(gpu::norm_router_fits(1, 16384, 128));
  CHECK_FALSE(gpu::norm_router_fits(1, 2048, 2048));
  CHECK_THROWS_AS(gpu::add_rms_norm_router_topk(nullptr, nullptr, 1, 16384, nullptr, 1e-6f, nullptr, nullptr, nullptr, 128, 8, true, nullptr, nullptr,
                                                nullptr, nullptr, s),
                  Error);
}

TEST_CASE("gpu add_rms_norm_gguf_gemv equals add_rms_norm + gguf_gemv (residual, normed row, products; Q4_K, Q6_K, Q8_0)") {
  if (!test::have_gpu()) return;
  // The fused launch runs the staged kernels' products; the separate gguf_gemv
  // must take the same set to compare bit for bit (the direct set, the
  // default, sums the runs in another fp32 order).
  struct Staged {
    Staged() { gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::staged); }
    ~Staged() { gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::direct); }
  } staged;
  gpu::Stream s;
  s.set_programmatic_launch(true);
  gpu::DeviceBuffer counter(16);
  gpu::memset_device(counter.data(), 0, 16, s);
  for (cpu::ExtType t : {cpu::ExtType::q4_k, cpu::ExtType::q6_k, cpu::ExtType::q8_0})
    for (auto [rows, cols, with_delta] : {std::tuple<int64_t, int64_t, bool>{4608, 2048, true}, {512, 2048, false}, {37, 768, true}, {300, 4096, true}}) {
      const auto wf = test::random_floats(static_cast<size_t>(rows * cols), 121 + static_cast<uint64_t>(cols), 0.05f);
      const auto bytes = qtools::quant_rows(t, wf.data(), rows, cols);
      const cpu::Mat view = cpu::ext_view(t, bytes.data(), rows, cols, "test");
      REQUIRE(gpu::gguf_native_supported(view));
      gpu::GgufDeviceMat dw({view}, s, "test weight");
      REQUIRE(gpu::norm_gemv_fits(dw.weight(), 1));
      const auto x = test::random_floats(static_cast<size_t>(cols), 122 + static_cast<uint64_t>(rows), 2.0f);
      const auto d = test::random_floats(static_cast<size_t>(cols), 123, 1.0f);
      const auto nw = test::bf16_of(test::random_floats(static_cast<size_t>(cols), 124, 0.5f));
      auto xa = test::to_device(x, s), xb = test::to_device(x, s), dd = test::to_device(d, s), dn = test::to_device(nw, s);
      const int64_t ldy = rows + 5;
      gpu::DeviceBuffer hba(static_cast<size_t>(cols) * 2), hbb(static_cast<size_t>(cols) * 2), hfa(static_cast<size_t>(cols) * 4),
          hfb(static_cast<size_t>(cols) * 4), ya(static_cast<size_t>(ldy) * 4), yb(static_cast<size_t>(ldy) * 4);
      const float* delta = with_delta ? dd.as<float>() : nullptr;
      gpu::add_rms_norm(xa.as<float>(), delta, nullptr, 1, cols, dn.as<gpu::bf16_t>(), 1e-6f, hba.as<gpu::bf16_t>(), hfa.as<float>(), s);
      gpu::gguf_gemv(dw.weight(), hba.as<gpu::bf16_t>(), 1, ya.as<float>(), ldy, s);
      for (int rep = 0; rep < 2; ++rep) {
        if (rep == 1) gpu::copy_to_device(xb.data(), x.data(), x.size() * 4, s);
        gpu::add_rms_norm_gguf_gemv(xb.as<float>(), delta, 1, dn.as<gpu::bf16_t>(), 1e-6f, hbb.as<gpu::bf16_t>(), hfb.as<float>(), dw.weight(), yb.as<float>(),
                                    ldy, counter.as<int32_t>(), s);
        const std::string what = std::string(cpu::ext_type_info(static_cast<uint32_t>(t))->name) + " " + std::to_string(rows) + "x" +
                                 std::to_string(cols) + (with_delta ? " +delta" : "") + " rep " + std::to_string(rep);
        CHECK_MESSAGE(test::to_host<float>(xa, x.size(), s) == test::to_host<float>(xb, x.size(), s), what);
        CHECK_MESSAGE(test::to_host<uint16_t>(hba, x.size(), s) == test::to_host<uint16_t>(hbb, x.size(), s), what);
        CHECK_MESSAGE(test::to_host<float>(hfa, x.size(), s) == test::to_host<float>(hfb, x.size(), s), what);
        const auto y1 = test::to_host<float>(ya, static_cast<size_t>(rows), s), y2 = test::to_host<float>(yb, static_cast<size_t>(rows), s);
        CHECK_MESSAGE(y1 == y2, what);
      }
    }
  CHECK(test::to_host<int32_t>(counter, 1, s)[0] == 0);
  gpu::GgufWeight w{gpu::GgufType::q8_0, counter.data(), 4, 64};
  CHECK_FALSE(gpu::norm_gemv_fits(w, 2));
  CHECK_THROWS_AS(gpu::add_rms_norm_gguf_gemv(nullptr, nullptr, 2, nullptr, 1e-6f, nullptr, nullptr, w, nullptr, 4, nullptr, s), Error);
  CHECK_THROWS_AS(gpu::add_rms_norm_gguf_gemv(nullptr, counter.as<float>(), 1, nullptr, 1e-6f, nullptr, nullptr, w, nullptr, 4, nullptr, s), Error);
}

TEST_CASE("gpu norm_rope_store_attention equals qkv_norm_rope_store + attention (decode, GQA, hd 64/128/160/256, split-K)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  s.set_programmatic_launch(true);
  for (int64_t hd : {64, 128, 160, 256})  // 160 and 256: the 256-thread kernel
    for (const std::vector<int32_t>& lens : {std::vector<int32_t>{1, 37, 300}, std::vector<int32_t>{1300}, std::vector<int32_t>{5, 700, 2}}) {
      const int64_t heads = 8, kvh = 2, ld = (heads + 2 * kvh) * hd + 8, width = kvh * hd, n = static_cast<int64_t>(lens.size());
      int64_t total = 0, max_len = 0;
      for (int32_t l : lens) total += l, max_len = std::max<int64_t>(max_len, l);
      const int64_t slots = total + 7;
      // Each sequence's positions on distinct slots, in a scrambled order.
      std::vector<int32_t> perm(static_cast<size_t>(slots));
      std::iota(perm.begin(), perm.end(), 0);
      for (size_t i = 0; i < perm.size(); ++i) std::swap(perm[i], perm[(i * 7919 + 13) % perm.size()]);
      std::vector<int32_t> lists, offsets, pos, slot;
      for (int32_t l : lens) {
        offsets.push_back(static_cast<int32_t>(lists.size()));
        for (int32_t p = 0; p < l; ++p) lists.push_back(perm[lists.size()]);
        pos.push_back(l - 1);
        slot.push_back(lists.back());
      }
      const auto qkv = test::random_floats(static_cast<size_t>(n * ld), 111 + hd + n, 1.5f);
      const auto cache_k = test::bf16_of(test::random_floats(static_cast<size_t>(slots * width), 112 + hd));
      const auto cache_v = test::bf16_of(test::random_floats(static_cast<size_t>(slots * width), 113 + hd));
      const auto wq = test::bf16_of(test::random_floats(static_cast<size_t>(hd), 114, 0.5f)), wk = test::bf16_of(test::random_floats(static_cast<size_t>(hd), 115, 0.5f));
      std::vector<float> inv_freq(static_cast<size_t>(hd / 2));
      for (int64_t i = 0; i < hd / 2; ++i) inv_freq[static_cast<size_t>(i)] = static_cast<float>(std::pow(1e6, -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
      auto qa = test::to_device(qkv, s), qb = test::to_device(qkv, s), kca = test::to_device(cache_k, s), vca = test::to_device(cache_v, s),
           kcb = test::to_device(cache_k, s), vcb = test::to_device(cache_v, s), dwq = test::to_device(wq, s), dwk = test::to_device(wk, s),
           dfreq = test::to_device(inv_freq, s), dl = test::to_device(lists, s), doff = test::to_device(offsets, s), dlen = test::to_device(lens, s),
           dpos = test::to_device(pos, s), dslot = test::to_device(slot, s);
      const size_t outn = static_cast<size_t>(n * heads * hd);
      gpu::DeviceBuffer oa(outn * 2), ob(outn * 2), scratch(static_cast<size_t>(std::max<int64_t>(gpu::attention_scratch_floats(n, heads, hd, max_len), 4)) * 4);
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
      gpu::qkv_norm_rope_store(qa.as<float>(), n, ld, heads, kvh, hd, dwq.as<gpu::bf16_t>(), dwk.as<gpu::bf16_t>(), 1e-6f, dpos.as<int32_t>(),
                               dfreq.as<float>(), dslot.as<int32_t>(), kca.as<gpu::bf16_t>(), vca.as<gpu::bf16_t>(), s);
      gpu::attention(qa.as<float>(), ld, n, heads, kvh, hd, kca.as<gpu::bf16_t>(), vca.as<gpu::bf16_t>(), dl.as<int32_t>(), doff.as<int32_t>(),
                     dlen.as<int32_t>(), max_len, scale, scratch.as<float>(), oa.as<gpu::bf16_t>(), s);
      gpu::norm_rope_store_attention(qb.as<float>(), ld, n, heads, kvh, hd, dwq.as<gpu::bf16_t>(), dwk.as<gpu::bf16_t>(), 1e-6f, dpos.as<int32_t>(),
                                     dfreq.as<float>(), dslot.as<int32_t>(), kcb.as<gpu::bf16_t>(), vcb.as<gpu::bf16_t>(), dl.as<int32_t>(),
                                     doff.as<int32_t>(), dlen.as<int32_t>(), max_len, scale, scratch.as<float>(), ob.as<gpu::bf16_t>(), s);
      const std::string what = "hd=" + std::to_string(hd) + " n=" + std::to_string(n) + " max_len=" + std::to_string(max_len) + " splits " +
                               std::to_string(gpu::attention_splits(n, heads, max_len));
      const auto out_a = test::to_host<uint16_t>(oa, outn, s), out_b = test::to_host<uint16_t>(ob, outn, s);
      CHECK_MESSAGE(out_a == out_b, what);
      CHECK_MESSAGE(test::to_host<uint16_t>(kca, cache_k.size(), s) == test::to_host<uint16_t>(kcb, cache_k.size(), s), what);
      CHECK_MESSAGE(test::to_host<uint16_t>(vca, cache_v.size(), s) == test::to_host<uint16_t>(vcb, cache_v.size(), s), what);
      CHECK(test::to_host<float>(qb, qkv.size(), s) == qkv);  // the fused launch leaves q|k|v as they were
      bool finite = true;
      for (uint16_t v : out_b) finite = finite && std::isfinite(bf16_to_f32(v));
      CHECK(finite);
    }
}

namespace {

// `steps` decode steps of `seqs` sequences after a 5-token prompt each,
// teacher-forced (fixed ids, so that runs stay comparable row by row);
// every step's logits appended. Also returns the graphs and kernels of the
// last step.
struct DecodeRun {
  std::vector<float> logits;
  size_t graphs = 0;
  std::vector<std::string> kernels;
};
DecodeRun decode(Model& m, int64_t seqs, int64_t steps) {
  const int64_t V = m.config().vocab_size;
  KvCache kv(m.kv_layout(), seqs * 4 + 2, 16);
  std::vector<int> ids;
  Batch b;
  for (int64_t q = 0; q < seqs; ++q) {
    ids.push_back(kv.add_sequence());
    kv.reserve(ids.back(), 5 + steps);
  }
  std::vector<float> lg;
  for (int64_t q = 0; q < seqs; ++q) {
    b.clear();
    for (int64_t p = 0; p < 5; ++p) b.add(static_cast<int32_t>((q * 31 + p * 7 + 3) % V), ids[static_cast<size_t>(q)], p, p == 4);
    m.forward(b, kv, lg);
  }
  DecodeRun r;
  for (int64_t t = 0; t < steps; ++t) {
    b.clear();
    for (int64_t q = 0; q < seqs; ++q) b.add(static_cast<int32_t>((q * 53 + t * 17 + 11) % V), ids[static_cast<size_t>(q)], 5 + t, true);
    m.forward(b, kv, lg);
    r.logits.insert(r.logits.end(), lg.begin(), lg.end());
  }
  r.graphs = m.gpu()->last_step_graphs();
  r.kernels = m.gpu()->last_step_kernels();
  return r;
}

}  // namespace

TEST_CASE("GGUF decode on the GPU: one graph per step of hmoe kernels; programmatic launch and graphs leave the logits unchanged") {
  if (!test::have_gpu()) return;
  const std::string gguf = test::fixture_ref("tiny-qwen3moe-Q8_0.gguf");
  REQUIRE_MESSAGE(std::filesystem::exists(gguf), gguf << " missing");
  auto load = [&](const char* pdl, const char* graphs, const char* fusion = "1") {
    std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", "all", "--progress", "none", "--gpu-programmatic-launch",
                                     pdl, "--cuda-graphs", graphs, "--gpu-decode-fusion", fusion};
    return Model::load(gguf, Settings::load(args));
  };
  for (const int64_t seqs : {1, 8}) {
    auto on = load("1", "1"), off = load("0", "1"), plain = load("1", "0"), unfused = load("0", "1", "0");
    const DecodeRun a = decode(*on, seqs, 12), b = decode(*off, seqs, 12), c = decode(*plain, seqs, 12), u = decode(*unfused, seqs, 12);
    REQUIRE(a.logits.size() == b.logits.size());
    CHECK_MESSAGE(a.logits == b.logits, seqs << " sequences: programmatic launch changed the logits");
    CHECK_MESSAGE(a.logits == c.logits, seqs << " sequences: graph replay changed the logits");
    // One launch per operation (main's sequence): the same top-1 wherever it is clear (the tiny model has
    // near-tied routing choices that summation order may flip), logits within that rounding.
    const int64_t V = on->config().vocab_size;
    REQUIRE(u.logits.size() == a.logits.size());
    const int64_t rows = static_cast<int64_t>(a.logits.size()) / V;
    int64_t clear = 0, same = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = u.logits.data() + r * V;
      std::vector<float> top(x, x + V);
      std::nth_element(top.begin(), top.begin() + 1, top.end(), std::greater<>());
      if (std::max(top[0], top[1]) - std::min(top[0], top[1]) <= 0.5f) continue;
      ++clear;
      same += argmax(a.logits.data() + r * V, V) == argmax(x, V);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < a.logits.size(); ++i) num += (a.logits[i] - u.logits[i]) * (a.logits[i] - u.logits[i]), den += u.logits[i] * u.logits[i];
    MESSAGE(seqs << " sequences: fused vs unfused decode: " << same << "/" << clear << " clear-margin top-1 equal, rel. logit error "
                 << std::sqrt(num / den));
    CHECK(same == clear);
    CHECK(std::sqrt(num / den) < 2e-2);
    CHECK(a.graphs == 1);
    CHECK(c.graphs == 0);
    const int64_t L = on->config().num_hidden_layers;
    CHECK(static_cast<int64_t>(a.kernels.size()) > L);
    std::string names;
    int64_t routers = 0, attentions = 0, norms = 0, foreign = 0;
    for (const auto& k : a.kernels) {
      names += k + "; ";
      norms += k.find("add_rms_norm_kernel") != std::string::npos;
      attentions += k.find("attention_kernel<true,") != std::string::npos;  // norms + rope + KV store + attention (<fused, head dim>)
      routers += k.find("router_kernel") != std::string::npos;  // the fused norm + router of gpu/decode_fused.cu
      foreign += k.find("hmoe::") == std::string::npos;  // cuBLAS or unnamed
    }
    MESSAGE(seqs << " sequences: " << a.kernels.size() << " kernels per decode step: " << names);
    CHECK(routers == L);
    CHECK(attentions == L);
    CHECK(norms == (seqs == 1 ? 1 : L + 1));  // one token: the input norms run inside the q|k|v products; the final norm stays
    CHECK(foreign == 0);
  }
}
