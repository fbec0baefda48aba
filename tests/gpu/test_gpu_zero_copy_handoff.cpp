// The zero-copy hand-off (--gpu-handoff zero-copy, engine/runtime/
// zero_copy_handoff.h): its kernels against host references, and hybrid
// decode through it against the copy hand-off on the same loaded model. The
// zero-copy path moves the same fp32 values (hidden states, routing, expert
// sums) and keeps every sum's order, so the logits must be bit-identical;
// a CPU expert step that throws, or a release withheld until the host's
// time-out, must fail the step with an error (never hang) and leave the
// runtime able to run the same step again with the same logits. Skips
// without a GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/handoff.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("zero-copy hand-off kernels: mapped copies, flags and the abort value") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t nh = 41 * 2048 + 12, nk = 41 * 8;  // several rounds of the copy loops, and a partial one
  const auto hf = test::random_floats(nh, 11, 1.0f);
  const auto w = test::random_floats(nk, 12, 1.0f);
  std::vector<int32_t> ids(nk);
  for (int64_t i = 0; i < nk; ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % 128);
  auto hf_d = test::to_device(hf, s), w_d = test::to_device(w, s), ids_d = test::to_device(ids, s);
  gpu::MappedBuffer m(4096 + 4 * (2 * nh + 2 * nk));
  uint32_t* flags = m.host<uint32_t>();  // [0] ready, [16] done, [32] end
  uint64_t* ts = reinterpret_cast<uint64_t*>(m.host<uint32_t>() + 64);
  const size_t hf_off = 1024, ids_off = hf_off + nh, w_off = ids_off + nk, out_off = w_off + nk;
  gpu::handoff_down(hf_d.as<float>(), ids_d.as<int32_t>(), w_d.as<float>(), nh, nk, m.device<float>() + hf_off, m.device<int32_t>() + ids_off,
                    m.device<float>() + w_off, m.device<uint32_t>(), reinterpret_cast<uint64_t*>(m.device<uint32_t>() + 64), s);
  s.synchronize();
  CHECK(flags[0] == 1);
  CHECK(std::memcmp(m.host<float>() + hf_off, hf.data(), nh * 4) == 0);
  CHECK(std::memcmp(m.host<int32_t>() + ids_off, ids.data(), nk * 4) == 0);
  CHECK(std::memcmp(m.host<float>() + w_off, w.data(), nk * 4) == 0);
  CHECK(ts[0] > 0);
  CHECK(ts[1] >= ts[0]);

  // wait_add: the kernel spins until the host releases, then copies the sums; the abort value leaves d alone.
  const auto out = test::random_floats(nh, 13, 2.0f);
  const auto before = test::random_floats(nh, 14, 1.0f);
  for (const uint32_t value : {gpu::kHandoffRelease, gpu::kHandoffAbort}) {
    auto d = test::to_device(before, s);
    std::memcpy(m.host<float>() + out_off, out.data(), nh * 4);
    gpu::handoff_wait_add(m.device<uint32_t>() + 16, m.device<float>() + out_off, nh, d.as<float>(), nullptr, s);
    gpu::handoff_signal(m.device<uint32_t>() + 32, nullptr, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(s.query());  // still waiting for the release
    CHECK(flags[32] == 0);
    std::atomic_ref<uint32_t>(flags[16]).store(value, std::memory_order_release);
    s.synchronize();
    CHECK(flags[16] == 0);  // reset by the GPU
    CHECK(flags[32] == 1);
    flags[32] = 0;
    const auto got = test::to_host<float>(d, static_cast<size_t>(nh), s);
    CHECK(std::memcmp(got.data(), (value == gpu::kHandoffRelease ? out : before).data(), nh * 4) == 0);
  }
}

