// Quantized Hugging Face checkpoints end to end: the tiny fixture is
// quantized into each format by the tests' own quantizers
// (tests/quant_tools/), loaded through Model::load, and compared with the
// same model holding the dequantized weights in F32 (fp32 tolerance).
// Then broken checkpoints: missing scales, shapes that disagree, bad configs.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "engine/loading/quant_config.h"
#include "engine/placement/placement.h"
#include "engine/serving/logits.h"
#include "io/mmap_file.h"
#include "io/safetensors.h"
#include "tests/model_run.h"
#include "tests/quant_tools/hf_pairs.h"
#include "tests/quant_tools/hf_quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

using qtools::gptq_cfg;
using qtools::make_pair;
using qtools::Quantizer;

std::unique_ptr<Model> load_quiet(const std::string& dir) {
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  return Model::load(dir, s);
}

std::vector<float> prompt_logits(Model& m) {
  return test::prompt_logits(m, {151644, 872, 198, 9707, 0, 10479, 525, 498, 30, 151645, 198, 151644, 77091, 198});
}

void compare_formats(const std::string& label, const nlohmann::json& qconfig, const Quantizer& quant) {
  const std::string src = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(src + "/model-00001-of-00003.safetensors"), "fixture shards missing in " << src);
  test::TempDir dq("quant-" + label), df("deq-" + label);
  qtools::make_pair(src, dq.str(), df.str(), qconfig, quant);
  auto mq = load_quiet(dq.str());
  auto mf = load_quiet(df.str());
  const auto lq = prompt_logits(*mq), lf = prompt_logits(*mf);
  REQUIRE(lq.size() == lf.size());
  const int64_t V = mq->config().vocab_size;
  double worst = 0, scale = 0;
  for (size_t i = 0; i < lq.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(lq[i] - lf[i]))), scale = std::max(scale, static_cast<double>(std::fabs(lf[i])));
  int same_top1 = 0;
  for (size_t p = 0; p < lq.size() / static_cast<size_t>(V); ++p) same_top1 += argmax(lq.data() + p * V, V) == argmax(lf.data() + p * V, V);
  // Quantization must have changed the model (the quantized weights are used).
  static const std::vector<float> original = prompt_logits(*load_quiet(src));
  double from_original = 0;
  for (size_t i = 0; i < lq.size(); ++i) from_original = std::max(from_original, static_cast<double>(std::fabs(lq[i] - original[i])));
  MESSAGE(label << ": max |logit diff| vs the dequantized F32 model " << worst << " (max |logit| " << scale << "; vs the unquantized bf16 model "
                << from_original << "), same top-1 at " << same_top1 << "/" << lq.size() / static_cast<size_t>(V));
  CHECK(worst < 1e-3);
  CHECK(from_original > 1e-3);
  CHECK(static_cast<size_t>(same_top1) == lq.size() / static_cast<size_t>(V));
}


}  // namespace

TEST_CASE("GPTQ checkpoints load and match their dequantized twin") {
  compare_formats("gptq-4bit-g32-sym", gptq_cfg(4, 32, true, false), [](const std::string& b, const float* w, int64_t o, int64_t i) {
    return qtools::quantize_gptq(b, w, o, i, 4, 32, true, false, 1);
  });
  compare_formats("gptq-4bit-g128-asym", gptq_cfg(4, 128, false, false), [](const std::string& b, const float* w, int64_t o, int64_t i) {
    return qtools::quantize_gptq(b, w, o, i, 4, 128, false, false, 1);
  });
  compare_formats("gptq-4bit-channel-asym", gptq_cfg(4, -1, false, false), [](const std::string& b, const float* w, int64_t o, int64_t i) {
    return qtools::quantize_gptq(b, w, o, i, 4, -1, false, false, 1);
  });
  compare_formats("gptq-8bit-g64-asym", gptq_cfg(8, 64, false, false), [](const std::string& b, const float* w, int64_t o, int64_t i) {
    return qtools::quantize_gptq(b, w, o, i, 8, 64, false, false, 1);
  });
  compare_formats("gptq-4bit-g32-desc_act", gptq_cfg(4, 32, true, true), [](const std::string& b, const float* w, int64_t o, int64_t i) {
    return qtools::quantize_gptq(b, w, o, i, 4, 32, true, true, static_cast<uint32_t>(o * 131 + i));
  });
}

TEST_CASE("mixed precision: experts int4 g32, attention int8 g64, layer 3 attention bf16, one config") {
  compare_formats("gptq-mixed", gptq_cfg(4, 128, false, false), [](const std::string& b, const float* w, int64_t o, int64_t i) {
    if (b.find("layers.3.self_attn") != std::string::npos) return qtools::HfQuantized{};
    if (b.find("self_attn") != std::string::npos) return qtools::quantize_gptq(b, w, o, i, 8, 64, false, false, 1);
    return qtools::quantize_gptq(b, w, o, i, 4, 32, true, false, 1);
  });
}

