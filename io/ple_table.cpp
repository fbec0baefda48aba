// The PLE table file and its four backends. File layout (little-endian):
//   [0, header_bytes)      FileHeader, then one TableEntry per table, zero
//                          padded to a multiple of 4096
//   [data_offset, ...)     each table's rows back to back, starting on a
//                          4096-byte boundary; the file ends on one too
// so that O_DIRECT can read any page of it.
#include "io/ple_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "configs/error.h"
#include "io/mmap_file.h"
#include "io/ple_row_cache.h"

namespace hmoe::io {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'H', 'M', 'O', 'E', '-', 'P', 'L', 'E'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kPage = kDirectAlign;
constexpr uint64_t kMaxHeaderBytes = 1 << 20;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t n_tables;
  uint64_t header_bytes;
  uint64_t file_bytes;
  uint64_t source_checksum;
  uint64_t header_checksum;  // of the header_bytes bytes with this field zero
};
static_assert(sizeof(FileHeader) == 48);

struct TableEntry {
  uint64_t rows, cols, row_bytes, data_offset;
  uint32_t dtype;
  uint32_t name_len;
  char name[88];
};
static_assert(sizeof(TableEntry) == 128);

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// A 64-bit multiply-xor hash over 8-byte words (not cryptographic: it
// detects a changed source, not an adversary).
uint64_t hash_bytes(uint64_t h, const uint8_t* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, n - i);
  h = (h ^ tail ^ (static_cast<uint64_t>(n) << 56)) * kMul;
  return h ^ (h >> 32);
}

std::string errno_text(int e) { return std::strerror(e); }

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<uint8_t, AlignedFree>;

AlignedBuf aligned_alloc_bytes(size_t n) {
  void* p = nullptr;
  if (::posix_memalign(&p, kPage, std::max<size_t>(round_up(n, kPage), kPage)) != 0)
    fail(ErrorKind::out_of_memory, "PLE table: cannot allocate " + std::to_string(n) + " bytes of aligned memory");
  return AlignedBuf(static_cast<uint8_t*>(p));
}

void validate_sources(const std::vector<PleSource>& sources) {
  if (sources.empty()) fail(ErrorKind::internal, "PLE table: no tables given");
  for (const auto& s : sources) {
    if (s.rows <= 0 || s.cols <= 0 || !s.data)
      fail(ErrorKind::bad_model, "PLE table source '" + s.name + "' is empty or has no data");
    if (s.dtype != DType::bf16 && s.dtype != DType::f16 && s.dtype != DType::f32)
      fail(ErrorKind::bad_model, "PLE table source '" + s.name + "' has dtype " + dtype_name(s.dtype) + "; supported: BF16, F16, F32");
  }
}

// The header a file for these sources must have (source checksum included).
std::vector<uint8_t> make_header(const std::vector<PleSource>& sources, uint64_t source_checksum) {
  const uint64_t header_bytes = round_up(sizeof(FileHeader) + sizeof(TableEntry) * sources.size(), kPage);
  std::vector<uint8_t> buf(header_bytes, 0);
  FileHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.n_tables = static_cast<uint32_t>(sources.size());
  h.header_bytes = header_bytes;
  uint64_t off = header_bytes;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    TableEntry e{};
    e.rows = static_cast<uint64_t>(s.rows);
    e.cols = static_cast<uint64_t>(s.cols);
    e.row_bytes = s.row_bytes();
    e.data_offset = off;
    e.dtype = static_cast<uint32_t>(s.dtype);
    e.name_len = static_cast<uint32_t>(std::min<size_t>(s.name.size(), sizeof(e.name)));
    std::memcpy(e.name, s.name.data(), e.name_len);
    std::memcpy(buf.data() + sizeof(FileHeader) + i * sizeof(TableEntry), &e, sizeof(e));
    off = round_up(off + s.nbytes(), kPage);
  }
  h.file_bytes = off;
  h.source_checksum = source_checksum;
  std::memcpy(buf.data(), &h, sizeof(h));
  h.header_checksum = hash_bytes(0x5eed, buf.data(), buf.size());
  std::memcpy(buf.data(), &h, sizeof(h));
  return buf;
}

