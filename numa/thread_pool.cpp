#include "numa/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace hmoe::numa {

ThreadPool::ThreadPool(int threads, bool spin, std::vector<int> cpus) : spin_(spin) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { worker_main(i); });
    if (static_cast<size_t>(i) < cpus.size()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[static_cast<size_t>(i)], &set);
      pthread_setaffinity_np(workers_.back().native_handle(), sizeof(set), &set);
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    ++generation_;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(int worker) {
  for (;;) {
    int64_t b = next_.fetch_add(chunk_);
    if (b >= n_) break;
    int64_t e = std::min(n_, b + chunk_);
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
    if (spin_) {
      for (int i = 0; i < 20000; ++i) {
        if (__atomic_load_n(&generation_, __ATOMIC_ACQUIRE) != seen) break;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
      }
    }
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
    }
    run_chunks(id);
    if (active_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> l(mu_);
      done_cv_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const Fn& fn, int64_t grain) {
  if (n <= 0) return;
  const int64_t threads = size();
  if (threads == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  // ~4 chunks per thread balances load without much contention.
  int64_t chunk = std::max<int64_t>(grain, (n + threads * 4 - 1) / (threads * 4));
  {
    std::lock_guard<std::mutex> l(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0);
    error_ = nullptr;
    active_.store(static_cast<int>(workers_.size()));
    __atomic_store_n(&generation_, generation_ + 1, __ATOMIC_RELEASE);
  }
  cv_.notify_all();
  run_chunks(0);
  {
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return active_.load() == 0; });
    fn_ = nullptr;
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace hmoe::numa
