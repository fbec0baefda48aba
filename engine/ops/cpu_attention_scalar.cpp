// attend_tiles_scalar: the attention inner loop (cpu_attention_kernel.inc)
// in plain C++ on 16-float arrays (the compiler's baseline vectors), for
// CPUs without AVX2 and for tests of the portable path.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/ops/cpu_attention_kernel.h"
#include "io/dtype.h"

namespace hmoe::ops::detail {

namespace {

struct Isa {
  struct V {
    float x[16];
  };
  static constexpr int kHeads = 8;
  static constexpr int kAcc = 8;
  static constexpr int kVAcc = 8;
  static V zero() { return set1(0.0f); }
  static V set1(float s) {
    V r;
    for (float& x : r.x) x = s;
    return r;
  }
  static V fma(V a, V b, V c) {
    for (int i = 0; i < 16; ++i) c.x[i] = std::fma(a.x[i], b.x[i], c.x[i]);
    return c;
  }
  static V mul(V a, V b) {
    for (int i = 0; i < 16; ++i) a.x[i] *= b.x[i];
    return a;
  }
  static V add(V a, V b) {
    for (int i = 0; i < 16; ++i) a.x[i] += b.x[i];
    return a;
  }
  static V sub(V a, V b) {
    for (int i = 0; i < 16; ++i) a.x[i] -= b.x[i];
    return a;
  }
  static V loadf(const float* p) {
    V r;
    std::memcpy(r.x, p, sizeof r.x);
    return r;
  }
  static void storef(float* p, V v) { std::memcpy(p, v.x, sizeof v.x); }
  template <KvDtype D>
  static V load(const uint8_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) {
      if constexpr (D == KvDtype::f32) {
        std::memcpy(&r.x[i], p + 4 * i, 4);
      } else if constexpr (D == KvDtype::bf16) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        r.x[i] = bf16_to_f32(h);
      } else {
        r.x[i] = static_cast<float>(static_cast<int8_t>(p[i]));
      }
    }
    return r;
  }
  static V keep_first(V v, int64_t T, float fill) {
    for (int64_t i = T; i < 16; ++i) v.x[i] = fill;
    return v;
  }
  static float reduce_max(V v) { return *std::max_element(v.x, v.x + 16); }
  static float reduce_add(V v) {
    float s = 0;
    for (float x : v.x) s += x;
    return s;
  }
  static V exp_neg(V v) {
    for (float& x : v.x) x = std::exp(x);
    return v;
  }
  static float exp1(float x) { return std::exp(x); }
  static void prefetch(const void* p) { __builtin_prefetch(p); }
};

}  // namespace

namespace {
#include "engine/ops/cpu_attention_kernel.inc"
}  // namespace

void attend_tiles_scalar(const AttnTiles& a) { attend(a); }

}  // namespace hmoe::ops::detail
