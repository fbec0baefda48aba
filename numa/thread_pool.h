// ThreadPool: a fixed set of workers that run one parallel_for at a time.
//
// Contract: parallel_for(n, fn) splits [0, n) into chunks and calls
// fn(begin, end, worker) from the workers and the calling thread; it returns
// when every chunk is done. Exceptions thrown by fn are rethrown (the first)
// in the caller. Not re-entrant: fn must not call parallel_for on the same
// pool. One caller at a time (the engine's step thread).
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
  // threads <= 0: hardware concurrency. spin: busy-wait briefly before sleeping.
  explicit ThreadPool(int threads, bool spin = true, std::vector<int> cpus = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // grain: minimum items per chunk.
  void parallel_for(int64_t n, const Fn& fn, int64_t grain = 1);

 private:
  void worker_main(int id);
  void run_chunks(int worker);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  bool spin_ = true;
  const Fn* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};
  std::exception_ptr error_;
  std::mutex error_mu_;
};

}  // namespace hmoe::numa
