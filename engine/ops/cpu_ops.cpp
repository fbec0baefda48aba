#include "engine/ops/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hmoe::ops {

void rms_norm(const float* x, int64_t n, int64_t d, const cpu::Mat& w, double eps, float* y) {
  std::vector<float> wf(static_cast<size_t>(d));
  cpu::to_f32(w.dtype, w.data, wf.data(), d);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * d;
    float* yt = y + t * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xt[i]) * xt[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) yt[i] = wf[static_cast<size_t>(i)] * (xt[i] * inv);
  }
}

Rope::Rope(int64_t hd, double theta) : head_dim(hd), inv_freq(static_cast<size_t>(hd / 2)) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(hd);
    inv_freq[static_cast<size_t>(i)] = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(expo)));
  }
}

void Rope::apply(float* x, int64_t heads, int64_t pos) const {
  const int64_t half = head_dim / 2;
  float cs[512], sn[512];
  std::vector<float> big_c, big_s;
  float* c = cs;
  float* s = sn;
  if (half > 512) {
    big_c.resize(static_cast<size_t>(half));
    big_s.resize(static_cast<size_t>(half));
    c = big_c.data();
    s = big_s.data();
  }
  for (int64_t i = 0; i < half; ++i) {
    const float f = static_cast<float>(pos) * inv_freq[static_cast<size_t>(i)];
    c[i] = static_cast<float>(std::cos(static_cast<double>(f)));
    s[i] = static_cast<float>(std::sin(static_cast<double>(f)));
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

void silu_mul(const float* g, const float* u, int64_t n, float* h) {
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void softmax_topk(const float* logits, int64_t e, int64_t k, bool normalize, int32_t* ids, float* weights) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < e; ++i) mx = std::max(mx, logits[i]);
  std::vector<float> p(static_cast<size_t>(e));
  double sum = 0;
  for (int64_t i = 0; i < e; ++i) {
    p[static_cast<size_t>(i)] = std::exp(logits[i] - mx);
    sum += p[static_cast<size_t>(i)];
  }
  for (auto& x : p) x = static_cast<float>(x / sum);
  std::vector<int32_t> idx(static_cast<size_t>(e));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] || (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
  });
  float s = 0;
  for (int64_t i = 0; i < k; ++i) s += p[static_cast<size_t>(idx[static_cast<size_t>(i)])];
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = idx[static_cast<size_t>(i)];
    weights[i] = p[static_cast<size_t>(idx[static_cast<size_t>(i)])] / (normalize ? s : 1.0f);
  }
}

}  // namespace hmoe::ops
