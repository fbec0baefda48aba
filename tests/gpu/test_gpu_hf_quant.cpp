// Quantized Hugging Face checkpoints on the GPU path: the tiny fixture
// quantized by the tests' own quantizers (tests/quant_tools/hf_pairs.h) into
// GPTQ int4/int8, AWQ, compressed-tensors W8A16 and FP8 block scales, every
// MoE layer resident. The resident experts kept in their GPU format
// (int4 groups, int8 groups, fp8) must agree with the same checkpoint's
// experts dequantized to bf16 on the GPU and with the CPU path of the same
// checkpoint within bf16 noise, and hold fewer bytes. Skips without a GPU.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/model_run.h"
#include "tests/quant_tools/hf_pairs.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::vector<float> prompt_logits(Model& m) {
  return test::prompt_logits(m, {151644, 872, 198, 9707, 0, 10479, 525, 498, 30, 151645, 198, 151644, 77091, 198});
}
const auto rel = test::rel_error;

}  // namespace

TEST_CASE("quantized HF checkpoints on the GPU: resident experts kept quantized match dequantized ones and the CPU") {
  if (!test::have_gpu()) return;
  const std::string src = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(src + "/model-00001-of-00003.safetensors"), "fixture shards missing in " << src);
  struct Case {
    const char* label;
    nlohmann::json cfg;
    qtools::Quantizer q;
  };
  const nlohmann::json ct8 = {{"quant_method", "compressed-tensors"},
                              {"format", "pack-quantized"},
                              {"config_groups", {{"g", {{"targets", {"Linear"}}, {"weights", {{"num_bits", 8}, {"symmetric", true}, {"strategy", "channel"}}}}}}},
                              {"ignore", {"lm_head", "re:.*mlp\\.gate$"}}};
  const std::vector<Case> cases = {
      {"gptq-4bit-g32-sym", qtools::gptq_cfg(4, 32, true, false),
       [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_gptq(b, w, o, i, 4, 32, true, false, 1); }},
      {"gptq-8bit-g32-asym", qtools::gptq_cfg(8, 32, false, false),
       [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_gptq(b, w, o, i, 8, 32, false, false, 1); }},
      {"awq-g32", {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"zero_point", true}, {"version", "gemm"}},
       [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_awq(b, w, o, i, 32); }},
      {"ct-w8a16-channel", ct8, [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_ct(b, w, o, i, 8, -1); }},
      {"fp8-block", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}},
       [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_fp8(b, w, o, i, 128, 128); }},
  };
  for (const Case& c : cases) {
    test::TempDir dq(std::string("gq-") + c.label), df(std::string("gf-") + c.label);
    qtools::make_pair(src, dq.str(), df.str(), c.cfg, c.q);
    auto load = [&](const std::string& device, bool quant) {
      std::vector<std::string> args = {"--device", device, "--gpu-resident-moe-layers", "all", "--progress", "none", "--gpu-quantized-experts",
                                       quant ? "1" : "0"};
      return Model::load(dq.str(), Settings::load(args));
    };
    auto mq = load("cuda", true), mb = load("cuda", false), mc = load("cpu", true);
    const auto lq = prompt_logits(*mq), lb = prompt_logits(*mb), lc = prompt_logits(*mc);
    REQUIRE(lq.size() == lc.size());
    const double q_vs_b = rel(lq, lb), q_vs_cpu = rel(lq, lc), b_vs_cpu = rel(lb, lc);
    MESSAGE(std::string(c.label) << ": GPU weight bytes " << mq->gpu()->weight_bytes() << " (bf16 experts " << mb->gpu()->weight_bytes()
                    << "); rel. logit error quantized vs bf16 experts " << q_vs_b << ", quantized vs CPU " << q_vs_cpu << ", bf16 experts vs CPU "
                    << b_vs_cpu);
    CHECK(mq->gpu()->weight_bytes() < mb->gpu()->weight_bytes());
    // The GPU's bf16 activations alone put both GPU runs 1-4% from the CPU on this model: the
    // quantized experts may not add to that.
    CHECK(q_vs_b < 2e-2);
    CHECK(q_vs_cpu < b_vs_cpu + 5e-3);
  }
}
