// Engram (PLE n-gram memory) modules against Hugging Face transformers'
// fp32 reference (engram_reference.json; tests/fixtures/README.md says how it was made)
// with every table backend; decode state across chunks and sequences; bad
// table paths at model load.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/layers/engram.h"
#include "engine/loading/model.h"
#include "engine/loading/model_config.h"
#include "engine/serving/logits.h"
#include "io/mmap_file.h"
#include "tests/fixture_compare.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

constexpr double kTol = 2e-3;

std::string engram_fixture() {
  const std::string dir = test::fixture_model("tiny-qwen3moe-engram");
  const bool ok = io::file_exists(dir + "/model-00001-of-00003.safetensors") && io::file_exists(dir + "/model-engram.safetensors") &&
                  io::file_exists(dir + "/config.json") && io::file_exists(dir + "/model.safetensors.index.json");
  if (!ok)
    FAIL("fixture missing in " << dir << ": run scripts/make-fixtures " << HMOE_BINARY_DIR
                               << " (it writes the base shards and the Engram tensors there, from tests/fixtures)");
  return dir;
}

Settings settings_for(const std::string& backend, const std::string& table) {
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  s.progress = "none";
  s.ple_backend = backend;
  s.ple_table = table;
  return s;
}

// Prefill of `ids` (in chunks of `chunk` tokens; 0 = all at once), returning every position's logits.
std::vector<float> prefill(Model& m, KvCache& kv, int seq, const std::vector<int32_t>& ids, size_t chunk) {
  const int64_t V = m.config().vocab_size;
  std::vector<float> all;
  if (chunk == 0) chunk = ids.size();
  for (size_t s = 0; s < ids.size(); s += chunk) {
    Batch b;
    for (size_t i = s; i < std::min(ids.size(), s + chunk); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
    std::vector<float> l;
    m.forward(b, kv, l);
    all.insert(all.end(), l.begin(), l.end());
  }
  REQUIRE(all.size() == ids.size() * static_cast<size_t>(V));
  return all;
}

}  // namespace

