#include "server/worker_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace hmoe::server {

WorkerPool::WorkerPool(int threads, int nice) : guard_(ctx_.get_executor()) {
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this, nice] {
      if (nice > 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice);  // best effort
      for (;;) {
        try {
          ctx_.run();
          return;
        } catch (const std::exception& e) {  // a bug in a job: log it, keep the thread
          std::fprintf(stderr, "hmoe serve: internal error in a worker job: %s\n", e.what());
        }
      }
    });
}

WorkerPool::~WorkerPool() {
  guard_.reset();
  ctx_.stop();
  for (auto& t : threads_) t.join();
}

}  // namespace hmoe::server
