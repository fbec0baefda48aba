// A GGUF (Q8_0) checkpoint on the GPU path (make_gpu_stack with a
// WeightSource): attention, norms, routers and lm_head dequantized to bf16
// on the GPU; resident experts kept as Q8_0 (gpu::quant_moe_experts) or,
// with --gpu-quantized-experts 0, dequantized to bf16; the other experts Q8_0
// on the CPU. Every prompt position where llama.cpp's top-1/top-2 margin
// exceeds 0.5 must agree with its top-1, as the CPU path does
// (tests/engine/test_gguf_model.cpp). --device auto takes the GPU as for any
// checkpoint. Skips without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "numa/quant_gguf.h"
#include "tests/bf16_agreement.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/model_run.h"
#include "tests/quant_tools/gguf_models.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("tiny-qwen3moe-Q8_0.gguf on the GPU agrees with llama.cpp's top-1 at clear margins (placements all, none, 1-2)") {
  if (!test::have_gpu()) return;
  const std::string gguf = test::fixture_ref("tiny-qwen3moe-Q8_0.gguf");
  REQUIRE_MESSAGE(std::filesystem::exists(gguf), gguf << " missing");
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("llamacpp_q8_0_reference.json")));
  {
    std::vector<std::string> args = {"--progress", "none"};
    auto auto_model = Model::load(gguf, Settings::load(args));
    CHECK(auto_model->gpu() != nullptr);  // --device auto
  }
  std::vector<std::vector<float>> quant_rows, bf16_rows;
  uint64_t quant_bytes = 0, bf16_bytes = 0;
  for (const std::string placement : {"all", "all/bf16", "none", "1-2"}) {
    const bool bf16 = placement == "all/bf16";
    std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", bf16 ? "all" : placement, "--progress", "none",
                                     "--gpu-quantized-experts", bf16 ? "0" : "1"};
    auto model = Model::load(gguf, Settings::load(args));
    REQUIRE(model->gpu() != nullptr);
    if (placement == "all") quant_bytes = model->gpu()->weight_bytes();
    if (bf16) bf16_bytes = model->gpu()->weight_bytes();
    const int64_t V = model->config().vocab_size;
    int checked = 0, agreed = 0;
    for (size_t c = 0; c < ref["chats"].size(); ++c) {
      const auto& chat = ref["chats"][c];
      const size_t np = chat["ids"].size();
      const auto rows = test::teacher_forced_rows(*model, chat);  // prompt rows first
      if (placement == "all") quant_rows.insert(quant_rows.end(), rows.begin(), rows.end());
      if (bf16) bf16_rows.insert(bf16_rows.end(), rows.begin(), rows.end());
      for (size_t p = 0; p < np; ++p) {
        const auto& tl = chat["top10_logits"][p];
        const double m = tl[0].get<double>() - tl[1].get<double>();
        if (m <= 0.5) continue;
        ++checked;
        const int32_t mine = argmax(rows[p].data(), V);
        agreed += mine == chat["top10_ids"][p][0].get<int32_t>();
        CHECK_MESSAGE(mine == chat["top10_ids"][p][0].get<int32_t>(), placement << ": chat " << c << " position " << p << " margin " << m);
      }
    }
    MESSAGE("GGUF Q8_0 on the GPU, placement " << placement << ": " << agreed << "/" << checked << " clear-margin positions agree with llama.cpp");
    CHECK(checked > 20);
  }
  // Q8_0 experts kept as stored: fewer bytes, and logits within bf16 noise of the dequantized experts.
  CHECK(quant_bytes < bf16_bytes);
  REQUIRE(quant_rows.size() == bf16_rows.size());
  // Whole-row relative error: near-tied routing in this tiny model may pick another expert in a
  // row or two under either rounding, so single logits are not compared.
  double num = 0, den = 0, worst_row = 0;
  for (size_t r = 0; r < quant_rows.size(); ++r) {
    double rn = 0, rd = 0;
    for (size_t i = 0; i < quant_rows[r].size(); ++i) {
      const double d = quant_rows[r][i] - bf16_rows[r][i];
      rn += d * d;
      rd += static_cast<double>(bf16_rows[r][i]) * bf16_rows[r][i];
    }
    num += rn, den += rd, worst_row = std::max(worst_row, std::sqrt(rn / rd));
  }
  MESSAGE("GPU weight bytes: Q8_0 experts " << quant_bytes << ", bf16 experts " << bf16_bytes << "; logits rel. error over " << quant_rows.size()
                                            << " rows " << std::sqrt(num / den) << " (worst row " << worst_row << ")");
  CHECK(std::sqrt(num / den) < 2e-2);
}

