#include "engine/serving/logits.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hmoe {

int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

void top_k(const float* logits, int64_t n, int64_t k, std::vector<int32_t>& ids, std::vector<float>& values) {
  k = std::min(k, n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  ids.assign(idx.begin(), idx.begin() + k);
  values.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) values[static_cast<size_t>(i)] = logits[ids[static_cast<size_t>(i)]];
}

double logsumexp(const float* logits, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(s);
}

}  // namespace hmoe
