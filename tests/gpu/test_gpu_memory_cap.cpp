// Issue 27 on the GPU: the memory cap (--gpu-memory: the plan's budget, and
// the ledger every device allocation passes through, naming what did not
// fit) and expert deferral in the hybrid step (--defer-experts: the GPU
// runtime's hand-offs defer as the CPU runtime does, on a worker thread).
// Skips without a GPU.
#include <doctest/doctest.h>

#include <filesystem>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "gpu/memory_cap.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/model_run.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::unique_ptr<Model> load(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.end(), {"--progress", "none", "--gpu-prefill-min-batch-size", "0"});
  Settings s = Settings::load(args);
  return Model::load(dir, s);
}

// Prompt logits, then three decode steps' logits (one token each), of one sequence.
std::vector<float> run(Model& m, const std::vector<int32_t>& ids) {
  KvCache kv(m.kv_layout(), 8, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, static_cast<int64_t>(ids.size()) + 3);
  Batch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> all, logits;
  m.forward(b, kv, all);
  for (int i = 0; i < 3; ++i) {
    b.clear();
    b.add(1000 + i, seq, static_cast<int64_t>(ids.size()) + i, true);
    m.forward(b, kv, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace

TEST_CASE("--gpu-memory caps the plan and every GPU allocation, naming what did not fit") {
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE(std::filesystem::exists(dir + "/config.json"));
  gpu::MemoryLedger& ledger = gpu::memory_ledger();
  {
    auto m = load(dir, {"--device", "cuda", "--gpu-memory", "2GiB"});
    CHECK(ledger.cap() == static_cast<uint64_t>((2ull << 30) * 0.9));
    const std::vector<int32_t> ids = {151644, 872, 198, 100, 200, 300};
    run(*m, ids);
    CHECK(ledger.held() > 0);
    CHECK(ledger.peak() <= ledger.cap());
    MESSAGE("tiny-qwen3moe under a 2 GiB cap: " << (ledger.held() >> 20) << " MiB held, peak " << (ledger.peak() >> 20) << " MiB");
    // A cap just above what is held: a longer step's scratch no longer fits and the error says so.
    ledger.set_cap(ledger.held() + (1u << 20), "test cap");
    std::vector<int32_t> longer(120, 500);
    try {
      run(*m, longer);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::out_of_memory);
      CHECK_MESSAGE(std::string(e.what()).find("GPU memory cap: ") != std::string::npos, e.what());
      CHECK_MESSAGE(std::string(e.what()).find("test cap") != std::string::npos, e.what());
    }
    ledger.set_cap(0, "");
  }
  // The plan refuses a budget the weights and KV cache cannot fit, naming the flag.
  try {
    load(dir, {"--device", "cuda", "--gpu-memory", "64MiB"});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::out_of_memory);
    CHECK_MESSAGE(std::string(e.what()).find("--gpu-memory") != std::string::npos, e.what());
  }
  // More than the card has.
  try {
    load(dir, {"--device", "cuda", "--gpu-memory", "1000GiB"});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_MESSAGE(std::string(e.what()).find("is more than") != std::string::npos, e.what());
  }
  ledger.set_cap(0, "");
}

TEST_CASE("--defer-experts in the GPU hybrid step matches the CPU runtime's deferral") {
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE(std::filesystem::exists(dir + "/config.json"));
  const std::vector<int32_t> ids = {151644, 872, 198, 100, 200, 300, 400, 500};
  const auto cpu0 = run(*load(dir, {"--device", "cpu", "--cpu-emulate-gpu-bf16", "1"}), ids);
  const auto cpu1 = run(*load(dir, {"--device", "cpu", "--cpu-emulate-gpu-bf16", "1", "--defer-experts", "1"}), ids);
  for (const std::string graphs : {"0", "1"}) {
    const auto gpu1 = run(*load(dir, {"--device", "cuda", "--gpu-resident-moe-layers", "none", "--defer-experts", "1", "--cuda-graphs", graphs}), ids);
    const double to_cpu1 = test::rel_error(gpu1, cpu1), deferral = test::rel_error(cpu1, cpu0);
    MESSAGE("cuda graphs " << graphs << ": GPU vs CPU with deferral " << to_cpu1 << "; deferral's own change " << deferral);
    CHECK(deferral > 0);
    CHECK(to_cpu1 < 0.5 * deferral);  // the GPU defers the same experts by the same layer
  }
  // Layers 1-2 resident: layer 0 hands off to a resident layer (no deferral), layer 3 is last: same as no deferral.
  const auto mixed0 = run(*load(dir, {"--device", "cuda", "--gpu-resident-moe-layers", "1-2"}), ids);
  const auto mixed1 = run(*load(dir, {"--device", "cuda", "--gpu-resident-moe-layers", "1-2", "--defer-experts", "1"}), ids);
  CHECK(test::rel_error(mixed1, mixed0) <= 1e-5);  // run-to-run noise at most; deferral moves these logits by ~10%
}
