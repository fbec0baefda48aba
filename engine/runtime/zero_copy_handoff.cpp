// ZeroCopyHandoff (see zero_copy_handoff.h): buffers, the host's spins on
// the GPU's flags, releases, the abort path and the hand-off's time.
#include "engine/runtime/zero_copy_handoff.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "configs/error.h"
#include "gpu/handoff.h"

namespace hmoe {

namespace {

uint32_t load_acquire(const uint32_t* p) { return std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(p)).load(std::memory_order_acquire); }
void store_release(uint32_t* p, uint32_t v) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_sfence();  // the experts' sums (ordinary stores) before the flag, for the PCIe reader
#endif
  std::atomic_ref<uint32_t>(*p).store(v, std::memory_order_release);
}
void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}
size_t align4(size_t words) { return (words + 3) / 4 * 4; }  // 16 bytes

}  // namespace

void ZeroCopyHandoff::reserve(int64_t handoffs, int64_t rows, int64_t hidden, int64_t topk) {
  if (static_cast<size_t>(handoffs) <= handoffs_cap_ && rows <= rows_cap_ && hidden == hidden_ && topk == topk_ && data_.bytes() > 0) return;
  handoffs_cap_ = std::max(handoffs_cap_, static_cast<size_t>(handoffs));
  rows_cap_ = std::max(rows_cap_, rows);
  hidden_ = hidden;
  topk_ = topk;
  ts_off_ = (2 * handoffs_cap_ + 1) * kFlagStride;
  hf_off_ = align4(ts_off_ + 2 * 4 * (handoffs_cap_ + 1));
  ids_off_ = align4(hf_off_ + static_cast<size_t>(rows_cap_ * hidden_));
  w_off_ = align4(ids_off_ + static_cast<size_t>(rows_cap_ * topk_));
  out_off_ = align4(w_off_ + static_cast<size_t>(rows_cap_ * topk_));
  const size_t words = out_off_ + static_cast<size_t>(rows_cap_ * hidden_);
  data_ = gpu::MappedBuffer();  // a larger one replaces it: graphs keyed on the old address are recaptured
  data_.reserve(words * 4);
  seen_at_.assign(handoffs_cap_, {});
  released_at_.assign(handoffs_cap_, {});
}

void ZeroCopyHandoff::key(std::vector<const void*>& k) const {
  k.push_back(data_.host<void>());
  k.push_back(reinterpret_cast<const void*>(handoffs_cap_));
  k.push_back(reinterpret_cast<const void*>(static_cast<uintptr_t>(rows_cap_)));
}

void ZeroCopyHandoff::enqueue_down(size_t j, const float* hf, const int32_t* ids, const float* w, int64_t rn, gpu::Stream& s) {
  if (j >= handoffs_cap_ || rn > rows_cap_) fail(ErrorKind::internal, "zero-copy hand-off: more hand-offs or rows than reserved");
  gpu::handoff_down(hf, ids, w, rn * hidden_, rn * topk_, data_.device<float>() + hf_off_, data_.device<int32_t>() + ids_off_,
                    data_.device<float>() + w_off_, flag_dev(ready_index(j)), ts_dev(j), s);
}

void ZeroCopyHandoff::enqueue_wait_add(size_t j, float* d, int64_t rn, gpu::Stream& s) {
  if (j >= handoffs_cap_ || rn > rows_cap_) fail(ErrorKind::internal, "zero-copy hand-off: more hand-offs or rows than reserved");
  gpu::handoff_wait_add(flag_dev(done_index(j)), data_.device<float>() + out_off_, rn * hidden_, d, ts_dev(j) + 2, s);
}

void ZeroCopyHandoff::enqueue_end(gpu::Stream& s) { gpu::handoff_signal(flag_dev(end_index()), ts_dev(handoffs_cap_), s); }

void ZeroCopyHandoff::begin_step(size_t handoffs) {
  if (handoffs > handoffs_cap_) fail(ErrorKind::internal, "zero-copy hand-off: more hand-offs than reserved");
  handoffs_ = handoffs;
  released_ = 0;
  for (size_t i = 0; i <= end_index(); ++i) std::atomic_ref<uint32_t>(*flag(i)).store(0, std::memory_order_relaxed);
  std::memset(ts(0), 0, 4 * 8 * (handoffs_cap_ + 1));
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ZeroCopyHandoff::spin(const uint32_t* f, const std::string& what, gpu::Stream& s) {
  const auto t0 = Clock::now();
  auto next_query = t0 + std::chrono::milliseconds(1);
  for (uint64_t i = 0;; ++i) {
    if (load_acquire(f) != 0) return;
    cpu_relax();
    if ((i & 63) != 0) continue;
    const auto now = Clock::now();
    if (now < next_query) continue;
    next_query = now + std::chrono::milliseconds(1);
    // An error in the step's kernels shows here; a stream that finished without the flag is a bug.
    if (s.query() && load_acquire(f) == 0) fail(ErrorKind::internal, "zero-copy hand-off: the GPU finished the step without " + what);
    if (std::chrono::duration<double>(now - t0).count() > timeout_s_)
      fail(ErrorKind::device, "zero-copy hand-off: " + what + " did not come from the GPU within " + std::to_string(timeout_s_) +
                                  " s (--gpu-handoff-timeout); the step is abandoned");
  }
}

void ZeroCopyHandoff::wait_ready(size_t j, int64_t layer, gpu::Stream& s) {
  spin(flag(ready_index(j)), "layer " + std::to_string(layer) + "'s hand-off (normed hidden states and routing)", s);
  seen_at_[j] = Clock::now();
}

void ZeroCopyHandoff::release(size_t j) {
  released_at_[j] = Clock::now();
  store_release(flag(done_index(j)), gpu::kHandoffRelease);
  released_ = j + 1;
}

void ZeroCopyHandoff::wait_end(gpu::Stream& s) {
  spin(flag(end_index()), "the end of the step", s);
  end_at_ = Clock::now();
}

bool ZeroCopyHandoff::abort(gpu::Stream& s) noexcept {
  for (size_t j = released_; j < handoffs_; ++j) store_release(flag(done_index(j)), gpu::kHandoffAbort);
  released_ = handoffs_;
  try {
    const auto t0 = Clock::now();
    while (!s.query()) {
      if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s_) return false;
      cpu_relax();
    }
    s.synchronize();
    begin_step(0);  // the GPU reset the done flags it saw; the ready and end flags are cleared here
    return true;
  } catch (...) {
    return false;  // an error in the step's kernels: the context is unusable
  }
}

double ZeroCopyHandoff::step_seconds() const {
  auto dev = [](uint64_t a, uint64_t b) { return b > a ? static_cast<double>(b - a) * 1e-9 : 0.0; };
  auto host = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  double t = 0;
  for (size_t j = 0; j < handoffs_; ++j) {
    const uint64_t* x = ts(j);
    t += dev(x[0], x[1]) + dev(x[2], x[3]);  // the two copy kernels
    // Crossings: release(j) -> GPU sees it ... GPU sets ready(j + 1) (or the end) -> host sees it.
    const bool last = j + 1 == handoffs_;
    const double host_gap = host(released_at_[j], last ? end_at_ : seen_at_[j + 1]);
    const double dev_span = dev(x[2], last ? ts(handoffs_cap_)[0] : ts(j + 1)[1]);
    t += std::max(0.0, host_gap - dev_span);
  }
  return t;
}

}  // namespace hmoe
