// Qwen3-Next (qwen3_next) on the fp32 CPU path, on the tiny-qwen3next
// fixture: against the reference (Hugging Face transformers' outputs,
// tiny-qwen3next/hf_reference.json, where checked in; else the numpy port
// of transformers' forward, np_reference.json): every prompt position's
// top-10 logits, the probe ids' logits and the log-sum-exp within 1e-3, and
// every greedy id. Then hmoe against itself where only the schedule
// differs: prompts split in pieces, decode after prefill, interleaved
// sequences, all equal to one full forward; and the recurrent state's
// bookkeeping (out-of-order positions refused, reused sequence ids zeroed).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/serving/logits.h"
#include "engine/loading/model.h"
#include "io/mmap_file.h"
#include "tests/fixture_compare.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

constexpr double kTol = 1e-3;
// Same model, another schedule (pieces, decode steps): the delta rule's
// chunks then fall elsewhere, so fp32 sums round differently (logits of
// magnitude ~20 move by ~1e-4, as transformers' own cached and uncached paths
// do); bit-identical where the chunks coincide.
constexpr double kScheduleTol = 5e-4;

std::unique_ptr<Model> load_fixture() {
  const std::string dir = test::fixture_model("tiny-qwen3next");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00004.safetensors"),
                  "fixture shards missing in " << dir << ": run scripts/make-fixtures " << HMOE_BINARY_DIR);
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";
  return Model::load(dir, s);
}

// Logits of every position of `ids` for one sequence, fed in pieces of the
// given sizes (the last piece takes the rest).
std::vector<float> run_pieces(Model& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& pieces) {
  const int64_t V = m.config().vocab_size, n = static_cast<int64_t>(ids.size());
  KvCache kv(m.kv_layout(), n / 16 + 2, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, n);
  std::vector<float> all(static_cast<size_t>(n * V)), part;
  int64_t pos = 0;
  for (size_t p = 0; pos < n; ++p) {
    const int64_t len = p < pieces.size() ? std::min(pieces[p], n - pos) : n - pos;
    Batch b;
    for (int64_t i = 0; i < len; ++i) b.add(ids[static_cast<size_t>(pos + i)], seq, pos + i, true);
    m.forward(b, kv, part);
    std::copy(part.begin(), part.end(), all.begin() + pos * V);
    pos += len;
  }
  return all;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

std::vector<int32_t> long_prompt(int64_t n) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 101) % 150000));
  return ids;
}

}  // namespace

TEST_CASE("tiny-qwen3next matches the reference at every position and every greedy step") {
  auto model = load_fixture();
  const std::string hf = test::fixture_ref("tiny-qwen3next/hf_reference.json");
  const bool have_hf = io::file_exists(hf);
  const auto ref = nlohmann::json::parse(test::read_file(have_hf ? hf : test::fixture_ref("tiny-qwen3next/np_reference.json")));
  MESSAGE("reference: " << std::string(have_hf ? "Hugging Face transformers (hf_reference.json)" : "numpy port of transformers (np_reference.json)"));
  const int64_t V = model->config().vocab_size;
  const auto probe = ref["info"]["probe_ids"].get<std::vector<int32_t>>();
  REQUIRE(ref["chats"].size() >= 5);
  double max_diff = 0;
  for (size_t c = 0; c < ref["chats"].size(); ++c) {
    const auto& chat = ref["chats"][c];
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
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* row = logits.data() + p * V;
      const std::string where = "chat " + std::to_string(c) + " prompt position " + std::to_string(p);
      test::check_top10(row, V, chat["top10_ids"][p], chat["top10_logits"][p], where, max_diff, kTol);
      CHECK_MESSAGE(std::fabs(logsumexp(row, V) - chat["logsumexp"][p].get<double>()) <= kTol, where);
      for (size_t j = 0; j < probe.size(); ++j) {
        const double d = std::fabs(row[probe[j]] - chat["probe_logits"][p][j].get<double>());
        max_diff = std::max(max_diff, d);
        CHECK_MESSAGE(d <= kTol, where << " probe id " << probe[j]);
      }
    }
    std::vector<float> last(logits.end() - V, logits.end());
    int64_t pos = static_cast<int64_t>(ids.size());
    for (size_t step = 0; step < greedy.size(); ++step) {
      const std::string where = "chat " + std::to_string(c) + " greedy step " + std::to_string(step);
      test::check_top10(last.data(), V, chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step], where, max_diff, kTol);
      const int32_t next = argmax(last.data(), V);
      REQUIRE_MESSAGE(next == greedy[step], where);
      b.clear();
      b.add(next, seq, pos++, true);
      model->forward(b, kv, last);
    }
  }
  MESSAGE("max |logit - reference| over all chats: " << max_diff);
  CHECK(max_diff <= kTol);
}

