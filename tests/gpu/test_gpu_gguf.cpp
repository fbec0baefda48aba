// A GGUF (Q8_0) checkpoint on the GPU path (make_gpu_stack with a
// WeightSource): attention, norms, routers, lm_head and resident experts
// dequantized to bf16 on the GPU, the other experts Q8_0 on the CPU. Every
// prompt position where llama.cpp's top-1/top-2 margin exceeds 0.5 must
// agree with its top-1, as the CPU path does (tests/engine/test_gguf_model.cpp).
// --device auto keeps such a checkpoint on the CPU. Skips without a GPU.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/logits.h"
#include "engine/model.h"
#include "tests/bf16_agreement.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("tiny-qwen3moe-Q8_0.gguf on the GPU agrees with llama.cpp's top-1 at clear margins (placements all, none, 1-2)") {
  if (!test::have_gpu()) return;
  const std::string gguf = test::fixture_ref("tiny-qwen3moe-Q8_0.gguf");
  REQUIRE_MESSAGE(std::filesystem::exists(gguf), gguf << " missing");
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("llamacpp_q8_0_reference.json")));
  {
    std::vector<std::string> args = {"--progress", "none"};
    auto cpu_model = Model::load(gguf, Settings::load(args));
    CHECK(cpu_model->gpu() == nullptr);  // --device auto: a GGUF stays on the CPU
  }
  for (const std::string placement : {"all", "none", "1-2"}) {
    std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", placement, "--progress", "none"};
    auto model = Model::load(gguf, Settings::load(args));
    REQUIRE(model->gpu() != nullptr);
    const int64_t V = model->config().vocab_size;
    int checked = 0, agreed = 0;
    for (size_t c = 0; c < ref["chats"].size(); ++c) {
      const auto& chat = ref["chats"][c];
      const size_t np = chat["ids"].size();
      const auto rows = test::teacher_forced_rows(*model, chat);  // prompt rows first
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
}
