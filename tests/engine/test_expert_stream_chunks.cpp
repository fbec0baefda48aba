// Streamed prefill's slot plan (engine/layers/expert_stream_chunks.h):
// whole layers when window + 1 of them fit, else balanced chunks of experts
// within the room, never fewer than kMinChunkExperts, against a brute force
// over every chunk count on random shapes and budgets; the Qwen3-30B-A3B
// shape on a 24 GiB card.
#include <doctest/doctest.h>

#include <random>

#include "engine/layers/expert_stream_chunks.h"

using namespace hmoe;

TEST_CASE("stream chunk plan: whole layers when they fit, else chunks of experts in the room") {
  const uint64_t eb = 5013504;  // one Q8_0 expert of Qwen3-30B-A3B (3 x 768 x 2048, 34 bytes per 32)
  // Whole layers: 2 x 128 experts fit.
  StreamChunkPlan p = plan_stream_chunks(128, eb, 1, 48, 2 * 128 * eb);
  CHECK(p.whole_layers());
  CHECK(p.slots == 2);
  CHECK(p.bytes() == 2 * 128 * eb);
  // One streamed layer: one slot is enough for whole layers.
  CHECK(plan_stream_chunks(128, eb, 1, 1, 128 * eb).slots == 1);
  // 1 GiB of room: 2 slots of 107 experts fit at most; balanced as 2 chunks of 64.
  p = plan_stream_chunks(128, eb, 1, 48, 1ull << 30);
  CHECK(!p.whole_layers());
  CHECK(p.slots == 2);
  CHECK(p.chunks_per_layer == 2);
  CHECK(p.experts_per_slot == 64);
  CHECK(p.bytes() <= (1ull << 30));
  MESSAGE("Qwen3-30B-A3B Q8_0 experts, window 1, 1 GiB: " << p.describe());
  // 200 MiB: 20 experts a slot at most -> 7 chunks of 19.
  p = plan_stream_chunks(128, eb, 1, 48, 200ull << 20);
  CHECK(p.chunks_per_layer == 7);
  CHECK(p.experts_per_slot == 19);
  CHECK(p.bytes() <= (200ull << 20));
  // Window 3: 4 slots share the room.
  p = plan_stream_chunks(128, eb, 3, 48, 1ull << 30);
  CHECK(p.slots == 4);
  CHECK(p.experts_per_slot * 4 * eb <= (1ull << 30));
  // Too small for kMinChunkExperts a slot: no streaming; chunks not allowed: whole layers or nothing.
  CHECK(!plan_stream_chunks(128, eb, 1, 48, 2 * 7 * eb).fits());
  CHECK(plan_stream_chunks(128, eb, 1, 48, 2 * 8 * eb).experts_per_slot == 8);
  CHECK(!plan_stream_chunks(128, eb, 1, 48, 1ull << 30, false).fits());
  CHECK(!plan_stream_chunks(0, eb, 1, 48, 1ull << 40).fits());
  CHECK(!plan_stream_chunks(128, eb, 1, 0, 1ull << 40).fits());
  // A chunk is never more than half a layer; a layer too small to split into chunks of 8 does not stream.
  p = plan_stream_chunks(32, eb, 1, 8, 40 * eb);
  CHECK(p.experts_per_slot == 16);
  CHECK(p.chunks_per_layer == 2);
  CHECK(!plan_stream_chunks(12, eb, 1, 8, 20 * eb).fits());
  // 20 experts in 3 chunks would be 7 each (< 8): none; 2 chunks of 10 need 40 experts of room.
  CHECK(!plan_stream_chunks(20, eb, 1, 8, 2 * 8 * eb).fits());
  CHECK(plan_stream_chunks(20, eb, 1, 8, 2 * 10 * eb).experts_per_slot == 10);
}

TEST_CASE("stream chunk plan against a brute force over chunk counts, random shapes and budgets") {
  std::mt19937_64 rng(27);
  for (int i = 0; i < 3000; ++i) {
    const int64_t E = 1 + static_cast<int64_t>(rng() % 300), layers = 1 + static_cast<int64_t>(rng() % 64);
    const int window = 1 + static_cast<int>(rng() % 8);
    const uint64_t eb = 1000 + rng() % 10000000, room = rng() % (static_cast<uint64_t>(E) * eb * 10 + 1);
    const StreamChunkPlan p = plan_stream_chunks(E, eb, window, layers, room);
    const int64_t whole_slots = std::min<int64_t>(window + 1, layers);
    if (static_cast<uint64_t>(whole_slots) * static_cast<uint64_t>(E) * eb <= room) {
      REQUIRE(p.whole_layers());
      CHECK(p.slots == whole_slots);
      CHECK(p.bytes() <= room);
      continue;
    }
    // Brute force: the fewest chunks whose balanced chunk (at most half a layer, at least min(8, E) experts) fits window + 1 (>= 2) slots.
    const int64_t S = std::max<int64_t>(window + 1, 2);
    int64_t best = 0;
    for (int64_t n = 2; n <= E && best == 0; ++n) {
      const int64_t c = (E + n - 1) / n;
      if (c > (E + 1) / 2) continue;
      if (c < std::min<int64_t>(kMinChunkExperts, E)) break;
      if (static_cast<uint64_t>(S) * static_cast<uint64_t>(c) * eb <= room) best = n;
    }
    if (best == 0) {
      CHECK(!p.fits());
      continue;
    }
    REQUIRE(p.fits());
    CHECK(p.chunks_per_layer == best);
    CHECK(p.experts_per_slot == (E + best - 1) / best);
    CHECK(p.slots == S);
    CHECK(p.bytes() <= room);
    CHECK(p.experts_per_slot * p.chunks_per_layer >= E);
    CHECK(p.experts_per_slot * (p.chunks_per_layer - 1) < E);
  }
}
