// PleTable: the per-layer n-gram embedding tables (PLE / Engram memory),
// served from a table file on fast storage instead of RAM. Such tables are
// tens to hundreds of GB but a step needs only a few rows per token, and the
// rows are known as soon as the tokens are, so they are read ahead while
// earlier layers compute.
//
// The table file is written once from the checkpoint's tensors (header with
// format version, shapes, dtype and a checksum of the source; data
// page-aligned so that O_DIRECT can read it) and mapped or read directly at
// later starts. A stale (other source, version or shapes) or truncated table
// file of ours is detected and rewritten with a notice; a file that is not
// ours, or a path that is a directory, is an error and is never touched.
//
// Backends (PleOptions::backend):
//   io_uring  O_DIRECT reads of the blocks holding the requested rows into an
//             aligned staging buffer, queue depth configurable; falls back to
//             pread workers (with a notice) when io_uring is unavailable.
//             Blocks are the finest O_DIRECT alignment the file allows
//             (statx; 512 B on most disks, else 4 KiB), so a 128-byte row
//             costs a 512-byte read, not a 4 KiB one. With `ordered`, a
//             table's reads are held until those of the table prefetched
//             before it have landed: tables are prefetched in the order the
//             step needs them, and the first is not slowed by the later ones
//             on a device whose queue is already saturated. Rows read are
//             kept in a row cache (cache_bytes, io/ple_row_cache.h) and
//             served from memory when asked for again.
//   pread     the same with worker threads doing pread.
//   mmap      the file mapped; madvise(WILLNEED) on the pages needed.
//   ram       the tables copied into memory; no table file at all.
// With a file backend, PleOptions::ram_tables still keeps chosen tables in
// memory (table_in_ram()); the file holds every table regardless.
//
// Contract: prefetch(t, rows) starts fetching the rows of table t for one
// step (duplicates are read once); row(t, i) points at the i-th requested row
// once wait(t) has returned, valid until the next prefetch(t). Calls for one
// table come from one thread (the step thread); different tables may be in
// flight at once. Errors are hmoe::Error naming the path: io for what the OS
// refused, invalid_argument for bad paths/options, bad_model for sources.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/uring_reader.h"