namespace {

// Per step, the logits of every row; B sequences of a fixed pseudo-random
// prompt each (one step per sequence), then `steps` decode steps of all B
// sequences at once, teacher-forced on fixed tokens, through `handoff`.
// `fault`, when given, runs for decode step `fault_step` only (the test
// hook); a step that throws is retried once without it.
struct Run {
  std::vector<std::vector<float>> logits;  // per step
  int64_t zero_copy_steps = 0, steps = 0;
  std::vector<std::string> errors;         // what the faulty step threw
  double fault_s = 0;                      // how long the faulty step took to fail
  size_t last_graphs = 0;
};

Run decode(Model& model, bool zero_copy, int64_t B, int64_t steps, double timeout_s = 10, std::function<bool(int64_t)> fault = nullptr,
           int64_t fault_step = -1) {
  GpuRuntime* g = model.gpu();
  REQUIRE(g != nullptr);
  g->set_zero_copy_handoff(zero_copy, timeout_s);
  g->reset_times();
  const int64_t V = model.config().vocab_size, prompt = 7;
  KvCache kv(model.kv_layout(), B * ((prompt + steps) / 16 + 2), 16);
  std::vector<int> seq(static_cast<size_t>(B));
  Run run;
  Batch b;
  std::vector<float> logits;
  auto token = [&](int64_t i, int64_t j) { return static_cast<int32_t>((i * 7919 + j * 104729 + 13) % std::min<int64_t>(V, 4000)); };
  for (int64_t i = 0; i < B; ++i) {
    seq[static_cast<size_t>(i)] = kv.add_sequence();
    kv.reserve(seq[static_cast<size_t>(i)], prompt + steps);
    b.clear();
    for (int64_t p = 0; p < prompt; ++p) b.add(token(i, p), seq[static_cast<size_t>(i)], p, p + 1 == prompt);
    model.forward(b, kv, logits);
    run.logits.push_back(logits);
  }
  for (int64_t t = 0; t < steps; ++t) {
    b.clear();
    for (int64_t i = 0; i < B; ++i) b.add(token(i, prompt + t), seq[static_cast<size_t>(i)], prompt + t, true);
    if (t == fault_step && fault) {
      g->set_handoff_test_hook(fault);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        model.forward(b, kv, logits);
      } catch (const Error& e) {
        run.errors.push_back(e.what());
      }
      run.fault_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      g->set_handoff_test_hook(nullptr);
      if (run.errors.empty()) {  // the hook did not fire: keep the step as it ran
        run.logits.push_back(logits);
        continue;
      }
    }
    model.forward(b, kv, logits);
    run.logits.push_back(logits);
  }
  run.zero_copy_steps = g->times().zero_copy_steps;
  run.steps = g->times().steps;
  run.last_graphs = g->last_step_graphs();
  return run;
}

double max_diff(const Run& a, const Run& b) {
  double m = 0;
  for (size_t i = 0; i < a.logits.size(); ++i)
    for (size_t j = 0; j < a.logits[i].size(); ++j) m = std::max(m, static_cast<double>(std::fabs(a.logits[i][j] - b.logits[i][j])));
  return m;
}

int64_t differing(const Run& a, const Run& b) {
  REQUIRE(a.logits.size() == b.logits.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    REQUIRE(a.logits[i].size() == b.logits[i].size());
    for (size_t j = 0; j < a.logits[i].size(); ++j) bad += std::memcmp(&a.logits[i][j], &b.logits[i][j], 4) != 0;
  }
  return bad;
}

std::unique_ptr<Model> load(const std::string& path, const std::string& resident) {
  REQUIRE_MESSAGE(std::filesystem::exists(path), path << " missing: run scripts/make-fixtures");
  std::vector<std::string> args = {"--device", "cuda", "--gpu-resident-moe-layers", resident, "--progress", "none", "--cuda-graphs", "1"};
  return Model::load(path, Settings::load(args));
}

