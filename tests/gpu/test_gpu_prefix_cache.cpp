// Prefix caching and the pinned host KV pool on the GPU path
// (engine/kv/kv_storage_gpu.h): GpuKvStorage's queued copies against a plain
// host model of the same moves on random data; the tiny Qwen3-MoE fixture's
// logits after a restore from the host pool against a run without caching;
// greedy outputs through the scheduler identical with caching on, off, and
// with a first tier so small that every reuse comes from the host pool
// (mirrors tests/server/test_prefix_cache.cpp); the DeepSeek-V3 latent cache
// through the host pool against a GPU prefix hit. Skips without a GPU.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "engine/kv/kv_storage_gpu.h"
#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/scheduler.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/prefix_reuse.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n, int64_t vocab = 151000) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

// Host model of a GpuKvStorage: planes [layer][block][bs*width] for both tiers.
struct Mirror {
  int64_t layers, blocks, bs, w, host;
  std::vector<uint16_t> dev, hst;
  uint16_t* at(std::vector<uint16_t>& v, int64_t nblocks, int64_t l, int64_t b) { return v.data() + (l * nblocks + b) * bs * w; }
  void move(std::vector<uint16_t>& dv, int64_t dn, int64_t d, std::vector<uint16_t>& sv, int64_t sn, int64_t s) {
    for (int64_t l = 0; l < layers; ++l) std::copy_n(at(sv, sn, l, s), bs * w, at(dv, dn, l, d));
  }
  void copy_block(int64_t d, int64_t s) { move(dev, blocks, d, dev, blocks, s); }
  void offload(int64_t b, int64_t h) { move(hst, host, h, dev, blocks, b); }
  void restore(int64_t h, int64_t b) { move(dev, blocks, b, hst, host, h); }
};

Settings gpu_settings(const std::string& placement) {
  std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", placement, "--progress", "none", "--threads", "2"};
  return Settings::load(args);
}

std::vector<int32_t> run_one(Scheduler& sched, const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t* cached = nullptr) {
  auto r = std::make_unique<SeqRequest>();
  r->prompt = prompt;
  r->max_tokens = max_tokens;
  r->sampling.temperature = 0;
  r->channel = std::make_shared<SeqChannel>();
  auto ch = r->channel;
  REQUIRE(sched.submit(std::move(r)) == Scheduler::Submit::ok);
  auto d = ch->wait_all();
  CHECK(d.finish == FinishReason::length);
  if (cached) *cached = ch->cached_tokens();
  std::vector<int32_t> out;
  for (const auto& e : d.tokens) out.push_back(e.token);
  return out;
}

}  // namespace