TEST_CASE("AWQ GEMM checkpoints load and match their dequantized twin") {
  compare_formats("awq-g32", {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 32}, {"zero_point", true}, {"version", "gemm"}},
                  [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_awq(b, w, o, i, 32); });
}

TEST_CASE("compressed-tensors pack-quantized W4A16 / W8A16 load and match their dequantized twin") {
  auto ct = [](int bits, int group) {
    nlohmann::json weights = {{"num_bits", bits}, {"type", "int"}, {"symmetric", true}, {"strategy", group > 0 ? "group" : "channel"}};
    if (group > 0) weights["group_size"] = group;
    return nlohmann::json{{"quant_method", "compressed-tensors"},
                          {"format", "pack-quantized"},
                          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}}}}},
                          {"ignore", {"lm_head", "re:.*mlp\\.gate$"}}};
  };
  compare_formats("ct-w4a16-g32", ct(4, 32), [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_ct(b, w, o, i, 4, 32); });
  compare_formats("ct-w8a16-channel", ct(8, -1), [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_ct(b, w, o, i, 8, -1); });
}

TEST_CASE("compressed-tensors config_groups per layer: experts W4A16 g32, attention W8A16 channel, layer 0 ignored") {
  const nlohmann::json cfg = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"experts", {{"targets", {"re:.*mlp\\.experts\\..*"}}, {"weights", {{"num_bits", 4}, {"symmetric", true}, {"strategy", "group"}, {"group_size", 32}}}}},
        {"attention", {{"targets", {"re:.*self_attn\\..*"}}, {"weights", {{"num_bits", 8}, {"symmetric", true}, {"strategy", "channel"}}}}}}},
      {"ignore", {"lm_head", "re:model\\.layers\\.0\\.self_attn\\..*"}}};
  const QuantConfig qc = QuantConfig::from_json(cfg, "test");
  REQUIRE(qc.scheme_for("model.layers.2.mlp.experts.5.up_proj"));
  CHECK(qc.scheme_for("model.layers.2.mlp.experts.5.up_proj")->bits == 4);
  CHECK(qc.scheme_for("model.layers.1.self_attn.o_proj")->bits == 8);
  CHECK(qc.scheme_for("model.layers.0.self_attn.o_proj") == nullptr);
  CHECK(qc.scheme_for("lm_head") == nullptr);
  CHECK(qc.scheme_for("model.layers.1.mlp.gate") == nullptr);
  compare_formats("ct-groups", cfg, [](const std::string& b, const float* w, int64_t o, int64_t i) {
    if (b.find("layers.0.self_attn") != std::string::npos) return qtools::HfQuantized{};
    if (b.find("self_attn") != std::string::npos) return qtools::quantize_ct(b, w, o, i, 8, -1);
    return qtools::quantize_ct(b, w, o, i, 4, 32);
  });
}

TEST_CASE("quantization_config parsing: fields and refusals") {
  const QuantConfig g = QuantConfig::from_json({{"quant_method", "gptq"}, {"bits", 8}, {"group_size", -1}, {"sym", false}, {"desc_act", true},
                                                {"checkpoint_format", "gptq_v2"}, {"modules_to_not_convert", {"lm_head"}}},
                                               "c");
  CHECK(g.method == QuantConfig::Method::gptq);
  CHECK(g.scheme.bits == 8);
  CHECK(g.scheme.group == -1);
  CHECK_FALSE(g.scheme.symmetric);
  CHECK(g.desc_act);
  CHECK_FALSE(g.gptq_v1);
  CHECK(g.scheme_for("lm_head") == nullptr);
  const QuantConfig f = QuantConfig::from_json({{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 64}}}, "c");
  CHECK(f.fp8_block_in == 64);
  CHECK_THROWS_WITH_AS(QuantConfig::from_json({{"quant_method", "fp8"}, {"fmt", "e4m3"}}, "c"), doctest::Contains("weight_block_size"), Error);
  CHECK_THROWS_WITH_AS(QuantConfig::from_json({{"quant_method", "awq"}, {"bits", 4}, {"version", "gemv"}}, "c"), doctest::Contains("gemv"), Error);
  CHECK_THROWS_WITH_AS(QuantConfig::from_json({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 48}}, "c"), doctest::Contains("group_size 48"), Error);
  CHECK_THROWS_WITH_AS(QuantConfig::from_json({{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}}, "c"),
                       doctest::Contains("float-quantized"), Error);
  CHECK_THROWS_WITH_AS(QuantConfig::from_json(nlohmann::json::array(), "c"), doctest::Contains("object"), Error);
}