// Copy, zero-copy, copy again on one loaded model, batch 1 and batch 3, 6 decode steps each.
void check_same_logits(const std::string& path, const std::string& resident) {
  auto model = load(path, resident);
  for (const int64_t B : {1, 3}) {
    const Run copy = decode(*model, false, B, 6);
    const Run zc = decode(*model, true, B, 6);
    const Run copy2 = decode(*model, false, B, 6);
    MESSAGE(path << " (" << resident << ") batch " << B << ": zero-copy steps " << zc.zero_copy_steps << " of " << zc.steps
                 << "; logits differing from the copy hand-off: " << differing(copy, zc) << " (copy run twice: " << differing(copy, copy2) << ")");
    CHECK(copy.zero_copy_steps == 0);
    CHECK(zc.zero_copy_steps == zc.steps);  // prompts of 7 tokens and the decode steps: every step is graph-sized
    CHECK(zc.last_graphs == 1);             // the whole step is one graph
    // The step's kernels and the CPU experts are deterministic, so the copy
    // hand-off repeats itself bit for bit; should the engine ever stop being
    // so, the zero-copy run may differ from it by no more than it differs
    // from itself.
    WARN(differing(copy, copy2) == 0);
    if (differing(copy, copy2) == 0) CHECK(differing(copy, zc) == 0);
    else CHECK(max_diff(copy, zc) <= 2 * max_diff(copy, copy2));
  }
}

}  // namespace

TEST_CASE("zero-copy hand-off: tiny-qwen3moe-Q8_0.gguf, every layer's experts on the CPU, logits bit-identical to the copy hand-off") {
  if (test::have_gpu()) check_same_logits(test::fixture_ref("tiny-qwen3moe-Q8_0.gguf"), "none");
}

TEST_CASE("zero-copy hand-off: tiny-qwen3moe safetensors, layers 0 and 3 on the CPU, logits bit-identical to the copy hand-off") {
  if (test::have_gpu()) check_same_logits(test::fixture_model("tiny-qwen3moe"), "1-2");
}

TEST_CASE("zero-copy hand-off: tiny-deepseekv3 (shared experts run on the GPU during the hand-off), logits bit-identical to the copy hand-off") {
  if (test::have_gpu()) check_same_logits(test::fixture_model("tiny-deepseekv3"), "2");
}

TEST_CASE("zero-copy hand-off: a failing CPU expert step and a withheld release fail the step cleanly; the retried step matches the copy hand-off") {
  if (!test::have_gpu()) return;
  auto model = load(test::fixture_ref("tiny-qwen3moe-Q8_0.gguf"), "none");
  const int64_t B = 2, steps = 5, at = 2;
  const Run copy = decode(*model, false, B, steps);
  // The CPU experts of layer 1 throw (as a failing expert engine would).
  auto throws = [](int64_t layer) -> bool {
    if (layer == 1) fail(ErrorKind::internal, "test: CPU experts of layer 1 failed");
    return true;
  };
  const Run failed = decode(*model, true, B, steps, 10, throws, at);
  REQUIRE(failed.errors.size() == 1);
  MESSAGE("throwing CPU experts: '" << failed.errors[0] << "' after " << failed.fault_s << " s");
  CHECK(failed.errors[0].find("layer 1 failed") != std::string::npos);
  CHECK(failed.zero_copy_steps > 0);
  CHECK(failed.fault_s < 5);
  CHECK(differing(copy, failed) == 0);  // the retried step and the ones after it
  // Layer 0's release withheld: the host's wait for layer 1 times out (0.3 s), names the layer, and releases the GPU.
  auto withholds = [](int64_t layer) { return layer != 0; };
  const Run timed_out = decode(*model, true, B, steps, 0.3, withholds, at);
  REQUIRE(timed_out.errors.size() == 1);
  MESSAGE("withheld release: '" << timed_out.errors[0] << "' after " << timed_out.fault_s << " s");
  CHECK(timed_out.errors[0].find("layer 1's hand-off") != std::string::npos);
  CHECK(timed_out.fault_s >= 0.3);
  CHECK(timed_out.fault_s < 5);
  CHECK(differing(copy, timed_out) == 0);
  // The last hand-off withheld: the wait for the end of the step times out.
  const int64_t last = model->config().num_hidden_layers - 1;
  auto withholds_last = [last](int64_t layer) { return layer != last; };
  const Run end_timed_out = decode(*model, true, B, steps, 0.3, withholds_last, at);
  REQUIRE(end_timed_out.errors.size() == 1);
  CHECK(end_timed_out.errors[0].find("the end of the step") != std::string::npos);
  CHECK(differing(copy, end_timed_out) == 0);
}
