// The host side of the GPU Gated DeltaNet step (engine/layers/hybrid_gpu.h):
// how a batch's tokens are ordered by sequence for the kernels, which
// sequences start fresh, and the positions refused. Needs no GPU.
#include <doctest/doctest.h>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/layers/hybrid_gpu.h"

using namespace hmoe;

namespace {
KvLayout hybrid_layout() {
  KvLayout l{1, 1, 8};
  l.seq_state_bytes = kDeltaNetHostStateBytes;
  return l;
}
int64_t& consumed(KvCache& kv, int seq) { return *reinterpret_cast<int64_t*>(kv.seq_state(seq)); }
}  // namespace

TEST_CASE("deltanet step plan: tokens ordered by sequence, groups, fresh flags") {
  KvCache kv(hybrid_layout(), 8, 16);
  const int a = kv.add_sequence(), b = kv.add_sequence(), c = kv.add_sequence();
  consumed(kv, b) = 7;  // b continues a state; a and c are new
  Batch bt;
  bt.add(1, a, 0, true);
  bt.add(2, b, 7, true);
  bt.add(3, a, 1, true);
  bt.add(4, c, 0, true);
  bt.add(5, a, 2, true);
  const DeltaNetPlan p = plan_deltanet_step(bt, kv);
  CHECK(p.seq == std::vector<int32_t>{a, b, c});
  CHECK(p.order == std::vector<int32_t>{0, 2, 4, 1, 3});
  CHECK(p.tok_group == std::vector<int32_t>{0, 0, 0, 1, 2});
  CHECK(p.start == std::vector<int32_t>{0, 3, 4});
  CHECK(p.count == std::vector<int32_t>{3, 1, 1});
  CHECK(p.fresh == std::vector<int32_t>{1, 0, 1});
  CHECK(p.multi);
  CHECK(p.single);

  Batch decode;  // one token per sequence: the ordered tokens are the batch rows
  decode.add(6, b, 8, true);
  decode.add(7, c, 1, true);
  consumed(kv, c) = 1;
  consumed(kv, b) = 8;
  const DeltaNetPlan d = plan_deltanet_step(decode, kv);
  CHECK(d.order == std::vector<int32_t>{0, 1});
  CHECK(d.fresh == std::vector<int32_t>{0, 0});
  CHECK_FALSE(d.multi);
}

TEST_CASE("deltanet step plan: positions that do not continue a sequence's state are refused, naming it") {
  KvCache kv(hybrid_layout(), 8, 16);
  const int a = kv.add_sequence();
  consumed(kv, a) = 4;
  Batch skip;
  skip.add(1, a, 5, true);  // 4 expected
  CHECK_THROWS_WITH_AS(plan_deltanet_step(skip, kv), doctest::Contains("sequence 0 gets position 5"), Error);
  Batch backwards;
  backwards.add(1, a, 4, true);
  backwards.add(2, a, 4, true);
  CHECK_THROWS_AS(plan_deltanet_step(backwards, kv), Error);
  // A freed and re-added id starts at zero again.
  kv.free_sequence(a);
  const int again = kv.add_sequence();
  CHECK(again == a);
  Batch fresh;
  fresh.add(1, again, 0, true);
  CHECK(plan_deltanet_step(fresh, kv).fresh == std::vector<int32_t>{1});
  // A cache without per-sequence state (a model built for another layout) is an internal error.
  KvCache plain(KvLayout{1, 1, 8}, 8, 16);
  const int s = plain.add_sequence();
  Batch one;
  one.add(1, s, 0, true);
  CHECK_THROWS_AS(plan_deltanet_step(one, plain), Error);
}
