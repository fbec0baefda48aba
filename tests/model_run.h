// Small helpers for tests that run a whole model: one prompt in one step,
// and the relative error between two logit vectors.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/loading/model.h"

namespace hmoe::test {

// The logits of every position of `ids` (one sequence from position 0, one step).
inline std::vector<float> prompt_logits(Model& m, const std::vector<int32_t>& ids) {
  KvCache kv(m.kv_layout(), static_cast<int64_t>(ids.size()) / 16 + 2, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, static_cast<int64_t>(ids.size()));
  Batch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  return logits;
}

// ||a - b|| / ||b|| over whole vectors.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += static_cast<double>(b[i]) * b[i];
  return std::sqrt(num / den);
}

}  // namespace hmoe::test