TEST_CASE("qwen3_next: a prompt split in pieces gives the logits of one piece") {
  auto model = load_fixture();
  const auto ids = long_prompt(150);
  const auto one = run_pieces(*model, ids, {150});
  // Pieces that cross the 64-token chunks of the kernel in different places,
  // single tokens (the one-step recurrence) among them.
  for (const auto& pieces : std::vector<std::vector<int64_t>>{{1, 1, 1, 70, 5, 1, 72}, {64, 64, 22}, {33, 100, 17}}) {
    const double d = max_abs_diff(run_pieces(*model, ids, pieces), one);
    MESSAGE("pieces starting " << pieces[0] << "," << pieces[1] << ": max |diff| " << d);
    CHECK(d <= kScheduleTol);
  }
}

TEST_CASE("qwen3_next: decoding token by token after a prefill equals one full forward") {
  auto model = load_fixture();
  const auto ids = long_prompt(90);
  const auto full = run_pieces(*model, ids, {90});
  std::vector<int64_t> pieces{40};
  pieces.insert(pieces.end(), 50, 1);
  const auto stepped = run_pieces(*model, ids, pieces);
  const double d = max_abs_diff(stepped, full);
  MESSAGE("prefill 40 + 50 decode steps vs one forward: max |diff| " << d);
  CHECK(d <= kScheduleTol);
}

TEST_CASE("qwen3_next: interleaved sequences in one batch give the logits of each alone") {
  auto model = load_fixture();
  const int64_t V = model->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {long_prompt(70), {151644, 872, 198, 9707, 525}, {30}};
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts) alone.push_back(run_pieces(*model, p, {static_cast<int64_t>(p.size())}));
  KvCache kv(model->kv_layout(), 16, 16);
  std::vector<int> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(kv.add_sequence());
    kv.reserve(seqs.back(), static_cast<int64_t>(p.size()));
  }
  Batch b;
  std::vector<std::pair<size_t, size_t>> rows;  // (prompt, position) per batch row
  for (size_t i = 0; i < 70; ++i)
    for (size_t s = 0; s < prompts.size(); ++s)
      if (i < prompts[s].size()) {
        b.add(prompts[s][i], seqs[s], static_cast<int64_t>(i), true);
        rows.emplace_back(s, i);
      }
  std::vector<float> l;
  model->forward(b, kv, l);
  double d = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t v = 0; v < V; v += 7)
      d = std::max(d, static_cast<double>(std::fabs(l[r * V + v] - alone[rows[r].first][rows[r].second * V + v])));
  MESSAGE("interleaved vs alone: max |diff| " << d);
  CHECK(d <= 1e-4);
}

TEST_CASE("qwen3_next: the recurrent state refuses out-of-order positions and starts from zero for a reused sequence id") {
  auto model = load_fixture();
  const auto ids = long_prompt(20);
  const auto ref = run_pieces(*model, ids, {20});
  const int64_t V = model->config().vocab_size;
  KvCache kv(model->kv_layout(), 8, 16);
  int seq = kv.add_sequence();
  kv.reserve(seq, 20);
  Batch b;
  for (int i = 0; i < 10; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, false);
  std::vector<float> l;
  model->forward(b, kv, l);
  // Position 12 skips 10 and 11: an internal error, nothing changed.
  b.clear();
  b.add(ids[12], seq, 12, true);
  CHECK_THROWS_AS(model->forward(b, kv, l), Error);
  b.clear();
  for (int i = 10; i < 20; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, true);
  model->forward(b, kv, l);
  double d = 0;
  for (int64_t i = 0; i < 10 * V; ++i) d = std::max(d, static_cast<double>(std::fabs(l[static_cast<size_t>(i)] - ref[static_cast<size_t>(10 * V + i)])));
  CHECK(d <= kScheduleTol);
  // Freed and added again (the scheduler's preemption): a fresh state.
  kv.free_sequence(seq);
  seq = kv.add_sequence();
  kv.reserve(seq, 20);
  b.clear();
  for (int i = 0; i < 20; ++i) b.add(ids[static_cast<size_t>(i)], seq, i, true);
  model->forward(b, kv, l);
  CHECK(max_abs_diff(l, ref) <= 1e-5);
}

