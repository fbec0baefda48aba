// GGUF files made by the tests' own writer and quantizers: a small random
// qwen3moe in every supported block type against its F32 twin (same graph,
// dequantized weights), then broken files (truncated, wrong magic/version,
// offsets past the end, misaligned data, unknown or unsupported types,
// inconsistent shapes, missing tensors) and a bounded fuzz over mutated
// headers: clear hmoe::Error every time, never a crash.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "engine/serving/logits.h"
#include "io/gguf.h"
#include "numa/quant_gguf.h"
#include "tests/model_run.h"
#include "tests/quant_tools/gguf_models.h"
#include "tests/quant_tools/gguf_writer.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;
using cpu::ExtType;

namespace {

using qtools::Built;
using qtools::build_model;
using qtools::kHeadDim;
using qtools::kHeads;
using qtools::kHidden;
using qtools::kKv;

// gguf_int8 false: the exact fp32 dequantize path (what the twin computes).
std::unique_ptr<Model> load_quiet(const std::string& path, bool gguf_int8 = false) {
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.threads = 1;
  s.cpu_gguf_int8 = gguf_int8;
  return Model::load(path, s);
}

std::vector<float> run(Model& m) { return test::prompt_logits(m, {3, 17, 200, 45, 99, 128, 7, 255}); }

std::string write(const test::TempDir& d, const std::string& name, const std::string& bytes) {
  const std::string p = d.str() + "/" + name;
  test::write_file(p, bytes);
  return p;
}

}  // namespace

TEST_CASE("GGUF block types: a qwen3moe in each type matches its F32 twin") {
  test::TempDir dir("gguf-types");
  // The unquantized model: each type must differ from it (the quantized
  // weights are really used) while matching its own dequantized twin.
  const auto base = run(*load_quiet(write(dir, "base.gguf", build_model(0).quant.bytes())));
  for (uint32_t type : {2u, 3u, 6u, 7u, 8u, 12u, 13u, 14u}) {
    Built b = build_model(type);
    auto mq = load_quiet(write(dir, "q.gguf", b.quant.bytes()));
    auto mf = load_quiet(write(dir, "f.gguf", b.twin.bytes()));
    const auto lq = run(*mq), lf = run(*mf);
    // The 8-bit-activation path (the default): within its activation rounding.
    auto m8 = load_quiet(write(dir, "q8.gguf", b.quant.bytes()), true);
    const auto l8 = run(*m8);
    REQUIRE(l8.size() == lf.size());
    double worst8 = 0;
    for (size_t i = 0; i < l8.size(); ++i) worst8 = std::max(worst8, static_cast<double>(std::fabs(l8[i] - lf[i])));
    REQUIRE(lq.size() == lf.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < lq.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(lq[i] - lf[i]))), scale = std::max(scale, static_cast<double>(std::fabs(lf[i])));
    double from_base = 0;
    for (size_t i = 0; i < lq.size(); ++i) from_base = std::max(from_base, static_cast<double>(std::fabs(lq[i] - base[i])));
    INFO(std::string(cpu::ext_type_info(type)->name) << ": max diff to the twin " << worst << ", to the unquantized model " << from_base
                                                     << ", max |logit| " << scale);
    CHECK(worst < 1e-4 * std::max(1.0, scale));
    INFO("8-bit activations: max diff to the twin " << worst8);
    CHECK(worst8 < 0.03 * std::max(1.0, scale));
    CHECK(from_base > 1e-4);
    CHECK(scale > 0.1);
  }
}

TEST_CASE("GGUF block types on the 8-bit path: a prompt in one step gives each token the bits it gets one step at a time") {
  // Batch invariance through the whole model: the 24-token step runs the
  // prompt-sized kernels (tiles for Q4_K/Q5_K/Q6_K/Q8_0), the one-token
  // steps the decode kernels; a token's logits must not tell them apart.
  test::TempDir dir("gguf-invariance");
  const std::vector<int32_t> ids = {3, 17, 200, 45, 99, 128, 7, 255, 31, 64, 12, 90, 150, 201, 5, 77, 42, 180, 9, 66, 130, 240, 18, 111};
  for (uint32_t type : {2u, 8u, 12u, 13u, 14u}) {
    Built b = build_model(type);
    auto m = load_quiet(write(dir, "q.gguf", b.quant.bytes()), true);
    const auto all = test::prompt_logits(*m, ids);
    const int64_t V = m->config().vocab_size;
    REQUIRE(all.size() == ids.size() * static_cast<size_t>(V));
    KvCache kv(m->kv_layout(), static_cast<int64_t>(ids.size()) / 16 + 2, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, static_cast<int64_t>(ids.size()));
    int64_t differ = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      Batch one;
      one.add(ids[i], seq, static_cast<int64_t>(i), true);
      std::vector<float> lg;
      m->forward(one, kv, lg);
      REQUIRE(lg.size() == static_cast<size_t>(V));
      differ += std::memcmp(lg.data(), all.data() + static_cast<int64_t>(i) * V, static_cast<size_t>(V) * sizeof(float)) != 0;
    }
    INFO(std::string(cpu::ext_type_info(type)->name) << ": " << differ << " of " << ids.size() << " tokens differ");
    CHECK(differ == 0);
  }
}

