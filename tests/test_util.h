// Helpers shared by the tests: temporary directories, file writing, and
// locating the fixtures (scripts/make-fixtures assembles them in
// HMOE_FIXTURES_DIR = BUILD_DIR/fixtures from tests/fixtures: reference data
// checked in, checkpoints generated bit for bit).
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace hmoe::test {

// A fresh directory under the build tree, removed at destruction.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::mt19937_64 rng{std::random_device{}()};
    path = std::filesystem::path(HMOE_BINARY_DIR) / "tmp" / (tag + "-" + std::to_string(rng()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Directory of a generated fixture checkpoint ("tiny-qwen3moe", ...).
inline std::string fixture_model(const std::string& name) { return std::string(HMOE_FIXTURES_DIR) + "/" + name; }
// A reference file or directory of the fixtures ("tiny-qwen3moe/hf_reference.json", ...).
inline std::string fixture_ref(const std::string& rel) { return std::string(HMOE_FIXTURES_DIR) + "/" + rel; }

// SHA-256 of a file in hex (coreutils' sha256sum), or "" when it cannot be
// computed: for reference data made from files that are not checked in, to
// tell the file the reference was made from from another one.
inline std::string file_sha256(const std::string& path) {
  if (path.find('\'') != std::string::npos) return "";
  FILE* p = popen(("sha256sum '" + path + "' 2>/dev/null").c_str(), "r");
  if (!p) return "";
  char buf[65] = {};
  const size_t n = std::fread(buf, 1, 64, p);
  pclose(p);
  return n == 64 ? std::string(buf, 64) : "";
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = nd(rng);
    if (x == 0.0f) x = scale * 1e-3f;
  }
  return v;
}

}  // namespace hmoe::test
