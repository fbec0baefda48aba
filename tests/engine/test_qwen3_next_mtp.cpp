// Qwen3-Next's multi-token-prediction head (mtp.*, run with
// --speculative-tokens) on the tiny-qwen3next fixture, fp32 CPU, against
// the numpy port (tests/fixtures/gen/np_qwen3_next_mtp.py,
// tiny-qwen3next/np_mtp_reference.json): the head's logits at every
// position of a prompt (top-10 and log-sum-exp within 1e-3), as one pass
// over the main model's hidden states and as a pass split in two (its KV
// layer carries the first part); from the safetensors checkpoint and from
// the F32 GGUF file, whose block num_hidden_layers holds the head (nextn.*).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "io/mmap_file.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::unique_ptr<Model> load_fixture(int64_t spec, const std::string& name = "tiny-qwen3next") {
  const std::string dir = test::fixture_model(name);
  REQUIRE_MESSAGE(io::file_exists(test::fixture_model("tiny-qwen3next/model-00001-of-00004.safetensors")), "run scripts/make-fixtures " << HMOE_BINARY_DIR);
  Settings s = Settings::defaults();
  s.progress = "none";
  s.device = "cpu";
  s.speculative_tokens = spec;
  s.kv_cache_dtype = "fp32";  // GGUF files default to bf16
  return Model::load(dir, s);
}

// The head's logits over positions 0..T-2 of ids, in passes of the given sizes.
std::vector<float> head_logits(Model& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& passes) {
  const int64_t T = static_cast<int64_t>(ids.size()), H = m.config().hidden_size;
  KvCache kv(m.kv_layout(), T / 16 + 2, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, T);
  Batch b;
  for (int64_t i = 0; i < T; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, i + 1 == T);
  std::vector<float> logits, out, all;
  m.forward(b, kv, logits);
  const std::vector<float> hid = m.hidden();
  REQUIRE(hid.size() == static_cast<size_t>(T * H));
  int64_t p = 0;
  for (size_t k = 0; p < T - 1; ++k) {
    const int64_t n = k < passes.size() ? std::min(passes[k], T - 1 - p) : T - 1 - p;
    Batch mb;
    for (int64_t i = p; i < p + n; ++i) mb.add(ids[static_cast<size_t>(i + 1)], seq, i, true);
    m.forward_mtp(mb, hid.data() + p * H, kv, logits, out);
    REQUIRE(out.size() == static_cast<size_t>(n * H));
    all.insert(all.end(), logits.begin(), logits.end());
    p += n;
  }
  return all;
}

}  // namespace

TEST_CASE("qwen3_next MTP head matches the numpy reference at every position (safetensors, and the GGUF file's nextn block)") {
  for (const std::string file : {"tiny-qwen3next", "tiny-qwen3next-F32.gguf"}) {
  CAPTURE(file);
  auto m = load_fixture(1, file);
  const int64_t V = m->config().vocab_size;
  std::ifstream f(test::fixture_ref("tiny-qwen3next/np_mtp_reference.json"));
  REQUIRE(f.good());
  const auto ref = nlohmann::json::parse(f);
  double worst = 0;
  for (const auto& pr : ref["prompts"]) {
    const auto ids = pr["ids"].get<std::vector<int32_t>>();
    const int64_t T = static_cast<int64_t>(ids.size());
    for (const auto& passes : std::vector<std::vector<int64_t>>{{T}, {T / 2}}) {
      const auto lg = head_logits(*m, ids, passes);
      REQUIRE(lg.size() == static_cast<size_t>((T - 1) * V));
      for (int64_t p = 0; p + 1 < T; ++p) {
        const float* row = lg.data() + p * V;
        const auto top = pr["top10_ids"][static_cast<size_t>(p)].get<std::vector<int32_t>>();
        const auto val = pr["top10_logits"][static_cast<size_t>(p)].get<std::vector<double>>();
        for (size_t k = 0; k < top.size(); ++k) worst = std::max(worst, std::fabs(static_cast<double>(row[top[k]]) - val[k]));
        double mx = row[0], s = 0;
        for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(row[v]) - mx);
        worst = std::max(worst, std::fabs(mx + std::log(s) - pr["logsumexp"][static_cast<size_t>(p)].get<double>()));
        CHECK(std::max_element(row, row + V) - row == top[0]);
      }
    }
  }
  MESSAGE(file << ": MTP head vs numpy: max |logit diff| " << worst);
  CHECK(worst <= 1e-3);
  }
}

TEST_CASE("qwen3_next MTP head: off without --speculative-tokens; the checkpoint's mtp.* weights still load") {
  auto m = load_fixture(0);
  CHECK(m->speculative_tokens() == 0);
  CHECK(m->kv_layout().layers == 2);
  CHECK_THROWS_AS(m->hidden(), Error);
}

TEST_CASE("qwen3_next MTP head: a checkpoint whose head lacks a tensor is a clear error with --speculative-tokens, and loads without") {
  const std::string src = test::fixture_model("tiny-qwen3next");
  REQUIRE(io::file_exists(src + "/model-00001-of-00004.safetensors"));
  test::TempDir dir("qwen3next-mtp-bad");
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().filename() != "model.safetensors.index.json") std::filesystem::create_symlink(e.path(), dir.path / e.path().filename());
  auto idx = nlohmann::json::parse(test::read_file(src + "/model.safetensors.index.json"));
  REQUIRE(idx["weight_map"].erase("mtp.layers.0.self_attn.k_proj.weight") == 1);
  test::write_file(dir.str() + "/model.safetensors.index.json", idx.dump());
  Settings s = Settings::defaults();
  s.progress = "none";
  s.device = "cpu";
  s.speculative_tokens = 2;
  try {
    Model::load(dir.str(), s);
    FAIL("loaded a head without its k_proj");
  } catch (const Error& e) {
    MESSAGE(std::string(e.what()));
    CHECK(e.kind() == ErrorKind::bad_model);
    CHECK(std::string(e.what()).find("mtp.layers.0.self_attn.k_proj.weight") != std::string::npos);
  }
  s.speculative_tokens = 0;  // the head is not run: its tensors are skipped, whole or not
  CHECK(Model::load(dir.str(), s)->speculative_tokens() == 0);
}