TEST_CASE("GpuKvStorage: queued copies, offloads and restores land as a host model of the same moves says") {
  if (!test::have_gpu()) return;
  const int64_t layers = 3, blocks = 6, bs = 4, kw = 24, vw = 8, host = 4;
  GpuKvStorage st(layers, blocks, bs, kw, vw, host);
  gpu::Stream s;
  Mirror mk{layers, blocks, bs, kw, host, {}, std::vector<uint16_t>(static_cast<size_t>(layers * host * bs * kw))};
  Mirror mv{layers, blocks, bs, vw, host, {}, std::vector<uint16_t>(static_cast<size_t>(layers * host * bs * vw))};
  mk.dev = test::bf16_of(test::random_floats(static_cast<size_t>(layers * blocks * bs * kw), 11));
  mv.dev = test::bf16_of(test::random_floats(static_cast<size_t>(layers * blocks * bs * vw), 12));
  gpu::copy_to_device(st.keys(0), mk.dev.data(), mk.dev.size() * 2, s);
  gpu::copy_to_device(st.values(0), mv.dev.data(), mv.dev.size() * 2, s);
  s.synchronize();
  CHECK(st.bytes_per_block() == layers * bs * (kw + vw) * 2);

  auto apply = [&](auto&& f) {
    f(st);
    f(mk);
    f(mv);
  };
  auto check_device = [&](const char* when) {
    std::vector<uint16_t> k(mk.dev.size()), v(mv.dev.size());
    gpu::copy_to_host(k.data(), st.keys(0), k.size() * 2, s);
    gpu::copy_to_host(v.data(), st.values(0), v.size() * 2, s);
    s.synchronize();
    CHECK_MESSAGE(k == mk.dev, when);
    CHECK_MESSAGE(v == mv.dev, when);
  };

  // Step 1: a run of two offloads (one 2-D copy per plane), a block copy,
  // then a restore into a block whose old contents were offloaded just before
  // (order matters), and a restore from a slot written in the same batch.
  const int64_t calls0 = st.copy_calls();
  apply([](auto& x) { x.offload(1, 0); });
  apply([](auto& x) { x.offload(2, 1); });
  apply([](auto& x) { x.copy_block(5, 3); });
  apply([](auto& x) { x.offload(4, 3); });
  apply([](auto& x) { x.restore(1, 4); });  // slot 1 holds block 2's data
  apply([](auto& x) { x.restore(0, 0); });
  st.begin_step(s);  // issues; s waits on the device
  s.synchronize();
  st.end_step();
  CHECK(st.copy_calls() - calls0 == 2 * 5);  // 5 ops after merging the first two, 2 planes each
  check_device("after step 1");

  // Step 2: overwrite a restored block on the step's stream (as kv_store
  // would), then offload it: the offload must see the step's data.
  std::vector<uint16_t> fresh = test::bf16_of(test::random_floats(static_cast<size_t>(bs * kw), 13));
  for (int64_t l = 0; l < layers; ++l) {
    gpu::copy_to_device(st.keys(l) + 4 * bs * kw, fresh.data(), fresh.size() * 2, s);
    std::copy(fresh.begin(), fresh.end(), mk.dev.begin() + (l * blocks + 4) * bs * kw);
  }
  apply([](auto& x) { x.offload(4, 2); });
  apply([](auto& x) { x.restore(2, 1); });
  apply([](auto& x) { x.restore(3, 2); });
  st.begin_step(s);
  s.synchronize();
  st.end_step();
  check_device("after step 2");

  // synchronize() issues and waits without a step.
  apply([](auto& x) { x.restore(1, 3); });
  st.synchronize();
  check_device("after synchronize");
  CHECK(st.copy_seconds() >= 0);
}

TEST_CASE("tiny-qwen3moe on the GPU: logits after a host-pool restore match a run without caching") {
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  auto model = Model::load(dir, gpu_settings("all"));
  REQUIRE(model->gpu() != nullptr);
  const int64_t V = model->config().vocab_size;
  std::mt19937_64 rng(3);
  auto a = random_tokens(rng, 40);
  auto b = a;
  b.resize(32);
  for (int32_t t : random_tokens(rng, 9)) b.push_back(t);  // shares 2 blocks of 16 with a

  // Reference: b in one forward, no caching.
  std::vector<float> want;
  {
    KvCache kv(model->kv_layout(), 8, 16);
    const int sq = kv.add_sequence();
    kv.reserve(sq, static_cast<int64_t>(b.size()));
    Batch bt;
    for (size_t i = 0; i < b.size(); ++i) bt.add(b[i], sq, static_cast<int64_t>(i), true);
    model->forward(bt, kv, want);
  }
  // Cached: a computed and committed; a filler takes every first-tier block
  // (a's go to the host pool); b restores 32 tokens and computes 9.
  const auto logits = test::prefix_reuse_logits(*model, a, b, 4, 8, true);
  std::vector<float> tail(want.end() - 9 * V, want.end());
  const double r = test::tol_ratio(logits, tail, 2e-2, 2e-2);
  MESSAGE("logits of the 9 uncached tokens after a restore vs no caching: worst |diff| / (0.02 + 0.02|ref|) = " << r);
  CHECK(r <= 1.0);
}