TEST_CASE("broken GGUF files are clear errors") {
  test::TempDir dir("gguf-bad");
  auto expect = [&](const std::string& label, const std::string& bytes, const char* needle) {
    INFO(label);
    CHECK_THROWS_WITH_AS(load_quiet(write(dir, label + ".gguf", bytes)), doctest::Contains(needle), Error);
  };
  const std::string good = build_model(8).quant.bytes();
  REQUIRE_NOTHROW(load_quiet(write(dir, "good.gguf", good)));
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, size_t{100}, good.size() / 3, good.size() - 1}) expect("truncated-" + std::to_string(cut), good.substr(0, cut), "GGUF");
  std::string bad = good;
  bad[0] = 'X';
  expect("magic", bad, "GGUF");
  {
    Built b = build_model(8);
    b.quant.version = 99;
    expect("version", b.quant.bytes(), "version");
  }
  {
    Built b = build_model(8);
    b.quant.tensors()[3].offset_override = 1ll << 40;
    expect("offset-past-end", b.quant.bytes(), "GGUF");
  }
  {
    Built b = build_model(8);
    b.quant.tensors()[3].offset_override = 4;
    expect("misaligned", b.quant.bytes(), "aligned");
  }
  {
    Built b = build_model(8);
    b.quant.tensors()[3].type = 77;
    expect("unknown-type", b.quant.bytes(), "GGUF");
  }
  {
    Built b = build_model(8);
    for (auto& t : b.quant.tensors())
      if (t.name == "blk.0.attn_q.weight") t.type = 34, t.bytes.assign(54 * (kHidden / 256) * kHeads * kHeadDim, 1);  // TQ1_0
    expect("unsupported-type", b.quant.bytes(), "tq1_0");
  }
  {
    Built b = build_model(0);
    for (auto& t : b.quant.tensors())
      if (t.name == "blk.1.attn_k.weight") t.shape = {kHidden, kKv * kHeadDim / 2}, t.bytes.resize(t.bytes.size() / 2);
    expect("inconsistent-shape", b.quant.bytes(), "blk.1.attn_k.weight");
  }
  {
    Built b = build_model(0);
    std::erase_if(b.quant.tensors(), [](const qtools::GgufTensorOut& t) { return t.name == "blk.1.ffn_up_exps.weight"; });
    expect("missing-tensor", b.quant.bytes(), "blk.1.ffn_up_exps.weight' is missing");
  }
  {
    Built b = build_model(0);
    b.quant.add({"blk.9.extra.weight", 0, {4}, std::vector<uint8_t>(16, 0)});
    expect("unexpected-tensor", b.quant.bytes(), "unexpected tensor 'blk.9.extra.weight'");
  }
  {
    qtools::GgufWriter w;
    w.kv_str("general.architecture", "llama");
    expect("arch", w.bytes(), "llama");
  }
}

TEST_CASE("fuzz: mutated GGUF headers end in hmoe::Error or a valid model, never a crash") {
  test::TempDir dir("gguf-fuzz");
  const std::string good = build_model(2).quant.bytes();
  auto f = io::GgufFile::open(write(dir, "base.gguf", good));
  const size_t header = static_cast<size_t>(f->data_offset());
  f.reset();
  std::mt19937 rng(20261203);
  int errors = 0, loaded = 0;
  for (int it = 0; it < 300; ++it) {
    std::string m = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % header;
      switch (rng() % 3) {
        case 0: m[pos] = static_cast<char>(rng() & 255); break;
        case 1: m[pos] = static_cast<char>(m[pos] ^ (1 << (rng() % 8))); break;
        default: m[pos] = static_cast<char>(0xFF); break;
      }
    }
    if (rng() % 8 == 0) m.resize(rng() % m.size());
    const std::string path = write(dir, "fuzz.gguf", m);
    try {
      auto model = load_quiet(path);
      ++loaded;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& ex) {
      FAIL("iteration " << it << ": non-hmoe exception " << ex.what());
    }
  }
  MESSAGE("fuzz: " << errors << " clear errors, " << loaded << " loads of harmless mutations");
  CHECK(errors > 100);
}