TEST_CASE("tiny-qwen3moe-engram matches the Hugging Face fp32 reference with every PLE backend") {
  const std::string dir = engram_fixture();
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3moe-engram/engram_reference.json")));
  REQUIRE(ref["chats"].size() >= 1);
  test::TempDir tmp("engram-fixture");
  const std::string table = tmp.str() + "/table.hmoe";
  // Also: io_uring with the first module's table in memory, and io_uring
  // reads issued by the step thread and by a polling kernel thread.
  for (const std::string backend : {"io_uring", "mmap", "pread", "ram", "io_uring ram0", "io_uring caller", "io_uring sqpoll"}) {
    CAPTURE(backend);
    Settings s = settings_for(backend.substr(0, backend.find(' ')), table);
    if (backend == "io_uring ram0") s.ple_ram_modules = "0";
    if (backend == "io_uring caller") s.ple_uring_issue = "caller";
    if (backend == "io_uring sqpoll") s.ple_uring_issue = "sqpoll";
    auto model = Model::load(dir, s);
    REQUIRE(model->engram() != nullptr);
    INFO("backend in use: " << io::ple_backend_name(model->engram()->table().backend()) << " " << model->engram()->table().notice());
    if (backend != "ram") CHECK(io::file_exists(table));
    const int64_t V = model->config().vocab_size;
    double max_diff = 0;
    for (size_t c = 0; c < ref["chats"].size(); ++c) {
      const auto& chat = ref["chats"][c];
      const auto ids = chat["ids"].get<std::vector<int32_t>>();
      const int64_t total = static_cast<int64_t>(ids.size()) + 32;
      KvCache kv(model->kv_layout(), total / 16 + 2, 16);
      const int seq = kv.add_sequence();
      kv.reserve(seq, total);
      const std::vector<float> logits = prefill(*model, kv, seq, ids, 0);
      for (size_t p = 0; p < ids.size(); ++p) {
        const float* row = logits.data() + p * V;
        const std::string where = backend + " chat " + std::to_string(c) + " prompt position " + std::to_string(p);
        test::check_top10(row, V, chat["top10_ids"][p], chat["top10_logits"][p], where, max_diff);
        CHECK(std::fabs(logsumexp(row, V) - chat["logsumexp"][p].get<double>()) <= kTol);
      }
      std::vector<float> last(logits.end() - V, logits.end());
      const auto greedy = chat["greedy_ids"].get<std::vector<int32_t>>();
      REQUIRE(greedy.size() == 32);
      int64_t pos = static_cast<int64_t>(ids.size());
      for (size_t step = 0; step < greedy.size(); ++step) {
        const std::string where = backend + " chat " + std::to_string(c) + " greedy step " + std::to_string(step);
        test::check_top10(last.data(), V, chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step], where, max_diff);
        const int32_t next = argmax(last.data(), V);
        REQUIRE_MESSAGE(next == greedy[step], where);
        Batch b;
        b.add(next, seq, pos++, true);
        model->forward(b, kv, last);
      }
    }
    const io::PleStats& st = model->engram()->table().stats();
    MESSAGE(backend << ": max |logit - reference| " << max_diff << "; rows requested " << st.rows_requested << ", distinct " << st.rows_unique
                    << ", reads " << st.reads << ", bytes " << st.bytes_read << ", I/O wait " << st.wait_ns / 1e6 << " ms, hidden "
                    << st.hidden_fraction());
    MESSAGE(model->engram()->stats_line());
    CHECK(model->engram()->stats_line().find(io::ple_backend_name(model->engram()->table().backend())) != std::string::npos);
    CHECK(st.rows_requested > 0);
    CHECK(st.rows_unique <= st.rows_requested);
    const io::PleTable& t = model->engram()->table();
    if (backend == "io_uring ram0") {
      CHECK(t.table_in_ram(0));
      CHECK_FALSE(t.table_in_ram(1));
      CHECK(t.table_stats(0).reads == 0);
      CHECK(t.table_stats(0).rows_requested > 0);
      CHECK(t.table_stats(1).reads > 0);
      CHECK(model->engram()->stats_line().find("1 of 2 modules in RAM") != std::string::npos);
    } else {
      CHECK(t.table_in_ram(0) == (backend == "ram"));
    }
  }
}

TEST_CASE("Engram state: chunked prefill and interleaved sequences equal one-shot prefill") {
  const std::string dir = engram_fixture();
  test::TempDir tmp("engram-chunks");
  auto model = Model::load(dir, settings_for("io_uring", tmp.str() + "/t.hmoe"));
  const int64_t V = model->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {
      {151644, 872, 198, 9707, 525, 498, 30, 151645, 198, 151644, 77091, 198, 9707, 0, 10479, 30},
      {9707, 0, 10479, 9707, 0, 10479, 9707, 0, 10479, 11, 12, 13},
      {30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43}};
  std::vector<std::vector<float>> whole;
  for (const auto& p : prompts) {
    KvCache kv(model->kv_layout(), 4, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, static_cast<int64_t>(p.size()));
    whole.push_back(prefill(*model, kv, seq, p, 0));
  }
  for (size_t chunk : {1, 2, 5}) {
    CAPTURE(chunk);
    for (size_t i = 0; i < prompts.size(); ++i) {
      KvCache kv(model->kv_layout(), 4, 16);
      const int seq = kv.add_sequence();
      kv.reserve(seq, static_cast<int64_t>(prompts[i].size()));
      const auto l = prefill(*model, kv, seq, prompts[i], chunk);
      double worst = 0;
      for (size_t k = 0; k < l.size(); ++k) worst = std::max(worst, static_cast<double>(std::fabs(l[k] - whole[i][k])));
      CHECK_MESSAGE(worst <= 1e-4, "prompt " << i << " chunk " << chunk << " differs by " << worst);
    }
  }
  // All three sequences in one flat batch, three tokens of each per step.
  KvCache kv(model->kv_layout(), 12, 16);
  std::vector<int> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(kv.add_sequence());
    kv.reserve(seqs.back(), static_cast<int64_t>(p.size()));
  }
  std::vector<std::vector<float>> got(prompts.size());
  for (size_t s = 0; s < 16; s += 3) {
    Batch b;
    std::vector<size_t> owner;
    for (size_t q = 0; q < prompts.size(); ++q)
      for (size_t i = s; i < std::min(prompts[q].size(), s + 3); ++i) {
        b.add(prompts[q][i], seqs[q], static_cast<int64_t>(i), true);
        owner.push_back(q);
      }
    if (b.tokens.empty()) break;
    std::vector<float> l;
    model->forward(b, kv, l);
    for (size_t r = 0; r < owner.size(); ++r) got[owner[r]].insert(got[owner[r]].end(), l.begin() + static_cast<int64_t>(r) * V, l.begin() + static_cast<int64_t>(r + 1) * V);
  }
  for (size_t q = 0; q < prompts.size(); ++q) {
    REQUIRE(got[q].size() == whole[q].size());
    double worst = 0;
    for (size_t k = 0; k < got[q].size(); ++k) worst = std::max(worst, static_cast<double>(std::fabs(got[q][k] - whole[q][k])));
    CHECK_MESSAGE(worst <= 1e-4, "interleaved prompt " << q << " differs by " << worst);
  }
  // Rows shared by sequences in one batch are read once: prompt 1 repeats one trigram.
  const io::PleStats& st = model->engram()->table().stats();
  CHECK(st.rows_unique < st.rows_requested);
}