TEST_CASE("tiny-deepseekv3 on the GPU: the latent cache restored from the host pool gives the logits of a GPU prefix hit") {
  // The DeepSeek-V3 GPU step keeps its latent cache in the KvCache's GpuKvStorage (no
  // values), so offload/restore must move it: b's 9 uncached tokens after a
  // restore of its 32-token prefix must give the logits they give when the
  // same prefix is still on the GPU (same batch shapes, so no bf16 routing
  // near-tie can part them).
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-deepseekv3");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/model-00003-of-00003.safetensors"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  auto model = Model::load(dir, gpu_settings("all"));
  REQUIRE(model->gpu() != nullptr);
  const int64_t V = model->config().vocab_size;
  std::mt19937_64 rng(5);
  auto a = random_tokens(rng, 40, V);
  auto b = a;
  b.resize(32);
  for (int32_t t : random_tokens(rng, 9, V)) b.push_back(t);
  const auto gpu_hit = test::prefix_reuse_logits(*model, a, b, 8, 0, false), restored = test::prefix_reuse_logits(*model, a, b, 4, 8, true);
  const double r = test::tol_ratio(restored, gpu_hit, 1e-3, 1e-3);
  MESSAGE("tiny-deepseekv3: 9 tokens after a host-pool restore vs after a GPU prefix hit: worst |diff| / (0.001 + 0.001|ref|) = " << r);
  CHECK(r <= 1.0);
}

TEST_CASE("scheduler on the GPU: greedy outputs are identical with prefix caching on, off, and from the host pool") {
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  for (const std::string placement : {"all", "0,3"}) {
    CAPTURE(placement);
    auto model = Model::load(dir, gpu_settings(placement));
    REQUIRE(model->gpu() != nullptr);
    Model& m = *model;
    std::mt19937_64 rng(31);
    const auto prefix = random_tokens(rng, 37);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 5; ++i) {
      auto p = prefix;
      auto tail = random_tokens(rng, 2 + rng() % 9);
      p.insert(p.end(), tail.begin(), tail.end());
      prompts.push_back(p);
    }
    prompts.push_back(prefix);
    prompts.push_back({prefix.begin(), prefix.begin() + 32});

    SchedulerConfig off;
    off.prefix_caching = false;
    off.kv_blocks = 64;
    std::vector<std::vector<int32_t>> want;
    {
      Scheduler s(m, off);
      for (const auto& p : prompts) want.push_back(run_one(s, p, 8));
    }
    SchedulerConfig on = off;
    on.prefix_caching = true;
    {
      Scheduler s(m, on);
      for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        int64_t cached = -1;
        CHECK(run_one(s, prompts[i], 8, &cached) == want[i]);
        CHECK(cached == (i == 0 ? 0 : i == 6 ? 16 : 32));
      }
    }
    // First tier of 4 blocks, host pool of 16: every reuse comes from the host pool.
    SchedulerConfig tiny = on;
    tiny.kv_blocks = 4;
    tiny.host_kv_blocks = 16;
    const auto other = random_tokens(rng, 50);
    std::vector<std::vector<int32_t>> ps, ws;
    std::vector<int32_t> other_want;
    {
      Scheduler ref(m, off);
      other_want = run_one(ref, other, 8);
      for (int i = 0; i < 4; ++i) {
        auto p = prefix;
        auto tail = random_tokens(rng, 10);
        p.insert(p.end(), tail.begin(), tail.end());
        ps.push_back(p);
        ws.push_back(run_one(ref, p, 8));
      }
    }
    Scheduler s(m, tiny);
    for (size_t i = 0; i < ps.size(); ++i) {
      CAPTURE(i);
      int64_t cached = -1;
      CHECK(run_one(s, ps[i], 8, &cached) == ws[i]);
      CHECK(cached == (i == 0 ? 0 : 32));
      CHECK(run_one(s, other, 8, &cached) == other_want);
      CHECK(cached == (i == 0 ? 0 : 48));
    }
    for (int i = 0; i < 1000 && s.stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const auto st = s.stats();
    CHECK(st.kv.hit_tokens == 0);
    CHECK(st.kv.host_hit_tokens == 3 * 32 + 3 * 48);
    CHECK(st.kv.restored_blocks == 3 * 2 + 3 * 3);
    CHECK(st.kv.restored_bytes == st.kv.restored_blocks * KvCache::bytes_per_block(m.kv_layout(), 16) / 2);  // bf16 on the GPU
  }
}
