#include "io/read_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "configs/error.h"
#include "io/uring_reader.h"

namespace hmoe::io {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

ReadProbeResult probe_random_reads(const std::string& path, const ReadProbeOptions& opt) {
  const uint32_t block = opt.block;
  if (block < 512 || block > (1u << 20) || (block & (block - 1)) != 0)
    fail(ErrorKind::invalid_argument, "read probe: block of " + std::to_string(block) + " bytes: must be a power of two in 512..1048576");
  if (!(opt.seconds > 0 && opt.seconds <= 600)) fail(ErrorKind::invalid_argument, "read probe: seconds must be in (0, 600]");
  if (opt.group < 1 || opt.group > 4096) fail(ErrorKind::invalid_argument, "read probe: group of " + std::to_string(opt.group) + " reads: must be in 1..4096");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(ErrorKind::io, path + ": cannot stat: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(ErrorKind::invalid_argument, path + " is a directory; give a file (a PLE table file, or any large file on the disk to probe)");
  ReadProbeResult r;
  r.file_bytes = static_cast<uint64_t>(st.st_size);
  const uint64_t blocks = r.file_bytes / block;
  if (blocks == 0) fail(ErrorKind::invalid_argument, path + " holds " + std::to_string(r.file_bytes) + " bytes, less than one " + std::to_string(block) + "-byte block");

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  r.direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT here (tmpfs): through the page cache
  if (fd < 0) fail(ErrorKind::io, path + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  if (r.direct) {
    const DirectIoAlign a = direct_io_align(fd);
    if (std::max(a.offset, a.memory) > block)
      fail(ErrorKind::invalid_argument, path + ": O_DIRECT reads of this file need " + std::to_string(std::max(a.offset, a.memory)) +
                                            "-byte alignment, more than the " + std::to_string(block) + "-byte block asked for");
  }
  // Reads per phase-1 batch: up to 1024, at most 64 MiB of buffer.
  const size_t batch = std::clamp<size_t>((size_t{64} << 20) / block, 16, 1024);
  const size_t slots = std::max(batch, static_cast<size_t>(opt.group));
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, slots * block) != 0) fail(ErrorKind::out_of_memory, "read probe: cannot allocate its buffer");
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(mem), &std::free);
  std::mt19937_64 rng(0x9E3779B97F4A7C15ull);
  auto random_reads = [&](size_t n) {
    std::vector<ReadRequest> reqs;
    for (size_t i = 0; i < n; ++i) reqs.push_back({(rng() % blocks) * block, block, buf.get() + i * block});
    return reqs;
  };
  auto make_reader = [&](unsigned qd, unsigned rings) {
    std::string why;
    std::unique_ptr<BlockReader> rd = make_uring_reader(fd, path, {.queue_depth = qd, .rings = rings}, &why);
    if (!rd) rd = make_pread_reader(fd, path, static_cast<int>(std::min(qd, 64u)));
    return rd;
  };

  // 1. Throughput at queue depth.
  auto reader = make_reader(std::max(1u, opt.queue_depth), std::max(1u, opt.rings));
  r.reader = reader->name();
  int64_t reads = 0;
  const auto t0 = Clock::now();
  while (since(t0) < opt.seconds) {
    auto g = reader->submit(random_reads(batch));
    reader->wait(*g);
    reads += static_cast<int64_t>(batch);
  }
  const double dt = since(t0);
  r.iops = static_cast<double>(reads) / dt;
  r.mbps = r.iops * block / 1e6;

  // 2. Latency, one read at a time.
  auto one = make_reader(1, 1);
  int n1 = 0;
  const auto t1 = Clock::now();
  while (n1 < 2000 && (n1 < 20 || since(t1) < opt.seconds / 3)) {
    auto g = one->submit(random_reads(1));
    one->wait(*g);
    ++n1;
  }
  r.qd1_us = since(t1) / n1 * 1e6;

  // 3. Groups of `group` reads at once, as one PLE module's rows for one token.
  std::vector<double> lat;
  const auto t2 = Clock::now();
  while (lat.size() < 400 && (lat.size() < 20 || since(t2) < opt.seconds / 3)) {
    auto g = reader->submit(random_reads(static_cast<size_t>(opt.group)));
    reader->wait(*g);
    lat.push_back(std::chrono::duration<double, std::micro>(g->completed - g->submitted).count());
  }
  std::sort(lat.begin(), lat.end());
  r.group_p50_us = lat[lat.size() / 2];
  r.group_p90_us = lat[std::min(lat.size() - 1, lat.size() * 9 / 10)];
  return r;
}

}  // namespace hmoe::io
