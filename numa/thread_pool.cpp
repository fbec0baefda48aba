#include "numa/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

namespace hmoe::numa {

namespace {

// About 50 us of pause instructions before a waiter goes to sleep.
constexpr int kSpinIterations = 4000;

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

bool pin(std::thread& t, const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return pthread_setaffinity_np(t.native_handle(), sizeof(set), &set) == 0;
}

}  // namespace

ThreadPool::ThreadPool(int threads, bool spin, std::vector<int> cpus) : spin_(spin) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { worker_main(i); });
    if (static_cast<size_t>(i) < cpus.size() && !pin(workers_.back(), {cpus[static_cast<size_t>(i)]})) ++binding_failures_;
  }
}

ThreadPool::ThreadPool(int threads, bool spin, const std::vector<std::vector<int>>& affinity, bool caller_joins)
    : caller_joins_(caller_joins), spin_(spin) {
  if (threads <= 0) threads = 1;
  const int first = caller_joins ? 1 : 0;
  for (int i = first; i < threads; ++i) {
    const int id = static_cast<int>(workers_.size()) + first;
    workers_.emplace_back([this, id] { worker_main(id); });
    if (static_cast<size_t>(i) < affinity.size() && !pin(workers_.back(), affinity[static_cast<size_t>(i)])) ++binding_failures_;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(int worker) {
  for (;;) {
    const int64_t b = next_.fetch_add(chunk_, std::memory_order_relaxed);
    if (b >= n_) break;
    const int64_t e = std::min(n_, b + chunk_);
    try {
      (*fn_)(b, e, worker);
    } catch (...) {
      std::lock_guard<std::mutex> l(error_mu_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_);
    }
  }
}

void ThreadPool::worker_main(int id) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    if (spin_)
      for (int i = 0; i < kSpinIterations && g == seen; ++i) {
        cpu_relax();
        g = generation_.load(std::memory_order_acquire);
      }
    if (g == seen) {
      std::unique_lock<std::mutex> l(mu_);
      wake_cv_.wait(l, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    run_chunks(id);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> l(mu_);
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::start(int64_t n, const Fn& fn, int64_t grain, int64_t max_chunk) {
  inline_job_ = false;
  error_ = nullptr;
  if (n <= 0) {
    inline_job_ = true;
    return;
  }
  const int64_t threads = size();
  if (workers_.empty() || (caller_joins_ && (threads == 1 || n <= grain))) {
    inline_job_ = true;
    try {
      fn(0, n, 0);
    } catch (...) {
      error_ = std::current_exception();
    }
    return;
  }
  // ~4 chunks per thread balances load without much contention.
  int64_t chunk = (n + threads * 4 - 1) / (threads * 4);
  if (max_chunk > 0) chunk = std::min(chunk, max_chunk);
  chunk = std::max<int64_t>(std::max<int64_t>(grain, 1), chunk);
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  next_.store(0, std::memory_order_relaxed);
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> l(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_cv_.notify_all();
}

void ThreadPool::finish() {
  if (!inline_job_) {
    if (caller_joins_) run_chunks(0);
    if (spin_)
      for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> l(mu_);
      done_cv_.wait(l, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    fn_ = nullptr;
  }
  inline_job_ = false;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadPool::parallel_for(int64_t n, const Fn& fn, int64_t grain, int64_t max_chunk) {
  start(n, fn, grain, max_chunk);
  finish();
}

}  // namespace hmoe::numa