FileHeader header_of(const std::vector<uint8_t>& buf) {
  FileHeader h;
  std::memcpy(&h, buf.data(), sizeof(h));
  return h;
}

TableEntry entry_of(const std::vector<uint8_t>& buf, size_t i) {
  TableEntry e;
  std::memcpy(&e, buf.data() + sizeof(FileHeader) + i * sizeof(TableEntry), sizeof(e));
  return e;
}

// Reads up to n bytes at offset 0; returns what it got.
std::vector<uint8_t> read_prefix(int fd, size_t n) {
  std::vector<uint8_t> buf(n);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, buf.data() + got, n - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  buf.resize(got);
  return buf;
}

void write_all(int fd, const uint8_t* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail(ErrorKind::io, path + ": write failed: " + errno_text(errno));
    if (w == 0) fail(ErrorKind::io, path + ": write made no progress");
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

}  // namespace

PleBackend parse_ple_backend(const std::string& what, const std::string& s) {
  if (s == "io_uring") return PleBackend::io_uring;
  if (s == "mmap") return PleBackend::mmap;
  if (s == "pread") return PleBackend::pread;
  if (s == "ram") return PleBackend::ram;
  fail(ErrorKind::invalid_argument, what + ": '" + s + "' is not a PLE backend (io_uring, mmap, pread or ram)");
}

const char* ple_backend_name(PleBackend b) {
  switch (b) {
    case PleBackend::io_uring: return "io_uring";
    case PleBackend::mmap: return "mmap";
    case PleBackend::pread: return "pread";
    case PleBackend::ram: return "ram";
  }
  return "?";
}

const char* ple_file_state_name(PleFileState s) {
  switch (s) {
    case PleFileState::ok: return "ok";
    case PleFileState::missing: return "missing";
    case PleFileState::stale: return "stale";
    case PleFileState::truncated: return "truncated";
    case PleFileState::foreign: return "foreign";
    case PleFileState::not_a_file: return "not a file";
  }
  return "?";
}

double PleStats::hidden_fraction() const {
  if (io_ns <= 0) return 1.0;
  return std::clamp(1.0 - static_cast<double>(wait_ns) / static_cast<double>(io_ns), 0.0, 1.0);
}

uint64_t ple_source_checksum(const std::vector<PleSource>& sources) {
  constexpr size_t kFull = size_t{256} << 20, kSample = 4096, kSamples = 4096;
  uint64_t h = 0x9e11;
  for (const auto& s : sources) {
    h = hash_bytes(h, reinterpret_cast<const uint8_t*>(s.name.data()), s.name.size());
    const uint64_t meta[3] = {static_cast<uint64_t>(s.dtype), static_cast<uint64_t>(s.rows), static_cast<uint64_t>(s.cols)};
    h = hash_bytes(h, reinterpret_cast<const uint8_t*>(meta), sizeof(meta));
    const size_t n = s.nbytes();
    if (n <= kFull) {
      h = hash_bytes(h, s.data, n);
      continue;
    }
    const size_t step = (n - kSample) / (kSamples - 1);
    for (size_t i = 0; i < kSamples; ++i) h = hash_bytes(h, s.data + i * step, kSample);
    h = hash_bytes(h, s.data + n - kSample, kSample);
  }
  return h;
}

