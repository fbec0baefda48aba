// Shared by the GGUF GPU benchmarks (bench_gpu_gguf, bench_gpu_gguf_lowbit):
// a matrix's blocks stacked `copies` times on the device, so that timed
// launches read distinct bytes, and a CUDA-event timer that flushes L2
// before each repetition and reports the median.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"

namespace hmoe::bench {

// `copies` copies of one [rows, cols] matrix of type t (its blocks `host`)
// stacked on the device, with 16 readable bytes past the end (gguf_moe_gemm
// reads up to 16 bytes past the last row).
struct GgufStack {
  gpu::DeviceBuffer data;
  gpu::GgufWeight w;
};
inline GgufStack gguf_stack(cpu::ExtType t, const std::vector<uint8_t>& host, int64_t rows, int64_t cols, int64_t copies, gpu::Stream& s) {
  GgufStack st;
  const cpu::Mat v = cpu::ext_view(t, host.data(), rows, cols, "bench");
  st.w.type = gpu::gguf_type_of(v, "bench");
  st.w.rows = rows * copies;
  st.w.cols = cols;
  const size_t one = host.size();
  st.data = gpu::DeviceBuffer(one * static_cast<size_t>(copies) + 16);
  gpu::copy_to_device(st.data.data(), host.data(), one, s);
  for (int64_t c = 1; c < copies; ++c) gpu::copy_on_device(st.data.as<uint8_t>() + one * c, st.data.data(), one, s);
  gpu::memset_device(st.data.as<uint8_t>() + one * static_cast<size_t>(copies), 0, 16, s);
  s.synchronize();
  st.w.data = st.data.data();
  return st;
}

// Median microseconds of fn() over `reps` launches after one warm-up, L2
// flushed (256 MiB written) before each.
struct GpuTimer {
  gpu::Stream& s;
  gpu::DeviceBuffer flush{size_t{256} << 20};
  gpu::Event a, b;
  int reps;
  GpuTimer(gpu::Stream& st, int r) : s(st), reps(r) {}
  template <class Fn>
  double us(Fn&& fn) {
    fn();  // warm-up
    s.synchronize();
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      gpu::memset_device(flush.data(), r & 0xFF, flush.bytes(), s);
      a.record(s);
      fn();
      b.record(s);
      b.synchronize();
      t.push_back(b.elapsed_ms(a) * 1e3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

inline const char* gguf_type_name(cpu::ExtType t) { return cpu::ext_type_info(static_cast<uint32_t>(t))->name; }

}  // namespace hmoe::bench
