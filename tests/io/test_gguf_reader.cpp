// io::GgufFile on hand-made hostile headers: inputs found by fuzzing the
// reader, each of which once opened "successfully" with a size that did not
// match the shape. (Whole broken models are tested in
// tests/engine/test_gguf_files.cpp.)
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "configs/error.h"
#include "io/gguf.h"
#include "tests/quant_tools/gguf_writer.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("GGUF reader: a shape whose size in bytes overflows 64 bits is an error, not a wrapped small size") {
  test::TempDir dir("gguf-reader");
  struct Case {
    const char* label;
    uint32_t type;
    std::vector<uint64_t> shape;
  };
  // f32: 2^62 elements * 4 bytes = 2^64, wraps to 0. q8_0: (2^64 - 32) elements / 32 * 34 wraps.
  // f16: 2^63 elements * 2 bytes wraps to 0; a 2-D shape gets there through its product.
  const Case cases[] = {
      {"f32-1d", 0, {uint64_t{1} << 62}},
      {"q8_0-1d", 8, {~uint64_t{31}}},
      {"f16-2d", 1, {uint64_t{1} << 32, uint64_t{1} << 31}},
  };
  for (const Case& c : cases) {
    INFO(c.label);
    qtools::GgufWriter w;
    w.kv_str("general.architecture", "qwen3moe");
    w.add({"token_embd.weight", c.type, c.shape, {}});
    const std::string path = dir.str() + "/" + c.label + ".gguf";
    test::write_file(path, w.bytes());
    CHECK_THROWS_WITH_AS(io::GgufFile::open(path), doctest::Contains("'token_embd.weight' size in bytes overflows"), Error);
  }
  // A sane shape with its data still opens.
  qtools::GgufWriter ok;
  ok.add({"small.weight", 0, {8, 2}, std::vector<uint8_t>(64, 0)});
  test::write_file(dir.str() + "/ok.gguf", ok.bytes());
  auto f = io::GgufFile::open(dir.str() + "/ok.gguf");
  REQUIRE(f->find_tensor("small.weight"));
  CHECK(f->find_tensor("small.weight")->bytes == 64);
}
