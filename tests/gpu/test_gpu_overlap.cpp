// Hybrid decode steps under CUDA graphs (one per GPU segment between CPU
// hand-offs) and under the GPU/CPU overlap (two micro-batches): the tiny
// Qwen3-MoE fixture with layers 0 and 3 on the CPU, four chats decoded as one
// batch of four sequences (teacher-forced), must agree with the reference
// top-1 wherever its top-1/top-2 margin exceeds 0.5, and with the plain path
// (no graphs, no overlap) to within bf16 noise. Skips without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

struct DecodeRun {
  std::vector<float> head;  // the first kHead logits of every decode row, step-major
  int64_t checked = 0, agree = 0;
  size_t captures = 0;
};
constexpr int64_t kHead = 4096;

DecodeRun decode_four_chats(const std::string& dir, const nlohmann::json& ref, const std::string& graphs, const std::string& overlap,
                            const std::string& second_rows, const std::string& resident = "1-2") {
  std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", resident, "--progress", "none",
                                   "--cuda-graphs", graphs, "--gpu-cpu-overlap", overlap};
  Settings s = Settings::load(args);
  auto model = Model::load(dir, s);
  GpuRuntime* stack = model->gpu();
  REQUIRE(stack != nullptr);
  if (overlap == "1" && !second_rows.empty()) stack->set_cpu_overlap(true, std::stoll(second_rows));
  const int64_t V = model->config().vocab_size;
  const size_t chats = ref["chats"].size();
  std::vector<std::vector<int32_t>> ids(chats), greedy(chats);
  int64_t blocks = 0;
  for (size_t c = 0; c < chats; ++c) {
    ids[c] = ref["chats"][c]["ids"].get<std::vector<int32_t>>();
    greedy[c] = ref["chats"][c]["greedy_ids"].get<std::vector<int32_t>>();
    blocks += static_cast<int64_t>(ids[c].size() + greedy[c].size()) / 16 + 2;
  }
  KvCache kv(model->kv_layout(), blocks, 16);
  std::vector<int> seq(chats);
  std::vector<int64_t> pos(chats);
  std::vector<std::vector<float>> last(chats);
  DecodeRun run;
  Batch b;
  std::vector<float> logits;
  for (size_t c = 0; c < chats; ++c) {  // prefill, one chat at a time
    seq[c] = kv.add_sequence();
    kv.reserve(seq[c], static_cast<int64_t>(ids[c].size() + greedy[c].size()));
    b.clear();
    for (size_t i = 0; i < ids[c].size(); ++i) b.add(ids[c][i], seq[c], static_cast<int64_t>(i), i + 1 == ids[c].size());
    model->forward(b, kv, logits);
    last[c].assign(logits.begin(), logits.begin() + V);
    pos[c] = static_cast<int64_t>(ids[c].size());
  }
  const size_t steps = greedy[0].size();
  for (size_t step = 0; step < steps; ++step) {
    for (size_t c = 0; c < chats && step < greedy[c].size(); ++c) {
      const auto& top_ids = ref["chats"][c]["greedy_top10_ids"][step];
      const auto& top_logits = ref["chats"][c]["greedy_top10_logits"][step];
      const double margin = top_logits[0].get<double>() - top_logits[1].get<double>();
      if (margin <= 0.5) continue;
      ++run.checked;
      const int32_t mine = argmax(last[c].data(), V);
      if (mine == top_ids[0].get<int32_t>()) ++run.agree;
      CHECK_MESSAGE(mine == top_ids[0].get<int32_t>(), "graphs " << graphs << " overlap " << overlap << ": chat " << c << " step " << step);
    }
    if (step + 1 == steps) break;
    b.clear();
    for (size_t c = 0; c < chats; ++c) b.add(greedy[c][step], seq[c], pos[c]++, true);  // teacher forcing, one batch
    model->forward(b, kv, logits);
    for (size_t c = 0; c < chats; ++c) {
      last[c].assign(logits.begin() + static_cast<int64_t>(c) * V, logits.begin() + static_cast<int64_t>(c + 1) * V);
      run.head.insert(run.head.end(), last[c].begin(), last[c].begin() + kHead);
    }
  }
  run.captures = stack->graph_captures();
  return run;
}

void check_graphs_and_overlap(const std::string& fixture, const std::string& resident) {
  const std::string dir = test::fixture_model(fixture);
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref(fixture + "/hf_reference.json")));
  const DecodeRun plain = decode_four_chats(dir, ref, "0", "0", "", resident);
  MESSAGE(fixture << " plain: " << plain.agree << "/" << plain.checked << " rows with margin > 0.5 agree");
  CHECK(plain.checked > 20);
  CHECK(plain.captures == 0);
  size_t graph_only_captures = 0;
  for (const auto& [graphs, overlap, second] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"1", "0", ""}, {"0", "1", ""}, {"1", "1", ""}, {"1", "1", "1"}}) {
    const DecodeRun r = decode_four_chats(dir, ref, graphs, overlap, second, resident);
    REQUIRE(r.head.size() == plain.head.size());
    double worst = 0;
    for (size_t i = 0; i < r.head.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(r.head[i] - plain.head[i])));
    MESSAGE(fixture << " graphs " << graphs << " overlap " << overlap << (second.empty() ? "" : " (second micro-batch " + second + " row)") << ": "
                    << r.agree << "/" << r.checked << " agree with the reference; max |logit - plain| " << worst << "; graphs captured "
                    << r.captures);
    CHECK(r.checked == plain.checked);
    CHECK(worst <= 0.05);
    if (graphs == "1") CHECK(r.captures > 0);
    if (graphs == "1" && overlap == "0") graph_only_captures = r.captures;
    // Two micro-batches replay one graph per segment each: more graphs than one batch.
    if (graphs == "1" && overlap == "1") CHECK(r.captures > graph_only_captures);
  }
}

}  // namespace

TEST_CASE("hybrid decode at batch 4: segment graphs and two micro-batches agree with plain launches and the reference") {
  if (test::have_gpu()) check_graphs_and_overlap("tiny-qwen3moe", "1-2");
}

// The same runtime features on the other architecture (one MoE layer on the
// GPU, the others handed off to the CPU with the shared expert on the GPU).
TEST_CASE("tiny-deepseekv3 hybrid decode at batch 4: segment graphs and two micro-batches agree with plain launches and the reference") {
  if (test::have_gpu()) check_graphs_and_overlap("tiny-deepseekv3", "2");
}
