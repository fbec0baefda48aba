// io_uring and pread implementations of BlockReader. By default each
// io_uring ring's driver thread owns it: submit() only queues the reads and
// pokes an eventfd the ring polls, so the step thread pays neither for
// issuing reads (O_DIRECT issue runs inline in io_uring_submit) nor for
// reaping them; several rings issue one group's reads in parallel. The
// `caller` and `sqpoll` issue paths fill the submission queue from submit()
// (under the ring's lock) and leave the driver only the reaping.
#include "io/uring_reader.h"

#include <liburing.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "configs/error.h"

namespace hmoe::io {

namespace {

using Clock = std::chrono::steady_clock;

struct Pending {
  std::shared_ptr<ReadGroup> group;
  ReadRequest req;
};

// Completion bookkeeping shared by both readers, and the groups held back
// behind an earlier one (submit(reqs, after)): when a group completes, the
// groups held behind it go to `dispatch` (or fail, once the reader closes).
class GroupTracker {
 public:
  using Dispatch = std::function<void(const std::shared_ptr<ReadGroup>&)>;
  GroupTracker(Dispatch dispatch, unsigned spin_us) : dispatch_(std::move(dispatch)), spin_(std::chrono::microseconds(spin_us)) {}

  // Starts g now (an empty group completes at once), or holds it behind `after`.
  void start(const std::shared_ptr<ReadGroup>& g, const std::shared_ptr<ReadGroup>& after) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      g->submitted = Clock::now();
      g->remaining = static_cast<int64_t>(g->reqs.size());
      if (g->reqs.empty()) {
        g->issued = g->completed = g->submitted;
        g->done.store(true, std::memory_order_release);
        return;
      }
      if (after && after->remaining > 0 && !closing_) {
        after->then.push_back(g);
        return;
      }
    }
    dispatch_(g);
  }
  void done_one(ReadGroup& g, const std::string& err) {
    std::vector<std::shared_ptr<ReadGroup>> released;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!err.empty() && g.error.empty()) g.error = err;
      if (--g.remaining == 0) complete(g, Clock::now(), released);
    }
    cv_.notify_all();
    release(released);
  }
  void done_many(std::vector<std::pair<std::shared_ptr<ReadGroup>, std::string>>& done) {
    if (done.empty()) return;
    std::vector<std::shared_ptr<ReadGroup>> released;
    bool any = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      const auto now = Clock::now();
      for (auto& [g, err] : done) {
        if (!err.empty() && g->error.empty()) g->error = err;
        if (--g->remaining == 0) {
          complete(*g, now, released);
          any = true;
        }
      }
    }
    if (any) cv_.notify_all();
    release(released);
  }
  // Some of g's reads were handed to the kernel (or a worker) at `at`.
  void issued(ReadGroup& g, Clock::time_point at) {
    std::lock_guard<std::mutex> lk(mu_);
    if (at > g.issued) g.issued = at;
  }
  int64_t wait(ReadGroup& g, const std::string& path) {
    const auto t0 = Clock::now();
    if (spin_.count() > 0)
      while (!g.done.load(std::memory_order_acquire) && Clock::now() - t0 < spin_) {
      }
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return g.remaining == 0; });
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    if (!g.error.empty()) fail(ErrorKind::io, path + ": " + g.error);
    return ns;
  }
  // From now on groups held behind others fail instead of being issued.
  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    closing_ = true;
  }

 private:
  void complete(ReadGroup& g, Clock::time_point now, std::vector<std::shared_ptr<ReadGroup>>& released) {
    g.completed = now;
    if (g.issued < g.submitted) g.issued = now;  // failed before being issued
    g.done.store(true, std::memory_order_release);
    for (auto& n : g.then) released.push_back(std::move(n));
    g.then.clear();
  }
  void release(std::vector<std::shared_ptr<ReadGroup>>& released) {
    while (!released.empty()) {
      auto g = std::move(released.back());
      released.pop_back();
      bool closing;
      {
        std::lock_guard<std::mutex> lk(mu_);
        closing = closing_;
        if (closing) {
          g->error = "reader closed before the read was issued";
          g->remaining = 0;
          complete(*g, Clock::now(), released);
        } else {
          g->submitted = Clock::now();
        }
      }
      if (closing) cv_.notify_all();
      else dispatch_(g);
    }
  }
  Dispatch dispatch_;
  const Clock::duration spin_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closing_ = false;
};

std::string read_error(const ReadRequest& r, int err) {
  return "read of " + std::to_string(r.len) + " bytes at offset " + std::to_string(r.offset) + " failed: " + std::strerror(err);
}

