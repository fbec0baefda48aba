// Expert deferral (see expert_deferral.h).
#include "engine/layers/expert_deferral.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "configs/error.h"

namespace hmoe {

ExpertDeferral::ExpertDeferral(int64_t defer, int64_t hidden, bool async) : defer_(defer), hidden_(hidden), async_(async) {
  if (async_) thread_ = std::thread([this] { worker(); });
}

ExpertDeferral::~ExpertDeferral() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void ExpertDeferral::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || has_job_; });
    if (stop_) return;
    has_job_ = false;
    busy_ = true;
    lock.unlock();
    try {
      pfn_(px_.data(), pending_n_, pids_.data(), pw_.data(), pk_, pout_.data());
    } catch (...) {
      lock.lock();
      error_ = std::current_exception();
      busy_ = false;
      cv_.notify_all();
      continue;
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void ExpertDeferral::wait() {
  if (!async_) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !has_job_ && !busy_; });
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
}

void ExpertDeferral::begin_step(std::vector<bool> may_defer) {
  try {
    wait();
  } catch (...) {  // a failed step's deferred work: already reported by that step
  }
  pending_layer_ = -1;
  may_ = std::move(may_defer);
}

void ExpertDeferral::run(int64_t layer, const float* x, int64_t n, const int32_t* ids, const float* w, int64_t k, float* out,
                         const RunFn& run_now) {
  const int64_t H = hidden_;
  if (pending_layer_ >= 0) {
    wait();
    if (pending_layer_ != layer - 1 || pending_n_ != n)
      fail(ErrorKind::internal, "expert deferral: layer " + std::to_string(pending_layer_) + "'s deferred experts reached layer " +
                                    std::to_string(layer) + " (" + std::to_string(n) + " rows, not " + std::to_string(pending_n_) + ")");
    for (int64_t i = 0; i < n * H; ++i) out[i] += pout_[static_cast<size_t>(i)];
    pending_layer_ = -1;
  }
  const bool may = layer >= 0 && static_cast<size_t>(layer) < may_.size() && may_[static_cast<size_t>(layer)];
  const int64_t d = std::min(defer_, k - 1);
  if (!may || d <= 0) {
    run_now(x, n, ids, w, k, out);
    return;
  }
  // Per token: the d lowest weights (ties: the later slot) are deferred, the others keep their order.
  const int64_t kn = k - d;
  now_ids_.resize(static_cast<size_t>(n * kn));
  now_w_.resize(static_cast<size_t>(n * kn));
  pids_.resize(static_cast<size_t>(n * d));
  pw_.resize(static_cast<size_t>(n * d));
  std::vector<int64_t> order(static_cast<size_t>(k));
  std::vector<char> later(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    const float* wt = w + t * k;
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return wt[a] > wt[b]; });
    std::fill(later.begin(), later.end(), 0);
    for (int64_t j = kn; j < k; ++j) later[static_cast<size_t>(order[static_cast<size_t>(j)])] = 1;
    int64_t a = 0, b = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (later[static_cast<size_t>(j)]) {
        pids_[static_cast<size_t>(t * d + b)] = ids[t * k + j];
        pw_[static_cast<size_t>(t * d + b++)] = wt[j];
      } else {
        now_ids_[static_cast<size_t>(t * kn + a)] = ids[t * k + j];
        now_w_[static_cast<size_t>(t * kn + a++)] = wt[j];
      }
    }
  }
  run_now(x, n, now_ids_.data(), now_w_.data(), kn, out);
  px_.assign(x, x + n * H);  // the caller reuses x for the next layer
  pout_.assign(static_cast<size_t>(n * H), 0.0f);
  pending_layer_ = layer;
  pending_n_ = n;
  pk_ = d;
  pfn_ = run_now;
  deferred_pairs_ += n * d;
  if (!async_) {
    pfn_(px_.data(), n, pids_.data(), pw_.data(), d, pout_.data());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    has_job_ = true;
  }
  cv_.notify_all();
}

void ExpertDeferral::end_step() {
  wait();
  if (pending_layer_ >= 0) {
    const int64_t l = pending_layer_;
    pending_layer_ = -1;
    fail(ErrorKind::internal, "expert deferral: layer " + std::to_string(l) + "'s deferred experts were never added (no next layer ran)");
  }
}

}  // namespace hmoe
