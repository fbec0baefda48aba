// The hand-off's own cost, without CPU experts: per host layer of a decode
// step, the time the copy hand-off and the zero-copy hand-off
// (engine/runtime/zero_copy_handoff.h) put on the critical path, for the
// Qwen3-30B-A3B shape (hidden 2048, top-8) at 1, 8 and 64 tokens, 48
// hand-offs a step.
//  - copy: per hand-off, the next segment's graph is launched (one
//    elementwise kernel standing for the segment), then as the runtime does:
//    event, three device-to-host copies (hf, ids, weights) into pinned
//    memory, event, the host waits on it, the sums (already computed) go up
//    with one host-to-device copy;
//  - zero-copy: the whole step is one graph (per hand-off the same kernel,
//    then the hand-off kernel into mapped memory and its ready flag; the
//    next one starts with the kernel that waits for the host's release and
//    copies the sums in); the host spins on each ready flag, writes nothing
//    new and releases at once.
// The floor it is measured against: the same step's kernels alone, one
// graph without hand-offs (what a step costs when no layer waits for the
// host). us per hand-off = (step time - floor) / 48. Wall time over 50
// steps after 5 warm-up steps, median.
//
// Usage: bench_gpu_handoff [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/runtime/zero_copy_handoff.h"
#include "gpu/device.h"
#include "gpu/handoff.h"
#include "gpu/kernels.h"
#include "gpu/memory.h"

using namespace hmoe;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHidden = 2048, kTopk = 8, kLayers = 48;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 50;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--steps") steps = std::max(1, std::stoi(argv[i + 1]));
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_handoff: %s\n", gpu::describe().c_str());
    return 0;
  }
  std::printf("# %s\n\nPer hand-off on the critical path (us): step time less the same kernels without hand-offs, / %lld hand-offs\n\n",
              gpu::describe().c_str(), static_cast<long long>(kLayers));
  std::printf("| tokens | floor us per step | copy us per hand-off | zero-copy us per hand-off | zero-copy / copy |\n|---|---|---|---|---|\n");
  for (const int64_t rows : {1, 8, 64}) {
    const int64_t nh = rows * kHidden, nk = rows * kTopk;
    gpu::Stream s;
    gpu::DeviceBuffer x(nh * 4), d(nh * 4), ids(nk * 4), w(nk * 4);
    gpu::memset_device(x.data(), 0, nh * 4, s);
    gpu::memset_device(d.data(), 0, nh * 4, s);
    gpu::memset_device(ids.data(), 0, nk * 4, s);
    gpu::memset_device(w.data(), 0, nk * 4, s);
    gpu::PinnedBuffer hf_h(nh * 4), ids_h(nk * 4), w_h(nk * 4), out_h(nh * 4);
    std::memset(out_h.as<float>(), 0, nh * 4);
    auto segment = [&] { gpu::add(x.as<float>(), d.as<float>(), nh, x.as<float>(), s); };
    auto time_steps = [&](const std::function<void()>& step) {
      std::vector<double> t;
      for (int i = 0; i < steps + 5; ++i) {
        const auto t0 = Clock::now();
        step();
        if (i >= 5) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      return median(t);
    };
    // Floor: every segment in one graph, no hand-off.
    gpu::Graph all;
    all.begin_capture(s);
    for (int64_t l = 0; l <= kLayers; ++l) segment();
    all.end_capture(s);
    const double floor_s = time_steps([&] {
      all.launch(s);
      s.synchronize();
    });
    // Copy hand-off.
    gpu::Graph seg;
    seg.begin_capture(s);
    segment();
    seg.end_capture(s);
    gpu::Event e0, e1;
    const double copy_s = time_steps([&] {
      for (int64_t l = 0; l < kLayers; ++l) {
        seg.launch(s);
        e0.record(s);
        gpu::copy_to_host(hf_h.as<float>(), x.as<float>(), nh * 4, s);
        gpu::copy_to_host(ids_h.as<int32_t>(), ids.as<int32_t>(), nk * 4, s);
        gpu::copy_to_host(w_h.as<float>(), w.as<float>(), nk * 4, s);
        e1.record(s);
        e1.synchronize();
        gpu::copy_to_device(d.as<float>(), out_h.as<float>(), nh * 4, s);
      }
      seg.launch(s);
      s.synchronize();
    });
    // Zero-copy hand-off.
    ZeroCopyHandoff zc;
    zc.reserve(kLayers, rows, kHidden, kTopk);
    gpu::Graph step;
    step.begin_capture(s);
    for (int64_t l = 0; l <= kLayers; ++l) {
      if (l > 0) zc.enqueue_wait_add(static_cast<size_t>(l - 1), d.as<float>(), rows, s);
      segment();
      if (l < kLayers) zc.enqueue_down(static_cast<size_t>(l), x.as<float>(), ids.as<int32_t>(), w.as<float>(), rows, s);
    }
    zc.enqueue_end(s);
    step.end_capture(s);
    double handoff_s = 0;
    const double zc_s = time_steps([&] {
      zc.begin_step(kLayers);
      step.launch(s);
      for (int64_t l = 0; l < kLayers; ++l) {
        zc.wait_ready(static_cast<size_t>(l), l, s);
        zc.release(static_cast<size_t>(l));
      }
      zc.wait_end(s);
      s.synchronize();
      handoff_s = zc.step_seconds();
    });
    const double per_copy = (copy_s - floor_s) / kLayers * 1e6, per_zc = (zc_s - floor_s) / kLayers * 1e6;
    std::printf("| %lld | %.1f | %.1f | %.1f | %.2f |\n", static_cast<long long>(rows), floor_s * 1e6, per_copy, per_zc, per_zc / per_copy);
    std::fprintf(stderr, "tokens %lld: the zero-copy path's own account of its last step: %.1f us per hand-off (kernels + flag crossings)\n",
                 static_cast<long long>(rows), handoff_s / kLayers * 1e6);
  }
  return 0;
}