PleFileState check_ple_file(const std::string& path, const std::vector<PleSource>& sources, std::string* why) {
  auto say = [&](PleFileState st, const std::string& msg) {
    if (why) *why = msg;
    return st;
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return say(PleFileState::missing, "does not exist");
    return say(PleFileState::not_a_file, std::string("cannot stat: ") + errno_text(errno));
  }
  if (S_ISDIR(st.st_mode)) return say(PleFileState::not_a_file, "is a directory, not a table file");
  if (!S_ISREG(st.st_mode)) return say(PleFileState::not_a_file, "is not a regular file");
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) return say(PleFileState::not_a_file, std::string("cannot open: ") + errno_text(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::vector<uint8_t> buf = read_prefix(fd.fd, static_cast<size_t>(std::min<uint64_t>(size, kMaxHeaderBytes)));
  const size_t m = std::min<size_t>(buf.size(), 8);
  if (std::memcmp(buf.data(), kMagic, m) != 0) return say(PleFileState::foreign, "does not start with the hmoe PLE table magic");
  if (buf.size() < sizeof(FileHeader)) return say(PleFileState::truncated, "is " + std::to_string(size) + " bytes, shorter than a header");
  const FileHeader h = header_of(buf);
  if (h.version != kVersion)
    return say(PleFileState::stale, "has format version " + std::to_string(h.version) + ", this build uses " + std::to_string(kVersion));
  if (h.header_bytes % kPage != 0 || h.header_bytes > kMaxHeaderBytes || h.header_bytes < sizeof(FileHeader) + sizeof(TableEntry) * h.n_tables)
    return say(PleFileState::stale, "has an inconsistent header size " + std::to_string(h.header_bytes));
  if (buf.size() < h.header_bytes) return say(PleFileState::truncated, "ends inside its header");
  buf.resize(h.header_bytes);
  FileHeader zeroed = h;
  zeroed.header_checksum = 0;
  std::vector<uint8_t> tmp = buf;
  std::memcpy(tmp.data(), &zeroed, sizeof(zeroed));
  if (hash_bytes(0x5eed, tmp.data(), tmp.size()) != h.header_checksum) return say(PleFileState::stale, "header checksum mismatch (corrupted header)");
  if (size < h.file_bytes)
    return say(PleFileState::truncated, "is " + std::to_string(size) + " bytes, its header says " + std::to_string(h.file_bytes));
  if (size > h.file_bytes)
    return say(PleFileState::stale, "is " + std::to_string(size) + " bytes, longer than the " + std::to_string(h.file_bytes) + " its header says");
  const std::vector<uint8_t> want = make_header(sources, 0);
  const FileHeader wh = header_of(want);
  if (h.n_tables != wh.n_tables)
    return say(PleFileState::stale, "holds " + std::to_string(h.n_tables) + " tables, the model has " + std::to_string(wh.n_tables));
  for (size_t i = 0; i < sources.size(); ++i) {
    const TableEntry a = entry_of(buf, i), b = entry_of(want, i);
    if (a.rows != b.rows || a.cols != b.cols || a.dtype != b.dtype || a.row_bytes != b.row_bytes || a.data_offset != b.data_offset ||
        a.name_len != b.name_len || std::memcmp(a.name, b.name, a.name_len) != 0)
      return say(PleFileState::stale, "table " + std::to_string(i) + " has name/shape/dtype " + std::string(a.name, a.name_len) + " [" +
                                          std::to_string(a.rows) + ", " + std::to_string(a.cols) + "] dtype " + std::to_string(a.dtype) +
                                          ", the model has " + sources[i].name + " [" + std::to_string(b.rows) + ", " +
                                          std::to_string(b.cols) + "] dtype " + std::to_string(b.dtype));
  }
  if (h.source_checksum != ple_source_checksum(sources)) return say(PleFileState::stale, "was written from different weights (source checksum differs)");
  return say(PleFileState::ok, "ok");
}

void write_ple_file(const std::string& path, const std::vector<PleSource>& sources, const std::string& progress) {
  validate_sources(sources);
  const std::vector<uint8_t> header = make_header(sources, ple_source_checksum(sources));
  const FileHeader h = header_of(header);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const std::string advice = "; choose a writable place with " + std::to_string(h.file_bytes) +
                             " bytes free (--ple-table / HMOE_PLE_TABLE) or keep the table in memory (HMOE_PLE_BACKEND=ram)";
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.fd < 0) fail(ErrorKind::io, "cannot write PLE table file " + path + ": " + errno_text(errno) + advice);
  try {
    const int e = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(h.file_bytes));
    if (e == EOPNOTSUPP || e == EINVAL) {
      if (::ftruncate(fd.fd, static_cast<off_t>(h.file_bytes)) != 0) fail(ErrorKind::io, tmp + ": cannot size: " + errno_text(errno));
    } else if (e != 0) {
      fail(ErrorKind::io, tmp + ": cannot reserve " + std::to_string(h.file_bytes) + " bytes: " + errno_text(e));
    }
    write_all(fd.fd, header.data(), header.size(), 0, tmp);
    constexpr size_t kChunk = size_t{8} << 20;
    uint64_t total = 0, done = 0;
    for (const auto& s : sources) total += s.nbytes();
    auto t_last = Clock::now();
    const bool show = progress != "none";
    for (size_t i = 0; i < sources.size(); ++i) {
      const TableEntry e2 = entry_of(header, i);
      const size_t n = sources[i].nbytes();
      for (size_t off = 0; off < n; off += kChunk) {
        const size_t len = std::min(kChunk, n - off);
        write_all(fd.fd, sources[i].data + off, len, e2.data_offset + off, tmp);
        done += len;
        if (show && (Clock::now() - t_last > std::chrono::seconds(1) || done == total)) {
          std::fprintf(stderr, "writing PLE table %s: %.0f%% (%.1f of %.1f MiB)\n", path.c_str(), 100.0 * static_cast<double>(done) / static_cast<double>(total),
                       static_cast<double>(done) / (1 << 20), static_cast<double>(total) / (1 << 20));
          t_last = Clock::now();
        }
      }
    }
    if (::fsync(fd.fd) != 0) fail(ErrorKind::io, tmp + ": fsync failed: " + errno_text(errno));
    Fd closing = std::move(fd);
    if (::close(closing.fd) != 0) {
      closing.fd = -1;
      fail(ErrorKind::io, tmp + ": close failed: " + errno_text(errno));
    }
    closing.fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail(ErrorKind::io, "cannot rename " + tmp + " to " + path + ": " + errno_text(errno));
  } catch (const Error& err) {
    ::unlink(tmp.c_str());
    fail(err.kind(), "cannot write PLE table file " + path + ": " + err.what() + advice);
  }
}