TEST_CASE("Engram state: a sequence that skips positions is an error, not a silent answer") {
  const std::string dir = engram_fixture();
  test::TempDir tmp("engram-skip");
  auto model = Model::load(dir, settings_for("ram", tmp.str() + "/unused.hmoe"));
  KvCache kv(model->kv_layout(), 4, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, 40);
  prefill(*model, kv, seq, {1, 2, 3, 4}, 0);
  Batch b;
  b.add(5, seq, 30, true);  // positions 4..29 never happened
  std::vector<float> l;
  try {
    model->forward(b, kv, l);
    FAIL("forward accepted a position without history");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::internal);
    CHECK(std::string(e.what()).find("position") != std::string::npos);
  }
  // A KV cache made without the Engram state is refused before any compute.
  KvLayout plain = model->kv_layout();
  plain.seq_state_bytes = 0;
  KvCache bare(plain, 4, 16);
  const int s2 = bare.add_sequence();
  bare.reserve(s2, 4);
  Batch b2;
  b2.add(1, s2, 0, true);
  CHECK_THROWS_AS(model->forward(b2, bare, l), Error);
}

TEST_CASE("Engram model load: bad table paths give clear errors and the ram backend still loads") {
  const std::string dir = engram_fixture();
  test::TempDir tmp("engram-bad");
  // A directory where the table file should be.
  const std::string as_dir = tmp.str() + "/a-directory";
  std::filesystem::create_directories(as_dir);
  try {
    Model::load(dir, settings_for("io_uring", as_dir));
    FAIL("a directory was accepted as the table file");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(std::string(e.what()).find("directory") != std::string::npos);
    CHECK(std::string(e.what()).find("HMOE_PLE_BACKEND=ram") != std::string::npos);
  }
  CHECK(std::filesystem::is_directory(as_dir));
  // Read settings out of range, and a row cache bigger than the machine: errors naming the setting.
  {
    Settings s = settings_for("io_uring", tmp.str() + "/cache.hmoe");
    s.ple_cache_mib = -1;
    CHECK_THROWS_WITH_AS(Model::load(dir, s), doctest::Contains("HMOE_PLE_CACHE_MIB"), Error);
    s.ple_cache_mib = int64_t{1} << 22;  // 4 TiB
    CHECK_THROWS_WITH_AS(Model::load(dir, s), doctest::Contains("--ple-cache-mib"), Error);
    s.ple_cache_mib = 1;
    s.ple_read_block = 1000;
    CHECK_THROWS_WITH_AS(Model::load(dir, s), doctest::Contains("HMOE_PLE_READ_BLOCK"), Error);
    s.ple_read_block = 0;
    s.ple_uring_issue = "kernel";
    CHECK_THROWS_WITH_AS(Model::load(dir, s), doctest::Contains("HMOE_PLE_URING_ISSUE"), Error);
    s.ple_uring_issue = "driver";
    s.ple_spin_us = -5;
    CHECK_THROWS_WITH_AS(Model::load(dir, s), doctest::Contains("HMOE_PLE_SPIN_US"), Error);
    s.ple_spin_us = 0;
    for (const char* bad : {"2", "auto", "0-x", "1-0"}) {  // the fixture has modules 0 and 1
      s.ple_ram_modules = bad;
      CHECK_THROWS_WITH_AS(Model::load(dir, s), doctest::Contains("HMOE_PLE_RAM_MODULES"), Error);
    }
    s.ple_ram_modules = "all";  // every table in memory, the file still written and checked
    auto all = Model::load(dir, s);
    CHECK(all->engram()->table().table_in_ram(0));
    CHECK(all->engram()->table().table_in_ram(1));
  }
  // A foreign file is left alone.
  const std::string foreign = tmp.str() + "/foreign.bin";
  test::write_file(foreign, std::string(10000, 'x'));
  CHECK_THROWS_AS(Model::load(dir, settings_for("mmap", foreign)), Error);
  CHECK(test::read_file(foreign) == std::string(10000, 'x'));
  // A table file in a directory that does not exist.
  try {
    Model::load(dir, settings_for("pread", tmp.str() + "/no/such/dir/t.hmoe"));
    FAIL("a table path in a missing directory was accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::io);
    CHECK(std::string(e.what()).find("HMOE_PLE_BACKEND=ram") != std::string::npos);
  }
  // ram never touches the path.
  auto m = Model::load(dir, settings_for("ram", as_dir));
  CHECK(m->engram()->table().backend() == io::PleBackend::ram);
  // Unknown backend names the setting.
  try {
    Model::load(dir, settings_for("floppy", ""));
    FAIL("unknown backend accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(std::string(e.what()).find("HMOE_PLE_BACKEND") != std::string::npos);
  }
}

TEST_CASE("Engram config: the engram block is validated") {
  const auto base = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3moe-engram/config.json")));
  const ModelConfig ok = ModelConfig::from_json(base, "config.json");
  CHECK(ok.arch == Arch::qwen3_moe_engram);
  CHECK(ok.engram.layer_ids == std::vector<int64_t>{1, 2});
  CHECK(ok.engram.max_ngram_size == 3);
  CHECK(ok.engram.n_embed_per_ngram == 64);
  CHECK(ok.engram.n_head_per_ngram == 4);
  CHECK(ok.engram.kernel_size == 4);
  CHECK(ok.engram.pad_id == 151643);
  CHECK(ok.engram.conv_norm_eps == doctest::Approx(1e-5));
  struct Bad {
    const char* field;
    nlohmann::json value;
  } bads[] = {{"layer_ids", nlohmann::json::array({1, 9})}, {"layer_ids", nlohmann::json::array({2, 2})},
              {"layer_ids", nlohmann::json::array()},      {"max_ngram_size", 1},
              {"n_head_per_ngram", 5},                      {"pad_id", 999999999},
              {"conv_norm_eps", 0},                         {"n_embed_per_ngram", "64"}};
  for (const auto& b : bads) {
    CAPTURE(b.field);
    nlohmann::json j = base;
    j["engram"][b.field] = b.value;
    try {
      ModelConfig::from_json(j, "config.json");
      FAIL("accepted engram." << b.field << " = " << b.value.dump());
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::bad_model);
      CHECK(std::string(e.what()).find(b.field) != std::string::npos);
    }
  }
  nlohmann::json j = base;
  j.erase("engram");
  CHECK_THROWS_AS(ModelConfig::from_json(j, "config.json"), Error);
}
