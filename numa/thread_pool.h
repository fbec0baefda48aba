// ThreadPool: a fixed set of workers that run one parallel_for at a time.
// NodePools (numa/node_pools.h) keeps one of these per NUMA node.
//
// Contract: parallel_for(n, fn) splits [0, n) into chunks and calls
// fn(begin, end, worker) from the workers (and the calling thread when the
// pool was built with caller_joins); it returns when every chunk is done.
// Exceptions thrown by fn are rethrown (the first) in the caller. Not
// re-entrant: fn must not call parallel_for on the same pool. One caller at a
// time. start()/finish() split parallel_for so that one thread can keep
// several pools (one per node) busy at once.
//
// Waiting: with spin, idle workers and the waiting caller busy-wait for about
// 50 microseconds before sleeping on a condition variable; without it they
// sleep at once (HMOE_POWER_SAVING=1). Start-up and shutdown are safe in both
// modes at any time between jobs.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hmoe::numa {

class ThreadPool {
 public:
  using Fn = std::function<void(int64_t begin, int64_t end, int worker)>;
  // threads <= 0: hardware concurrency. The caller is one of the threads.
  // cpus[i], when given, pins worker i (i >= 1) to that CPU.
  explicit ThreadPool(int threads, bool spin = true, std::vector<int> cpus = {});
  // threads in total; affinity[i] (if non-empty) is the CPU set of thread i.
  // caller_joins: thread 0 is the caller of parallel_for/finish; otherwise
  // all `threads` are workers and the caller only waits. Affinity that the
  // OS refuses is skipped and counted in binding_failures().
  ThreadPool(int threads, bool spin, const std::vector<std::vector<int>>& affinity, bool caller_joins);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + (caller_joins_ ? 1 : 0); }
  int binding_failures() const { return binding_failures_; }
  // grain: minimum items per chunk. Chunks are ~n / (4 threads) items;
  // max_chunk > 0 caps them (items that are each a lot of work: a small step
  // of big items then ends within one item of balance).
  void parallel_for(int64_t n, const Fn& fn, int64_t grain = 1, int64_t max_chunk = 0);
  // Asynchronous halves: fn must stay alive until finish() returns.
  void start(int64_t n, const Fn& fn, int64_t grain = 1, int64_t max_chunk = 0);
  void finish();

 private:
  void worker_main(int id);
  void run_chunks(int worker);

  std::vector<std::thread> workers_;
  bool caller_joins_ = true;
  bool spin_ = true;
  int binding_failures_ = 0;
  bool inline_job_ = false;  // start() ran the job on the caller already

  std::mutex mu_;
  std::condition_variable wake_cv_, done_cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> pending_{0};

  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  std::mutex error_mu_;
};

}  // namespace hmoe::numa