// ---- PleTable -------------------------------------------------------------------

struct PleTable::TableSlot {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::bf16;
  size_t row_bytes = 0;
  uint64_t data_offset = 0;
  AlignedBuf ram;  // the table, when it is kept in memory
  AlignedBuf staging;
  size_t staging_cap = 0;
  std::vector<const uint8_t*> ptrs;
  struct Run {
    uint64_t begin, end, staging_off;
  };
  std::vector<Run> runs;
  std::shared_ptr<ReadGroup> group;
  bool pending = false;
  PleStats stats;
  std::vector<int64_t> pinned;                              // row-cache slots the last prefetch hands out
  std::vector<std::pair<int64_t, const uint8_t*>> fresh;  // rows being read (staging), for the cache
};

struct PleTable::Impl {
  Fd fd;  // declared before the reader: closed after it has drained
  std::unique_ptr<MappedFile> map;
  std::unique_ptr<BlockReader> reader;
  uint32_t max_read_bytes = 128 << 10;
  uint64_t block = kPage;                 // read granularity (see PleOptions::read_align)
  bool ordered = true;
  std::shared_ptr<ReadGroup> last_group;  // the latest submitted (PleOptions::ordered)
  std::unique_ptr<PleRowCache> cache;     // io_uring/pread only
};

PleTable::~PleTable() {
  impl_.reset();  // drain in-flight reads before the staging buffers go
}

int64_t PleTable::rows(int t) const { return tables_.at(static_cast<size_t>(t))->rows; }
int64_t PleTable::cols(int t) const { return tables_.at(static_cast<size_t>(t))->cols; }
DType PleTable::dtype(int t) const { return tables_.at(static_cast<size_t>(t))->dtype; }

