// ZeroCopyHandoff: the CPU hand-offs of a decode-sized GPU step through
// mapped pinned host memory (setting gpu_handoff = zero-copy).
//
// Why: with the copy hand-off every host layer puts on the step's critical
// path three device-to-host copies, an event wait, a host-to-device copy and
// the launch of the next segment's graph (~50-80 us a layer beyond the GPU's
// own work). Here the whole step is enqueued up front (one CUDA graph): at the
// end of a hand-off layer's GPU work a kernel writes the normed hidden
// states and the routing into mapped host memory and sets a `ready` flag; the
// host, spinning on that flag, runs the CPU experts straight from those
// buffers, writes their sums into mapped memory and sets `done`; the GPU,
// spinning on `done` in a one-block kernel at the start of the next segment,
// copies the sums into the residual delta and goes on. No copy engine, event
// or launch is left between the two sides.
//
// Contract (one step at a time, one host thread; not thread-safe):
//  - reserve() before capture: buffers for `handoffs` hand-offs of up to
//    `rows` rows; their addresses (key()) change only when it grows, so a
//    graph captured with them stays valid while key() holds;
//  - the device side (enqueue_down / enqueue_wait_add / enqueue_end) only
//    enqueues kernels on the stream (capturable; the flags are fixed
//    addresses, no per-step parameters);
//  - begin_step() clears the flags (the stream must be idle); then per
//    hand-off j in order: wait_ready(j) (throws Error(device) naming the
//    layer after the time-out, or the stream's error), the caller reads
//    hf()/ids()/weights() and writes out(), release(j); then wait_end();
//  - on any failure after the work was enqueued, abort() releases every
//    hand-off not yet released with kHandoffAbort (the GPU finishes the step
//    without the experts' sums; the caller discards it) and waits, bounded by
//    the time-out, for the stream to drain. It never throws; false means the
//    GPU did not drain (the runtime must not be used again).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/memory.h"

namespace hmoe {

class ZeroCopyHandoff {
 public:
  void reserve(int64_t handoffs, int64_t rows, int64_t hidden, int64_t topk);
  // What a graph captured with these buffers depends on (their base address and sizes).
  void key(std::vector<const void*>& k) const;
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

  // Device side. hf [rn, hidden] fp32, ids / w [rn, topk]; d [rn, hidden] fp32.
  void enqueue_down(size_t j, const float* hf, const int32_t* ids, const float* w, int64_t rn, gpu::Stream& s);
  void enqueue_wait_add(size_t j, float* d, int64_t rn, gpu::Stream& s);
  void enqueue_end(gpu::Stream& s);

  // Host side.
  void begin_step(size_t handoffs);
  void wait_ready(size_t j, int64_t layer, gpu::Stream& s);
  const float* hf() const { return data_.host<float>() + hf_off_; }  // [rows, hidden] of the hand-off waited for
  int32_t* ids() const { return data_.host<int32_t>() + ids_off_; }  // writable: a routing replay rewrites it
  const float* weights() const { return data_.host<float>() + w_off_; }
  float* out() const { return data_.host<float>() + out_off_; }
  void release(size_t j);
  void wait_end(gpu::Stream& s);
  bool abort(gpu::Stream& s) noexcept;
  size_t released() const { return released_; }

  // After a completed step: seconds of the hand-offs (see
  // GpuStepTimes::transfer_s): the GPU's time in the hand-off kernels (their
  // copies to and from mapped memory) plus the flags' crossings, measured as
  // each host-side interval release(j-1) -> ready(j) seen (and release(last)
  // -> end seen) less the GPU's span between seeing release(j-1) and
  // setting ready(j) (and the end flag), from the GPU's timestamps.
  double step_seconds() const;

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kFlagStride = 16;  // uint32 words: one 64-byte line per flag
  uint32_t* flag(size_t i) const { return data_.host<uint32_t>() + i * kFlagStride; }
  uint32_t* flag_dev(size_t i) const { return data_.device<uint32_t>() + i * kFlagStride; }
  size_t ready_index(size_t j) const { return 2 * j; }
  size_t done_index(size_t j) const { return 2 * j + 1; }
  size_t end_index() const { return 2 * handoffs_cap_; }
  // ts per hand-off: [0] down start, [1] ready set, [2] release seen, [3] sums copied; then the end's.
  uint64_t* ts(size_t j) const { return reinterpret_cast<uint64_t*>(data_.host<uint32_t>() + ts_off_) + 4 * j; }
  uint64_t* ts_dev(size_t j) const { return reinterpret_cast<uint64_t*>(data_.device<uint32_t>() + ts_off_) + 4 * j; }
  void spin(const uint32_t* f, const std::string& what, gpu::Stream& s);

  // One mapped allocation: flags (one line each: ready and done per
  // hand-off, then the end flag), timestamps, hf, ids, weights, out.
  gpu::MappedBuffer data_;
  size_t ts_off_ = 0, hf_off_ = 0, ids_off_ = 0, w_off_ = 0, out_off_ = 0;  // in 4-byte words, 16-byte aligned
  int64_t rows_cap_ = 0, hidden_ = 0, topk_ = 0;
  size_t handoffs_cap_ = 0, handoffs_ = 0, released_ = 0;
  double timeout_s_ = 10.0;
  std::vector<Clock::time_point> seen_at_, released_at_;
  Clock::time_point end_at_;
};

}  // namespace hmoe
