// MODEL as a `qwen3next` GGUF file (engine/loading/gguf_qwen3next.h): the
// tiny Qwen3-Next fixture written by tests/fixtures/gen/gguf_qwen3next.py in
// llama.cpp's layout (norms stored as 1 + w, ssm_a = -exp(A_log),
// in_proj_qkvz split into attn_qkv / attn_gate, the MTP head as an extra
// block), in F32 and Q8_0, against the safetensors checkpoint run by the same
// engine: the config, the logits, and the errors for metadata and tensors
// that do not fit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/loading/gguf_model.h"
#include "engine/loading/gguf_qwen3next.h"
#include "engine/loading/model.h"
#include "engine/serving/logits.h"
#include "engine/layers/weights.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "numa/kernels.h"
#include "tests/model_run.h"
#include "tests/test_util.h"

using namespace hmoe;
namespace fs = std::filesystem;

namespace {

// gguf_int8 false: GGUF blocks multiply fp32 activations (no 8-bit activation rounding).
std::unique_ptr<Model> load_cpu(const std::string& path, bool gguf_int8 = true) {
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";
  s.cpu_gguf_int8 = gguf_int8;
  s.kv_cache_dtype = "fp32";  // GGUF files default to a bf16 cache
  return Model::load(path, s);
}

std::string fixture_gguf(const char* type) {
  const std::string p = test::fixture_ref(std::string("tiny-qwen3next-") + type + ".gguf");
  REQUIRE_MESSAGE(fs::exists(p), p << " missing: run scripts/make-fixtures");
  return p;
}

std::vector<std::vector<int32_t>> prompts() {
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3next/hf_reference.json")));
  std::vector<std::vector<int32_t>> out;
  for (const auto& c : ref["chats"]) out.push_back(c["ids"].get<std::vector<int32_t>>());
  return out;
}

struct Cmp {
  double max_diff = 0, rel = 0;
  int checked = 0, agreed = 0;
};

// a's logits against b's over the reference prompts: max |diff|, relative
// L2, top-1 agreement where b's top-1/top-2 margin > 0.5.
Cmp compare(Model& a, Model& b) {
  Cmp r;
  const int64_t V = b.config().vocab_size;
  for (const auto& ids : prompts()) {
    const auto la = test::prompt_logits(a, ids), lb = test::prompt_logits(b, ids);
    REQUIRE(la.size() == lb.size());
    r.rel = std::max(r.rel, test::rel_error(la, lb));
    for (size_t i = 0; i < la.size(); ++i) r.max_diff = std::max(r.max_diff, static_cast<double>(std::fabs(la[i] - lb[i])));
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* row = lb.data() + p * V;
      const int32_t top = argmax(row, V);
      float second = -1e30f;
      for (int64_t v = 0; v < V; ++v)
        if (v != top) second = std::max(second, row[v]);
      if (row[top] - second <= 0.5f) continue;
      ++r.checked;
      r.agreed += argmax(la.data() + p * V, V) == top;
    }
  }
  return r;
}

