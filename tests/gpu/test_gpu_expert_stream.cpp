// The prefetch-window scheduler (engine/layers/expert_stream.h): its two
// kernels against scalar references on random data, and the tiny-qwen3moe
// fixture with no resident MoE layers and a minimum batch of 1 (every pass
// streamed: prompts and single-token steps), under each window fill, expert
// product, pinning and window setting. Every prompt position and
// teacher-forced step whose reference top-1/top-2 margin exceeds 0.5 must
// agree with the reference's top-1, as the CPU-expert path does
// (test_gpu_fixture.cpp). Skips without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "gpu/moe_stream.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("moe_gather_rows and moe_combine_sorted match scalar references") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t n = 37, k = 3, H = 40, E = 6, P = n * k;
  const auto x = test::bf16_of(test::random_floats(static_cast<size_t>(n * H), 11));
  std::mt19937_64 rng(5);
  std::vector<int32_t> ids(static_cast<size_t>(P));
  for (auto& id : ids) id = static_cast<int32_t>(rng() % E);
  // pair_list: pairs grouped by expert, as moe_route orders them (any order within a group works).
  std::vector<int32_t> pl(static_cast<size_t>(P));
  std::iota(pl.begin(), pl.end(), 0);
  std::stable_sort(pl.begin(), pl.end(), [&](int32_t a, int32_t b) { return ids[static_cast<size_t>(a)] < ids[static_cast<size_t>(b)]; });
  const auto ys = test::random_floats(static_cast<size_t>(P * H), 12);
  const auto w = test::random_floats(static_cast<size_t>(P), 13);
  auto dx = test::to_device(x, s), dpl = test::to_device(pl, s), dys = test::to_device(ys, s), dw = test::to_device(w, s);
  gpu::DeviceBuffer xs(static_cast<size_t>(P * H) * 2), inv(static_cast<size_t>(P) * 4), out(static_cast<size_t>(n * H) * 4);
  gpu::moe_gather_rows(dx.as<uint16_t>(), H, k, dpl.as<int32_t>(), P, xs.as<uint16_t>(), s);
  gpu::moe_combine_sorted(dys.as<float>(), dpl.as<int32_t>(), dw.as<float>(), n, k, H, inv.as<int32_t>(), out.as<float>(), s);
  std::vector<uint16_t> hxs(static_cast<size_t>(P * H));
  std::vector<float> hout(static_cast<size_t>(n * H));
  gpu::copy_to_host(hxs.data(), xs.data(), hxs.size() * 2, s);
  gpu::copy_to_host(hout.data(), out.data(), hout.size() * 4, s);
  s.synchronize();
  int64_t bad = 0;
  for (int64_t i = 0; i < P; ++i)
    for (int64_t h = 0; h < H; ++h) bad += hxs[static_cast<size_t>(i * H + h)] != x[static_cast<size_t>(pl[static_cast<size_t>(i)] / k * H + h)];
  CHECK(bad == 0);
  std::vector<int32_t> pos(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) pos[static_cast<size_t>(pl[static_cast<size_t>(i)])] = static_cast<int32_t>(i);
  double worst = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double r = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = t * k + j;
        r += static_cast<double>(w[static_cast<size_t>(p)]) * ys[static_cast<size_t>(pos[static_cast<size_t>(p)] * H + h)];
      }
      worst = std::max(worst, std::fabs(r - hout[static_cast<size_t>(t * H + h)]));
    }
  MESSAGE("combine: max |gpu - ref| " << worst);
  CHECK(worst < 1e-4);
}

namespace {

struct Variant {
  const char* name;
  ExpertStreamOptions o;
};

}  // namespace