std::unique_ptr<PleTable> PleTable::open(const std::vector<PleSource>& sources, const PleOptions& opt) {
  validate_sources(sources);
  if (const int64_t a = opt.read_align; a != 0 && (a < 512 || a > static_cast<int64_t>(kPage) || (a & (a - 1)) != 0))
    fail(ErrorKind::invalid_argument, "PLE read block (--ple-read-block / HMOE_PLE_READ_BLOCK) " + std::to_string(a) +
                                          " bytes: must be 0 (automatic) or a power of two in 512..4096");
  {  // Tables kept in memory must fit it: a clear error now, not the OOM killer mid-copy.
    uint64_t in_ram = 0;
    for (size_t i = 0; i < sources.size(); ++i)
      if (opt.backend == PleBackend::ram || (i < opt.ram_tables.size() && opt.ram_tables[i])) in_ram += sources[i].nbytes();
    const uint64_t phys = physical_memory_bytes();
    if (phys > 0 && in_ram > phys / 10 * 9)
      fail(ErrorKind::out_of_memory, "PLE tables kept in memory need " + std::to_string(in_ram >> 20) + " MiB, more than 90% of this machine's " +
                                         std::to_string(phys >> 20) + " MiB: read them from a file (HMOE_PLE_BACKEND=io_uring) or keep fewer in memory "
                                         "(--ple-ram-modules / HMOE_PLE_RAM_MODULES)");
  }
  std::unique_ptr<PleTable> pt(new PleTable());
  pt->backend_ = opt.backend;
  pt->path_ = opt.path;
  pt->impl_ = std::make_unique<Impl>();
  pt->impl_->max_read_bytes = std::max<uint32_t>(static_cast<uint32_t>(round_up(opt.max_read_bytes, kPage)), kPage);
  for (const auto& s : sources) {
    auto slot = std::make_unique<TableSlot>();
    slot->rows = s.rows;
    slot->cols = s.cols;
    slot->dtype = s.dtype;
    slot->row_bytes = s.row_bytes();
    pt->tables_.push_back(std::move(slot));
  }
  // Tables kept in memory: all of them (ram backend) or those of ram_tables.
  auto keep_in_ram = [&](size_t i) {
    pt->tables_[i]->ram = aligned_alloc_bytes(sources[i].nbytes());
    std::memcpy(pt->tables_[i]->ram.get(), sources[i].data, sources[i].nbytes());
  };
  if (opt.backend == PleBackend::ram) {
    for (size_t i = 0; i < sources.size(); ++i) keep_in_ram(i);
    return pt;
  }
  if (opt.path.empty()) fail(ErrorKind::invalid_argument, "PLE table: no table file path given (--ple-table / HMOE_PLE_TABLE)");
  std::string why;
  const PleFileState st = check_ple_file(opt.path, sources, &why);
  switch (st) {
    case PleFileState::ok: break;
    case PleFileState::not_a_file:
      fail(ErrorKind::invalid_argument, "PLE table file " + opt.path + " " + why + "; point --ple-table / HMOE_PLE_TABLE at a file, or use HMOE_PLE_BACKEND=ram");
    case PleFileState::foreign:
      fail(ErrorKind::invalid_argument, "PLE table file " + opt.path + " " + why +
                                            ": it is not an hmoe table file, so it is left alone; remove it or choose another --ple-table / HMOE_PLE_TABLE");
    case PleFileState::missing:
      write_ple_file(opt.path, sources, opt.progress);
      pt->file_written_ = true;
      break;
    case PleFileState::stale:
    case PleFileState::truncated:
      pt->notice_ = "PLE table file " + opt.path + " " + why + " (" + ple_file_state_name(st) + "): rewriting it";
      std::fprintf(stderr, "hmoe: %s\n", pt->notice_.c_str());
      write_ple_file(opt.path, sources, opt.progress);
      pt->file_written_ = true;
      break;
  }
  if (pt->file_written_) {
    const PleFileState again = check_ple_file(opt.path, sources, &why);
    if (again != PleFileState::ok) fail(ErrorKind::io, "PLE table file " + opt.path + " was just written but reads back " + ple_file_state_name(again) + ": " + why);
  }
  for (size_t i = 0; i < sources.size() && i < opt.ram_tables.size(); ++i)
    if (opt.ram_tables[i]) keep_in_ram(i);
  const std::vector<uint8_t> header = make_header(sources, 0);
  for (size_t i = 0; i < sources.size(); ++i) pt->tables_[i]->data_offset = entry_of(header, i).data_offset;

  Impl& im = *pt->impl_;
  if (opt.backend == PleBackend::mmap) {
    im.map = std::make_unique<MappedFile>(opt.path);
    ::madvise(const_cast<uint8_t*>(im.map->data()), im.map->size(), MADV_RANDOM);
    return pt;
  }
  int flags = O_RDONLY | O_CLOEXEC;
  if (opt.direct) flags |= O_DIRECT;
  im.fd = Fd(::open(opt.path.c_str(), flags));
  if (im.fd.fd < 0 && opt.direct && errno == EINVAL) {
    im.fd = Fd(::open(opt.path.c_str(), O_RDONLY | O_CLOEXEC));
    pt->notice_ += std::string(pt->notice_.empty() ? "" : "; ") + "O_DIRECT is not supported for " + opt.path + ": reads go through the page cache";
  }
  if (im.fd.fd < 0) fail(ErrorKind::io, "PLE table file " + opt.path + ": cannot open: " + errno_text(errno));
  const int pread_threads = std::max(1, opt.pread_threads);
  if (opt.backend == PleBackend::io_uring) {
    std::string no;
    UringOptions uo;
    uo.queue_depth = opt.queue_depth;
    uo.rings = opt.uring_rings;
    uo.issue = opt.uring_issue;
    uo.spin_us = opt.spin_us;
    im.reader = make_uring_reader(im.fd.fd, opt.path, uo, &no);
    if (!im.reader && uo.issue == UringIssue::sqpoll) {  // SQPOLL refused (old kernel, seccomp): driver threads issue instead
      std::string no2;
      uo.issue = UringIssue::driver;
      im.reader = make_uring_reader(im.fd.fd, opt.path, uo, &no2);
      if (im.reader) {
        pt->notice_ += std::string(pt->notice_.empty() ? "" : "; ") + "io_uring SQPOLL is unavailable (" + no + "): driver threads issue the reads";
        std::fprintf(stderr, "hmoe: notice: %s\n", pt->notice_.c_str());
      } else {
        no = no2;
      }
    }
    if (!im.reader) {
      pt->backend_ = PleBackend::pread;
      pt->notice_ += std::string(pt->notice_.empty() ? "" : "; ") + "io_uring is unavailable (" + no + "): using " +
                     std::to_string(pread_threads) + " pread workers";
      std::fprintf(stderr, "hmoe: notice: %s\n", pt->notice_.c_str());
    }
  }
  if (!im.reader) im.reader = make_pread_reader(im.fd.fd, opt.path, pread_threads, opt.spin_us);
  im.ordered = opt.ordered;
  if (opt.cache_bytes > 0) {
    size_t slot = 0;
    for (const auto& t : pt->tables_) slot = std::max(slot, t->row_bytes);
    im.cache = std::make_unique<PleRowCache>(opt.cache_bytes, slot);
  }
  im.block = kPage;
  const DirectIoAlign dio = direct_io_align(im.fd.fd);
  const bool is_direct = (::fcntl(im.fd.fd, F_GETFL) & O_DIRECT) != 0;
  if (opt.read_align != 0) {
    const int64_t a = opt.read_align;
    if (is_direct && static_cast<uint64_t>(a) < std::max(dio.offset, dio.memory))
      fail(ErrorKind::invalid_argument, "PLE read block " + std::to_string(a) + " bytes is finer than the " +
                                            std::to_string(std::max(dio.offset, dio.memory)) + " bytes O_DIRECT needs on " + opt.path +
                                            " (set --ple-read-block / HMOE_PLE_READ_BLOCK to 0 for automatic)");
    im.block = static_cast<uint64_t>(a);
  } else if (is_direct && dio.offset != 0) {
    const uint64_t a = std::max<uint64_t>({512, dio.offset, dio.memory});
    if (a <= kPage) im.block = a;
  }
  return pt;
}