namespace {

nlohmann::json fixture_config() {
  return nlohmann::json::parse(test::read_file(test::fixture_model("tiny-qwen3next") + "/config.json"));
}

// The Error that from_json throws for `j`, with its message.
std::string config_error(const nlohmann::json& j, ErrorKind kind = ErrorKind::bad_model) {
  try {
    ModelConfig::from_json(j, "config.json");
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("no error for " << j.dump());
  return "";
}

}  // namespace

TEST_CASE("qwen3_next config: layer kinds from full_attention_interval or layer_types, bad ones named") {
  nlohmann::json j = fixture_config();
  const ModelConfig c = ModelConfig::from_json(j, "config.json");
  CHECK(c.arch == Arch::qwen3_next);
  CHECK(c.hybrid.full_attention == std::vector<bool>{false, false, true, false, false, true});
  CHECK(c.hybrid.partial_rotary_factor == doctest::Approx(0.25));
  CHECK(c.hybrid.shared_expert_intermediate_size == 48);
  CHECK_FALSE(c.is_moe_layer(4));

  nlohmann::json t = j;  // layer_types agreeing with the interval
  t["layer_types"] = {"linear_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"};
  CHECK(ModelConfig::from_json(t, "config.json").hybrid.full_attention == c.hybrid.full_attention);
  t.erase("full_attention_interval");  // layer_types alone
  t["layer_types"][0] = "full_attention";
  CHECK(ModelConfig::from_json(t, "config.json").hybrid.full_attention[0]);

  nlohmann::json bad = j;
  bad["layer_types"] = t["layer_types"];  // disagrees with the interval
  CHECK(config_error(bad).find("layer_types") != std::string::npos);
  CHECK(config_error(bad).find("full_attention_interval") != std::string::npos);
  bad.erase("full_attention_interval");
  bad["layer_types"] = {"linear_attention", "full_attention"};
  CHECK(config_error(bad).find("has 2 entries but num_hidden_layers is 6") != std::string::npos);
  bad["layer_types"] = {"linear_attention", "linear_attention", "sliding_attention", "linear_attention", "linear_attention", "full_attention"};
  CHECK(config_error(bad).find("entry 2 is 'sliding_attention'") != std::string::npos);
  bad["layer_types"] = "full_attention";
  CHECK(config_error(bad).find("layer_types") != std::string::npos);
  bad = j;
  bad["full_attention_interval"] = 0;
  CHECK(config_error(bad).find("full_attention_interval") != std::string::npos);
  bad = j;
  bad["linear_num_value_heads"] = 3;
  CHECK(config_error(bad).find("linear_num_value_heads") != std::string::npos);
  bad = j;
  bad["partial_rotary_factor"] = 0.01;
  CHECK(config_error(bad).find("partial_rotary_factor") != std::string::npos);
  bad = j;
  bad["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK(config_error(bad, ErrorKind::unsupported).find("yarn") != std::string::npos);
}

TEST_CASE("qwen3_next checkpoint: a layer kind without its weights is a clear error") {
  const std::string src = test::fixture_model("tiny-qwen3next");
  REQUIRE(io::file_exists(src + "/model-00001-of-00004.safetensors"));
  test::TempDir dir("qwen3next-bad");
  for (const auto& e : std::filesystem::directory_iterator(src))
    if (e.path().filename() != "config.json") std::filesystem::create_symlink(e.path(), dir.path / e.path().filename());
  nlohmann::json j = fixture_config();
  j.erase("full_attention_interval");
  j["layer_types"] = {"full_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"};
  test::write_file(dir.str() + "/config.json", j.dump());
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";
  try {
    Model::load(dir.str(), s);
    FAIL("loaded a checkpoint whose layer 0 has no full-attention weights");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::bad_model);
    MESSAGE(std::string(e.what()));
    CHECK(std::string(e.what()).find("model.layers.0.self_attn.") != std::string::npos);
  }
}

TEST_CASE("qwen3_next: weights held as fp32 (--dtype f32) give the logits of the bf16 views") {
  auto bf16 = load_fixture();
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.device = "cpu";
  s.weight_dtype = "f32";
  auto f32 = Model::load(test::fixture_model("tiny-qwen3next"), s);
  const auto ids = long_prompt(80);
  const double d = max_abs_diff(run_pieces(*f32, ids, {80}), run_pieces(*bf16, ids, {80}));
  MESSAGE("fp32 vs bf16 weights (same values): max |diff| " << d);
  CHECK(d <= 1e-4);
}