// Every GGUF block type on the GPU (tests/quant_tools/gguf_models.h: hidden
// 256, experts of 256, so the K-quants fit): resident experts kept in their
// GPU format (Q8_0, Q4_K as stored; Q4_0/Q4_1 as int4 groups; Q5_0/Q5_1/
// Q5_K/Q6_K as int8 groups) against the same file with the experts
// dequantized to bf16 on the GPU, and against the CPU path of the same file.
// The quantized experts hold each weight exactly, the bf16 ones round it,
// so the two GPU runs differ by bf16 noise only.
TEST_CASE("GGUF block types on the GPU: quantized resident experts match dequantized ones and the CPU") {
  if (!test::have_gpu()) return;
  test::TempDir dir("gpu-gguf-types");
  auto load = [&](const std::string& path, const std::string& device, bool quant) {
    std::vector<std::string> args = {"--device", device, "--gpu-resident-moe-layers", "all", "--progress", "none", "--gpu-quantized-experts",
                                     quant ? "1" : "0"};
    return Model::load(path, Settings::load(args));
  };
  auto run = [](Model& m, int64_t len = 11) {
    std::vector<int32_t> ids = {3, 17, 200, 45, 99, 128, 7, 255, 31, 64, 12};
    for (int64_t i = 11; i < len; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 5) % 256));  // > 64 tokens: the big-pass path
    return test::prompt_logits(m, ids);
  };
  const auto rel = test::rel_error;
  for (uint32_t type : {2u, 3u, 6u, 7u, 8u, 12u, 13u, 14u}) {
    const std::string path = dir.str() + "/q.gguf";
    test::write_file(path, qtools::build_model(type).quant.bytes());
    auto mq = load(path, "cuda", true), mb = load(path, "cuda", false), mc = load(path, "cpu", true);
    const auto lq = run(*mq), lb = run(*mb), lc = run(*mc);
    REQUIRE(lq.size() == lc.size());
    const double q_vs_b = rel(lq, lb), q_vs_cpu = rel(lq, lc), b_vs_cpu = rel(lb, lc);
    MESSAGE(std::string(cpu::ext_type_info(type)->name) << ": GPU weight bytes " << mq->gpu()->weight_bytes() << " (bf16 experts " << mb->gpu()->weight_bytes()
                                           << "); rel. logit error quantized vs bf16 experts " << q_vs_b << ", quantized vs CPU " << q_vs_cpu
                                           << ", bf16 experts vs CPU " << b_vs_cpu);
    CHECK(mq->gpu()->weight_bytes() < mb->gpu()->weight_bytes());
    CHECK(q_vs_b < 2e-2);
    CHECK(q_vs_cpu < b_vs_cpu + 5e-3);  // the quantized experts add nothing to the GPU's bf16 noise
    // A 100-token prompt: experts dequantized a chunk at a time and multiplied by cuBLAS.
    const auto pq = run(*mq, 100), pb = run(*mb, 100), pc = run(*mc, 100);
    MESSAGE(std::string(cpu::ext_type_info(type)->name) << ", 100 tokens: rel. logit error quantized vs bf16 experts " << rel(pq, pb)
                                                         << ", quantized vs CPU " << rel(pq, pc) << ", bf16 experts vs CPU " << rel(pb, pc));
    CHECK(rel(pq, pb) < 2e-2);
    CHECK(rel(pq, pc) < rel(pb, pc) + 5e-3);
  }
}