TEST_CASE("tiny-qwen3moe with every MoE layer streamed agrees with the reference top-1") {
  if (!test::have_gpu()) return;
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3moe/hf_reference.json")));
  std::vector<std::string> args = {"--device",   "cuda", "--gpu-resident-moe-layers", "none", "--progress", "none", "--gpu-prefill-min-batch-size",
                                   "1", "--gpu-prefetch-window", "2"};
  Settings st = Settings::load(args);
  auto model = Model::load(dir, st);
  GpuRuntime* stack = model->gpu();
  REQUIRE(stack != nullptr);
  REQUIRE_MESSAGE(stack->expert_stream() != nullptr, "the settings did not enable streaming");
  CHECK(stack->expert_stream()->options().min_batch == 1);
  CHECK(stack->expert_stream()->options().window == 2);
  const ModelConfig& c = model->config();
  const int64_t V = c.vocab_size;
  const uint64_t expert_bytes = static_cast<uint64_t>(3 * c.hidden_size * c.moe_intermediate_size) * 2;

  using O = ExpertStreamOptions;
  auto opt = [](O::Fill f, O::Compute k, O::Source src, int window, bool serial) {
    O o;
    o.min_batch = 1;
    o.window = window;
    o.fill = f;
    o.compute = k;
    o.source = src;
    o.serial = serial;
    o.quiet = true;
    return o;
  };
  const std::vector<Variant> variants = {
      {"settings (auto fill/compute, window 2)", stack->expert_stream()->options()},
      {"fill all, gemm, pinned in place, window 1", opt(O::Fill::all, O::Compute::gemm, O::Source::in_place, 1, false)},
      {"fill all, kernel, pinned copy, window 3", opt(O::Fill::all, O::Compute::kernel, O::Source::copy, 3, false)},
      {"fill routed, gemm, window 1", opt(O::Fill::routed, O::Compute::gemm, O::Source::automatic, 1, false)},
      {"fill routed, kernel, window 2", opt(O::Fill::routed, O::Compute::kernel, O::Source::automatic, 2, false)},
      {"serial upload, gemm", opt(O::Fill::all, O::Compute::gemm, O::Source::automatic, 1, true)},
      {"CPU experts (streaming off)", opt(O::Fill::all, O::Compute::gemm, O::Source::automatic, 1, false)},
  };
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    ExpertStreamOptions o = v.o;
    const bool off = vi + 1 == variants.size();
    if (off) o.min_batch = 0;
    if (vi > 0) stack->enable_expert_streaming(o);
    CHECK((stack->expert_stream() == nullptr) == off);
    int64_t checked = 0, agree = 0, passes = 0;
    for (size_t ci = 0; ci < ref["chats"].size(); ++ci) {
      const auto& chat = ref["chats"][ci];
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
      ++passes;
      auto check_row = [&](const float* row, const nlohmann::json& top_ids, const nlohmann::json& top_logits, const std::string& where) {
        const double margin = top_logits[0].get<double>() - top_logits[1].get<double>();
        if (margin <= 0.5) return;
        ++checked;
        const int32_t mine = argmax(row, V);
        if (mine == top_ids[0].get<int32_t>()) ++agree;
        CHECK_MESSAGE(mine == top_ids[0].get<int32_t>(), v.name << ": " << where << " margin " << margin);
      };
      for (size_t p = 0; p < ids.size(); ++p)
        check_row(logits.data() + p * V, chat["top10_ids"][p], chat["top10_logits"][p], "chat " + std::to_string(ci) + " prompt " + std::to_string(p));
      std::vector<float> last(logits.end() - V, logits.end());
      int64_t pos = static_cast<int64_t>(ids.size());
      for (size_t step = 0; step < greedy.size(); ++step) {
        check_row(last.data(), chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step],
                  "chat " + std::to_string(ci) + " step " + std::to_string(step));
        if (step + 1 == greedy.size()) break;
        b.clear();
        b.add(greedy[step], seq, pos++, true);
        model->forward(b, kv, last);
        ++passes;
      }
    }
    MESSAGE(std::string(v.name) << ": " << agree << "/" << checked << " rows with margin > 0.5 agree");
    CHECK(checked > 20);
    if (off) continue;
    const ExpertStreamStats& ss = stack->expert_stream()->stats();
    const int64_t moe_layers = c.num_hidden_layers;  // every layer of the fixture is MoE, none resident
    CHECK(ss.passes == passes);
    REQUIRE(static_cast<int64_t>(ss.layers.size()) == moe_layers);
    const uint64_t all = static_cast<uint64_t>(passes) * static_cast<uint64_t>(moe_layers) * static_cast<uint64_t>(c.num_experts) * expert_bytes;
    if (v.o.fill == O::Fill::routed) {
      // One-token passes route to k experts: a routed fill copies fewer bytes than all experts.
      CHECK(ss.bytes < all);
      CHECK(ss.bytes >= static_cast<uint64_t>(passes) * static_cast<uint64_t>(moe_layers * c.num_experts_per_tok) * expert_bytes);
    } else if (v.o.fill == O::Fill::all) {
      CHECK(ss.bytes == all);
    }
    CHECK(ss.copy_s > 0);
    CHECK(ss.compute_s > 0);
    MESSAGE(std::string(v.name) << ": " << ss.passes << " passes, " << ss.bytes << " bytes, copy " << ss.copy_s * 1e3 << " ms, stall " << ss.stall_s * 1e3
                   << " ms, hidden " << ss.hidden_fraction() << ", achieved " << ss.achieved_bandwidth() / 1e9 << " GB/s of pinned "
                   << ss.pinned_bandwidth / 1e9);
  }
}
