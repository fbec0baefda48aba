// Low-bit GGUF experts (Q2_K, Q3_K, IQ1-IQ4, MXFP4; the "dynamic" quants'
// routed experts) that live on the host and reach the GPU only as streamed
// or cached copies, as stored (engine/layers/expert_stream_layout.h: the
// native slot layout; engine/layers/gpu_expert_cache.h: slot pools per type):
//  - prefill streaming (--gpu-resident-moe-layers none, every pass streams):
//    the slots hold the file's blocks and run the same gpu::gguf_* kernels
//    as resident experts, so the logits equal the resident ones for a short
//    prompt (decode-style kernels) and a 100-token one (the grouped
//    tensor-core product), per type and for a mixed file (IQ1_S experts with
//    IQ2_XXS down matrices); the slot bytes are the stored ones, far below
//    bf16's;
//  - split decode and the expert cache (every miss copied): the GPU share
//    runs on slot copies of the stored blocks; against the CPU experts
//    (teacher-forced on their greedy ids) the logits stay within the GPU
//    share's activation rounding and the top-1 agrees where the CPU's
//    margin > 0.5.
// The models are tests/quant_tools/lowbit_blocks.h's deepseek2 files (the
// tiny-deepseekv3-256 shapes: 2 MoE layers of 4 experts of 256 x 256,
// top-2 of 2 groups). Skips without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/loading/model.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "io/tensor/quant_blocks_lowbit.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/model_run.h"
#include "tests/quant_tools/lowbit_blocks.h"
#include "tests/test_util.h"

using namespace hmoe;
using cpu::ExtType;

namespace {

std::string name(ExtType t) { return cpu::lowbit_type_info(static_cast<uint32_t>(t))->name; }

std::unique_ptr<Model> load(const std::string& path, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--device", "cuda", "--progress", "none"};
  args.insert(args.end(), extra.begin(), extra.end());
  return Model::load(path, Settings::load(args));
}

struct File {
  std::string label, format;
  ExtType type, down;
};

std::vector<File> files() {
  std::vector<File> f;
  for (ExtType t : cpu::lowbit::kAll) f.push_back({name(t), name(t), t, static_cast<ExtType>(0)});
  f.push_back({"MIXED (IQ1_S experts, IQ2_XXS down)", "IQ1_S / IQ2_XXS", cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs});
  f.push_back({"MIXED (IQ2_XXS experts, Q2_K down)", "IQ2_XXS / Q2_K", cpu::lowbit::iq2_xxs, cpu::lowbit::q2_k});
  return f;
}

double rows_rel(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (size_t r = 0; r < a.size() && r < b.size(); ++r)
    for (size_t i = 0; i < a[r].size(); ++i) {
      const double d = a[r][i] - b[r][i];
      num += d * d;
      den += static_cast<double>(b[r][i]) * b[r][i];
    }
  return std::sqrt(num / den);
}

// A prompt in one step, then the given ids one decode step each (or, with
// `greedy` > 0, that many steps of the model's own argmax, appended to
// *then); the logits of every row.
std::vector<std::vector<float>> run_rows(Model& m, const std::vector<int32_t>& prompt, std::vector<int32_t>& then, int greedy = 0) {
  const int64_t V = m.config().vocab_size;
  const int64_t total = static_cast<int64_t>(prompt.size() + then.size()) + greedy;
  KvCache kv(m.kv_layout(), total / 16 + 2, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, total);
  Batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < prompt.size(); ++i) rows.emplace_back(logits.begin() + static_cast<int64_t>(i) * V, logits.begin() + static_cast<int64_t>(i + 1) * V);
  int64_t pos = static_cast<int64_t>(prompt.size());
  for (size_t i = 0; i < then.size() || greedy > 0; ++i) {
    if (i == then.size()) {  // greedy: the next id is the last row's argmax
      then.push_back(argmax(rows.back().data(), V));
      --greedy;
    }
    b.clear();
    b.add(then[i], seq, pos++, true);
    m.forward(b, kv, logits);
    rows.emplace_back(logits.begin(), logits.begin() + V);
  }
  return rows;
}

}  // namespace

