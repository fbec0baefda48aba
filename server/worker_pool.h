// WorkerPool: the threads that do the HTTP server's CPU work off its I/O
// thread (request parsing, chat template rendering, tokenization). An
// io_context run by N threads; post() work to executor().
//
// The threads run at a raised nice value (setpriority on each thread): on a
// machine whose cores are busy decoding, preparing one huge prompt then
// takes the CPU the engine and the I/O thread leave, instead of taking
// half of it from the running streams. 0 keeps the process's priority.
//
// Thread safety: executor() and post from any thread. The destructor stops
// the context (queued work is dropped) and joins the threads.
#pragma once
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <optional>
#include <thread>
#include <vector>

namespace hmoe::server {

class WorkerPool {
 public:
  WorkerPool(int threads, int nice);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  boost::asio::io_context::executor_type executor() { return ctx_.get_executor(); }

 private:
  boost::asio::io_context ctx_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard_;
  std::vector<std::thread> threads_;
};

}  // namespace hmoe::server