// One ring and its driver thread. Several rings share one GroupTracker, so a
// group's reads can be spread over them. In the `driver` issue path only the
// driver touches the submission queue; in `caller` and `sqpoll` enqueue()
// fills it under mu_, and so does the driver (reads that waited for a free
// slot, short-read remainders, its wake-up poll).
class UringRing {
 public:
  UringRing(int fd, unsigned qd, const UringOptions& opt, GroupTracker& tracker)
      : fd_(fd), qd_(qd), issue_(opt.issue), spin_(std::chrono::microseconds(opt.spin_us)), tracker_(tracker) {}
  // attach_to: in sqpoll, the ring whose kernel polling thread this one shares (null for the first).
  bool init(std::string* why, const UringRing* attach_to) {
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      if (why) *why = std::string("eventfd: ") + std::strerror(errno);
      return false;
    }
    io_uring_params p{};
    if (issue_ == UringIssue::sqpoll) {
      p.flags = IORING_SETUP_SQPOLL;
      p.sq_thread_idle = 10;  // ms of polling after the last submission before the kernel thread sleeps (a decode step is shorter)
      if (attach_to) {
        p.flags |= IORING_SETUP_ATTACH_WQ;
        p.wq_fd = static_cast<unsigned>(attach_to->ring_.ring_fd);
      }
    }
    const int e = io_uring_queue_init_params(qd_ + 2, &ring_, &p);
    if (e < 0) {
      if (why) *why = std::string("io_uring_queue_init") + (issue_ == UringIssue::sqpoll ? " with SQPOLL: " : ": ") + std::strerror(-e);
      ::close(wake_fd_);
      wake_fd_ = -1;
      return false;
    }
    ops_.resize(qd_);
    for (unsigned i = 0; i < qd_; ++i) free_ops_.push_back(i);
    {
      std::lock_guard<std::mutex> lk(mu_);
      arm_wake();
      io_uring_submit(&ring_);
    }
    driver_ = std::thread([this] { drive(); });
    return true;
  }
  ~UringRing() {
    if (driver_.joinable()) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
      }
      wake();
      driver_.join();
    }
    if (wake_fd_ >= 0) {
      io_uring_queue_exit(&ring_);
      ::close(wake_fd_);
    }
  }

  // Queues reads i = first, first + step, ... of g (stride over the rings).
  void enqueue(const std::shared_ptr<ReadGroup>& g, size_t first, size_t step) {
    if (issue_ == UringIssue::driver) {
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (size_t i = first; i < g->reqs.size(); i += step) pending_.push_back({g, g->reqs[i]});
      }
      wake();
      return;
    }
    std::vector<ReadGroup*> issued;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (size_t i = first; i < g->reqs.size(); i += step) pending_.push_back({g, g->reqs[i]});
      fill_sq_locked(issued);
      io_uring_submit(&ring_);
    }
    stamp(issued);
  }

 private:
  static constexpr uint64_t kWakeTag = ~uint64_t{0};

  void wake() {
    const uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
  // A poll on the eventfd: submit() and the destructor write to it to wake
  // the driver out of io_uring_wait_cqe. Needs mu_ (or the driver path).
  void arm_wake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_poll_add(sqe, wake_fd_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }
  // Moves pending reads into submission entries while slots are free;
  // `issued` collects their groups. Needs mu_.
  void fill_sq_locked(std::vector<ReadGroup*>& issued) {
    // The ring has queue depth + 2 entries and at most queue depth reads plus
    // one poll are ever unconsumed, so an entry is always free; should the
    // kernel (SQPOLL) lag, the reads stay pending for the next round.
    while (!pending_.empty() && !free_ops_.empty() && io_uring_sq_space_left(&ring_) > 1) {
      const unsigned slot = free_ops_.back();
      free_ops_.pop_back();
      ops_[slot] = std::move(pending_.front());
      pending_.pop_front();
      const ReadRequest& r = ops_[slot].req;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_read(sqe, fd_, r.dst, r.len, r.offset);
      io_uring_sqe_set_data64(sqe, slot);
      if (issued.empty() || issued.back() != ops_[slot].group.get()) issued.push_back(ops_[slot].group.get());
    }
  }
  void stamp(std::vector<ReadGroup*>& issued) {
    if (issued.empty()) return;
    const auto now = Clock::now();
    for (ReadGroup* g : issued) tracker_.issued(*g, now);
    issued.clear();
  }

  // The driver reaps completions; in the `driver` issue path it also fills
  // the submission queue, so the step thread never pays for issuing reads.
  void drive() {
    std::vector<std::pair<uint64_t, int>> got;
    std::vector<std::pair<std::shared_ptr<ReadGroup>, std::string>> finished;
    std::vector<ReadGroup*> issued;
    bool stopping = false, idle = true;
    const bool owns_sq = issue_ == UringIssue::driver;
    for (;;) {
      finished.clear();
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_ && !stopping) {
          stopping = true;
          for (auto& p : pending_) finished.push_back({std::move(p.group), "reader closed before the read was issued"});
          pending_.clear();
        }
        fill_sq_locked(issued);
        if (!owns_sq) io_uring_submit(&ring_);
        idle = free_ops_.size() == qd_;
      }
      tracker_.done_many(finished);
      if (stopping && idle) return;
      if (owns_sq) io_uring_submit(&ring_);
      stamp(issued);
      io_uring_cqe* cqe = nullptr;
      int e = 0;
      if (spin_.count() > 0 && !idle) {  // reads in flight: poll for a while before sleeping
        const auto t0 = Clock::now();
        while ((e = io_uring_peek_cqe(&ring_, &cqe)) == -EAGAIN && Clock::now() - t0 < spin_) {
        }
      }
      if (!cqe) e = io_uring_wait_cqe(&ring_, &cqe);
      if (e == -EINTR) continue;
      if (e < 0) {
        fail_all(std::string("io_uring_wait_cqe: ") + std::strerror(-e));
        return;
      }
      io_uring_cqe* cqes[64];
      const unsigned k = io_uring_peek_batch_cqe(&ring_, cqes, 64);
      got.clear();
      for (unsigned i = 0; i < k; ++i) got.push_back({io_uring_cqe_get_data64(cqes[i]), cqes[i]->res});
      io_uring_cq_advance(&ring_, k);
      finished.clear();
      std::vector<Pending> retry;
      bool rearm = false;
      std::vector<unsigned> freed;
      for (const auto& [tag, res] : got) {
        if (tag == kWakeTag) {
          uint64_t v;
          while (::read(wake_fd_, &v, sizeof(v)) < 0 && errno == EINTR) {
          }
          rearm = true;
          continue;
        }
        Pending op = std::move(ops_[tag]);
        ops_[tag] = {};
        freed.push_back(static_cast<unsigned>(tag));
        std::string err;
        if (res < 0) {
          err = read_error(op.req, -res);
        } else if (res == 0) {
          err = "read at offset " + std::to_string(op.req.offset) + " hit the end of the file (truncated?)";
        } else if (static_cast<uint32_t>(res) < op.req.len) {  // short read: queue the rest first
          ReadRequest rest{op.req.offset + static_cast<uint64_t>(res), op.req.len - static_cast<uint32_t>(res),
                           static_cast<uint8_t*>(op.req.dst) + res};
          retry.push_back({op.group, rest});
          continue;
        }
        finished.push_back({std::move(op.group), std::move(err)});
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (unsigned f : freed) free_ops_.push_back(f);
        for (auto it = retry.rbegin(); it != retry.rend(); ++it) pending_.push_front(std::move(*it));
        if (rearm) arm_wake();
      }
      tracker_.done_many(finished);
    }
  }

  void fail_all(const std::string& err) {
    std::vector<Pending> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& p : pending_) all.push_back(std::move(p));
      pending_.clear();
    }
    for (auto& o : ops_)
      if (o.group) all.push_back(std::move(o));
    for (auto& p : all) tracker_.done_one(*p.group, err);
  }

  int fd_;
  unsigned qd_;
  UringIssue issue_;
  Clock::duration spin_;
  int wake_fd_ = -1;
  io_uring ring_{};
  std::mutex mu_;  // guards pending_, free_ops_, stop_, and the submission queue outside the `driver` path
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::vector<Pending> ops_;  // slot -> read in flight; a slot is written by whoever holds it
  std::vector<unsigned> free_ops_;
  GroupTracker& tracker_;
  std::thread driver_;
};

