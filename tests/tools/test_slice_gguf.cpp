// slice_gguf (tools/slice_gguf/): the synthetic GGUF files it writes for
// qwen3moe, deepseek2 and qwen3next are deterministic for a seed, carry the
// layout and keys the loaders (hmoe's, and llama.cpp's as read from its
// source) take, and hmoe loads, tokenizes with, runs and benchmarks them;
// bad options are named (the binaries are run).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "engine/loading/model.h"
#include "io/gguf.h"
#include "tests/model_run.h"
#include "tests/test_util.h"
#include "tests/tools/cli_run.h"

using namespace hmoe;
using test::contains;
using test::Run;
using test::run;
using test::run_cmd;

namespace {

const std::string kSlice = std::string(HMOE_BINARY_DIR) + "/bin/slice_gguf";

// The f32 values of a 1-D F32 tensor.
std::vector<float> f32_values(const io::GgufTensor& t) {
  REQUIRE(t.type == 0u);
  std::vector<float> v(static_cast<size_t>(t.elements()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// hmoe bench FILE ARGS --json: runs, and reports the file's layers, experts and vocabulary.
void check_bench(const std::string& file, const std::string& args, int layers, int experts, int vocab) {
  const Run g = run("bench " + file + " " + args + " --json");
  REQUIRE_MESSAGE(g.code == 0, g.out);
  const auto js = nlohmann::json::parse(g.out.substr(g.out.rfind("\n{") + 1));
  CHECK(js["layers"] == layers);
  CHECK(js["experts"] == experts);
  CHECK(js["vocab"] == vocab);
}

struct Bad {
  std::string args, says;
};

// slice_gguf PREFIX ARGS for each bad case: a non-zero exit naming the problem.
void check_refused(const std::string& prefix, const std::vector<Bad>& bad) {
  for (const Bad& e : bad) {
    const Run r = run_cmd(kSlice + prefix + e.args);
    CHECK_MESSAGE(r.code != 0, e.args << ": " << r.out);
    CHECK_MESSAGE(contains(r.out, e.says), e.args << ": " << r.out);
  }
}

}  // namespace

TEST_CASE("slice_gguf writes a qwen3moe GGUF with the real Qwen3 tokenizer that hmoe loads, tokenizes with and benchmarks") {
  test::TempDir tmp("slice");
  const std::string file = tmp.str() + "/slice.gguf";
  const std::string shape = " --layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --experts 8 --expert-ffn 32 --top-k 2 --threads 2";
  const Run w = run_cmd(kSlice + " --out " + file + shape + " --seed 3");
  REQUIRE_MESSAGE(w.code == 0, w.out);
  CHECK_MESSAGE(contains(w.out, "2 layers"), w.out);
  // Deterministic for a seed, whatever the thread count.
  const Run w1 = run_cmd(kSlice + " --out " + file + ".1" + shape + " --seed 3 --threads 1");
  REQUIRE(w1.code == 0);
  CHECK(test::read_file(file) == test::read_file(file + ".1"));
  // The embedded tokenizer tokenizes as the Hugging Face files do.
  test::write_file(tmp.str() + "/t.txt", "Hello, world! 你好 <|im_start|>user\n<think>x</think> 12345\t\n");
  const Run a = run("tokenize " + file + " --file " + tmp.str() + "/t.txt --json");
  const Run b = run("tokenize " + test::fixture_model("tiny-qwen3moe") + " --file " + tmp.str() + "/t.txt --json");
  REQUIRE_MESSAGE(a.code == 0, a.out);
  REQUIRE_MESSAGE(b.code == 0, b.out);
  const auto ids = nlohmann::json::parse(a.out.substr(a.out.rfind('{')))["ids"];
  CHECK(ids == nlohmann::json::parse(b.out.substr(b.out.rfind('{')))["ids"]);
  CHECK(std::find(ids.begin(), ids.end(), 151644) != ids.end());  // <|im_start|> as one control token
  check_bench(file, "-p 8 -n 2 -r 1 --threads 1", 2, 8, 151936);
  // Q8_0 experts written directly (issue 27's full-depth model): hmoe loads and runs them; deterministic too.
  const std::string q8 = tmp.str() + "/slice-q8.gguf";
  const Run q = run_cmd(kSlice + " --out " + q8 + shape + " --seed 3 --expert-type q8_0");
  REQUIRE_MESSAGE(q.code == 0, q.out);
  const Run q1 = run_cmd(kSlice + " --out " + q8 + ".1.gguf" + shape + " --seed 3 --expert-type q8_0 --threads 1");
  REQUIRE(q1.code == 0);
  CHECK(test::read_file(q8) == test::read_file(q8 + ".1.gguf"));
  CHECK(test::read_file(q8).size() < test::read_file(file).size());
  const Run gq = run("bench " + q8 + " -p 8 -n 2 -r 1 --threads 1");
  CHECK_MESSAGE(gq.code == 0, gq.out);
  const Run pq = run("plan " + q8);
  CHECK_MESSAGE(contains(pq.out, "Q8_0"), pq.out);
  // --routing-replay drives the GPU path only.
  const Run rr = run("bench " + q8 + " -p 0 -n 2 -r 1 --threads 1 --device cpu --routing-replay " + file);
  CHECK(rr.code != 0);
  CHECK_MESSAGE(contains(rr.out, "--routing-replay"), rr.out);
  check_refused("", {Bad{" --layers 2", "--out FILE is required"}, Bad{" --out " + file + " --layers 0", "--layers must be in 1..1024"},
                       Bad{" --out " + file + " --bogus 1", "unknown option '--bogus'"}, Bad{" --out " + file + " --heads 5 --kv-heads 2", "multiple of --kv-heads"},
                       Bad{" --out " + file + " --tokenizer " + tmp.str(), "tokenizer.json: cannot open"},
                       Bad{" --out " + file + " --expert-type q4_k", "--expert-type must be f16 or q8_0"},
                       Bad{" --out /nonexistent/dir/x.gguf --layers 1 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16 --experts 8 --expert-ffn 32 --top-k 2", "cannot create"}});
}

TEST_CASE("slice_gguf --arch deepseek2: DeepSeek-V3 layout with low-bit expert blocks and the DeepSeek tokenizer; hmoe loads and benchmarks it") {
  test::TempDir tmp("slice-ds2");
  const std::string file = tmp.str() + "/ds.gguf";
  const std::string shape = " --arch deepseek2 --layers 3 --dense-layers 1 --hidden 256 --heads 2 --experts 8 --expert-ffn 256 --top-k 2 --groups 4"
                            " --group-top 2 --q-lora 256 --kv-lora 256 --ffn 512 --expert-types iq2_xxs,Q2_K --threads 2";
  const Run w = run_cmd(kSlice + " --out " + file + shape + " --seed 5 --imatrix-out " + tmp.str() + "/u.imatrix");
  REQUIRE_MESSAGE(w.code == 0, w.out);
  CHECK_MESSAGE(contains(w.out, "deepseek2, 3 layers"), w.out);
  CHECK_MESSAGE(contains(w.out, "uniform importance matrix for 6 expert tensors"), w.out);
  const Run w1 = run_cmd(kSlice + " --out " + file + ".1" + shape + " --seed 5 --threads 1");
  REQUIRE(w1.code == 0);
  CHECK(test::read_file(file) == test::read_file(file + ".1"));  // deterministic whatever the thread count
  // The file as hmoe reads it: deepseek2 metadata, the experts' stored types, the rest F16/F32.
  const auto f = io::GgufFile::open(file);
  int iq2 = 0, q2 = 0;
  for (const io::GgufTensor& t : f->tensors()) {
    if (t.name.find("_exps.") == std::string::npos) {
      CHECK_MESSAGE((t.type == 0 || t.type == 1), t.name);
      continue;
    }
    const bool down = t.name.find("down") != std::string::npos;
    CHECK_MESSAGE(t.type == (down ? 10u : 16u), t.name);
    (down ? q2 : iq2)++;
  }
  CHECK(iq2 == 4);
  CHECK(q2 == 2);
  // The uniform importance matrix: llama-imatrix's layout, a sums and a counts tensor per expert tensor.
  const auto im = io::GgufFile::open(tmp.str() + "/u.imatrix");
  CHECK(im->tensors().size() == 12);
  // The embedded tokenizer tokenizes as the DeepSeek-V3 fixture's Hugging Face files do.
  test::write_file(tmp.str() + "/t.txt", "Hello, world! 你好 12345\t\n");
  const Run a = run("tokenize " + file + " --file " + tmp.str() + "/t.txt --json");
  const Run b = run("tokenize " + test::fixture_model("tiny-deepseekv3") + " --file " + tmp.str() + "/t.txt --json");
  REQUIRE_MESSAGE(a.code == 0, a.out);
  REQUIRE_MESSAGE(b.code == 0, b.out);
  CHECK(nlohmann::json::parse(a.out.substr(a.out.rfind('{')))["ids"] == nlohmann::json::parse(b.out.substr(b.out.rfind('{')))["ids"]);
  check_bench(file, "-p 8 -n 2 -r 1 --threads 1 --device cpu", 3, 8, 129280);
  check_refused(" --out " + file + ".bad", {Bad{" --arch llama", "--arch must be qwen3moe, deepseek2 or qwen3next"},
                       Bad{shape + " --expert-types iq9_x,q2_k", "'iq9_x' is not one of"},
                       Bad{shape + " --expert-types iq2_xxs", "wants GATE_UP,DOWN"},
                       Bad{shape + " --groups 3", "multiple of --groups"},
                       Bad{shape + " --hidden 384", "multiples of 256"},
                       Bad{" --expert-types q2_k,q2_k", "are for --arch deepseek2"}});
}

TEST_CASE("slice_gguf --arch qwen3next: llama.cpp's qwen3next layout and keys; hmoe loads it, runs a forward pass with finite logits and benchmarks it") {
  test::TempDir tmp("slice-q3n");
  const std::string file = tmp.str() + "/q3n.gguf";
  // 4 layers: DeltaNet, DeltaNet, DeltaNet, full attention (every 4th).
  const std::string shape = " --arch qwen3next --layers 4 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 --expert-ffn 32 --top-k 2"
                            " --linear-key-heads 2 --linear-value-heads 4 --linear-head-dim 16 --shared-ffn 32 --threads 2";
  const Run w = run_cmd(kSlice + " --out " + file + shape + " --seed 7");
  REQUIRE_MESSAGE(w.code == 0, w.out);
  CHECK_MESSAGE(contains(w.out, "qwen3next, 4 layers"), w.out);
  const Run w1 = run_cmd(kSlice + " --out " + file + ".1" + shape + " --seed 7 --threads 1");
  REQUIRE(w1.code == 0);
  CHECK(test::read_file(file) == test::read_file(file + ".1"));  // deterministic whatever the thread count

  // The keys llama.cpp's qwen3next loader requires (llama_model_qwen3next::load_arch_hparams
  // and the common hparams: no default) and the shapes load_arch_tensors asks for.
  const auto f = io::GgufFile::open(file);
  for (const char* k : {"context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon", "ssm.conv_kernel", "ssm.inner_size",
                        "ssm.state_size", "ssm.time_step_rank", "ssm.group_count"})
    CHECK_MESSAGE(f->find(std::string("qwen3next.") + k) != nullptr, k);
  CHECK(f->find("qwen3next.nextn_predict_layers") == nullptr);  // no MTP block
  auto u = [&](const char* k) { return f->get(std::string("qwen3next.") + k).as_u64(k); };
  CHECK(u("block_count") == 4);
  CHECK(u("full_attention_interval") == 4);
  CHECK(u("rope.dimension_count") == 8);  // partial rotary 0.25 of 32
  CHECK(u("ssm.inner_size") == 4 * 16);
  CHECK(u("expert_shared_feed_forward_length") == 32);
  auto shape_of = [&](const std::string& name) {
    const io::GgufTensor* t = f->find_tensor(name);
    REQUIRE_MESSAGE(t != nullptr, name);
    return t->shape;
  };
  using S = std::vector<uint64_t>;
  const uint64_t conv_dim = 2 * 2 * 16 + 4 * 16;
  CHECK(shape_of("blk.0.attn_qkv.weight") == S{64, conv_dim});
  CHECK(shape_of("blk.0.attn_gate.weight") == S{64, 64});
  CHECK(shape_of("blk.0.ssm_ba.weight") == S{64, 8});
  CHECK(shape_of("blk.0.ssm_conv1d.weight") == S{4, conv_dim});
  CHECK(shape_of("blk.0.ssm_dt.bias") == S{4});
  CHECK(shape_of("blk.0.ssm_a") == S{4});
  CHECK(shape_of("blk.0.ssm_norm.weight") == S{16});
  CHECK(shape_of("blk.0.ssm_out.weight") == S{64, 64});
  CHECK(f->find_tensor("blk.0.attn_q.weight") == nullptr);
  CHECK(shape_of("blk.3.attn_q.weight") == S{64, 2 * 4 * 32});  // query and its output gate
  CHECK(shape_of("blk.3.attn_k.weight") == S{64, 2 * 32});
  CHECK(shape_of("blk.3.attn_output.weight") == S{4 * 32, 64});
  CHECK(shape_of("blk.3.attn_q_norm.weight") == S{32});
  CHECK(f->find_tensor("blk.3.attn_qkv.weight") == nullptr);
  CHECK(shape_of("blk.3.post_attention_norm.weight") == S{64});
  CHECK(shape_of("blk.3.ffn_gate_inp.weight") == S{64, 8});
  CHECK(shape_of("blk.3.ffn_gate_exps.weight") == S{64, 32, 8});
  CHECK(shape_of("blk.3.ffn_down_exps.weight") == S{32, 64, 8});
  CHECK(shape_of("blk.3.ffn_down_shexp.weight") == S{32, 64});
  CHECK(shape_of("blk.3.ffn_gate_inp_shexp.weight")[0] == 64);
  CHECK(shape_of("output.weight") == S{64, 151936});
  // Values in the ranges the model uses: A = exp(A_log) in [1, 16), dt_bias in [0, 2), norms 1 (1 + w stored, w = 0).
  for (float a : f32_values(*f->find_tensor("blk.1.ssm_a"))) CHECK((a <= -1.0f && a > -16.0f));
  for (float d : f32_values(*f->find_tensor("blk.1.ssm_dt.bias"))) CHECK((d >= 0.0f && d < 2.0f));
  for (float n : f32_values(*f->find_tensor("blk.2.attn_norm.weight"))) CHECK(n == 1.0f);

  // hmoe's loader takes it as Qwen3-Next; a forward pass gives finite logits that depend on the tokens.
  std::vector<std::string> none;
  Settings st = Settings::load(none);
  st.progress = "none";
  st.device = "cpu";
  auto m = Model::load(file, st);
  CHECK(m->config().arch == Arch::qwen3_next);
  CHECK(m->config().num_hidden_layers == 4);
  CHECK(m->config().hybrid.full_attention == std::vector<bool>{false, false, false, true});
  const std::vector<int32_t> ids = {9707, 11, 1879, 0, 151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30};
  const std::vector<float> logits = test::prompt_logits(*m, ids);
  REQUIRE(logits.size() == ids.size() * 151936);
  double sum2 = 0;
  size_t non_finite = 0;
  for (float x : logits) {
    non_finite += !std::isfinite(x);
    sum2 += static_cast<double>(x) * x;
  }
  REQUIRE(non_finite == 0);
  const double rms = std::sqrt(sum2 / static_cast<double>(logits.size()));
  CHECK(rms > 1e-3);
  CHECK(rms < 1e3);
  CHECK(test::rel_error(std::vector<float>(logits.begin(), logits.begin() + 151936), std::vector<float>(logits.end() - 151936, logits.end())) > 1e-3);

  // hmoe bench runs it (repetitions after the warm-up start each sequence over: linear attention keeps a state).
  check_bench(file, "-p 32 -n 4 -r 2 -d 8 --threads 1 --device cpu", 4, 8, 151936);
  // Q8_0 routed experts: smaller, loads and runs.
  const std::string q8 = tmp.str() + "/q3n-q8.gguf";
  const Run q = run_cmd(kSlice + " --out " + q8 + shape + " --seed 7 --expert-type q8_0");
  REQUIRE_MESSAGE(q.code == 0, q.out);
  CHECK(io::GgufFile::open(q8)->find_tensor("blk.0.ffn_up_exps.weight")->type == 8u);
  CHECK(test::read_file(q8).size() < test::read_file(file).size());
  const Run gq = run("bench " + q8 + " -p 16 -n 2 -r 1 --threads 1 --device cpu");
  CHECK_MESSAGE(gq.code == 0, gq.out);
  check_refused(" --out " + file + ".bad", {Bad{shape + " --linear-value-heads 3", "--linear-value-heads must be a multiple of --linear-key-heads"},
                       Bad{shape + " --head-dim 36", "--head-dim must be a multiple of 8"},
                       Bad{shape + " --expert-type q8_0 --expert-types q2_k,q2_k", "not both"},
                       Bad{" --linear-key-heads 4", "--shared-ffn for qwen3next"}});
}
