// Top-1 agreement on the rows whose top-1/top-2 margin in a reference
// exceeds a threshold: the GPU tests' check against logits of another
// schedule, precision or format (rows x V floats, row-major).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/serving/logits.h"

namespace hmoe::test {

struct ClearTop1 {
  int64_t rows = 0;   // rows of ref with a margin above the threshold
  int64_t agree = 0;  // of those, rows where mine has ref's top-1
};

inline ClearTop1 clear_top1(const std::vector<float>& mine, const std::vector<float>& ref, int64_t V, float margin = 0.5f) {
  ClearTop1 c;
  const size_t n = std::min(mine.size(), ref.size()) / static_cast<size_t>(V);
  for (size_t r = 0; r < n; ++r) {
    const float* a = ref.data() + r * static_cast<size_t>(V);
    const int32_t top = argmax(a, V);
    float second = -1e30f;
    for (int64_t v = 0; v < V; ++v)
      if (v != top) second = std::max(second, a[v]);
    if (a[top] - second <= margin) continue;
    ++c.rows;
    c.agree += argmax(mine.data() + r * static_cast<size_t>(V), V) == top;
  }
  return c;
}

}  // namespace hmoe::test