// The kernel issues an O_DIRECT read inline in io_uring_submit (several
// microseconds each on a virtio or NVMe queue), so one thread issues a
// group's reads one after another; with several rings (and, in the `driver`
// path, driver threads) a group is issued in parallel, each ring taking
// every rings-th read.
class UringReader final : public BlockReader {
 public:
  UringReader(int fd, std::string path, const UringOptions& opt)
      : path_(std::move(path)), tracker_([this](const std::shared_ptr<ReadGroup>& g) { issue(g); }, opt.spin_us) {
    for (unsigned i = 0; i < opt.rings; ++i)
      rings_.push_back(std::make_unique<UringRing>(fd, std::max(1u, opt.queue_depth / opt.rings), opt, tracker_));
  }
  ~UringReader() override { tracker_.close(); }
  bool init(std::string* why) {
    for (auto& r : rings_)
      if (!r->init(why, r == rings_.front() ? nullptr : rings_.front().get())) return false;
    return true;
  }
  std::shared_ptr<ReadGroup> submit(std::vector<ReadRequest> reqs, const std::shared_ptr<ReadGroup>& after) override {
    auto g = std::make_shared<ReadGroup>();
    g->reqs = std::move(reqs);
    tracker_.start(g, after);
    return g;
  }
  int64_t wait(ReadGroup& g) override { return tracker_.wait(g, path_); }
  const char* name() const override { return "io_uring"; }

