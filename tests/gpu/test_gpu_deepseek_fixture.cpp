// The tiny DeepSeek-V3 fixture on the GPU (GpuMlaStack): for each way of
// attending over the latent cache (latent/absorbed everywhere, expanded
// everywhere, expanded prefill + latent decode) and three placements (all
// MoE layers resident, none, a mixed one), every prompt position and every
// teacher-forced decode step whose reference top-1/top-2 margin exceeds 0.5
// must agree with the Hugging Face reference's top-1. Skips without a GPU.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/blocks_gpu_mla.h"
#include "engine/logits.h"
#include "engine/model.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

void run_fixture(const std::string& mode) {
  const std::string dir = test::fixture_model("tiny-deepseekv3");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/model-00003-of-00003.safetensors"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-deepseekv3/hf_reference.json")));
  for (const std::string placement : {"all", "none", "2"}) {
    std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", placement, "--progress", "none", "--mla-attention", mode};
    Settings s = Settings::load(args);
    auto model = Model::load(dir, s);
    REQUIRE(model->gpu() != nullptr);
    REQUIRE(dynamic_cast<GpuMlaStack*>(model->gpu()) != nullptr);
    const int64_t V = model->config().vocab_size;
    int64_t checked = 0, agree = 0;
    for (size_t c = 0; c < ref["chats"].size(); ++c) {
      const auto& chat = ref["chats"][c];
      const auto ids = chat["ids"].get<std::vector<int32_t>>();
      const auto greedy = chat["greedy_ids"].get<std::vector<int32_t>>();
      const int64_t total = static_cast<int64_t>(ids.size() + greedy.size());
      KvCache kv(model->kv_layout(), total / 16 + 2, 16);
      const int seq = kv.add_sequence();
      kv.reserve(seq, total);
      Batch b;
      for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
      std::vector<float> logits;
      model->forward(b, kv, logits);
      REQUIRE(logits.size() == ids.size() * static_cast<size_t>(V));
      auto check_row = [&](const float* row, const nlohmann::json& top_ids, const nlohmann::json& top_logits, const std::string& where) {
        const double margin = top_logits[0].get<double>() - top_logits[1].get<double>();
        if (margin <= 0.5) return;
        ++checked;
        const int32_t mine = argmax(row, V);
        if (mine == top_ids[0].get<int32_t>()) ++agree;
        CHECK_MESSAGE(mine == top_ids[0].get<int32_t>(), mode << " / " << placement << ": " << where << " margin " << margin);
      };
      for (size_t p = 0; p < ids.size(); ++p)
        check_row(logits.data() + p * V, chat["top10_ids"][p], chat["top10_logits"][p], "chat " + std::to_string(c) + " prompt " + std::to_string(p));
      std::vector<float> last(logits.end() - V, logits.end());
      int64_t pos = static_cast<int64_t>(ids.size());
      for (size_t step = 0; step < greedy.size(); ++step) {
        check_row(last.data(), chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step],
                  "chat " + std::to_string(c) + " step " + std::to_string(step));
        if (step + 1 == greedy.size()) break;
        b.clear();
        b.add(greedy[step], seq, pos++, true);  // teacher forcing: the reference's token
        model->forward(b, kv, last);
      }
    }
    MESSAGE("mla_attention=" << mode << ", placement " << placement << ": " << agree << "/" << checked << " rows with margin > 0.5 agree");
    CHECK(checked > 20);
  }
}

}  // namespace

TEST_CASE("tiny-deepseekv3 on the GPU agrees with the reference top-1: latent (absorbed) attention") { if (test::have_gpu()) run_fixture("latent"); }
TEST_CASE("tiny-deepseekv3 on the GPU agrees with the reference top-1: expanded K/V") { if (test::have_gpu()) run_fixture("expanded"); }
TEST_CASE("tiny-deepseekv3 on the GPU agrees with the reference top-1: expanded prefill, latent decode") {
  if (test::have_gpu()) run_fixture("expanded_prefill");
}

TEST_CASE("tiny-deepseekv3 on the GPU: latent and expanded attention give close logits, batched sequences as alone") {
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-deepseekv3");
  REQUIRE(std::filesystem::exists(dir + "/config.json"));
  const std::vector<std::vector<int32_t>> prompts = {{0, 5126, 33, 900, 17}, {0, 128803, 19923, 3, 128804, 44, 45}, {4}};
  auto run = [&](const std::string& mode, bool batched) {
    std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", "1", "--progress", "none", "--mla-attention", mode};
    Settings s = Settings::load(args);
    auto model = Model::load(dir, s);
    std::vector<std::vector<float>> rows(prompts.size());
    KvCache kv(model->kv_layout(), 12, 16);
    std::vector<int> seqs;
    for (const auto& p : prompts) {
      seqs.push_back(kv.add_sequence());
      kv.reserve(seqs.back(), static_cast<int64_t>(p.size()));
    }
    if (batched) {
      Batch b;
      std::vector<size_t> order;
      for (size_t i = 0; i < 7; ++i)
        for (size_t q = 0; q < prompts.size(); ++q)
          if (i < prompts[q].size()) {
            b.add(prompts[q][i], seqs[q], static_cast<int64_t>(i), i + 1 == prompts[q].size());
            if (i + 1 == prompts[q].size()) order.push_back(q);
          }
      std::vector<float> l;
      model->forward(b, kv, l);
      const int64_t V = model->config().vocab_size;
      for (size_t k = 0; k < order.size(); ++k) rows[order[k]].assign(l.begin() + static_cast<int64_t>(k) * V, l.begin() + static_cast<int64_t>(k + 1) * V);
    } else {
      for (size_t q = 0; q < prompts.size(); ++q) {
        Batch b;
        for (size_t i = 0; i < prompts[q].size(); ++i) b.add(prompts[q][i], seqs[q], static_cast<int64_t>(i), i + 1 == prompts[q].size());
        model->forward(b, kv, rows[q]);
      }
    }
    return rows;
  };
  auto worst = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    double w = 0;
    for (size_t q = 0; q < a.size(); ++q) {
      REQUIRE(a[q].size() == b[q].size());
      for (size_t i = 0; i < a[q].size(); ++i) w = std::max(w, static_cast<double>(std::fabs(a[q][i] - b[q][i])));
    }
    return w;
  };
  const auto lat_alone = run("latent", false), lat_batch = run("latent", true), exp_alone = run("expanded", false), mix_batch = run("expanded_prefill", true);
  const double d_batch = worst(lat_alone, lat_batch), d_mode = worst(lat_alone, exp_alone), d_mix = worst(exp_alone, mix_batch);
  MESSAGE("max |logit| differences: latent batched vs alone " << d_batch << ", latent vs expanded " << d_mode << ", expanded_prefill batched vs expanded alone " << d_mix);
  CHECK(d_batch <= 0.3);  // bf16 activations: summation order and rounding points differ (logits are ~17)
  CHECK(d_mode <= 0.5);   // different rounding points (absorbed weights in bf16)
  CHECK(d_mix <= 0.5);    // the 1-token prompt attends in the latent space in the mixed batch
}
