// PLE table file and backends: random tables read back through every
// backend byte for byte; the header's staleness/truncation checks and the
// rewrite; bad inputs (directory, foreign file, read-only directory, file
// size limit); the block readers on their own.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "configs/error.h"
#include "io/mmap_file.h"
#include "io/ple_row_cache.h"
#include "io/ple_table.h"
#include "io/uring_reader.h"
#include "tests/test_util.h"

using namespace hmoe;
using namespace hmoe::io;

namespace {

// Random tables with rows that straddle pages (148 and 34 bytes) and one
// bigger than a page (5000 bytes).
struct RandomTables {
  std::vector<std::vector<uint8_t>> data;
  std::vector<PleSource> sources;
  explicit RandomTables(uint64_t seed) {
    std::mt19937_64 rng(seed);
    const struct {
      int64_t rows, cols;
      DType dt;
    } shapes[] = {{3001, 37, DType::f32}, {777, 17, DType::bf16}, {40, 1250, DType::f32}};
    for (const auto& s : shapes) {
      std::vector<uint8_t> d(static_cast<size_t>(s.rows * s.cols) * dtype_size(s.dt));
      for (auto& b : d) b = static_cast<uint8_t>(rng() | 1);
      data.push_back(std::move(d));
    }
    for (size_t i = 0; i < data.size(); ++i) {
      PleSource p;
      p.name = "model.layers." + std::to_string(i) + ".engram.table.weight";
      p.dtype = shapes[i].dt;
      p.rows = shapes[i].rows;
      p.cols = shapes[i].cols;
      p.data = data[i].data();
      sources.push_back(p);
    }
  }
};

PleOptions options(const std::string& path, PleBackend b) {
  PleOptions o;
  o.path = path;
  o.backend = b;
  o.progress = "none";
  o.queue_depth = 8;
  o.pread_threads = 3;
  return o;
}

void check_reads(PleTable& t, const RandomTables& rt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<int64_t>> want(rt.sources.size());
    for (size_t k = 0; k < rt.sources.size(); ++k) {
      const size_t n = 1 + rng() % 300;
      for (size_t i = 0; i < n; ++i) want[k].push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(rt.sources[k].rows)));
      want[k].push_back(want[k][0]);  // a duplicate
      want[k].push_back(rt.sources[k].rows - 1);
      t.prefetch(static_cast<int>(k), want[k].data(), want[k].size());
    }
    for (size_t k = 0; k < rt.sources.size(); ++k) {
      t.wait(static_cast<int>(k));
      const size_t rb = rt.sources[k].row_bytes();
      for (size_t i = 0; i < want[k].size(); ++i) {
        const uint8_t* got = t.row(static_cast<int>(k), i);
        const uint8_t* ref = rt.data[k].data() + static_cast<size_t>(want[k][i]) * rb;
        REQUIRE_MESSAGE(std::memcmp(got, ref, rb) == 0, "table " << k << " row " << want[k][i] << " step " << step);
      }
    }
  }
}

