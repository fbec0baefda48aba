// GGUF reader: the fixture's header, metadata and tensor table, and
// truncated/corrupted copies that must end in hmoe::Error, never a crash.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "configs/error.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "io/gguf.h"

namespace fs = std::filesystem;
using hmoe::io::GgufFile;

namespace {
const std::string kGguf = std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe-Q8_0.gguf";

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}
std::string write_tmp(const std::string& name, const std::string& bytes) {
  fs::path d = fs::path(HMOE_BINARY_DIR) / "tests" / "tokenizer_tmp";
  fs::create_directories(d);
  std::string p = (d / name).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}
}  // namespace

TEST_CASE("gguf fixture: header, metadata, tensors") {
  auto g = GgufFile::open(kGguf);
  CHECK(g->version() == 3);
  CHECK(g->alignment() == 32);
  CHECK(g->data_offset() % 32 == 0);
  CHECK(g->get("general.architecture").as_string("general.architecture") == "qwen3moe");
  CHECK(g->get("tokenizer.ggml.model").as_string("") == "gpt2");
  CHECK(g->get("tokenizer.ggml.tokens").as_strings("").size() > 150000);
  CHECK(g->get("tokenizer.ggml.token_type").as_array<int32_t>("").size() == g->get("tokenizer.ggml.tokens").as_strings("").size());
  CHECK(g->get("qwen3moe.block_count").as_u64("") == 4);
  CHECK_THROWS_AS(g->get("general.architecture").as_u64("general.architecture"), hmoe::Error);
  CHECK_THROWS_AS(g->get("no.such.key"), hmoe::Error);
  REQUIRE(!g->tensors().empty());
  for (const auto& t : g->tensors()) {
    CHECK(t.data >= g->file_data() + g->data_offset());
    CHECK(t.data + t.bytes <= g->file_data() + g->file_size());
    CHECK(hmoe::io::ggml_type_info(t.type) != nullptr);
  }
  const auto* emb = g->find_tensor("token_embd.weight");
  REQUIRE(emb);
  CHECK(emb->shape.size() == 2);
  CHECK(emb->shape[0] == 64);
}

TEST_CASE("gguf: truncated and corrupted files are bad_model errors naming the file") {
  std::string all = slurp(kGguf);
  REQUIRE(all.size() > 1000000);
  for (size_t cut : {size_t(0), size_t(3), size_t(10), size_t(24), size_t(100), size_t(5000), size_t(600000), all.size() - 1}) {
    CAPTURE(cut);
    std::string p = write_tmp("cut.gguf", all.substr(0, cut));
    try {
      GgufFile::open(p);
      FAIL("no error");
    } catch (const hmoe::Error& e) {
      CHECK(e.kind() == hmoe::ErrorKind::bad_model);
      CHECK(std::string(e.what()).find("cut.gguf") != std::string::npos);
    }
  }
  std::string bad_magic = all;
  bad_magic[0] = 'X';
  CHECK_THROWS_AS(GgufFile::open(write_tmp("magic.gguf", bad_magic)), hmoe::Error);
  std::string huge_count = all;
  for (int i = 0; i < 8; ++i) huge_count[16 + i] = '\x7f';  // metadata count
  CHECK_THROWS_AS(GgufFile::open(write_tmp("count.gguf", huge_count)), hmoe::Error);
  // Flip bytes all over the header: any outcome but a crash is fine.
  for (size_t pos = 24; pos < 4000; pos += 97) {
    std::string x = all.substr(0, 200000);
    x[pos] = static_cast<char>(x[pos] ^ 0xA5);
    try {
      GgufFile::open(write_tmp("flip.gguf", x));
    } catch (const hmoe::Error&) {
    }
  }
}

TEST_CASE("encode is thread-safe and handles huge pieces") {
  auto tok = hmoe::tok::Tokenizer::from_dir(std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Thread safety test " + std::to_string(i) + " 中文 😀\n";
  auto expect = tok->encode(text);
  std::vector<std::thread> ts;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([&, k] {
      for (int r = 0; r < 20; ++r) ok[k] += tok->encode(text) == expect;
    });
  for (auto& t : ts) t.join();
  for (int k = 0; k < 4; ++k) CHECK(ok[k] == 20);
  std::string spaces(1 << 20, ' ');
  CHECK(tok->decode(tok->encode(spaces + "x" + spaces)) == spaces + "x" + spaces);
  std::string word(200000, 'q');
  CHECK(tok->decode(tok->encode(word)) == word);
  std::string han;
  for (int i = 0; i < 5000; ++i) han += "的一是不了人我在有他";
  CHECK(tok->decode(tok->encode(han)) == han);
}
