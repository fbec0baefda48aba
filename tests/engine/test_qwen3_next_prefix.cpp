// Prefix caching on the hybrid Qwen3-Next fixture (fp32 CPU path): a hit
// shares the full-attention layers' KV blocks and restores the linear-attention
// layers' recurrent state from a snapshot taken at a block boundary
// (engine/kv/kv_cache.h). The logits after a hit must be the cold run's bit
// for bit: the Gated DeltaNet layer cuts its work at absolute multiples of its
// chunk, so where a step begins (the snapshot, or 0) does not move a bit.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "engine/loading/model.h"
#include "io/mmap_file.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::unique_ptr<Model> load_fixture() {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00004.safetensors"),
                  "fixture shards missing in " << dir << ": run scripts/make-fixtures " << HMOE_BINARY_DIR);
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";
  return Model::load(dir, s);
}

std::vector<int32_t> random_ids(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 150000);
  return ids;
}

// Cold run: logits of positions [from, n) of `ids`, computed from position 0
// in one cache without prefix caching, in steps of the given sizes.
std::vector<float> cold(Model& m, const std::vector<int32_t>& ids, int64_t from, const std::vector<int64_t>& steps) {
  const int64_t V = m.config().vocab_size, n = static_cast<int64_t>(ids.size());
  KvCache kv(m.kv_layout(), n / 16 + 2, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, n);
  std::vector<float> out, part;
  int64_t pos = 0;
  for (size_t k = 0; pos < n; ++k) {
    const int64_t len = k < steps.size() ? std::min(steps[k], n - pos) : n - pos;
    Batch b;
    for (int64_t i = pos; i < pos + len; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, i >= from);
    m.forward(b, kv, part);
    out.insert(out.end(), part.begin(), part.end());
    pos += len;
  }
  REQUIRE(out.size() == static_cast<size_t>((n - from) * V));
  return out;
}

// Computes `ids` in a sequence of `kv` (one step, snapshots planned at
// `snap`), commits and frees it.
void compute_and_cache(Model& m, KvCache& kv, const std::vector<int32_t>& ids, const std::vector<int64_t>& snap) {
  const int seq = kv.add_sequence();
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t got = kv.attach_prefix(seq, ids, n - 1);
  kv.reserve(seq, n);
  for (int64_t at : snap) CHECK(kv.plan_state_snapshot(seq, ids, at));
  Batch b;
  for (int64_t i = got; i < n; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, i + 1 == n);
  std::vector<float> l;
  m.forward(b, kv, l);
  kv.commit(seq, ids, n);
  kv.clear_state_checkpoints();
  kv.free_sequence(seq);
}

