// ops::attention_prefill (engine/ops/cpu_attention_prefill.cpp): prompt runs
// of many lengths (block tails, one past a run's minimum), runs that start
// after a cached prefix, two sequences in one batch with decode tokens and a
// short run beside them, GQA groups, hd 64, 128 and 256, every KV dtype, and 0-3
// threads, against the scalar reference on random data.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/ops/cpu_ops.h"
#include "numa/thread_pool.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("attention_prefill: prompt runs, prefixes, mixed batches, dtypes and threads equal the scalar reference") {
  struct Shape {
    int64_t heads, kvh, hd;
  };
  for (Shape sh : {Shape{32, 4, 128}, Shape{16, 2, 256}, Shape{8, 2, 64}, Shape{6, 6, 64}}) {
    for (KvDtype dt : {KvDtype::f32, KvDtype::bf16, KvDtype::q8_0}) {
      const int64_t bs = 16, maxlen = 300;
      KvLayout layout{2, sh.kvh, sh.hd};
      layout.dtype = dt;
      KvCache kv(layout, maxlen / bs * 3 + 8, bs);
      const int a = kv.add_sequence(), b = kv.add_sequence(), c = kv.add_sequence();
      for (int s : {a, b, c}) kv.reserve(s, maxlen);
      for (int s : {a, b, c}) {
        auto ks = test::random_floats(static_cast<size_t>(maxlen * sh.kvh * sh.hd), 10 + static_cast<uint64_t>(s));
        auto vs = test::random_floats(static_cast<size_t>(maxlen * sh.kvh * sh.hd), 20 + static_cast<uint64_t>(s));
        for (int64_t p = 0; p < maxlen; ++p) kv.store(1, s, p, ks.data() + p * sh.kvh * sh.hd, vs.data() + p * sh.kvh * sh.hd);
      }
      struct Case {
        const char* what;
        std::vector<ops::TokenSlot> slots;
      };
      std::vector<Case> cases;
      for (int64_t len : {16, 17, 63, 64, 65, 130}) {
        Case cs{"run from 0", {}};
        for (int64_t p = 0; p < len; ++p) cs.slots.push_back({a, p});
        cases.push_back(cs);
      }
      {
        Case cs{"run after a prefix of 77", {}};
        for (int64_t p = 77; p < 77 + 40; ++p) cs.slots.push_back({b, p});
        cases.push_back(cs);
      }
      {
        Case cs{"decode, run, short run, run", {{c, 250}}};
        for (int64_t p = 100; p < 133; ++p) cs.slots.push_back({a, p});
        for (int64_t p = 5; p < 9; ++p) cs.slots.push_back({b, p});
        for (int64_t p = 200; p < 220; ++p) cs.slots.push_back({c, p});
        cs.slots.push_back({b, 299});
        cases.push_back(cs);
      }
      for (const Case& cs : cases) {
        const int64_t n = static_cast<int64_t>(cs.slots.size());
        auto q = test::random_floats(static_cast<size_t>(n * sh.heads * sh.hd), 99 + static_cast<uint64_t>(n));
        for (auto& v : q) v *= 3.0f;  // peaked softmax
        const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
        std::vector<float> ref(q.size());
        ops::attention_reference(q.data(), n, sh.heads, sh.kvh, sh.hd, cs.slots.data(), kv, 1, scale, ref.data());
        for (int threads : {0, 1, 3}) {
          std::unique_ptr<numa::ThreadPool> pool;
          if (threads) pool = std::make_unique<numa::ThreadPool>(threads, false);
          std::vector<float> out(q.size(), NAN);
          ops::attention_prefill(q.data(), n, sh.heads, sh.kvh, sh.hd, cs.slots.data(), kv, 1, scale, out.data(), pool.get());
          double worst = 0;
          for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(out[i] - ref[i])));
          INFO(cs.what << " n " << n << " heads " << sh.heads << "/" << sh.kvh << " hd " << sh.hd << " dtype " << kv_dtype_name(dt) << " threads "
                       << threads << " worst " << worst);
          CHECK(worst < 2e-5);
        }
      }
    }
  }
}

// Batch invariance: a prompt run through attention_prefill gives every token
// the same bits as ops::attention gives it alone (one token, its own call),
// for contexts the decode kernel runs as one chunk (< 256), the GQA groups
// whose heads it sums in 1, 2, 4 and 8 chains (G = 8, 12, 2, 1 ...), hd 64,
// 128 and 256, fp32 and bf16 KV, and 0-3 threads.
TEST_CASE("attention_prefill: each token's bits equal ops::attention's for that token alone") {
  if (cpu::best_isa() != cpu::Isa::avx512) {
    MESSAGE("no AVX-512 here: attention_prefill is ops::attention itself, nothing to compare");
    return;
  }
  struct Shape {
    int64_t heads, kvh, hd;
  };
  for (Shape sh : {Shape{32, 4, 128}, Shape{16, 2, 256}, Shape{4, 2, 64}, Shape{24, 2, 64}, Shape{7, 1, 128}, Shape{6, 6, 64}}) {
    for (KvDtype dt : {KvDtype::f32, KvDtype::bf16}) {
      const int64_t bs = 16, maxlen = 250;
      KvLayout layout{2, sh.kvh, sh.hd};
      layout.dtype = dt;
      KvCache kv(layout, maxlen / bs + 4, bs);
      const int a = kv.add_sequence();
      kv.reserve(a, maxlen);
      auto ks = test::random_floats(static_cast<size_t>(maxlen * sh.kvh * sh.hd), 31);
      auto vs = test::random_floats(static_cast<size_t>(maxlen * sh.kvh * sh.hd), 32);
      for (int64_t p = 0; p < maxlen; ++p) kv.store(1, a, p, ks.data() + p * sh.kvh * sh.hd, vs.data() + p * sh.kvh * sh.hd);
      std::vector<ops::TokenSlot> slots;
      for (int64_t p = 3; p < maxlen; ++p) slots.push_back({a, p});  // one run after a prefix of 3
      const int64_t n = static_cast<int64_t>(slots.size()), row = sh.heads * sh.hd;
      auto q = test::random_floats(static_cast<size_t>(n * row), 33);
      for (auto& v : q) v *= 3.0f;
      const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
      for (int threads : {0, 1, 3}) {
        std::unique_ptr<numa::ThreadPool> pool;
        if (threads) pool = std::make_unique<numa::ThreadPool>(threads, false);
        std::vector<float> out(q.size(), NAN), one(static_cast<size_t>(row));
        ops::attention_prefill(q.data(), n, sh.heads, sh.kvh, sh.hd, slots.data(), kv, 1, scale, out.data(), pool.get());
        int64_t differ = 0, first = -1;
        for (int64_t t = 0; t < n; ++t) {
          ops::attention(q.data() + t * row, 1, sh.heads, sh.kvh, sh.hd, &slots[static_cast<size_t>(t)], kv, 1, scale, one.data(), pool.get());
          if (std::memcmp(one.data(), out.data() + t * row, static_cast<size_t>(row) * sizeof(float)) != 0) {
            ++differ;
            if (first < 0) first = t;
          }
        }
        INFO("heads " << sh.heads << "/" << sh.kvh << " hd " << sh.hd << " dtype " << kv_dtype_name(dt) << " threads " << threads
                      << " first differing position " << (first < 0 ? -1 : slots[static_cast<size_t>(first)].pos));
        CHECK(differ == 0);
      }
    }
  }
}