// Makes `dir` refuse new files even for root (the immutable flag); false when the filesystem or capabilities do not allow it.
bool make_immutable(const std::string& dir, bool on) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return false;
  int flags = 0;
  bool ok = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
  if (ok) {
    flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
    ok = ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
  }
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("PLE table: every backend returns the source rows") {
  RandomTables rt(11);
  test::TempDir tmp("ple-backends");
  const std::string path = tmp.str() + "/t.hmoe";
  for (PleBackend b : {PleBackend::io_uring, PleBackend::pread, PleBackend::mmap, PleBackend::ram}) {
    CAPTURE(ple_backend_name(b));
    auto t = PleTable::open(rt.sources, options(path, b));
    if (b == PleBackend::io_uring) {
      INFO(t->notice());
      CHECK(t->backend() == PleBackend::io_uring);  // io_uring works on this kernel; a fallback would show in the notice
    }
    check_reads(*t, rt, 99);
    const PleStats& st = t->stats();
    CHECK(st.steps == 15);
    CHECK(st.rows_unique < st.rows_requested);
    if (b != PleBackend::ram) {
      CHECK(st.bytes_read % t->read_block() == 0);
      CHECK(st.bytes_read > 0);
      int64_t reads = 0;
      for (int k = 0; k < 3; ++k) reads += t->table_stats(k).reads;
      CHECK(reads == st.reads);
    }
  }
  // Read blocks: automatic (the file's O_DIRECT alignment), 4096 and 512
  // (where the file allows it), each with and without ordered reads; bad
  // block sizes are refused naming the problem.
  {
    auto automatic = PleTable::open(rt.sources, options(path, PleBackend::io_uring));
    const uint32_t fine = automatic->read_block();
    CHECK(fine >= 512);
    CHECK(fine <= 4096);
    automatic.reset();
    for (PleBackend b : {PleBackend::io_uring, PleBackend::pread})
      for (uint32_t blk : {4096u, 512u})
        for (bool ordered : {true, false}) {
          CAPTURE(ple_backend_name(b));
          CAPTURE(blk);
          CAPTURE(ordered);
          PleOptions o = options(path, b);
          o.read_align = blk;
          o.ordered = ordered;
          if (blk < fine) {
            CHECK_THROWS_WITH_AS(PleTable::open(rt.sources, o), doctest::Contains("finer than"), Error);
            continue;
          }
          auto t = PleTable::open(rt.sources, o);
          CHECK(t->read_block() == blk);
          check_reads(*t, rt, 5 + blk);
          CHECK(t->stats().bytes_read % blk == 0);
        }
    PleOptions o = options(path, PleBackend::io_uring);
    o.read_align = 1000;
    CHECK_THROWS_WITH_AS(PleTable::open(rt.sources, o), doctest::Contains("power of two"), Error);
  }
  // When io_uring cannot be set up (here: a queue depth it refuses) the
  // table falls back to pread workers and says so.
  {
    PleOptions o = options(path, PleBackend::io_uring);
    o.queue_depth = 0;
    auto t = PleTable::open(rt.sources, o);
    CHECK(t->backend() == PleBackend::pread);
    CHECK(t->notice().find("io_uring is unavailable") != std::string::npos);
    check_reads(*t, rt, 13);
  }
  // Table 1 of 3 kept in memory, the others read (file backends): the same
  // rows, and no reads for table 1; a list shorter than the tables pads with "read".
  for (PleBackend b : {PleBackend::io_uring, PleBackend::pread, PleBackend::mmap}) {
    CAPTURE(ple_backend_name(b));
    PleOptions o = options(path, b);
    o.ram_tables = {false, true};
    auto t = PleTable::open(rt.sources, o);
    CHECK_FALSE(t->table_in_ram(0));
    CHECK(t->table_in_ram(1));
    CHECK_FALSE(t->table_in_ram(2));
    check_reads(*t, rt, 21);
    CHECK(t->table_stats(1).reads == 0);
    CHECK(t->table_stats(1).rows_requested > 0);
    CHECK(t->table_stats(0).reads > 0);
    CHECK(t->table_stats(2).reads > 0);
  }
  // Tables to keep in memory that exceed the machine's memory are refused
  // before any allocation or copy (the source here is far smaller than it claims).
  {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    REQUIRE(pages > 0);
    std::vector<PleSource> huge = rt.sources;
    huge[1].rows = static_cast<int64_t>(static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / huge[1].row_bytes()) + 1;
    CHECK_THROWS_WITH_AS(PleTable::open(huge, options(path, PleBackend::ram)), doctest::Contains("HMOE_PLE_BACKEND=io_uring"), Error);
    PleOptions o = options(path, PleBackend::io_uring);
    o.ram_tables = {false, true};
    CHECK_THROWS_WITH_AS(PleTable::open(huge, o), doctest::Contains("--ple-ram-modules"), Error);
  }
  // Non-O_DIRECT reads and a queue depth of one work too.
  PleOptions o = options(path, PleBackend::io_uring);
  o.direct = false;
  o.queue_depth = 1;
  o.max_read_bytes = 4096;
  auto t = PleTable::open(rt.sources, o);
  CHECK_FALSE(t->file_written());
  check_reads(*t, rt, 7);
}

