// The CPU forward pass against Hugging Face transformers' fp32 reference on
// the tiny Qwen3-MoE fixture: every prompt position's top-10 logits and
// log-sum-exp within 2e-3, the same top-10 ids where the reference's gaps
// allow, and all 32 greedy ids with each step's top-10 logits.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/loading/model.h"
#include "engine/serving/logits.h"
#include "io/mmap_file.h"
#include "tests/fixture_compare.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

constexpr double kTol = 2e-3;

}  // namespace

TEST_CASE("tiny-qwen3moe matches the Hugging Face fp32 reference") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00003.safetensors"),
                  "fixture shards missing in " << dir << ": run scripts/make-fixtures " << HMOE_BINARY_DIR);
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3moe/hf_reference.json")));
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";  // the fp32 CPU path is what the 2e-3 tolerance is for
  auto model = Model::load(dir, s);
  const int64_t V = model->config().vocab_size;
  REQUIRE(ref["chats"].size() >= 1);
  double max_diff = 0;
  for (size_t c = 0; c < ref["chats"].size(); ++c) {
    const auto& chat = ref["chats"][c];
    const auto ids = chat["ids"].get<std::vector<int32_t>>();
    const int64_t total = static_cast<int64_t>(ids.size()) + 32;
    KvCache kv(model->kv_layout(), total / 16 + 2, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, total);
    Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
    std::vector<float> logits;
    model->forward(b, kv, logits);
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* row = logits.data() + p * V;
      const std::string where = "chat " + std::to_string(c) + " prompt position " + std::to_string(p);
      test::check_top10(row, V, chat["top10_ids"][p], chat["top10_logits"][p], where, max_diff);
      CHECK(std::fabs(logsumexp(row, V) - chat["logsumexp"][p].get<double>()) <= kTol);
    }
    std::vector<float> last(logits.end() - V, logits.end());
    const auto greedy = chat["greedy_ids"].get<std::vector<int32_t>>();
    REQUIRE(greedy.size() == 32);
    int64_t pos = static_cast<int64_t>(ids.size());
    for (size_t step = 0; step < greedy.size(); ++step) {
      const std::string where = "chat " + std::to_string(c) + " greedy step " + std::to_string(step);
      test::check_top10(last.data(), V, chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step], where, max_diff);
      const int32_t next = argmax(last.data(), V);
      REQUIRE_MESSAGE(next == greedy[step], where);
      b.clear();
      b.add(next, seq, pos++, true);
      model->forward(b, kv, last);
    }
  }
  MESSAGE("max |logit - reference| over all chats: " << max_diff);
}

TEST_CASE("batched sequences give the same logits as one sequence at a time") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(dir + "/config.json"), "fixture missing: run scripts/make-fixtures");
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";  // the fp32 CPU path is what the 2e-3 tolerance is for
  auto model = Model::load(dir, s);
  const int64_t V = model->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{9707, 0, 10479}, {151644, 872, 198, 9707, 525}, {30}};
  // Alone.
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) {
    KvCache kv(model->kv_layout(), 4, 16);
    int seq = kv.add_sequence();
    kv.reserve(seq, static_cast<int64_t>(p.size()));
    Batch b;
    for (size_t i = 0; i < p.size(); ++i) b.add(p[i], seq, static_cast<int64_t>(i), i + 1 == p.size());
    std::vector<float> l;
    model->forward(b, kv, l);
    alone.push_back(l);
  }
  // Together, interleaved in one flat batch.
  KvCache kv(model->kv_layout(), 12, 16);
  Batch b;
  std::vector<int> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(kv.add_sequence());
    kv.reserve(seqs.back(), static_cast<int64_t>(p.size()));
  }
  for (size_t i = 0; i < 5; ++i)
    for (size_t s2 = 0; s2 < prompts.size(); ++s2)
      if (i < prompts[s2].size()) b.add(prompts[s2][i], seqs[s2], static_cast<int64_t>(i), i + 1 == prompts[s2].size());
  std::vector<float> l;
  model->forward(b, kv, l);
  // logit rows come in batch order: seq 2 ends first (i=0), then seq 0 (i=2), then seq 1 (i=4).
  const int order[3] = {2, 0, 1};
  for (int r = 0; r < 3; ++r)
    for (int64_t v = 0; v < V; v += 97) CHECK(l[static_cast<size_t>(r * V + v)] == alone[static_cast<size_t>(order[r])][static_cast<size_t>(v)]);
}
