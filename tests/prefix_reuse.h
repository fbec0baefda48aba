// One prefix-reuse scenario for the model tests: sequence a (40 tokens) is
// computed and its two full blocks committed; then b, which shares a's first
// 32 tokens, attaches them and computes its 9 others. With `filler`, a
// sequence taking every first-tier block runs in between, so a's blocks go
// to the host tier and b restores them.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/loading/model.h"

namespace hmoe::test {

// Logits of b's 9 uncached tokens. a: 40 tokens; b: a's first 32, then 9.
inline std::vector<float> prefix_reuse_logits(Model& model, const std::vector<int32_t>& a, const std::vector<int32_t>& b, int64_t blocks,
                                              int64_t host_blocks, bool filler) {
  REQUIRE(a.size() == 40);
  REQUIRE(b.size() == 41);
  const int64_t V = model.config().vocab_size;
  KvCache kv(model.kv_layout(), blocks, 16, KvCacheOptions{true, 7, host_blocks});
  std::vector<float> logits;
  Batch bt;
  const int sa = kv.add_sequence();
  REQUIRE(kv.attach_prefix(sa, a, 39) == 0);
  kv.reserve(sa, 40);
  for (size_t i = 0; i < a.size(); ++i) bt.add(a[i], sa, static_cast<int64_t>(i), i + 1 == a.size());
  model.forward(bt, kv, logits);
  kv.commit(sa, a, 40);
  kv.free_sequence(sa);
  if (filler) {  // takes every first-tier block: a's full blocks go to the host pool
    const int sf = kv.add_sequence();
    kv.reserve(sf, blocks * 16);
    bt.clear();
    for (int64_t i = 0; i < blocks * 16; ++i) bt.add(static_cast<int32_t>(1000 + i), sf, i, i + 1 == blocks * 16);
    model.forward(bt, kv, logits);
    kv.free_sequence(sf);
    CHECK(kv.stats().offloaded_blocks == 2);
  }
  const int sb = kv.add_sequence();
  REQUIRE(kv.attach_prefix(sb, b, static_cast<int64_t>(b.size()) - 1) == 32);
  CHECK(kv.stats().host_hit_tokens == (filler ? 32 : 0));
  kv.reserve(sb, static_cast<int64_t>(b.size()));
  bt.clear();
  for (size_t i = 32; i < b.size(); ++i) bt.add(b[i], sb, static_cast<int64_t>(i), true);
  model.forward(bt, kv, logits);
  REQUIRE(logits.size() == 9 * static_cast<size_t>(V));
  return logits;
}

}  // namespace hmoe::test