void PleTable::prefetch(int t, const int64_t* rows, size_t n) {
  if (t < 0 || t >= tables()) fail(ErrorKind::internal, "PLE table index " + std::to_string(t) + " out of range");
  TableSlot& s = *tables_[static_cast<size_t>(t)];
  if (s.pending && s.group) {  // never reuse staging under a read
    auto g = std::move(s.group);
    s.pending = false;
    impl_->reader->wait(*g);
  }
  s.pending = false;
  s.group.reset();
  PleRowCache* cache = impl_->cache.get();
  if (cache) {  // the previous prefetch's rows are no longer handed out
    for (int64_t slot : s.pinned) cache->unpin(slot);
    s.pinned.clear();
  }
  s.fresh.clear();
  for (size_t i = 0; i < n; ++i)
    if (rows[i] < 0 || rows[i] >= s.rows)
      fail(ErrorKind::internal, "PLE table " + std::to_string(t) + ": row " + std::to_string(rows[i]) + " outside 0.." + std::to_string(s.rows - 1));
  PleStats& st = s.stats;
  st.rows_requested += static_cast<int64_t>(n);
  std::vector<int64_t> uniq(rows, rows + n);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  st.rows_unique += static_cast<int64_t>(uniq.size());
  s.ptrs.resize(n);
  if (s.ram) {
    for (size_t i = 0; i < n; ++i) s.ptrs[i] = s.ram.get() + static_cast<size_t>(rows[i]) * s.row_bytes;
    s.pending = true;
    return;
  }
  // Rows in the row cache are served from it (pinned until the next
  // prefetch of this table); the others are read.
  std::vector<std::pair<int64_t, int64_t>> hits;  // (row, cache slot), sorted by row
  if (cache) {
    std::vector<int64_t> miss;
    miss.reserve(uniq.size());
    for (int64_t r : uniq) {
      const int64_t slot = cache->find(t, r);
      if (slot < 0) {
        miss.push_back(r);
        continue;
      }
      cache->pin(slot);
      s.pinned.push_back(slot);
      hits.push_back({r, slot});
    }
    uniq.swap(miss);
    st.rows_cached += static_cast<int64_t>(hits.size());
  }
  // Block runs covering the distinct rows (uniq is sorted, so runs come out
  // sorted); mmap advises whole pages. Blocks less than a page apart join
  // one run: reading the gap costs less than another request, so dense
  // steps (prefill) make no more reads than with 4 KiB blocks.
  const uint64_t blk = backend_ == PleBackend::mmap ? kPage : impl_->block;
  const uint64_t join = kPage - blk;
  s.runs.clear();
  uint64_t staging = 0;
  for (int64_t r : uniq) {
    const uint64_t off = s.data_offset + static_cast<uint64_t>(r) * s.row_bytes;
    const uint64_t b = off / blk * blk, e = round_up(off + s.row_bytes, blk);
    if (!s.runs.empty() && b <= s.runs.back().end + join) {
      if (e > s.runs.back().end) {
        staging += e - s.runs.back().end;
        s.runs.back().end = e;
      }
    } else {
      s.runs.push_back({b, e, staging});
      staging += e - b;
    }
  }
  if (backend_ == PleBackend::mmap) {
    for (size_t i = 0; i < n; ++i) s.ptrs[i] = impl_->map->data() + s.data_offset + static_cast<uint64_t>(rows[i]) * s.row_bytes;
    for (const auto& run : s.runs) {
      ::madvise(const_cast<uint8_t*>(impl_->map->data()) + run.begin, run.end - run.begin, MADV_WILLNEED);
      st.reads += 1;
      st.bytes_read += static_cast<int64_t>(run.end - run.begin);
    }
    s.pending = true;
    return;
  }
  if (staging > s.staging_cap) {
    s.staging = aligned_alloc_bytes(staging);
    s.staging_cap = staging;
  }
  auto staged = [&](int64_t row) -> const uint8_t* {
    const uint64_t off = s.data_offset + static_cast<uint64_t>(row) * s.row_bytes;
    auto it = std::upper_bound(s.runs.begin(), s.runs.end(), off, [](uint64_t o, const TableSlot::Run& run) { return o < run.begin; });
    --it;
    return s.staging.get() + it->staging_off + (off - it->begin);
  };
  for (size_t i = 0; i < n; ++i) {
    if (!hits.empty()) {
      auto h = std::lower_bound(hits.begin(), hits.end(), std::make_pair(rows[i], int64_t{-1}));
      if (h != hits.end() && h->first == rows[i]) {
        s.ptrs[i] = cache->data(h->second);
        continue;
      }
    }
    s.ptrs[i] = staged(rows[i]);
  }
  if (cache)
    for (int64_t r : uniq) s.fresh.push_back({r, staged(r)});
  std::vector<ReadRequest> reqs;
  const uint64_t max_read = impl_->max_read_bytes;
  for (const auto& run : s.runs)
    for (uint64_t b = run.begin; b < run.end; b += max_read) {
      const uint64_t len = std::min(max_read, run.end - b);
      reqs.push_back({b, static_cast<uint32_t>(len), s.staging.get() + run.staging_off + (b - run.begin)});
      st.bytes_read += static_cast<int64_t>(len);
    }
  st.reads += static_cast<int64_t>(reqs.size());
  s.group = impl_->reader->submit(std::move(reqs), impl_->ordered ? impl_->last_group : nullptr);
  impl_->last_group = s.group;
  s.pending = true;
}

