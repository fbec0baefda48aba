// Random-read probe of one file: how fast this machine's storage serves the
// small random reads a PLE table file gets (io/ple_table.h). Used by
// `hmoe bench disk` (compare with the reads/s `hmoe plan` says a model
// needs) and by bench_ple's raw baseline.
//
// Contract: probe_random_reads reads `block`-byte blocks at random aligned
// offsets of `path` (O_DIRECT where the filesystem allows it, else through
// the page cache, said in `direct`), with io_uring (pread workers where
// io_uring cannot be set up, said in `reader`):
//   1. queue depth `queue_depth` over `rings` rings for about `seconds`: IOPS, MB/s;
//   2. one read at a time (QD 1): latency;
//   3. groups of `group` reads issued at once, the next group once the last
//      has landed (one PLE module's rows for one token): p50 / p90 of a
//      group's submit-to-last-read time.
// Errors are hmoe::Error naming the path: invalid_argument for a directory,
// a file smaller than one block or options out of range; io for what the OS refuses.
#pragma once
#include <cstdint>
#include <string>

namespace hmoe::io {

struct ReadProbeOptions {
  uint32_t block = 512;       // bytes per read: a power of two, 512..1 MiB
  double seconds = 3.0;       // phase 1 duration (phases 2 and 3 take about a third of it each)
  unsigned queue_depth = 64;  // phase 1
  unsigned rings = 4;         // phase 1
  int group = 16;             // phase 3 reads per group (1..4096)
};

struct ReadProbeResult {
  uint64_t file_bytes = 0;
  bool direct = false;        // O_DIRECT (page cache bypassed)
  std::string reader;         // "io_uring" or "pread"
  double iops = 0, mbps = 0;  // phase 1
  double qd1_us = 0;          // phase 2, mean
  double group_p50_us = 0, group_p90_us = 0;  // phase 3
};

ReadProbeResult probe_random_reads(const std::string& path, const ReadProbeOptions& opt);

}  // namespace hmoe::io
