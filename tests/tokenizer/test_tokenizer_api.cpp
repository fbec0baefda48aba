// API behaviour: special tokens, parse_special, errors on bad inputs,
// streaming edge cases, UTF-8 helpers.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "configs/error.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "engine/text/tokenizer/unicode.h"

namespace fs = std::filesystem;
using hmoe::Error;
using hmoe::ErrorKind;
using hmoe::tok::Tokenizer;

namespace {
const std::string kQwen = std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe";

const Tokenizer& qwen() {
  static auto t = Tokenizer::from_dir(kQwen);
  return *t;
}

template <class F> ErrorKind kind_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::internal;
}

std::string tmpdir(const std::string& name) {
  fs::path d = fs::path(HMOE_BINARY_DIR) / "tests" / "tokenizer_tmp" / name;
  fs::create_directories(d);
  return d.string();
}
}  // namespace

TEST_CASE("special tokens") {
  const Tokenizer& t = qwen();
  auto im_end = t.token_to_id("<|im_end|>");
  REQUIRE(im_end);
  CHECK(*im_end == 151645);
  CHECK(t.is_special(*im_end));
  CHECK_FALSE(t.is_special(9707));
  CHECK(t.token_to_id("Ġworld") == 1879);
  CHECK_FALSE(t.token_to_id("no-such-token-xyz"));
  CHECK(t.vocab_size() == 151669);
  auto ids = t.encode("a<|im_end|>b");
  CHECK(ids.size() == 3);
  CHECK(ids[1] == *im_end);
  auto plain = t.encode("a<|im_end|>b", false);
  CHECK(std::find(plain.begin(), plain.end(), *im_end) == plain.end());
  CHECK(t.decode(plain) == "a<|im_end|>b");
  CHECK(t.decode(ids, true) == "ab");
  CHECK(t.decode(ids) == "a<|im_end|>b");
  CHECK(t.id_to_piece(*im_end) == "<|im_end|>");
  CHECK(t.eos_id() == im_end);
}

TEST_CASE("bad ids are invalid_argument") {
  const Tokenizer& t = qwen();
  CHECK(kind_of([&] { t.decode({1, -1}); }) == ErrorKind::invalid_argument);
  CHECK(kind_of([&] { t.decode({t.vocab_size()}); }) == ErrorKind::invalid_argument);
  CHECK(kind_of([&] { t.id_to_piece(1 << 30); }) == ErrorKind::invalid_argument);
  hmoe::tok::IncrementalDecoder d(t);
  CHECK(kind_of([&] { d.push(-5); }) == ErrorKind::invalid_argument);
}

TEST_CASE("bad model files are bad_model and name the file") {
  auto msg_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::bad_model);
      return e.what();
    }
    FAIL("no error");
    return "";
  };
  std::string missing = tmpdir("missing");
  fs::remove(missing + "/tokenizer.json");
  CHECK(msg_of([&] { Tokenizer::from_dir(missing); }).find("tokenizer.json") != std::string::npos);
  std::string broken = tmpdir("broken");
  std::ofstream(broken + "/tokenizer.json") << "{\"model\": {\"vocab\": {\"a\": 0,";
  CHECK(msg_of([&] { Tokenizer::from_dir(broken); }).find("malformed JSON") != std::string::npos);
  std::string wrong = tmpdir("wrong");
  std::ofstream(wrong + "/tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}})";
  CHECK(msg_of([&] { Tokenizer::from_dir(wrong); }).find("merge 0") != std::string::npos);
  std::string notgguf = tmpdir("gguf") + "/x.gguf";
  std::ofstream(notgguf) << "GGUF\x03";
  CHECK(msg_of([&] { Tokenizer::from_gguf(notgguf); }).find("x.gguf") != std::string::npos);
  CHECK(kind_of([&] { Tokenizer::from_gguf(notgguf + ".absent"); }) == ErrorKind::io);
}

TEST_CASE("streaming holds back partial UTF-8 and flushes U+FFFD") {
  const Tokenizer& t = qwen();
  std::string text = "😀 é 中";
  auto ids = t.encode(text);
  hmoe::tok::IncrementalDecoder d(t);
  std::string all;
  for (int32_t id : ids) {
    std::string p = d.push(id);
    CHECK(hmoe::tok::utf8_valid(p));
    all += p;
  }
  all += d.finish();
  CHECK(all == text);
  // A lone lead byte token: nothing until finish, then U+FFFD.
  auto lead = t.token_to_id("ð");  // byte 0xF0
  REQUIRE(lead);
  hmoe::tok::IncrementalDecoder d2(t);
  CHECK(d2.push(*lead).empty());
  CHECK(d2.finish() == "\xEF\xBF\xBD");
  CHECK(t.decode({*lead}) == "\xEF\xBF\xBD");
}

TEST_CASE("lossy UTF-8 follows WHATWG") {
  auto lossy = [](std::string s) {
    std::string o;
    hmoe::tok::utf8_append_lossy(s, o, true);
    return o;
  };
  const std::string R = "\xEF\xBF\xBD";
  CHECK(lossy("a\xFF" "b") == "a" + R + "b");
  CHECK(lossy("\xED\xA0\x80") == R + R + R);
  CHECK(lossy("\xF0\x9F\x98") == R);
  CHECK(lossy("\xE2\x82" "a") == R + "a");
  CHECK(lossy("\xC0\xAF") == R + R);
  CHECK(hmoe::tok::utf8_valid("héllo 😀"));
  CHECK_FALSE(hmoe::tok::utf8_valid("\xED\xA0\x80"));
}

TEST_CASE("invalid UTF-8 input is tokenized as U+FFFD") {
  const Tokenizer& t = qwen();
  CHECK(t.encode("a\xFF" "b") == t.encode("a\xEF\xBF\xBD" "b"));
  CHECK(t.decode(t.encode("x\xC3")) == "x\xEF\xBF\xBD");
}
