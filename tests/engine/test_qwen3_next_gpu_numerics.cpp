// The GPU path's numerics for Qwen3-Next, checked without a GPU: the CPU
// path with the GPU's roundings emulated (--cpu-emulate-gpu-bf16: bf16
// product inputs where the GPU rounds them, and per the setting
// gpu_hybrid_precise the GPU's two modes: zero-centred norm weights (1 + w)
// in fp32 or bf16, router and shared-expert gate on fp32 or bf16 inputs,
// the linear/gated-attention projections on a bf16 hi + lo pair or one bf16;
// the bf16 KV cache with --kv-cache-dtype bf16; the GPU-resident experts'
// bf16 inputs with --cpu-bf16-dot where the CPU has AVX512-BF16, and then
// their bf16 activation where the GPU rounds it: everywhere in the bf16
// mode, in the cuBLAS passes of > 64 tokens in the precise mode, whose
// grouped decode kernels keep it as hi + lo) against Hugging Face
// transformers' fp32 reference of the tiny-qwen3next fixture.
//
// The bf16 mode (the GPU path before gpu_hybrid_precise) misses 9 to 12 of
// the 217 rows of margin > 0.5 here, as the device's all-GPU run did (206/217
// on an H100): the bf16 (1 + w) norm weights alone take it from 210 to 206,
// the DeltaNet in_proj's bf16 input is the largest single term (its q/k/v and
// gates feed the recurrence), a bf16 router input flips near-tied experts.
// The precise mode agrees at every such row (with the resident experts'
// activation rounded in every pass it would miss one, margin 0.61: hence
// the grouped kernels' hi + lo activation). The bar for the GPU
// path is that every row of margin > 0.5 agrees (tests/gpu runs the same
// check on the device).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "engine/loading/model.h"
#include "io/mmap_file.h"
#include "numa/kernels.h"
#include "tests/reference_agreement.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

test::Agreement emulated(const nlohmann::json& ref, const std::vector<std::string>& extra) {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00004.safetensors"), "fixture shards missing in " << dir << ": run scripts/make-fixtures");
  std::vector<std::string> args = {"--device", "cpu", "--progress", "none", "--cpu-emulate-gpu-bf16", "1", "--kv-cache-dtype", "bf16"};
  args.insert(args.end(), extra.begin(), extra.end());
  Settings s = Settings::load(args);
  auto m = Model::load(dir, s);
  return test::reference_agreement(*m, ref);
}

}  // namespace

TEST_CASE("qwen3_next with the GPU's roundings emulated: the precise mode agrees with the reference at every row of margin > 0.5; the bf16 mode does not") {
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3next/hf_reference.json")));
  // Resident experts (bf16 inputs, where the CPU can round them so) and host experts (fp32 inputs).
  for (const std::string dot : {"1", "0"}) {
    const std::string experts = dot == "1" ? "experts with bf16 inputs" : "experts with fp32 inputs";
    const auto precise = emulated(ref, {"--cpu-bf16-dot", dot});
    MESSAGE("precise mode, " << experts << ": " << precise.summary());
    CHECK(precise.checked > 200);
    CHECK(precise.agree == precise.checked);
    CHECK(precise.clear_agree == precise.clear);
    const auto bf16 = emulated(ref, {"--cpu-bf16-dot", dot, "--gpu-hybrid-precise", "0"});
    MESSAGE("bf16 mode, " << experts << ": " << bf16.summary());
    CHECK(bf16.checked == precise.checked);
    CHECK(bf16.checked - bf16.agree >= 5);  // the misses the device saw, so that the emulation is known to see them
    // The precise mode is closer to the reference everywhere that matters: its largest difference is well below the bf16 mode's.
    CHECK(precise.worst * 4 < bf16.worst);
  }
}

// Which rounding the GPU-resident experts lost (issue 25; bench/README.md):
// the device's all-GPU and mixed runs missed one row of margin > 0.5 (chat 0
// step 22, margin 0.61) that its CPU-expert and streamed runs kept, because
// the resident home never received ExpertHomeOptions::split_act and so
// rounded the experts' activation between gate/up and down to one bf16 in
// every pass. Emulated here with everything else in the precise mode: the
// bf16 inputs of the experts alone keep every row; the one-bf16 activation
// on top of them (gpu_hybrid_precise_act 0) flips exactly that row; its
// hi + lo pair keeps it.
TEST_CASE("qwen3_next with the GPU's roundings emulated: the experts' one-bf16 activation flips the row of margin 0.61, its hi + lo pair keeps it") {
  if (!cpu::has_bf16_dot()) {
    MESSAGE("skipped: the experts' bf16 inputs and activation are emulated with the AVX512-BF16 dot products, which this CPU lacks");
    return;
  }
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3next/hf_reference.json")));
  const auto pair = emulated(ref, {"--cpu-bf16-dot", "1"});
  const auto one = emulated(ref, {"--cpu-bf16-dot", "1", "--gpu-hybrid-precise-act", "0"});
  MESSAGE("experts' activation as hi + lo: " << pair.summary() << "\nexperts' activation as one bf16: " << one.summary());
  REQUIRE(pair.checked > 200);
  REQUIRE(one.checked == pair.checked);
  CHECK(pair.agree == pair.checked);
  CHECK(one.checked - one.agree == 1);
  for (size_t i = 0; i < one.rows.size(); ++i) {
    if (one.rows[i].agree) continue;
    CHECK(one.rows[i].where == "chat 0 step 22");
    CHECK(one.rows[i].margin > 0.6);
    CHECK(one.rows[i].margin < 0.62);
    CHECK(pair.rows[i].where == one.rows[i].where);
    CHECK(pair.rows[i].agree);
  }
}
