// Helpers for the GPU tests: skipping without a device, bf16 rounding, and
// device round trips of host vectors.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "gpu/device.h"
#include "gpu/kernels.h"
#include "io/dtype.h"

namespace hmoe::test {

// False (after printing "SKIP: no CUDA device ...") where no GPU can run the test.
inline bool have_gpu() {
  if (gpu::device_count() > 0) return true;
  MESSAGE("SKIP: no CUDA device (" << gpu::describe() << ")");
  return false;
}

inline std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}
inline std::vector<float> f32_of(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_f32(v[i]);
  return o;
}
// Rounds through bf16, as the GPU sees bf16 inputs.
inline std::vector<float> bf16_round(const std::vector<float>& v) { return f32_of(bf16_of(v)); }

// A split bf16 pair read back: hi + lo, and a check that lo is the rounding
// remainder of hi (|lo| at most half a bf16 step of hi, or hi is 0).
inline std::vector<float> bf16_pair_sum(const std::vector<uint16_t>& hi, const std::vector<uint16_t>& lo) {
  REQUIRE(hi.size() == lo.size());
  std::vector<float> o(hi.size());
  int64_t bad = 0;
  for (size_t i = 0; i < hi.size(); ++i) {
    const float h = bf16_to_f32(hi[i]), l = bf16_to_f32(lo[i]);
    if (std::fabs(l) > std::fabs(h) * (1.0f / 256.0f)) ++bad;
    o[i] = h + l;
  }
  CHECK(bad == 0);
  return o;
}

template <class T>
gpu::DeviceBuffer to_device(const std::vector<T>& v, gpu::Stream& s) {
  gpu::DeviceBuffer d(std::max<size_t>(v.size() * sizeof(T), 16));
  gpu::copy_to_device(d.data(), v.data(), v.size() * sizeof(T), s);
  return d;
}
template <class T>
std::vector<T> to_host(const gpu::DeviceBuffer& d, size_t count, gpu::Stream& s) {
  std::vector<T> v(count);
  gpu::copy_to_host(v.data(), d.data(), count * sizeof(T), s);
  s.synchronize();
  return v;
}

// Largest |a - b| / (atol + rtol * |b|); <= 1 passes.
inline double tol_ratio(const std::vector<float>& a, const std::vector<float>& b, double atol, double rtol) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double r = std::fabs(static_cast<double>(a[i]) - b[i]) / (atol + rtol * std::fabs(static_cast<double>(b[i])));
    if (!(r <= worst)) worst = std::isnan(r) ? 1e30 : r;
  }
  return worst;
}

}  // namespace hmoe::test