TEST_CASE("PLE row cache: finds what it holds, CLOCK eviction spares pinned and recently used rows") {
  PleRowCache none(0, 16);
  CHECK(none.capacity() == 0);
  uint8_t buf[16] = {};
  CHECK(none.insert(0, 1, buf, 16) == -1);
  CHECK(none.find(0, 1) == -1);

  PleRowCache c(8 * 16, 16);
  REQUIRE(c.capacity() == 8);
  auto fill = [](int t, int64_t r, uint8_t* out) {
    for (int i = 0; i < 16; ++i) out[i] = static_cast<uint8_t>(t * 31 + r * 7 + i);
  };
  // A model of which rows must be present: pinned ones always; checked data on every hit.
  std::mt19937_64 rng(5);
  std::vector<std::pair<int, int64_t>> pinned;
  std::vector<int64_t> pinned_slots;
  for (int step = 0; step < 4000; ++step) {
    const int t = static_cast<int>(rng() % 3);
    const int64_t r = static_cast<int64_t>(rng() % 20);
    int64_t slot = c.find(t, r);
    if (slot < 0) {
      fill(t, r, buf);
      slot = c.insert(t, r, buf, 16);
    }
    if (slot >= 0) {
      uint8_t want[16];
      fill(t, r, want);
      REQUIRE(std::memcmp(c.data(slot), want, 16) == 0);
      REQUIRE(c.find(t, r) == slot);
    }
    if (rng() % 4 == 0 && pinned.size() < 6 && slot >= 0) {
      c.pin(slot);
      pinned.push_back({t, r});
      pinned_slots.push_back(slot);
    } else if (!pinned.empty() && rng() % 3 == 0) {
      c.unpin(pinned_slots.back());
      pinned.pop_back();
      pinned_slots.pop_back();
    }
    for (size_t i = 0; i < pinned.size(); ++i) REQUIRE(c.find(pinned[i].first, pinned[i].second) == pinned_slots[i]);
    REQUIRE(c.size() <= c.capacity());
  }
  // A cache bigger than half the machine's memory is refused, naming the setting.
  {
    const size_t phys = static_cast<size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    CHECK(PleRowCache::footprint(phys, 128) > phys / 2);
    CHECK_THROWS_WITH_AS(PleRowCache(phys, 128), doctest::Contains("--ple-cache-mib"), Error);
  }
  // Every slot pinned: an insert gives up instead of evicting.
  PleRowCache full(2 * 16, 16);
  fill(0, 1, buf);
  const int64_t a = full.insert(0, 1, buf, 16), b = full.insert(0, 2, buf, 16);
  REQUIRE(a >= 0);
  REQUIRE(b >= 0);
  full.pin(a);
  full.pin(b);
  CHECK(full.insert(0, 3, buf, 16) == -1);
  CHECK(full.insert(0, 1, buf, 32) == -1);  // bigger than a slot
  full.unpin(b);
  CHECK(full.insert(0, 3, buf, 16) == b);
  CHECK(full.find(0, 2) == -1);
  CHECK(full.find(0, 1) == a);
}