TEST_CASE("FP8 e4m3 with 128x128 block scales loads and matches its dequantized twin") {
  compare_formats("fp8-block", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}},
                  [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_fp8(b, w, o, i, 128, 128); });
}

TEST_CASE("broken quantized checkpoints are clear errors") {
  const std::string src = test::fixture_model("tiny-qwen3moe");
  REQUIRE(io::file_exists(src + "/model-00001-of-00003.safetensors"));
  const auto gptq = [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_gptq(b, w, o, i, 4, 32, true, false, 1); };
  auto expect_error = [&](const std::string& label, const nlohmann::json& cfg, const std::function<void(std::vector<io::TensorToWrite>&)>& mutate,
                          const std::string& needle) {
    test::TempDir dq("bad-" + label), df("badf-" + label);
    make_pair(src, dq.str(), df.str(), cfg, gptq, mutate);
    CHECK_THROWS_WITH_AS(load_quiet(dq.str()), doctest::Contains(needle.c_str()), Error);
  };
  const std::string victim = "model.layers.1.self_attn.q_proj";
  expect_error("missing-scales", gptq_cfg(4, 32, true, false),
               [&](auto& ts) { std::erase_if(ts, [&](const io::TensorToWrite& t) { return t.name == victim + ".scales"; }); }, "scales' is missing");
  expect_error("bad-shape", gptq_cfg(4, 32, true, false),
               [&](auto& ts) {
                 for (auto& t : ts)
                   if (t.name == victim + ".scales") t.shape = {t.shape[1], t.shape[0]}, (void)0;
               },
               "scales");
  expect_error("bad-gidx", gptq_cfg(4, 32, true, false),
               [&](auto& ts) {
                 for (auto& t : ts)
                   if (t.name == victim + ".g_idx") std::memset(t.bytes.data(), 0x7f, 4);
               },
               "g_idx[0]");
  expect_error("bad-method", {{"quant_method", "bitsandbytes"}}, {}, "quant_method 'bitsandbytes'");
  expect_error("bad-bits", gptq_cfg(3, 32, true, false), {}, "bits 3");
  expect_error("ct-asym", {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                           {"config_groups", {{"g", {{"targets", {"Linear"}}, {"weights", {{"num_bits", 4}, {"symmetric", false}, {"group_size", 32}}}}}}}},
               [&](auto& ts) {
                 for (auto& t : ts)
                   if (t.name.ends_with(".qweight")) t.name = t.name.substr(0, t.name.size() - 8) + ".weight_packed";
               },
               "asymmetric");
}

// Placement counts a quantized checkpoint's experts as they are held: as
// stored on the CPU, in the GPU format when resident (not as bf16).
TEST_CASE("quantized checkpoints: expert bytes per weight for placement and hmoe plan") {
  const std::string src = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(src + "/model-00001-of-00003.safetensors"), "fixture shards missing in " << src);
  test::TempDir dq("plan-q"), df("plan-f");
  qtools::make_pair(src, dq.str(), df.str(), gptq_cfg(4, 32, true, false),
                    [](const std::string& b, const float* w, int64_t o, int64_t i) { return qtools::quantize_gptq(b, w, o, i, 4, 32, true, false, 1); });
  auto mq = load_quiet(dq.str());
  auto mf = load_quiet(df.str());
  const ModelConfig& cq = mq->config();
  // int4 codes (0.5 B) + one f32 scale per 32 weights (0.125 B); symmetric: no zeros.
  CHECK(cq.expert_bytes_per_weight == doctest::Approx(0.625));
  CHECK(cq.gpu_expert_bytes_per_weight == doctest::Approx(0.625));
  CHECK(mf->config().expert_bytes_per_weight == 0.0);  // plain checkpoint: from torch_dtype
  std::vector<std::string> args = {"--gpu-resident-moe-layers", "all"};
  Settings s = Settings::load(args);
  GpuTarget gpu{"test GPU", 24ull << 30, 0, true};
  const Plan pq = make_plan(cq, s, gpu), pf = make_plan(mf->config(), s, gpu);
  CHECK(pq.gpu_expert_bytes * 3 < pf.gpu_expert_bytes);
  s.gpu_quantized_experts = false;  // dequantized to bf16 on the GPU: bf16 bytes again
  CHECK(make_plan(cq, s, gpu).gpu_expert_bytes == expert_layer_bytes(cq) * static_cast<uint64_t>(pq.moe_layers()));
}