TEST_CASE("gpu gguf low-bit: streamed experts (prefill window) are the file's blocks and give the resident experts' logits") {
  if (!test::have_gpu()) return;
  test::TempDir dir("gpu-gguf-lowbit-stream");
  for (const File& f : files()) {
    INFO(f.label);
    const std::string path = dir.str() + "/m.gguf";
    test::write_file(path, qtools::deepseek2_lowbit_gguf(f.type, f.down, 5 + static_cast<uint64_t>(f.type)).bytes());
    const std::vector<std::string> common = {"--gpu-prefetch-window", "2", "--gpu-expert-cache", "0"};
    std::vector<std::string> res = common, str = common;
    res.insert(res.end(), {"--gpu-resident-moe-layers", "all"});
    str.insert(str.end(), {"--gpu-resident-moe-layers", "none", "--gpu-prefill-min-batch-size", "1"});
    auto resident = load(path, res), streamed = load(path, str);
    REQUIRE(streamed->gpu()->expert_stream() != nullptr);
    const ExpertStream& xs = *streamed->gpu()->expert_stream();
    CHECK(xs.quantized());
    CHECK(xs.format() == f.format);
    for (int64_t len : {11, 100}) {  // decode-style kernels; the grouped tensor-core product
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < len; ++i) ids.push_back(static_cast<int32_t>((i * 131 + 7) % 512));
      const auto lr = test::prompt_logits(*resident, ids), ls = test::prompt_logits(*streamed, ids);
      const double rel = test::rel_error(ls, lr);
      MESSAGE(f.label << ", " << len << " tokens: streamed (" << xs.format() << ", host image " << xs.pinned_copy_bytes()
                      << " bytes) vs resident rel. error " << rel);
      CHECK(rel < 1e-4);
    }
    const ExpertStreamStats& st = xs.stats();
    CHECK(st.passes == 2);
    // Bytes moved: at most every layer's stored experts per pass (2 MoE layers of 4 x 3 x 256 x 256 weights), under bf16's.
    const uint64_t weights = 2ull * 4 * 3 * 256 * 256;
    const auto* gi = cpu::lowbit_type_info(static_cast<uint32_t>(f.type));
    const auto* di = cpu::lowbit_type_info(static_cast<uint32_t>(f.down != static_cast<ExtType>(0) ? f.down : f.type));
    const double stored = weights / 3.0 * (2.0 * gi->block_bytes / gi->block_elems + 1.0 * di->block_bytes / di->block_elems);
    MESSAGE(f.label << ": " << st.bytes << " bytes streamed in " << st.passes << " passes; stored experts " << stored << " bytes");
    CHECK(st.bytes > 0);
    CHECK(static_cast<double>(st.bytes) <= 2 * stored + 4096);
    CHECK(static_cast<double>(st.bytes) < 0.3 * 2 * 2.0 * static_cast<double>(weights));  // bf16 slots: 2 bytes a weight, 2 passes
  }
}

// The expert cache's first GPU run hung under in-place pinning; it passes
// under the copy residence (tests/gpu/test_gpu_expert_cache.cpp says more).
TEST_CASE("gpu gguf low-bit: split decode and the expert cache copy the stored blocks and agree with the CPU experts") {
  if (!test::have_gpu()) return;
  test::TempDir dir("gpu-gguf-lowbit-cache");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 9; ++i) prompt.push_back((i * 53 + 7) % 512);
  for (const File& f : files()) {
    INFO(f.label);
    const std::string path = dir.str() + "/m.gguf";
    test::write_file(path, qtools::deepseek2_lowbit_gguf(f.type, f.down, 5 + static_cast<uint64_t>(f.type)).bytes());
    const std::vector<std::string> host = {"--gpu-resident-moe-layers", "none", "--gpu-prefill-min-batch-size", "0"};
    std::vector<std::string> a = host, b = host;
    a.insert(a.end(), {"--gpu-expert-cache", "0"});
    b.insert(b.end(), {"--gpu-expert-cache", "auto", "--gpu-split-decode", "1"});
    auto off = load(path, a), on = load(path, b);
    CHECK(off->gpu()->expert_cache() == nullptr);
    REQUIRE(on->gpu()->expert_cache() != nullptr);
    const int64_t V = off->config().vocab_size;
    // 15 greedy steps of the CPU experts, then the cache/split run teacher-forced on their ids.
    std::vector<int32_t> ids;
    const auto base = run_rows(*off, prompt, ids, 15);
    REQUIRE(ids.size() == 15);
    const auto got = run_rows(*on, prompt, ids);
    int checked = 0, agreed = 0;
    for (size_t p = 0; p < base.size(); ++p) {
      std::vector<int32_t> top;
      std::vector<float> tv;
      top_k(base[p].data(), V, 2, top, tv);
      if (tv[0] - tv[1] <= 0.5f) continue;
      ++checked;
      agreed += argmax(got[p].data(), V) == top[0];
    }
    const double rel = rows_rel(got, base);
    const GpuExpertCacheStats& st = on->gpu()->expert_cache()->stats();
    MESSAGE(f.label << ": " << on->gpu()->expert_cache()->describe() << "; rel. logit error vs CPU experts " << rel << "; top-1 " << agreed << "/"
                    << checked << "; GPU pairs " << st.c.gpu_pairs << ", CPU pairs " << st.c.cpu_pairs << ", hits " << st.c.hits << ", bytes "
                    << st.c.bytes);
    CHECK(st.c.gpu_pairs > 0);
    CHECK(st.c.hits > 0);  // 2 layers x 4 experts fit the auto-sized cache
    CHECK(st.c.bytes > 0);
    CHECK(checked >= 10);
    CHECK(agreed * 100 >= checked * 90);  // group-routing near-ties may flip a position
    CHECK(rel < 0.05);
  }
}
