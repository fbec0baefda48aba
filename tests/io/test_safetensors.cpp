// Safetensors reader: good files load as views, and every kind of corrupt
// file is an Error naming the file and the problem (never a crash).
#include <doctest/doctest.h>

#include <cstring>

#include "configs/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

io::TensorToWrite f32_tensor(const std::string& name, std::vector<int64_t> shape, float base) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  io::TensorToWrite t{name, DType::f32, shape, std::vector<uint8_t>(static_cast<size_t>(n) * 4)};
  for (int64_t i = 0; i < n; ++i) {
    float v = base + static_cast<float>(i);
    std::memcpy(t.bytes.data() + i * 4, &v, 4);
  }
  return t;
}

std::string raw_file(const std::string& header, size_t data_bytes, uint64_t hlen_override = 0) {
  std::string s(8, '\0');
  uint64_t hl = hlen_override ? hlen_override : header.size();
  std::memcpy(s.data(), &hl, 8);
  s += header;
  s += std::string(data_bytes, '\x01');
  return s;
}

// Expects loading `path` to throw an Error whose message contains both needles.
void expect_error(const std::string& path, const std::string& needle) {
  try {
    io::SafetensorsFile f(path);
    FAIL("no error for " << path << " (expected '" << needle << "')");
  } catch (const Error& e) {
    CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
    CHECK_MESSAGE(std::string(e.what()).find(path) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("safetensors round trip through the writer") {
  test::TempDir dir("st");
  const std::string p = dir.str() + "/a.safetensors";
  io::write_safetensors(p, {f32_tensor("x", {2, 3}, 1.5f), f32_tensor("y", {4}, -2.0f)});
  io::SafetensorsFile f(p);
  REQUIRE(f.tensors().size() == 2);
  const auto& x = f.tensors().at("x");
  CHECK(x.shape == std::vector<int64_t>{2, 3});
  CHECK(x.dtype == DType::f32);
  float v;
  std::memcpy(&v, x.data + 5 * 4, 4);
  CHECK(v == 6.5f);
  std::memcpy(&v, f.tensors().at("y").data + 4, 4);
  CHECK(v == -1.0f);
}

TEST_CASE("corrupt safetensors files are clear errors") {
  test::TempDir dir("stbad");
  auto p = [&](const char* n) { return dir.str() + "/" + n; };

  test::write_file(p("short"), "abc");
  expect_error(p("short"), "truncated");

  test::write_file(p("huge"), raw_file("{}", 0, 1ull << 40));
  expect_error(p("huge"), "larger than");

  test::write_file(p("past"), raw_file("{}", 0, 500));
  expect_error(p("past"), "past the end");

  test::write_file(p("json"), raw_file("{not json", 0));
  expect_error(p("json"), "not valid JSON");

  test::write_file(p("array"), raw_file("[1,2]", 0));
  expect_error(p("array"), "not a JSON object");

  test::write_file(p("dtype"), raw_file(R"({"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}})", 4));
  expect_error(p("dtype"), "unknown dtype");

  test::write_file(p("offs"), raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  expect_error(p("offs"), "past the end of the data");

  test::write_file(p("size"), raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  expect_error(p("size"), "bytes for shape");

  test::write_file(p("overlap"), raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  expect_error(p("overlap"), "overlap");

  test::write_file(p("neg"), raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  expect_error(p("neg"), "shape");

  test::write_file(p("rev"), raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8));
  expect_error(p("rev"), "data_offsets");

  test::write_file(p("missing"), raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8));
  expect_error(p("missing"), "data_offsets");

  CHECK_THROWS_AS(io::SafetensorsFile(p("does-not-exist")), Error);
}

TEST_CASE("a truncated shard is reported, not read past its end") {
  test::TempDir dir("sttrunc");
  const std::string p = dir.str() + "/m.safetensors";
  io::write_safetensors(p, {f32_tensor("w", {64, 64}, 0.25f)});
  std::string bytes = test::read_file(p);
  test::write_file(p, bytes.substr(0, bytes.size() - 100));
  expect_error(p, "truncated");
}

TEST_CASE("sharded index: missing shard, tensor not in its shard") {
  test::TempDir dir("stidx");
  io::write_safetensors(dir.str() + "/s1.safetensors", {f32_tensor("a", {2}, 1.0f)});
  test::write_file(dir.str() + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  try {
    io::TensorStore s(dir.str());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("s2.safetensors") != std::string::npos);
  }
  test::write_file(dir.str() + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors","zz":"s1.safetensors"}})");
  try {
    io::TensorStore s(dir.str());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("'zz'") != std::string::npos);
  }
  test::write_file(dir.str() + "/model.safetensors.index.json", R"({"weight_map":{"a":"../etc/passwd"}})");
  CHECK_THROWS_AS(io::TensorStore(dir.str()), Error);
  test::write_file(dir.str() + "/model.safetensors.index.json", "{broken");
  CHECK_THROWS_AS(io::TensorStore(dir.str()), Error);
  test::write_file(dir.str() + "/model.safetensors.index.json", R"({"weight_map":{"a":"s1.safetensors"}})");
  io::TensorStore ok(dir.str());
  CHECK(ok.find("a") != nullptr);
  CHECK_THROWS_AS(ok.get("a", {3}), Error);
  CHECK_THROWS_AS(ok.get("nope"), Error);
}

TEST_CASE("dtype conversions round to nearest even and are exact where representable") {
  CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_f32(f32_to_bf16(-3.5f)) == -3.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  CHECK(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
  CHECK(f16_to_f32(f32_to_f16(0.333251953125f)) == 0.333251953125f);
  CHECK(f16_to_f32(f32_to_f16(65504.0f)) == 65504.0f);
  CHECK(f16_to_f32(f32_to_f16(1e-7f)) == doctest::Approx(1.1920928955078125e-07).epsilon(0.01));
  for (float v : {0.1f, -7.25f, 1234.5f, 3e-5f}) {
    CHECK(f16_to_f32(f32_to_f16(v)) == doctest::Approx(v).epsilon(1e-3));
    CHECK(bf16_to_f32(f32_to_bf16(v)) == doctest::Approx(v).epsilon(8e-3));
  }
}
