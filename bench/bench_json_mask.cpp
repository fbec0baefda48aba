// JSON mode's per-step cost (engine/text/json_constraint.h): json_mask over a
// tokenizer's whole vocabulary from a few typical states, against the
// decode step it is added to (one mask per generated token, on the CPU,
// while the GPU or the expert engine computes the next step elsewhere).
// Usage: bench_json_mask [MODEL_DIR] (default: the tiny-qwen3moe fixture
// under build/fixtures; its tokenizer is Qwen3's 151,669 tokens).
// Never passes or fails on time.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "configs/error.h"
#include "engine/text/json_constraint.h"
#include "engine/text/tokenizer/tokenizer.h"

using namespace hmoe;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "fixtures/tiny-qwen3moe";
  try {
    const auto t = tok::Tokenizer::from_dir(dir);
    auto t0 = std::chrono::steady_clock::now();
    const JsonVocab v(*t);
    const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int64_t V = v.size();
    std::printf("tokenizer %s: %lld tokens; JsonVocab built in %.1f ms (once per model)\n", dir.c_str(), static_cast<long long>(V), build_ms);
    std::printf("%-34s %10s %12s\n", "state (output so far)", "allowed", "us per mask");
    const std::vector<int32_t> ends = {0};
    std::vector<float> row(static_cast<size_t>(V));
    for (const char* prefix : {"", "{", "{\"na", "{\"name\": ", "{\"name\": \"Ali", "{\"name\": \"Alice\", \"age\": 3", "{\"tags\": [\"a\", ", "{\"a\": 1}"}) {
      JsonState st;
      if (!st.feed(prefix)) fail(ErrorKind::internal, std::string("bench: prefix not accepted: ") + prefix);
      int64_t allowed = 0;
      const int reps = 50;
      t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        std::fill(row.begin(), row.end(), 1.0f);
        allowed = json_mask(v, st, ends, row.data(), V);
      }
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("%-34s %10lld %12.1f\n", (std::string("'") + prefix + "'").c_str(), static_cast<long long>(allowed), us);
    }
    std::printf("(each mask also refills the row here: a %lld-float fill costs a few us of the figure)\n", static_cast<long long>(V));
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_json_mask: %s\n", e.what());
    return 1;
  }
  return 0;
}