TEST_CASE("PLE table with a row cache: repeated rows come from memory, byte for byte, with three tables in flight") {
  RandomTables rt(17);
  test::TempDir tmp("ple-cache");
  const std::string path = tmp.str() + "/t.hmoe";
  for (PleBackend b : {PleBackend::io_uring, PleBackend::pread})
    for (size_t cache_bytes : {size_t{16} << 20, size_t{3} * 5000}) {  // room for every row (5000-byte slots); room for 3
      CAPTURE(ple_backend_name(b));
      CAPTURE(cache_bytes);
      PleOptions o = options(path, b);
      o.cache_bytes = cache_bytes;
      auto t = PleTable::open(rt.sources, o);
      check_reads(*t, rt, 99);
      check_reads(*t, rt, 99);  // the same rows again
      const PleStats st = t->stats();
      CHECK(st.rows_cached <= st.rows_unique);
      if (cache_bytes > 100000) CHECK_MESSAGE(st.rows_cached * 2 >= st.rows_unique, st.rows_cached << " of " << st.rows_unique);  // the second pass is all hits
      else CHECK(st.rows_cached < st.rows_unique / 4);
    }
}

TEST_CASE("PLE table file: header checks, stale and truncated files are rewritten") {
  RandomTables rt(5);
  test::TempDir tmp("ple-header");
  const std::string path = tmp.str() + "/t.hmoe";
  std::string why;
  CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::missing);
  {
    auto t = PleTable::open(rt.sources, options(path, PleBackend::pread));
    CHECK(t->file_written());
    CHECK(t->notice().empty());
  }
  CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::ok);
  const uint64_t size = std::filesystem::file_size(path);
  CHECK(size % 4096 == 0);
  const std::string original = test::read_file(path);
  CHECK(original.compare(0, 8, "HMOE-PLE") == 0);
  {  // second open maps it directly
    auto t = PleTable::open(rt.sources, options(path, PleBackend::mmap));
    CHECK_FALSE(t->file_written());
  }

  SUBCASE("changed source bytes") {
    rt.data[1][12345] ^= 0x40;
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::stale);
    CHECK(why.find("checksum") != std::string::npos);
    auto t = PleTable::open(rt.sources, options(path, PleBackend::io_uring));
    CHECK(t->file_written());
    CHECK(t->notice().find("stale") != std::string::npos);
    check_reads(*t, rt, 3);
  }
  SUBCASE("changed shape") {
    rt.sources[0].rows -= 1;
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::stale);
  }
  SUBCASE("other format version") {
    std::string s = original;
    s[8] = 9;
    test::write_file(path, s);
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::stale);
    CHECK(why.find("version") != std::string::npos);
  }
  SUBCASE("corrupted header") {
    std::string s = original;
    s[48 + 3] ^= 1;  // first table's row count
    test::write_file(path, s);
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::stale);
    CHECK(why.find("header checksum") != std::string::npos);
  }
  SUBCASE("truncated inside the data") {
    std::filesystem::resize_file(path, size - 4096);
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::truncated);
    auto t = PleTable::open(rt.sources, options(path, PleBackend::io_uring));
    CHECK(t->file_written());
    CHECK(t->notice().find("truncated") != std::string::npos);
    CHECK(std::filesystem::file_size(path) == size);
    check_reads(*t, rt, 4);
  }
  SUBCASE("truncated inside the header, and empty") {
    std::filesystem::resize_file(path, 100);
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::truncated);
    std::filesystem::resize_file(path, 0);
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::truncated);
    auto t = PleTable::open(rt.sources, options(path, PleBackend::mmap));
    CHECK(t->file_written());
    check_reads(*t, rt, 5);
  }
  SUBCASE("longer than its header says") {
    std::filesystem::resize_file(path, size + 4096);
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::stale);
  }
}