 private:
  void issue(const std::shared_ptr<ReadGroup>& g) {
    const size_t used = std::min(rings_.size(), g->reqs.size());
    for (size_t i = 0; i < used; ++i) rings_[i]->enqueue(g, i, used);
  }

  std::string path_;
  GroupTracker tracker_;  // declared before the rings, which refer to it
  std::vector<std::unique_ptr<UringRing>> rings_;
};

// Full pread of one request (retrying short reads and EINTR); returns "" or the error.
std::string pread_one(int fd, const ReadRequest& r) {
  uint64_t done = 0;
  while (done < r.len) {
    const ssize_t got = ::pread(fd, static_cast<uint8_t*>(r.dst) + done, r.len - done, static_cast<off_t>(r.offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return read_error(r, errno);
    }
    if (got == 0) return "read at offset " + std::to_string(r.offset + done) + " hit the end of the file (truncated?)";
    done += static_cast<uint64_t>(got);
  }
  return {};
}

class PreadReader final : public BlockReader {
 public:
  PreadReader(int fd, std::string path, int threads, unsigned spin_us)
      : fd_(fd), path_(std::move(path)), tracker_([this](const std::shared_ptr<ReadGroup>& g) { issue(g); }, spin_us) {
    for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { work(); });
  }
  ~PreadReader() override {
    tracker_.close();
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  std::shared_ptr<ReadGroup> submit(std::vector<ReadRequest> reqs, const std::shared_ptr<ReadGroup>& after) override {
    auto g = std::make_shared<ReadGroup>();
    g->reqs = std::move(reqs);
    tracker_.start(g, after);
    return g;
  }
  int64_t wait(ReadGroup& g) override { return tracker_.wait(g, path_); }
  const char* name() const override { return "pread"; }

 private:
  void issue(const std::shared_ptr<ReadGroup>& g) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (const auto& r : g->reqs) queue_.push_back({g, r});
    }
    cv_.notify_all();
  }
  void work() {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      tracker_.issued(*p.group, Clock::now());
      tracker_.done_one(*p.group, pread_one(fd_, p.req));
    }
  }
  int fd_;
  std::string path_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stop_ = false;
  GroupTracker tracker_;
  std::vector<std::thread> workers_;
};

}  // namespace

UringIssue parse_uring_issue(const std::string& what, const std::string& s) {
  if (s == "driver") return UringIssue::driver;
  if (s == "caller") return UringIssue::caller;
  if (s == "sqpoll") return UringIssue::sqpoll;
  fail(ErrorKind::invalid_argument, what + ": unknown io_uring issue path '" + s + "' (expected driver, caller or sqpoll)");
}

const char* uring_issue_name(UringIssue i) {
  switch (i) {
    case UringIssue::driver: return "driver";
    case UringIssue::caller: return "caller";
    case UringIssue::sqpoll: return "sqpoll";
  }
  return "?";
}

std::unique_ptr<BlockReader> make_uring_reader(int fd, const std::string& path, const UringOptions& opt, std::string* why) {
  if (opt.queue_depth == 0 || opt.queue_depth > 4096) {
    if (why) *why = "queue depth " + std::to_string(opt.queue_depth) + " is outside 1..4096";
    return nullptr;
  }
  if (opt.rings == 0 || opt.rings > 64) {
    if (why) *why = "ring count " + std::to_string(opt.rings) + " is outside 1..64";
    return nullptr;
  }
  if (opt.spin_us > 100000) {
    if (why) *why = "spin of " + std::to_string(opt.spin_us) + " us is outside 0..100000";
    return nullptr;
  }
  UringOptions o = opt;
  o.rings = std::min(opt.rings, opt.queue_depth);
  auto r = std::make_unique<UringReader>(fd, path, o);
  if (!r->init(why)) return nullptr;
  return r;
}

std::unique_ptr<BlockReader> make_pread_reader(int fd, const std::string& path, int threads, unsigned spin_us) {
  return std::make_unique<PreadReader>(fd, path, threads, spin_us);
}

DirectIoAlign direct_io_align(int fd) {
  DirectIoAlign a;
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    auto pow2 = [](uint32_t v) { return v != 0 && (v & (v - 1)) == 0; };
    if (pow2(sx.stx_dio_offset_align) && pow2(sx.stx_dio_mem_align)) {
      a.offset = sx.stx_dio_offset_align;
      a.memory = sx.stx_dio_mem_align;
    }
  }
#else
  (void)fd;
#endif
  return a;
}

void pread_all(int fd, const std::string& path, const std::vector<ReadRequest>& reqs) {
  for (const auto& r : reqs) {
    std::string err = pread_one(fd, r);
    if (!err.empty()) fail(ErrorKind::io, path + ": " + err);
  }
}

}  // namespace hmoe::io
