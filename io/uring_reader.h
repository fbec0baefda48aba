// Asynchronous block reads from one file: io_uring (liburing) when the kernel
// allows it, else a few pread worker threads. The PLE table (io/ple_table.h)
// uses it to read the rows of the next step while earlier layers compute.
//
// Contract: submit() queues a group of reads and returns at once; a driver
// thread (io_uring) or the workers (pread) carry them out, at most
// queue_depth in flight. wait() blocks until every read of the group has
// landed and throws Error(io) naming the file when one failed or came back
// short. Destinations must stay valid until wait() returns. submit() and
// wait() may be called from any thread; one group is waited for once.
// With O_DIRECT files, offsets, lengths and destinations must be aligned to
// kDirectAlign (or the finer alignment direct_io_align() reports).
//
// Issue paths (UringOptions::issue): `driver` (default) - a driver thread
// per ring fills the submission queue and reaps, the submitter only queues;
// `caller` - the submitting thread issues the reads itself (paying the
// kernel's inline O_DIRECT issue) and the driver only reaps; `sqpoll` - the
// submitting thread writes submission entries that a kernel thread, polling,
// issues (one busy kernel thread shared by the rings). `spin_us` > 0 lets
// driver threads and wait() busy-poll that long before sleeping, trading a
// core for the wake-up latency of a sleeping thread.
//
// Ordering: submit(reqs, after) holds the group's reads back until the group
// `after` has completed (failed or not), then issues them. Reads needed
// sooner are then not slowed by reads needed later sharing a saturated
// device queue. A reader being destroyed fails held groups instead.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hmoe::io {

inline constexpr uint64_t kDirectAlign = 4096;

struct ReadRequest {
  uint64_t offset = 0;
  uint32_t len = 0;
  void* dst = nullptr;
};

// One submitted group of reads. Times are steady_clock: submitted (or
// released from behind `after`), issued (the last read handed to the kernel
// or a pread worker), completed (the last read landed).
struct ReadGroup {
  std::vector<ReadRequest> reqs;
  std::chrono::steady_clock::time_point submitted, issued, completed;
  // Filled by the reader.
  int64_t remaining = 0;
  std::atomic<bool> done{false};  // set with `completed`, for spinning waiters
  std::string error;
  std::vector<std::shared_ptr<ReadGroup>> then;  // held until this group completes
};

class BlockReader {
 public:
  virtual ~BlockReader() = default;
  // `after` (may be null or already complete): issue these reads only once it has completed.
  virtual std::shared_ptr<ReadGroup> submit(std::vector<ReadRequest> reqs, const std::shared_ptr<ReadGroup>& after = nullptr) = 0;
  // Returns nanoseconds spent blocked.
  virtual int64_t wait(ReadGroup& g) = 0;
  virtual const char* name() const = 0;
};

enum class UringIssue { driver, caller, sqpoll };
// "driver", "caller" or "sqpoll"; throws Error(invalid_argument) naming `what`.
UringIssue parse_uring_issue(const std::string& what, const std::string& s);
const char* uring_issue_name(UringIssue i);

struct UringOptions {
  unsigned queue_depth = 64;  // reads in flight, shared by the rings (1..4096)
  unsigned rings = 1;         // rings, each with a driver thread (1..64, at most queue_depth)
  UringIssue issue = UringIssue::driver;
  unsigned spin_us = 0;       // busy-poll before sleeping (0..100000)
};

// fd stays owned by the caller and must outlive the reader. Returns nullptr
// and sets *why when io_uring cannot be set up (ENOSYS, EPERM under seccomp,
// ENOMEM for locked memory, SQPOLL refused) or the options are out of range.
// A group's reads are spread over the rings and issued in parallel.
std::unique_ptr<BlockReader> make_uring_reader(int fd, const std::string& path, const UringOptions& opt, std::string* why);
std::unique_ptr<BlockReader> make_pread_reader(int fd, const std::string& path, int threads, unsigned spin_us = 0);

// The offset/length and memory alignment O_DIRECT reads of fd need
// (statx STATX_DIOALIGN, Linux 6.1+), each a power of two; 0 when the kernel
// or filesystem does not say (then kDirectAlign is the safe choice).
struct DirectIoAlign {
  uint32_t offset = 0, memory = 0;
};
DirectIoAlign direct_io_align(int fd);

// Reads one whole group synchronously with pread (used by tests and the
// benchmark's raw baseline); throws Error(io).
void pread_all(int fd, const std::string& path, const std::vector<ReadRequest>& reqs);

}  // namespace hmoe::io