TEST_CASE("PLE table file: bad paths and filesystems") {
  RandomTables rt(6);
  test::TempDir tmp("ple-bad");

  SUBCASE("path is a directory") {
    std::string why;
    CHECK(check_ple_file(tmp.str(), rt.sources, &why) == PleFileState::not_a_file);
    try {
      PleTable::open(rt.sources, options(tmp.str(), PleBackend::io_uring));
      FAIL("directory accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
      CHECK(std::string(e.what()).find("is a directory") != std::string::npos);
    }
  }
  SUBCASE("foreign file is refused and left alone") {
    const std::string path = tmp.str() + "/foreign";
    std::string junk(8192, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 7 + 1);
    test::write_file(path, junk);
    try {
      PleTable::open(rt.sources, options(path, PleBackend::mmap));
      FAIL("foreign file accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
      CHECK(std::string(e.what()).find("not an hmoe table file") != std::string::npos);
    }
    CHECK(test::read_file(path) == junk);
    // A short file that is not a prefix of the magic is foreign too.
    test::write_file(path, "abc");
    std::string why;
    CHECK(check_ple_file(path, rt.sources, &why) == PleFileState::foreign);
  }
  SUBCASE("read-only directory") {
    const std::string dir = tmp.str() + "/ro";
    std::filesystem::create_directories(dir);
    bool immutable = make_immutable(dir, true);
    if (!immutable) std::filesystem::permissions(dir, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    const bool blocks = ::access(dir.c_str(), W_OK) != 0 || immutable;
    if (!blocks) {
      MESSAGE("cannot make a read-only directory here (root without CAP_LINUX_IMMUTABLE): skipped");
    } else {
      try {
        PleTable::open(rt.sources, options(dir + "/t.hmoe", PleBackend::io_uring));
        FAIL("wrote into a read-only directory");
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::io);
        const std::string msg = e.what();
        CHECK(msg.find(dir + "/t.hmoe") != std::string::npos);
        CHECK(msg.find("HMOE_PLE_BACKEND=ram") != std::string::npos);
      }
      // ram needs no file.
      auto t = PleTable::open(rt.sources, options(dir + "/t.hmoe", PleBackend::ram));
      check_reads(*t, rt, 8);
    }
    if (immutable) make_immutable(dir, false);
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
    CHECK(std::filesystem::is_empty(dir));
  }
  SUBCASE("file size limit (stands in for a full filesystem)") {
    const std::string path = tmp.str() + "/big.hmoe";
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string msg;
    try {
      PleTable::open(rt.sources, options(path, PleBackend::pread));
    } catch (const Error& e) {
      msg = e.what();
      CHECK(e.kind() == ErrorKind::io);
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK_MESSAGE(!msg.empty(), "a write past the file size limit was not reported");
    CHECK(msg.find("bytes free") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(path));
    for (const auto& ent : std::filesystem::directory_iterator(tmp.path)) FAIL("left behind: " << ent.path());
  }
  SUBCASE("rows outside the table") {
    auto t = PleTable::open(rt.sources, options(tmp.str() + "/t.hmoe", PleBackend::ram));
    const int64_t bad = rt.sources[0].rows;
    CHECK_THROWS_AS(t->prefetch(0, &bad, 1), Error);
    CHECK_THROWS_AS(t->wait(1), Error);  // wait without prefetch
  }
}

TEST_CASE("block readers: io_uring and pread agree with the file, errors are reported") {
  test::TempDir tmp("ple-reader");
  const std::string path = tmp.str() + "/data.bin";
  std::mt19937_64 rng(3);
  std::string bytes(1 << 20, '\0');
  for (auto& c : bytes) c = static_cast<char>(rng());
  test::write_file(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  REQUIRE(fd >= 0);
  std::string why;
  auto uring = make_uring_reader(fd, path, {.queue_depth = 4}, &why);
  REQUIRE_MESSAGE(uring != nullptr, why);
  auto rings = make_uring_reader(fd, path, {.queue_depth = 8, .rings = 3}, &why);  // a group spread over 3 rings
  REQUIRE_MESSAGE(rings != nullptr, why);
  // The step thread issues into 2 rings; the driver threads only reap and spin a little.
  auto caller = make_uring_reader(fd, path, {.queue_depth = 4, .rings = 2, .issue = UringIssue::caller, .spin_us = 50}, &why);
  REQUIRE_MESSAGE(caller != nullptr, why);
  // A polling kernel thread issues (it may be refused in a container: then skipped).
  auto sqpoll = make_uring_reader(fd, path, {.queue_depth = 8, .rings = 2, .issue = UringIssue::sqpoll}, &why);
  if (!sqpoll) MESSAGE("io_uring SQPOLL unavailable here, not tested: " << why);
  auto pr = make_pread_reader(fd, path, 2);
  auto pr_spin = make_pread_reader(fd, path, 3, 20);
  for (BlockReader* r : {uring.get(), rings.get(), caller.get(), sqpoll.get(), pr.get(), pr_spin.get()}) {
    if (!r) continue;
    CAPTURE(r->name());
    void* mem = nullptr;
    REQUIRE(::posix_memalign(&mem, 4096, 64 * 8192) == 0);
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(mem), &std::free);
    std::vector<ReadRequest> reqs;
    for (int i = 0; i < 64; ++i) {
      const uint64_t page = rng() % 255;
      reqs.push_back({page * 4096, static_cast<uint32_t>(4096 * (1 + i % 2)), buf.get() + i * 8192});
    }
    auto g = r->submit(reqs);
    r->wait(*g);
    for (const auto& q : reqs) REQUIRE(std::memcmp(q.dst, bytes.data() + q.offset, q.len) == 0);
    CHECK(g->done.load());
    CHECK(g->submitted <= g->issued);
    CHECK(g->issued <= g->completed);
    // Past the end of the file.
    auto bad = r->submit({{uint64_t{1} << 21, 4096, buf.get()}});
    try {
      r->wait(*bad);
      FAIL("read past the end accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::io);
      CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
    // Misaligned O_DIRECT read: the kernel's EINVAL comes back as an error.
    auto mis = r->submit({{100, 4096, buf.get()}});
    CHECK_THROWS_AS(r->wait(*mis), Error);
    // An empty group is complete at once.
    auto empty = r->submit({});
    CHECK(r->wait(*empty) >= 0);
    // Ordered groups: the second is issued only once the first has landed,
    // even when the first fails; a chain of three keeps its order.
    std::vector<ReadRequest> first(reqs.begin(), reqs.begin() + 32), second(reqs.begin() + 32, reqs.end());
    auto g1 = r->submit(first);
    auto g2 = r->submit(second, g1);
    auto g3 = r->submit({{0, 4096, buf.get()}}, g2);
    r->wait(*g3);
    r->wait(*g2);
    r->wait(*g1);
    CHECK(g2->submitted >= g1->completed);
    CHECK(g3->submitted >= g2->completed);
    for (const auto& q : second) REQUIRE(std::memcmp(q.dst, bytes.data() + q.offset, q.len) == 0);
    auto f1 = r->submit({{uint64_t{1} << 21, 4096, buf.get()}});
    auto f2 = r->submit({{4096, 4096, buf.get() + 4096}}, f1);
    CHECK_THROWS_AS(r->wait(*f1), Error);
    r->wait(*f2);
    CHECK(std::memcmp(buf.get() + 4096, bytes.data() + 4096, 4096) == 0);
  }
  // A reader closed with groups still held behind others completes them all
  // (read or failed with "reader closed"), so nobody waits forever.
  {
    auto r = make_uring_reader(fd, path, {.queue_depth = 2}, &why);
    REQUIRE(r != nullptr);
    void* mem = nullptr;
    REQUIRE(::posix_memalign(&mem, 4096, 16 * 4096) == 0);
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(mem), &std::free);
    std::vector<std::shared_ptr<ReadGroup>> gs;
    for (int i = 0; i < 8; ++i)
      gs.push_back(r->submit({{static_cast<uint64_t>(i) * 4096, 4096, buf.get() + i * 4096}, {static_cast<uint64_t>(i + 8) * 4096, 4096, buf.get() + (i + 8) * 4096}},
                             gs.empty() ? nullptr : gs.back()));
    r.reset();
    for (const auto& g : gs) {
      CHECK(g->remaining == 0);
      if (!g->error.empty()) CHECK(g->error.find("closed") != std::string::npos);
    }
  }
  uring.reset();
  rings.reset();
  caller.reset();
  sqpoll.reset();
  pr.reset();
  pr_spin.reset();
  ::close(fd);
  CHECK(make_uring_reader(0, path, {.queue_depth = 0}, &why) == nullptr);
  CHECK(why.find("queue depth") != std::string::npos);
  CHECK(make_uring_reader(0, path, {.queue_depth = 4, .rings = 0}, &why) == nullptr);
  CHECK(why.find("ring count") != std::string::npos);
  CHECK(make_uring_reader(0, path, {.spin_us = 200000}, &why) == nullptr);
  CHECK(why.find("spin") != std::string::npos);
  CHECK(parse_uring_issue("x", "sqpoll") == UringIssue::sqpoll);
  CHECK_THROWS_WITH_AS(parse_uring_issue("--ple-uring-issue", "kernel"), doctest::Contains("--ple-uring-issue"), Error);
}

TEST_CASE("block readers: threads submitting at once, ordered chains, every issue path") {
  test::TempDir tmp("ple-reader-mt");
  const std::string path = tmp.str() + "/data.bin";
  std::mt19937_64 rng(5);
  std::string bytes(1 << 20, '\0');
  for (auto& c : bytes) c = static_cast<char>(rng());
  test::write_file(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  REQUIRE(fd >= 0);
  for (UringIssue issue : {UringIssue::driver, UringIssue::caller, UringIssue::sqpoll}) {
    CAPTURE(uring_issue_name(issue));
    std::string why;
    // A small queue depth, so that reads wait for free slots.
    auto r = make_uring_reader(fd, path, {.queue_depth = 6, .rings = 3, .issue = issue, .spin_us = issue == UringIssue::caller ? 20u : 0u}, &why);
    if (!r) {
      MESSAGE("io_uring (" << uring_issue_name(issue) << ") unavailable here, not tested: " << why);
      continue;
    }
    constexpr int kThreads = 4, kGroups = 40, kReads = 9;
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        std::mt19937_64 g(100 + t);
        void* mem = nullptr;
        if (::posix_memalign(&mem, 4096, 2 * kReads * 4096) != 0) return;
        std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(mem), &std::free);
        std::shared_ptr<ReadGroup> prev;
        std::vector<ReadRequest> prev_reqs;
        try {
          for (int k = 0; k < kGroups; ++k) {
            std::vector<ReadRequest> reqs;
            uint8_t* half = buf.get() + (k % 2) * kReads * 4096;  // alternate halves: the previous group may still be in flight
            for (int i = 0; i < kReads; ++i) reqs.push_back({(g() % 2040) * 512, 512u * static_cast<uint32_t>(1 + g() % 8), half + i * 4096});
            auto cur = r->submit(reqs, prev);  // held until the previous one landed
            if (prev) {
              r->wait(*prev);
              for (const auto& q : prev_reqs)
                if (std::memcmp(q.dst, bytes.data() + q.offset, q.len) != 0) errors[static_cast<size_t>(t)] = "wrong bytes";
            }
            prev = cur;
            prev_reqs = reqs;
          }
          r->wait(*prev);
          for (const auto& q : prev_reqs)
            if (std::memcmp(q.dst, bytes.data() + q.offset, q.len) != 0) errors[static_cast<size_t>(t)] = "wrong bytes";
        } catch (const Error& e) {
          errors[static_cast<size_t>(t)] = e.what();
        }
      });
    for (auto& th : ts) th.join();
    for (const auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  }
  ::close(fd);
}
