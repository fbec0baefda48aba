// The tiny Qwen3-MoE Engram fixture (engram_reference.json) on the GPU path
// with the bf16 rules: every prompt position and teacher-forced decode step
// whose reference top-1/top-2 margin exceeds 0.5 agrees with the
// reference's top-1, for all-resident and none-resident placements, with the
// ram and io_uring table backends. Then the GPU history across steps:
// chunked prefill, and several sequences decoded in one batch (two
// micro-batches with --gpu-cpu-overlap), against one-shot prefill. Skips
// without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/layers/engram.h"
#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "io/mmap_file.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::string engram_dir() {
  const std::string dir = test::fixture_model("tiny-qwen3moe-engram");
  REQUIRE_MESSAGE(io::file_exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  return dir;
}

std::unique_ptr<Model> load_gpu(const std::string& dir, const std::string& placement, const std::string& backend, const std::string& table,
                                bool overlap = false) {
  std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", placement, "--progress", "none", "--ple-backend", backend,
                                   "--ple-table", table, "--gpu-cpu-overlap", overlap ? "1" : "0"};
  if (overlap) {  // decode batches take the CPU hand-offs (two micro-batches), not the streamed experts
    args.push_back("--gpu-prefill-min-batch-size");
    args.push_back("0");
  }
  auto m = Model::load(dir, Settings::load(args));
  REQUIRE(m->gpu() != nullptr);
  REQUIRE(m->engram() != nullptr);
  return m;
}

std::vector<float> run_chunks(Model& m, KvCache& kv, int seq, const std::vector<int32_t>& ids, size_t chunk) {
  std::vector<float> all;
  for (size_t s = 0; s < ids.size(); s += chunk) {
    Batch b;
    for (size_t i = s; i < std::min(ids.size(), s + chunk); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
    std::vector<float> l;
    m.forward(b, kv, l);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  return worst;
}

}  // namespace

TEST_CASE("tiny-qwen3moe-engram on the GPU agrees with the reference top-1 (placements all/none, backends ram/io_uring)") {
  if (!test::have_gpu()) return;
  const std::string dir = engram_dir();
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3moe-engram/engram_reference.json")));
  test::TempDir tmp("gpu-engram-fixture");
  for (const std::string backend : {"ram", "io_uring"})
    for (const std::string placement : {"all", "none"}) {
      CAPTURE(backend);
      CAPTURE(placement);
      auto model = load_gpu(dir, placement, backend, tmp.str() + "/table.hmoe");
      INFO("backend in use: " << io::ple_backend_name(model->engram()->table().backend()) << " " << model->engram()->table().notice());
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
        std::vector<float> logits = run_chunks(*model, kv, seq, ids, ids.size());
        auto check_row = [&](const float* row, const nlohmann::json& top_ids, const nlohmann::json& top_logits, const std::string& where) {
          const double margin = top_logits[0].get<double>() - top_logits[1].get<double>();
          if (margin <= 0.5) return;
          ++checked;
          const int32_t mine = argmax(row, V);
          if (mine == top_ids[0].get<int32_t>()) ++agree;
          CHECK_MESSAGE(mine == top_ids[0].get<int32_t>(), where << " margin " << margin);
        };
        for (size_t p = 0; p < ids.size(); ++p)
          check_row(logits.data() + p * V, chat["top10_ids"][p], chat["top10_logits"][p], "chat " + std::to_string(c) + " prompt " + std::to_string(p));
        std::vector<float> last(logits.end() - V, logits.end());
        int64_t pos = static_cast<int64_t>(ids.size());
        for (size_t step = 0; step < greedy.size(); ++step) {
          check_row(last.data(), chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step],
                    "chat " + std::to_string(c) + " step " + std::to_string(step));
          if (step + 1 == greedy.size()) break;
          Batch b;
          b.add(greedy[step], seq, pos++, true);  // teacher forcing: the reference's token
          model->forward(b, kv, last);
        }
      }
      MESSAGE(backend << ", placement " << placement << ": " << agree << "/" << checked << " rows with margin > 0.5 agree; "
                      << model->engram()->stats_line());
      CHECK(checked > 20);
      CHECK(model->engram()->table().stats().rows_requested > 0);
    }
}