// File bytes with a patch applied, written to a temporary .gguf.
struct TempGguf {
  std::string path;
  TempGguf(const std::string& bytes, const std::string& tag) {
    path = (fs::temp_directory_path() / ("hmoe-q3n-" + tag + "-" + std::to_string(::getpid()) + ".gguf")).string();
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ~TempGguf() { fs::remove(path); }
};

// Replaces the first length-prefixed string `from` by `to` (same length).
std::string renamed(std::string bytes, const std::string& from, const std::string& to) {
  REQUIRE(from.size() == to.size());
  std::string needle(8, '\0');
  const uint64_t n = from.size();
  std::memcpy(needle.data(), &n, 8);
  const size_t at = bytes.find(needle + from);
  REQUIRE(at != std::string::npos);
  bytes.replace(at + 8, to.size(), to);
  return bytes;
}

std::string error_of(const std::string& path) {
  try {
    load_cpu(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("qwen3next GGUF metadata gives the ModelConfig of config.json") {
  const ModelConfig h = ModelConfig::from_dir(test::fixture_ref("tiny-qwen3next"));
  for (const char* type : {"F32", "Q8_0"}) {
    INFO(type);
    const ModelConfig g = gguf_model_config(*io::GgufFile::open(fixture_gguf(type)));
    CHECK(g.arch == Arch::qwen3_next);
    CHECK(g.vocab_size == h.vocab_size);
    CHECK(g.hidden_size == h.hidden_size);
    CHECK(g.intermediate_size == h.intermediate_size);
    CHECK(g.moe_intermediate_size == h.moe_intermediate_size);
    CHECK(g.num_hidden_layers == h.num_hidden_layers);  // the MTP block is not one of them
    CHECK(g.num_attention_heads == h.num_attention_heads);
    CHECK(g.num_key_value_heads == h.num_key_value_heads);
    CHECK(g.head_dim == h.head_dim);
    CHECK(g.num_experts == h.num_experts);
    CHECK(g.num_experts_per_tok == h.num_experts_per_tok);
    CHECK(g.norm_topk_prob == h.norm_topk_prob);
    CHECK(g.mlp_only_layers == h.mlp_only_layers);
    CHECK(g.rms_norm_eps == doctest::Approx(h.rms_norm_eps));
    CHECK(g.rope_theta == doctest::Approx(h.rope_theta));
    CHECK(g.hybrid.full_attention == h.hybrid.full_attention);
    CHECK(g.hybrid.linear_conv_kernel_dim == h.hybrid.linear_conv_kernel_dim);
    CHECK(g.hybrid.linear_key_head_dim == h.hybrid.linear_key_head_dim);
    CHECK(g.hybrid.linear_value_head_dim == h.hybrid.linear_value_head_dim);
    CHECK(g.hybrid.linear_num_key_heads == h.hybrid.linear_num_key_heads);
    CHECK(g.hybrid.linear_num_value_heads == h.hybrid.linear_num_value_heads);
    CHECK(g.hybrid.partial_rotary_factor == doctest::Approx(h.hybrid.partial_rotary_factor));
    CHECK(g.hybrid.shared_expert_intermediate_size == h.hybrid.shared_expert_intermediate_size);
    CHECK(g.tie_word_embeddings == h.tie_word_embeddings);
  }
}

TEST_CASE("qwen3next GGUF: F32 gives the logits of the safetensors checkpoint, Q8_0 those of its values in F32") {
  auto hf = load_cpu(test::fixture_model("tiny-qwen3next"));
  auto f32 = load_cpu(fixture_gguf("F32"));
  const Cmp a = compare(*f32, *hf);
  MESSAGE("F32 GGUF vs safetensors: max |diff| " << a.max_diff << ", relative " << a.rel << ", top-1 " << a.agreed << "/" << a.checked);
  CHECK(a.max_diff <= 1e-4);  // the same weights but for norms and A_log through 1 + w and -exp (float rounding)
  CHECK(a.agreed == a.checked);
  CHECK(a.checked > 50);
  // Q8_0 (fp32 activations) against the F32 file of the values its blocks
  // hold: the same weights, so any difference is how the Q8_0 path reads
  // them (the regrouped in_proj_qkvz rows among them). With 8-bit
  // activations, and against the bf16 checkpoint, the tiny random model
  // moves a lot (printed, not checked).
  auto q8v = load_cpu(fixture_gguf("Q8_0-values-F32"));
  auto q8 = load_cpu(fixture_gguf("Q8_0"), false);
  const Cmp b = compare(*q8, *q8v);
  MESSAGE("Q8_0 GGUF vs its values in F32: max |diff| " << b.max_diff << ", relative " << b.rel << ", top-1 " << b.agreed << "/" << b.checked);
  CHECK(b.rel <= 1e-4);
  CHECK(b.agreed == b.checked);
  auto q8i = load_cpu(fixture_gguf("Q8_0"));
  const Cmp d = compare(*q8i, *q8v);
  MESSAGE("Q8_0 GGUF with 8-bit activations vs its values in F32: max |diff| " << d.max_diff << ", relative " << d.rel << ", top-1 " << d.agreed << "/"
                                                                                << d.checked);
  const Cmp c = compare(*q8, *hf);
  MESSAGE("Q8_0 GGUF vs the bf16 safetensors: max |diff| " << c.max_diff << ", relative " << c.rel << ", top-1 " << c.agreed << "/" << c.checked);
}

TEST_CASE("qwen3next GGUF: in_proj_qkvz regrouped from attn_qkv and attn_gate is the checkpoint's, row for row") {
  const ModelConfig c = ModelConfig::from_dir(test::fixture_ref("tiny-qwen3next"));
  const int64_t rows = 2 * c.hybrid.key_dim() + 2 * c.hybrid.value_dim(), H = c.hidden_size;
  auto rows_of = [&](WeightSource& src, const std::string& name) {
    const cpu::Mat m = src.mat(name, rows, H);
    std::vector<float> v(static_cast<size_t>(rows * H));
    for (int64_t r = 0; r < rows; ++r) cpu::row_to_f32(m, r, v.data() + r * H);
    return v;
  };
  io::TensorStore store(test::fixture_model("tiny-qwen3next"));
  ModelConfig gc;
  auto f32 = open_gguf_source(fixture_gguf("F32"), gc);
  auto q8 = open_gguf_source(fixture_gguf("Q8_0"), gc);
  auto q8v = open_gguf_source(fixture_gguf("Q8_0-values-F32"), gc);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.hybrid.full_attention[static_cast<size_t>(l)]) continue;
    const std::string name = "model.layers." + std::to_string(l) + ".linear_attn.in_proj_qkvz.weight";
    const io::TensorView& t = store.get(name, {rows, H});
    std::vector<float> hf(static_cast<size_t>(rows * H));
    cpu::to_f32(t.dtype, t.data, hf.data(), rows * H);
    CHECK_MESSAGE(rows_of(*f32, name) == hf, name);
    CHECK_MESSAGE(rows_of(*q8, name) == rows_of(*q8v, name), name);
  }
}

TEST_CASE("qwen3next GGUF: an unknown metadata key and a missing tensor are errors naming them") {
  const std::string bytes = test::read_file(fixture_gguf("F32"));
  {
    TempGguf t(renamed(bytes, "qwen3next.expert_used_count", "qwen3next.expert_usedXcount"), "key");
    const std::string e = error_of(t.path);
    CHECK_MESSAGE(e.find("unknown metadata key 'qwen3next.expert_usedXcount'") != std::string::npos, e);
  }
  {
    TempGguf t(renamed(bytes, "blk.0.attn_gate.weight", "blk.0.attn_gatX.weight"), "tensor");
    const std::string e = error_of(t.path);
    CHECK_MESSAGE(e.find("'blk.0.attn_gate.weight' is missing") != std::string::npos, e);
  }
}
