// The int8 limit the GGUF kernels' benchmarks print against: vpdpbusd
// multiply-adds per second with every operand in registers
// (cpu::detail::q8_vnni_peak_macs, numa/quant_gguf_q8.h).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <vector>

#include "numa/quant_gguf_q8.h"
#include "numa/thread_pool.h"

namespace hmoe::cpu::detail {

namespace {

std::atomic<int32_t> g_vnni_sink{0};  // keeps the spin's result alive

// 16 independent vpdpbusd chains, `iters` times: 16 * 64 multiply-adds each.
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) int32_t vnni_spin(int64_t iters) {
  __m512i a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  for (int64_t it = 0; it < iters; ++it) {
    __asm__ volatile("" : "+v"(w), "+v"(x));
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
  }
  __m512i s = a[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_epi32(s, a[i]);
  return _mm512_reduce_add_epi32(s);
}

}  // namespace

double q8_vnni_peak_macs(numa::ThreadPool* pool) {
  if (!q8_has_vnni()) return 0.0;
  // Per thread: multiply-adds over that thread's own CPU time (best of 5),
  // so other processes sharing the cores do not lower the limit.
  constexpr int64_t kIters = 1000000;
  auto one = [] {
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      timespec a{}, b{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
      g_vnni_sink.fetch_add(vnni_spin(kIters), std::memory_order_relaxed);
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
      const double sec = static_cast<double>(b.tv_sec - a.tv_sec) + 1e-9 * static_cast<double>(b.tv_nsec - a.tv_nsec);
      if (sec > 0) best = std::max(best, 16.0 * 64.0 * static_cast<double>(kIters) / sec);
    }
    return best;
  };
  if (!pool) return one();
  std::vector<double> per(static_cast<size_t>(pool->size()), 0.0);
  pool->parallel_for(pool->size(), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) per[static_cast<size_t>(i)] = one();
  }, 1, 1);
  double sum = 0;
  for (double v : per) sum += v;
  return sum;
}

}  // namespace hmoe::cpu::detail