TEST_CASE("Engram on the GPU: chunked prefill and batched decode of several sequences equal one-shot prefill") {
  if (!test::have_gpu()) return;
  const std::string dir = engram_dir();
  test::TempDir tmp("gpu-engram-state");
  const std::vector<std::vector<int32_t>> prompts = {
      {151644, 872, 198, 9707, 525, 498, 30, 151645, 198, 151644, 77091, 198, 9707, 0, 10479, 30, 11, 12, 13, 14},
      {9707, 0, 10479, 9707, 0, 10479, 9707, 0, 10479, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21},
      {30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49}};
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    auto model = load_gpu(dir, "none", "io_uring", tmp.str() + "/t.hmoe", overlap);
    const int64_t V = model->config().vocab_size;
    std::vector<std::vector<float>> whole;
    for (const auto& p : prompts) {
      KvCache kv(model->kv_layout(), 4, 16);
      const int seq = kv.add_sequence();
      kv.reserve(seq, static_cast<int64_t>(p.size()));
      whole.push_back(run_chunks(*model, kv, seq, p, p.size()));
    }
    if (!overlap) {  // the scale of bf16 differences: the fp32 CPU path on the same prompts
      std::vector<std::string> args = {"--device", "cpu", "--progress", "none", "--ple-backend", "ram"};
      auto cpu = Model::load(dir, Settings::load(args));
      for (size_t i = 0; i < prompts.size(); ++i) {
        KvCache kv(cpu->kv_layout(), 4, 16);
        const int seq = kv.add_sequence();
        kv.reserve(seq, static_cast<int64_t>(prompts[i].size()));
        MESSAGE("prompt " << i << ": max |GPU - fp32 CPU| one-shot " << max_abs_diff(run_chunks(*cpu, kv, seq, prompts[i], prompts[i].size()), whole[i]));
      }
    }
    // bf16 products over other batch shapes round differently; a history row
    // missed or misplaced moves logits by far more than this.
    const double tol = 0.03;
    for (size_t chunk : {1, 3, 7}) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        KvCache kv(model->kv_layout(), 4, 16);
        const int seq = kv.add_sequence();
        kv.reserve(seq, static_cast<int64_t>(prompts[i].size()));
        const double worst = max_abs_diff(run_chunks(*model, kv, seq, prompts[i], chunk), whole[i]);
        CHECK_MESSAGE(worst <= tol, "prompt " << i << " chunk " << chunk << " differs by " << worst);
      }
    }
    // The three sequences: 5 tokens each in one prefill batch, then one token
    // of each per step (decode batches of 3 rows, 2 micro-batches with overlap).
    KvCache kv(model->kv_layout(), 12, 16);
    std::vector<int> seqs;
    for (const auto& p : prompts) {
      seqs.push_back(kv.add_sequence());
      kv.reserve(seqs.back(), static_cast<int64_t>(p.size()));
    }
    std::vector<std::vector<float>> got(prompts.size());
    for (size_t s = 0; s < prompts[0].size();) {
      const size_t take = s == 0 ? 5 : 1;
      Batch b;
      std::vector<size_t> owner;
      for (size_t q = 0; q < prompts.size(); ++q)
        for (size_t i = s; i < s + take; ++i) {
          b.add(prompts[q][i], seqs[q], static_cast<int64_t>(i), true);
          owner.push_back(q);
        }
      std::vector<float> l;
      model->forward(b, kv, l);
      for (size_t r = 0; r < owner.size(); ++r)
        got[owner[r]].insert(got[owner[r]].end(), l.begin() + static_cast<int64_t>(r) * V, l.begin() + static_cast<int64_t>(r + 1) * V);
      s += take;
    }
    for (size_t q = 0; q < prompts.size(); ++q) {
      const double worst = max_abs_diff(got[q], whole[q]);
      CHECK_MESSAGE(worst <= tol, "batched sequence " << q << " differs by " << worst);
      MESSAGE("overlap " << overlap << ": batched sequence " << q << " max |logit - one-shot| " << worst);
    }
  }
}