int64_t PleTable::wait(int t) {
  if (t < 0 || t >= tables()) fail(ErrorKind::internal, "PLE table index " + std::to_string(t) + " out of range");
  TableSlot& s = *tables_[static_cast<size_t>(t)];
  if (!s.pending) fail(ErrorKind::internal, "PLE table " + std::to_string(t) + ": wait() without prefetch()");
  s.pending = false;
  PleStats& st = s.stats;
  st.steps += 1;
  if (s.ram) return 0;
  int64_t ns = 0;
  if (backend_ == PleBackend::mmap) {
    // Touch each page: whatever WILLNEED has not brought in yet faults here.
    const auto t0 = Clock::now();
    volatile uint8_t sink = 0;
    for (const auto& run : s.runs)
      for (uint64_t p = run.begin; p < run.end; p += kPage) sink = sink ^ impl_->map->data()[p];
    ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    st.wait_ns += ns;
    return ns;
  }
  auto g = std::move(s.group);
  ns = impl_->reader->wait(*g);
  st.wait_ns += ns;
  st.io_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(g->completed - g->submitted).count();
  st.issue_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(g->issued - g->submitted).count();
  if (PleRowCache* cache = impl_->cache.get())
    for (const auto& [r, p] : s.fresh) cache->insert(t, r, p, s.row_bytes);
  s.fresh.clear();
  return ns;
}

bool PleTable::table_in_ram(int t) const { return static_cast<bool>(tables_.at(static_cast<size_t>(t))->ram); }

PleStats& PleStats::operator+=(const PleStats& o) {
  steps += o.steps;
  rows_requested += o.rows_requested;
  rows_unique += o.rows_unique;
  rows_cached += o.rows_cached;
  reads += o.reads;
  bytes_read += o.bytes_read;
  wait_ns += o.wait_ns;
  io_ns += o.io_ns;
  issue_ns += o.issue_ns;
  return *this;
}

PleStats PleTable::stats() const {
  PleStats sum;
  for (const auto& t : tables_) sum += t->stats;
  return sum;
}

const PleStats& PleTable::table_stats(int t) const { return tables_.at(static_cast<size_t>(t))->stats; }

void PleTable::reset_stats() {
  for (auto& t : tables_) t->stats = {};
}

uint32_t PleTable::read_block() const {
  return backend_ == PleBackend::ram ? 0 : backend_ == PleBackend::mmap ? static_cast<uint32_t>(kPage) : static_cast<uint32_t>(impl_->block);
}

const uint8_t* PleTable::row(int t, size_t i) const { return tables_[static_cast<size_t>(t)]->ptrs[i]; }

}  // namespace hmoe::io