// A hit: attaches what the cache has of `ids` (expecting `want` tokens) and
// returns the logits of the rest, computed in one step.
std::vector<float> hit(Model& m, KvCache& kv, const std::vector<int32_t>& ids, int64_t want) {
  const int seq = kv.add_sequence();
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t got = kv.attach_prefix(seq, ids, n - 1);
  CHECK(got == want);
  kv.reserve(seq, n);
  Batch b;
  for (int64_t i = got; i < n; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, true);
  std::vector<float> l;
  m.forward(b, kv, l);
  kv.free_sequence(seq);
  return l;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("qwen3_next prefix cache: a hit restores KV blocks and the recurrent state, logits bit for bit those of the cold run") {
  auto model = load_fixture();
  const KvLayout& lay = model->kv_layout();
  REQUIRE(lay.seq_state_bytes > 0);
  REQUIRE(lay.state_align == 64);
  KvCache kv(lay, 64, 16, KvCacheOptions{true, 3, 0, 4});
  REQUIRE(kv.prefix_caching());
  REQUIRE(kv.snapshot_align() == 64);

  const auto a = random_ids(150, 1);
  compute_and_cache(*model, kv, a, {64, 128});  // snapshots taken inside one 150-token step
  CHECK(kv.stats().snapshots_taken == 2);
  CHECK(kv.stats().snapshots_held == 2);

  // Full hit: b shares a's first 130 tokens; the deepest snapshot is at 128.
  auto b = a;
  b.resize(130);
  for (int32_t t : random_ids(40, 2)) b.push_back(t);
  const auto warm_b = hit(*model, kv, b, 128);
  CHECK(kv.last_match_tokens() == 128);
  CHECK(same_bits(warm_b, cold(*model, b, 128, {170})));
  // The cold run in other steps split at multiples of the chunk gives the same bits.
  CHECK(same_bits(warm_b, cold(*model, b, 128, {64, 64, 42})));

  // Partial hit: c shares 100 tokens (six full blocks match) but the deepest
  // snapshot inside them is at 64: 64 tokens reused, 32 matched ones recomputed.
  const int64_t short_before = kv.stats().snapshot_short_tokens;
  auto c = a;
  c.resize(100);
  for (int32_t t : random_ids(30, 3)) c.push_back(t);
  const auto warm_c = hit(*model, kv, c, 64);
  CHECK(kv.last_match_tokens() == 96);
  CHECK(kv.stats().snapshot_short_tokens - short_before == 32);
  CHECK(same_bits(warm_c, cold(*model, c, 64, {130})));
  CHECK(kv.stats().snapshots_restored == 2);

  // No snapshot at all inside the match: nothing reused, state from zero.
  KvCache kv2(lay, 64, 16, KvCacheOptions{true, 3, 0, 4});
  compute_and_cache(*model, kv2, a, {});
  const auto cold_c = hit(*model, kv2, c, 0);
  CHECK(kv2.last_match_tokens() == 96);
  CHECK(same_bits(cold_c, cold(*model, c, 0, {130})));
}

TEST_CASE("qwen3_next prefix cache: snapshots die with their blocks and the pool reuses its oldest slot") {
  auto model = load_fixture();
  const KvLayout& lay = model->kv_layout();
  // 16 blocks of 16 tokens: a 150-token prompt takes 10 of them.
  KvCache kv(lay, 16, 16, KvCacheOptions{true, 3, 0, 1});
  const auto a = random_ids(150, 4);
  compute_and_cache(*model, kv, a, {128});
  CHECK(kv.stats().snapshots_held == 1);
  // One slot: a new snapshot (of another prompt) takes it from a's block.
  const auto d = random_ids(70, 5);
  compute_and_cache(*model, kv, d, {64});
  CHECK(kv.stats().snapshots_held == 1);
  CHECK(kv.stats().snapshots_dropped == 1);
  auto a2 = a;
  a2.push_back(7);
  hit(*model, kv, a2, 0);  // a's blocks are still cached, its snapshot is gone
  CHECK(kv.last_match_tokens() == 144);
  // A prompt that needs every block evicts d's cached blocks and with them its snapshot.
  const auto e = random_ids(16 * 16 - 1, 6);
  compute_and_cache(*model, kv, e, {});
  CHECK(kv.stats().snapshots_held == 0);
  CHECK(kv.stats().snapshots_dropped == 2);
  auto d2 = d;
  d2.push_back(9);
  hit(*model, kv, d2, 0);
  // Positions off the alignment, or past the tokens, are refused.
  const int s = kv.add_sequence();
  CHECK_FALSE(kv.plan_state_snapshot(s, a, 48));
  CHECK_FALSE(kv.plan_state_snapshot(s, a, 192));
  kv.free_sequence(s);
}

TEST_CASE("qwen3_next prefix cache: without snapshot slots prefix caching stays off") {
  auto model = load_fixture();
  KvCache kv(model->kv_layout(), 16, 16, KvCacheOptions{true, 0, 4, 0});
  CHECK_FALSE(kv.prefix_caching());
  KvCache with(model->kv_layout(), 16, 16, KvCacheOptions{true, 0, 4, 2});
  CHECK(with.prefix_caching());
  CHECK(with.host_blocks() == 0);  // host blocks would come back without their snapshots
}