namespace hmoe::io {

enum class PleBackend { io_uring, mmap, pread, ram };
// "io_uring", "mmap", "pread" or "ram"; throws Error(invalid_argument) naming `what`.
PleBackend parse_ple_backend(const std::string& what, const std::string& s);
const char* ple_backend_name(PleBackend b);

// One table as stored in the checkpoint (row-major [rows, cols]).
struct PleSource {
  std::string name;
  DType dtype = DType::bf16;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;  // rows * cols * dtype_size bytes
  size_t row_bytes() const { return static_cast<size_t>(cols) * dtype_size(dtype); }
  size_t nbytes() const { return static_cast<size_t>(rows) * row_bytes(); }
};

struct PleOptions {
  std::string path;                   // table file (unused by ram)
  PleBackend backend = PleBackend::io_uring;
  unsigned queue_depth = 64;          // io_uring reads in flight (shared by the rings)
  unsigned uring_rings = 4;           // io_uring rings, each with a driver thread issuing reads
  UringIssue uring_issue = UringIssue::driver;  // see io/uring_reader.h
  unsigned spin_us = 0;               // readers and wait() busy-poll this long before sleeping
  int pread_threads = 4;              // pread workers (and the io_uring fallback)
  bool direct = true;                 // O_DIRECT for io_uring and pread
  uint32_t max_read_bytes = 128 << 10;  // adjacent blocks are merged into reads up to this size
  int64_t read_align = 0;             // read block size (512..4096, power of two); 0: the finest O_DIRECT allows
  bool ordered = true;                // hold a table's reads until the previous prefetch's have landed
  size_t cache_bytes = 0;             // io_uring/pread: rows kept in memory once read (PleRowCache); 0: none
  // File backends: tables (by index; shorter than the table count is padded
  // with false) copied into memory at open, as with the ram backend, while
  // the others are read from the file. For the first modules of a step,
  // whose reads have only a layer or two of compute to hide behind.
  std::vector<bool> ram_tables;
  std::string progress = "auto";      // Progress mode while writing the file
};

// Counters since construction (or reset_stats()). Times in nanoseconds.
struct PleStats {
  int64_t steps = 0;           // wait() calls
  int64_t rows_requested = 0;  // rows asked for, duplicates included
  int64_t rows_unique = 0;     // distinct rows among them
  int64_t rows_cached = 0;     // distinct rows served from the row cache (not read)
  int64_t reads = 0;           // read requests issued (or pages advised for mmap)
  int64_t bytes_read = 0;      // bytes those reads cover
  int64_t wait_ns = 0;         // time the step thread spent blocked in wait()
  int64_t io_ns = 0;           // time from submit to the last completion, summed
  int64_t issue_ns = 0;        // of which: submit to the last read handed to the kernel (or a worker)
  // Share of the I/O time that overlapped compute: 1 - wait/io (1 when no I/O).
  double hidden_fraction() const;
  PleStats& operator+=(const PleStats& o);
};

enum class PleFileState { ok, missing, stale, truncated, foreign, not_a_file };
const char* ple_file_state_name(PleFileState s);

// Inspects a table file against the sources; *why explains anything but ok.
PleFileState check_ple_file(const std::string& path, const std::vector<PleSource>& sources, std::string* why);
// Writes the table file (via a temporary file renamed into place), showing
// progress. Throws Error(io) on a read-only or full filesystem, leaving no file.
// progress: "none" is silent, anything else prints a line to stderr about once a second.
void write_ple_file(const std::string& path, const std::vector<PleSource>& sources, const std::string& progress);
// The checksum of the source recorded in the header: the names, dtypes and
// shapes, and the bytes (all of them up to 256 MiB per table, else 4096
// evenly spaced 4 KiB samples plus both ends).
uint64_t ple_source_checksum(const std::vector<PleSource>& sources);

class PleTable {
 public:
  // Validates the sources, then (file backends) checks the table file,
  // rewriting it when missing, stale or truncated, and opens it.
  static std::unique_ptr<PleTable> open(const std::vector<PleSource>& sources, const PleOptions& opt);
  ~PleTable();
  PleTable(const PleTable&) = delete;
  PleTable& operator=(const PleTable&) = delete;

  int64_t tables() const { return static_cast<int64_t>(tables_.size()); }
  int64_t rows(int t) const;
  int64_t cols(int t) const;
  DType dtype(int t) const;
  // The backend in use (io_uring may have fallen back to pread).
  PleBackend backend() const { return backend_; }
  // Why the requested backend was not used, or why the file was rewritten; empty otherwise.
  const std::string& notice() const { return notice_; }
  // True when this open wrote the table file.
  bool file_written() const { return file_written_; }
  const std::string& path() const { return path_; }

  // Starts fetching rows[0..n) of table t; rows must lie in [0, rows(t)).
  void prefetch(int t, const int64_t* rows, size_t n);
  // Blocks until the rows of the last prefetch(t) are readable; returns ns blocked.
  int64_t wait(int t);
  // The i-th row of the last prefetch(t) (after wait(t)).
  const uint8_t* row(int t, size_t i) const;

  // All tables, and table t alone.
  PleStats stats() const;
  const PleStats& table_stats(int t) const;
  void reset_stats();
  // True when table t is served from memory (the ram backend, or ram_tables).
  bool table_in_ram(int t) const;
  // Bytes per read block (io_uring/pread: see read_align; mmap: the page).
  uint32_t read_block() const;

  struct Impl;

 private:
  PleTable() = default;
  struct TableSlot;
  PleBackend backend_ = PleBackend::ram;
  std::string path_, notice_;
  bool file_written_ = false;
  std::vector<std::unique_ptr<TableSlot>> tables_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe::io
