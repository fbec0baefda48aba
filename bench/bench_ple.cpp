// PLE n-gram table (Engram) served from a file: step time with the table in
// RAM against each file backend (io_uring, pread, mmap), with the I/O wait
// per step, the share of I/O hidden behind compute, and the IOPS/bandwidth
// the backends achieved against a raw io_uring random-read test of the same
// file in the same run. Prints figures; never fails on time.
//
// The synthetic model: two real Engram modules (engine/layers/engram.h: hashing,
// table rows, key/value projections, gates, conv) before layers 2 and 5 of
// 8 synthetic dense layers (a bf16 [hidden, hidden] gemm each), hidden 2048,
// 3-grams, 16 heads of 64 bf16 per token and module (128-byte rows). The
// table is read with O_DIRECT (no page cache) by io_uring and pread; mmap
// goes through the page cache, which is dropped (fadvise DONTNEED) before
// each backend's run. io_uring runs four ways: its defaults (the finest
// O_DIRECT block the file allows, module 2's reads held until module 1's
// have landed), then with both modules' reads at once, with 4 KiB blocks,
// and with both changes; the raw test runs at the fine block and at 4 KiB.
// Then the issue paths (--ple-uring-issue caller / sqpoll, and busy-polling
// --ple-spin-us 1000), and the first module's table kept in memory
// (--ple-ram-modules 0). --variants LABEL,... runs only those (and ram).
// --burst instead times single groups of reads per reader configuration
// (see burst_test), against a floor with no thread hand-off at all.
// --gpu times decode with the modules inside a whole GPU step instead (see
// gpu_decode; needs a CUDA GPU).
//
// With --zipf S the token ids follow Zipf's law (rank k with weight
// 1/(k+1)^S, as words in text) instead of being uniform, so that n-grams
// repeat and the row cache (--ple-cache-mib, default on; the variant
// "io_uring no cache" has none) serves some rows from memory.
//
// With --text FILE[,FILE...] it only decodes those files' tokens (tokenizer
// of --tokenizer DIR, default fixtures/tiny-qwen3moe: Qwen3's) through the
// io_uring backend and prints the row cache's hit rate per 1000 tokens.
//
// usage: bench_ple [--table-mib N] [--dir DIR] [--decode-steps N] [--prefill N] [--threads N] [--rounds N] [--zipf S]
//                  [--text FILE,... [--tokenizer DIR]]
//   defaults: 2048 MiB of table (both modules), DIR ./bench-ple-data, 48 decode
//   steps split over 3 rounds (the prefill runs rounds/3 times), a 2048-token
//   prefill. DIR keeps the checkpoint and table file for later runs.
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "bench/synthetic_model.h"
#include "configs/error.h"
#include "configs/settings.h"
#include "engine/layers/cpu_layers.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/layers/engram.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/read_probe.h"
#include "io/uring_reader.h"
#include "numa/kernels.h"
#include "numa/node_pools.h"

using namespace hmoe;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kHidden = 2048, kLayers = 8, kVocab = 151936, kCompressed = 100000;
constexpr int64_t kNgram = 3, kEmbedPerNgram = 512, kHeadsPerNgram = 8, kKernel = 4;
constexpr int64_t kHeads = (kNgram - 1) * kHeadsPerNgram, kHeadDim = kEmbedPerNgram / kHeadsPerNgram, kDmem = (kNgram - 1) * kEmbedPerNgram;

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

std::vector<uint8_t> random_bf16(int64_t n, uint64_t seed, float scale) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * 2);
  Rng r{seed * 0x9E3779B97F4A7C15ull + 1};
  for (int64_t i = 0; i < n; ++i) {
    const float u = (static_cast<float>(r.next() >> 40) / static_cast<float>(1 << 24) - 0.5f) * 2 * scale;
    const uint16_t b = f32_to_bf16(u);
    std::memcpy(out.data() + i * 2, &b, 2);
  }
  return out;
}

std::vector<uint8_t> i64_bytes(const std::vector<int64_t>& v) {
  std::vector<uint8_t> out(v.size() * 8);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

ModelConfig make_config() {
  ModelConfig c;
  c.arch = Arch::qwen3_moe_engram;
  c.model_type = "qwen3_moe_engram";
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.num_hidden_layers = kLayers;
  c.engram.layer_ids = {2, 5};
  c.engram.max_ngram_size = kNgram;
  c.engram.n_embed_per_ngram = kEmbedPerNgram;
  c.engram.n_head_per_ngram = kHeadsPerNgram;
  c.engram.kernel_size = kKernel;
  c.engram.pad_id = 0;
  return c;
}

// Writes DIR/model.safetensors with the Engram tensors (unless it is there already).
void make_checkpoint(const std::string& dir, int64_t rows_per_module) {
  const std::string path = dir + "/model.safetensors";
  const int64_t head_rows = rows_per_module / kHeads;
  const uint64_t want_min = static_cast<uint64_t>(2 * head_rows * kHeads * kHeadDim * 2);
  if (std::filesystem::exists(path) && std::filesystem::file_size(path) > want_min &&
      std::filesystem::file_size(path) < want_min + (64u << 20)) {
    io::TensorStore probe(dir);
    const auto* t = probe.find("model.layers.2.engram.table.weight");
    if (t && t->shape[0] == head_rows * kHeads) return;
  }
  std::filesystem::create_directories(dir);
  std::printf("writing the synthetic checkpoint (%.0f MiB of tables) to %s ...\n", static_cast<double>(want_min) / (1 << 20), path.c_str());
  std::fflush(stdout);
  std::vector<io::TensorToWrite> ts;
  std::vector<int64_t> lookup(static_cast<size_t>(kVocab));
  for (int64_t i = 0; i < kVocab; ++i) lookup[static_cast<size_t>(i)] = (i * 7919) % kCompressed;
  ts.push_back({"model.engram.token_lookup", DType::i64, {kVocab}, i64_bytes(lookup)});
  std::mt19937_64 rng(42);
  for (int64_t layer : {2, 5}) {
    const std::string p = "model.layers." + std::to_string(layer) + ".engram.";
    std::vector<int64_t> mult(kNgram);
    for (auto& m : mult) m = static_cast<int64_t>(rng() % (static_cast<uint64_t>(INT64_MAX / kCompressed) / 2)) * 2 + 1;
    std::vector<int64_t> sizes(kHeads, head_rows);
    for (size_t h = 0; h < sizes.size(); ++h) sizes[h] -= static_cast<int64_t>(h);  // distinct sizes
    int64_t total = 0;
    for (auto s : sizes) total += s;
    ts.push_back({p + "multipliers", DType::i64, {kNgram}, i64_bytes(mult)});
    ts.push_back({p + "head_sizes", DType::i64, {kHeads}, i64_bytes(sizes)});
    ts.push_back({p + "table.weight", DType::bf16, {total, kHeadDim}, random_bf16(total * kHeadDim, static_cast<uint64_t>(layer), 1.0f)});
    ts.push_back({p + "key_proj.weight", DType::bf16, {kHidden, kDmem}, random_bf16(kHidden * kDmem, 10 + static_cast<uint64_t>(layer), 0.05f)});
    ts.push_back({p + "key_proj.bias", DType::bf16, {kHidden}, random_bf16(kHidden, 20 + static_cast<uint64_t>(layer), 0.1f)});
    ts.push_back({p + "value_proj.weight", DType::bf16, {kHidden, kDmem}, random_bf16(kHidden * kDmem, 30 + static_cast<uint64_t>(layer), 0.05f)});
    ts.push_back({p + "value_proj.bias", DType::bf16, {kHidden}, random_bf16(kHidden, 40 + static_cast<uint64_t>(layer), 0.1f)});
    for (const char* nm : {"key_norm.weight", "query_norm.weight", "conv_norm.weight"})
      ts.push_back({p + nm, DType::bf16, {kHidden}, random_bf16(kHidden, 50 + static_cast<uint64_t>(layer), 1.0f)});
    ts.push_back({p + "conv.weight", DType::bf16, {kHidden, kKernel}, random_bf16(kHidden * kKernel, 60 + static_cast<uint64_t>(layer), 0.5f)});
  }
  io::write_safetensors(path, ts);
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Random `block`-byte O_DIRECT reads over the table file's data with
// io_uring at queue depth 64 over 4 rings for about `seconds`; then QD 1
// latency and 16-read groups (io/read_probe.h).
io::ReadProbeResult raw_uring(const std::string& path, double seconds, uint32_t block) {
  io::ReadProbeOptions o;
  o.block = block;
  o.seconds = seconds;
  return io::probe_random_reads(path, o);
}

// The latency of one module's reads at decode: a group of `n` random
// `block`-byte O_DIRECT reads submitted, then `gap_us` of compute on the
// submitting thread (the layers in front of the module), then wait(); then
// `rest_us` more compute (the rest of the step) before the next group. Per
// reader configuration: the median and 90th percentile of submit -> last
// read issued, issued -> last read landed, submit -> landed, and the time
// wait() blocked. `direct` is the floor: the submitting thread issues into
// its own ring and polls for completions, no other thread involved.
struct BurstConfig {
  std::string label;
  bool pread = false, direct = false;
  io::UringOptions opt;
};

void spin_for(double us) {
  const auto t0 = Clock::now();
  while (secs(t0) * 1e6 < us) {
  }
}

void burst_test(const std::string& path, uint32_t block, int n, double gap_us, double rest_us, int groups) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) fail(ErrorKind::io, path + ": cannot open with O_DIRECT");
  const uint64_t blocks = std::filesystem::file_size(path) / block;
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, static_cast<size_t>(n) * 4096) != 0) fail(ErrorKind::out_of_memory, "burst test buffer");
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(mem), &std::free);
  std::vector<BurstConfig> cfgs;
  cfgs.push_back({"direct (floor)", false, true, {}});
  for (unsigned rings : {1u, 4u, 16u}) cfgs.push_back({"driver x" + std::to_string(rings), false, false, {64, rings, io::UringIssue::driver, 0}});
  for (unsigned spin : {100u, 1000u}) cfgs.push_back({"driver x4 spin " + std::to_string(spin), false, false, {64, 4, io::UringIssue::driver, spin}});
  for (unsigned rings : {1u, 4u}) cfgs.push_back({"caller x" + std::to_string(rings), false, false, {64, rings, io::UringIssue::caller, 0}});
  cfgs.push_back({"caller x1 spin 1000", false, false, {64, 1, io::UringIssue::caller, 1000}});
  for (unsigned rings : {1u, 4u}) cfgs.push_back({"sqpoll x" + std::to_string(rings), false, false, {64, rings, io::UringIssue::sqpoll, 0}});
  cfgs.push_back({"sqpoll x1 spin 1000", false, false, {64, 1, io::UringIssue::sqpoll, 1000}});
  cfgs.push_back({"pread x16", true, false, {}});
  std::printf("\nburst test: %d random %u-byte O_DIRECT reads, then %.0f us of compute, wait, %.0f us more; %d groups per configuration\n", n, block, gap_us,
              rest_us, groups);
  std::printf("| reader | issue us p50 / p90 | device us p50 / p90 | submit->landed us p50 / p90 | wait us p50 / p90 | mean wait us |\n|---|---:|---:|---:|---:|---:|\n");
  Rng rng{777};
  auto pct = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  for (const auto& c : cfgs) {
    std::vector<double> issue, device, total, waited;
    std::string why;
    std::unique_ptr<io::BlockReader> r;
    io_uring ring{};
    if (c.direct) {
      if (io_uring_queue_init(static_cast<unsigned>(n) + 2, &ring, 0) < 0) continue;
    } else {
      r = c.pread ? io::make_pread_reader(fd, path, 16) : io::make_uring_reader(fd, path, c.opt, &why);
      if (!r) {
        std::printf("| %s | unavailable: %s | | | | |\n", c.label.c_str(), why.c_str());
        continue;
      }
    }
    for (int gi = 0; gi < groups + 10; ++gi) {
      std::vector<io::ReadRequest> reqs;
      for (int i = 0; i < n; ++i) reqs.push_back({(rng.next() % blocks) * block, block, buf.get() + i * 4096});
      if (c.direct) {
        const auto t0 = Clock::now();
        for (const auto& q : reqs) io_uring_prep_read(io_uring_get_sqe(&ring), fd, q.dst, q.len, q.offset);
        io_uring_submit(&ring);
        const auto t1 = Clock::now();
        int left = n;
        auto poll = [&] {
          io_uring_cqe* cqe;
          while (left > 0 && io_uring_peek_cqe(&ring, &cqe) == 0) {
            if (cqe->res != static_cast<int>(block)) fail(ErrorKind::io, "burst test: direct read failed");
            io_uring_cqe_seen(&ring, cqe);
            --left;
          }
        };
        Clock::time_point landed{};
        const auto gap0 = Clock::now();
        while (secs(gap0) * 1e6 < gap_us) {  // compute, checking now and then what landed
          poll();
          if (left == 0 && landed == Clock::time_point{}) landed = Clock::now();
        }
        const auto w0 = Clock::now();
        while (left > 0) poll();
        if (landed == Clock::time_point{}) landed = Clock::now();
        const double w = secs(w0) * 1e6;
        if (gi >= 10) {
          issue.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          device.push_back(std::chrono::duration<double, std::micro>(landed - t1).count());
          total.push_back(std::chrono::duration<double, std::micro>(landed - t0).count());
          waited.push_back(w);
        }
      } else {
        auto g = r->submit(std::move(reqs));
        spin_for(gap_us);
        const double w = static_cast<double>(r->wait(*g)) / 1e3;
        if (gi >= 10) {
          issue.push_back(std::chrono::duration<double, std::micro>(g->issued - g->submitted).count());
          device.push_back(std::chrono::duration<double, std::micro>(g->completed - g->issued).count());
          total.push_back(std::chrono::duration<double, std::micro>(g->completed - g->submitted).count());
          waited.push_back(w);
        }
      }
      spin_for(rest_us);
    }
    if (c.direct) io_uring_queue_exit(&ring);
    double mean = 0;
    for (double w : waited) mean += w / static_cast<double>(waited.size());
    std::printf("| %s | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f | %.1f |\n", c.label.c_str(), pct(issue, 0.5), pct(issue, 0.9), pct(device, 0.5),
                pct(device, 0.9), pct(total, 0.5), pct(total, 0.9), pct(waited, 0.5), pct(waited, 0.9), mean);
    std::fflush(stdout);
  }
  ::close(fd);
}

struct Synthetic {
  std::vector<std::vector<uint8_t>> weights;
  std::vector<cpu::Mat> layers;
  Synthetic() {
    for (int64_t l = 0; l < kLayers; ++l) {
      weights.push_back(random_bf16(kHidden * kHidden, 100 + static_cast<uint64_t>(l), 1.0f / std::sqrt(static_cast<float>(kHidden))));
      layers.push_back(cpu::Mat{DType::bf16, weights.back().data(), kHidden, kHidden});
    }
  }
};

double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

struct Row {
  std::string backend, scenario;
  double seconds = 0;  // timed steps, summed
  double cpu_seconds = 0;  // CPU time of the whole process (all threads, io_uring's kernel threads too) over them
  int64_t steps = 0;
  io::PleStats io;      // summed over the rounds
  io::PleStats m0, m1;  // the first and second module alone
  void add(const Row& o) {
    seconds += o.seconds;
    cpu_seconds += o.cpu_seconds;
    steps += o.steps;
    io += o.io;
    m0 += o.m0;
    m1 += o.m1;
  }
};

// "total (issue + device)" microseconds per step of one table's reads, "-" when it read nothing.
std::string reads_cell(const io::PleStats& st, double steps) {
  if (st.io_ns <= 0) return "-";
  const double total = static_cast<double>(st.io_ns) / 1e3 / steps, issue = static_cast<double>(st.issue_ns) / 1e3 / steps;
  return std::to_string(static_cast<int>(total)) + " (" + std::to_string(static_cast<int>(issue)) + " + " + std::to_string(static_cast<int>(total - issue)) + ")";
}

void step(EngramModules& e, const Synthetic& syn, const Batch& b, KvCache& kv, std::vector<float>& x, std::vector<float>& tmp,
          numa::ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  e.begin_step(b, kv);
  for (int64_t l = 0; l < kLayers; ++l) {
    if (int m = e.module_before(l); m >= 0) e.apply(m, x.data(), b, kv);
    cpu::gemm(x.data(), n, syn.layers[static_cast<size_t>(l)], tmp.data(), &pool);
    for (int64_t i = 0; i < n * kHidden; ++i) x[static_cast<size_t>(i)] = 0.5f * x[static_cast<size_t>(i)] + std::tanh(tmp[static_cast<size_t>(i)]);
  }
}

// Token ids: uniform over the vocabulary, or (zipf > 0) rank k drawn with
// weight 1 / (k + 1)^zipf, as word frequencies in text go (s about 1); the
// ranks are scattered over the ids.
class TokenSource {
 public:
  explicit TokenSource(double zipf) {
    if (zipf <= 0) return;
    cdf_.resize(static_cast<size_t>(kVocab));
    double acc = 0;
    for (int64_t k = 0; k < kVocab; ++k) cdf_[static_cast<size_t>(k)] = acc += 1.0 / std::pow(static_cast<double>(k + 1), zipf);
    for (auto& v : cdf_) v /= acc;
  }
  int32_t next(Rng& rng) const {
    if (cdf_.empty()) return static_cast<int32_t>(rng.next() % kVocab);
    const double u = static_cast<double>(rng.next() >> 11) / static_cast<double>(uint64_t{1} << 53);
    const int64_t rank = std::min<int64_t>(kVocab - 1, std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
    return static_cast<int32_t>((rank * 7919 + 13) % kVocab);
  }

 private:
  std::vector<double> cdf_;
};

// `round` seeds the tokens: every round draws new ones (a replayed sequence
// would be served from the row cache of the round before).
Row run_scenario(EngramModules& e, const Synthetic& syn, numa::ThreadPool& pool, const TokenSource& tokens, int64_t round, const std::string& backend,
                 int64_t batch, int64_t steps,
                 int64_t prefill) {
  KvLayout layout{1, 1, 1};
  layout.seq_state_bytes = e.seq_state_bytes();
  KvCache kv(layout, 4, 16);
  std::vector<int> seqs;
  std::vector<int64_t> pos;
  Rng rng{static_cast<uint64_t>(batch * 1000 + prefill + 7 + round * 1000003)};
  const int64_t n = prefill > 0 ? prefill : batch;
  std::vector<float> x(static_cast<size_t>(n * kHidden)), tmp(x.size());
  auto fill_x = [&] {
    for (auto& v : x) v = static_cast<float>(static_cast<int64_t>(rng.next() % 2001) - 1000) * 1e-3f;
  };
  Row row;
  row.backend = backend;
  if (prefill > 0) {
    row.scenario = "prefill " + std::to_string(prefill);
  } else {
    row.scenario = "decode b" + std::to_string(batch);
    for (int64_t s = 0; s < batch; ++s) {  // 4-token prompts, not timed
      seqs.push_back(kv.add_sequence());
      pos.push_back(0);
    }
    Batch b;
    for (int64_t s = 0; s < batch; ++s)
      for (int64_t i = 0; i < 4; ++i) b.add(tokens.next(rng), seqs[static_cast<size_t>(s)], pos[static_cast<size_t>(s)]++, false);
    std::vector<float> xp(static_cast<size_t>(4 * batch * kHidden), 0.1f), tp(xp.size());
    step(e, syn, b, kv, xp, tp, pool);
  }
  e.table().reset_stats();
  double total = 0;
  const double cpu0 = process_cpu_seconds();
  for (int64_t it = 0; it < steps; ++it) {
    Batch b;
    if (prefill > 0) {
      const int s = kv.add_sequence();
      for (int64_t i = 0; i < prefill; ++i) b.add(tokens.next(rng), s, i, false);
    } else {
      for (int64_t s = 0; s < batch; ++s) b.add(tokens.next(rng), seqs[static_cast<size_t>(s)], pos[static_cast<size_t>(s)]++, false);
    }
    fill_x();
    const auto t0 = Clock::now();
    step(e, syn, b, kv, x, tmp, pool);
    total += secs(t0);
    if (prefill > 0) kv.free_sequence(b.slots[0].seq);
  }
  row.seconds = total;
  row.cpu_seconds = process_cpu_seconds() - cpu0;
  row.steps = steps;
  row.io = e.table().stats();
  row.m0 = e.table().table_stats(0);
  row.m1 = e.table().table_stats(1);
  return row;
}

// Text as a token stream: one sequence decoding the text's tokens one step
// at a time on `e` (a file backend with its row cache), printing per window
// of 1000 tokens how many of the distinct rows asked for came from the cache
// (the cache starts empty and warms over the text).
void text_hits(EngramModules& e, const Synthetic& syn, numa::ThreadPool& pool, const std::vector<int32_t>& ids, const std::string& what) {
  KvLayout layout{1, 1, 1};
  layout.seq_state_bytes = e.seq_state_bytes();
  KvCache kv(layout, 4, 16);
  const int seq = kv.add_sequence();
  std::vector<float> x(static_cast<size_t>(kHidden), 0.01f), tmp(x.size());
  e.table().reset_stats();
  std::printf("\n%s: %zu tokens, decode batch 1\n| tokens | rows asked (distinct) | from the row cache | I/O wait ms/step |\n|---:|---:|---:|---:|\n",
              what.c_str(), ids.size());
  io::PleStats last;
  for (size_t i = 0; i < ids.size(); ++i) {
    Batch b;
    b.add(ids[i], seq, static_cast<int64_t>(i), false);
    step(e, syn, b, kv, x, tmp, pool);
    if ((i + 1) % 1000 == 0 || i + 1 == ids.size()) {
      const io::PleStats st = e.table().stats();
      const int64_t uniq = st.rows_unique - last.rows_unique, hit = st.rows_cached - last.rows_cached;
      const double steps = static_cast<double>(st.steps - last.steps) / static_cast<double>(e.modules());
      std::printf("| %zu | %lld | %.1f%% | %.3f |\n", i + 1, static_cast<long long>(uniq), uniq > 0 ? 100.0 * static_cast<double>(hit) / static_cast<double>(uniq) : 0.0,
                  steps > 0 ? static_cast<double>(st.wait_ns - last.wait_ns) / 1e6 / steps : 0.0);
      std::fflush(stdout);
      last = st;
    }
  }
}

// --gpu: the same Engram modules inside a whole GPU step (GpuRuntime, engine/
// engram_gpu.h) of a synthetic Qwen3-30B-A3B-shaped model with 8 layers,
// all resident (random bf16 weights; the modules before layers 2 and 5, as
// above). The window in front of module 1 is then two GPU layers, not two
// CPU gemms. Decode at batch 1 and 8 per PLE variant (one GpuRuntime each),
// plain launches and CUDA graphs (the layers between modules replayed), the
// variants rotated over rounds: step time against the in-RAM table, and the
// I/O wait of module 1 and 2.
void gpu_decode(const std::vector<std::unique_ptr<EngramModules>>& mods, const std::vector<std::string>& labels, const io::TensorStore& engram_store,
                int64_t steps, int64_t rounds, const TokenSource& tokens) {
  const ModelConfig plain = bench::qwen3_30b_a3b_config(kLayers);  // the synthetic weights: the Qwen3-MoE graph
  ModelConfig c = plain;
  const ModelConfig e = make_config();
  c.arch = e.arch;
  c.model_type = e.model_type;
  c.engram = e.engram;
  numa::PoolOptions popt;
  popt.threads = 8;           // fills the synthetic weights
  popt.power_saving = true;  // every MoE layer is resident: the CPU expert pools stay idle
  popt.quiet = true;
  numa::NodePools pools(popt);
  auto model = bench::make_synthetic_model(plain, pools.pool(0), 7);
  const WeightLookup base = model->get();
  const WeightLookup get = [&](const std::string& name, const std::vector<int64_t>& shape) {
    if (name.find(".engram.") == std::string::npos) return base(name, shape);
    const io::TensorView& t = engram_store.get(name, shape);
    return cpu::Mat{t.dtype, t.data, shape.empty() ? 1 : shape[0], shape.size() > 1 ? shape[1] : 1};
  };
  std::printf("\nGPU step: synthetic Qwen3-30B-A3B shapes, %lld layers, all resident (%.1f GB of bf16 weights), Engram modules before layers 2 and 5\n",
              static_cast<long long>(kLayers), static_cast<double>(model->bytes()) / 1e9);
  const std::vector<bool> resident(static_cast<size_t>(kLayers), true);
  std::vector<std::unique_ptr<GpuRuntime>> stacks;
  GpuRuntimeOptions ro;
  ro.resident = resident;
  for (size_t v = 0; v < mods.size(); ++v) stacks.push_back(GpuRuntime::from_lookup(c, get, pools, ro, mods[v].get()));
  std::printf("| CUDA graphs | batch | variant | step ms | vs ram | I/O wait ms/step (module 1 + 2) | module 1 reads us (issue + device) | reads/step | cached rows/step |\n"
              "|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
  for (bool graphs : {false, true})
  for (int batch : {1, 8}) {
    for (auto& st : stacks) st->set_cuda_graphs(graphs);
    std::vector<double> secs_sum(mods.size(), 0);
    std::vector<int64_t> nsteps(mods.size(), 0);
    std::vector<io::PleStats> m0(mods.size()), m1(mods.size());
    for (int64_t round = 0; round < rounds; ++round)
      for (size_t k = 0; k < mods.size(); ++k) {
        const size_t v = (k + static_cast<size_t>(round)) % mods.size();
        // New tokens for every round, batch and graph setting: replayed ones would come from the row cache.
        Rng rng{static_cast<uint64_t>(batch * 7777 + round * 1000003 + (graphs ? 500009 : 0) + 11)};
        const int64_t prompt = 8, per = std::max<int64_t>(1, steps / rounds), total = prompt + per + 2;
        KvLayout layout{kLayers, c.num_key_value_heads, c.head_dim};
        layout.seq_state_bytes = mods[v]->seq_state_bytes();
        KvCache kv(layout, batch * ((total + 15) / 16) + 1, 16);
        std::vector<int> seqs;
        Batch b;
        for (int q = 0; q < batch; ++q) {
          seqs.push_back(kv.add_sequence());
          kv.reserve(seqs.back(), total);
          for (int64_t i = 0; i < prompt; ++i) b.add(tokens.next(rng), seqs.back(), i, i + 1 == prompt);
        }
        std::vector<float> logits;
        stacks[v]->forward(b, kv, logits);  // prompt, untimed
        mods[v]->table().reset_stats();
        for (int64_t i = 0; i < per; ++i) {
          b.clear();
          for (int q = 0; q < batch; ++q) b.add(tokens.next(rng), seqs[static_cast<size_t>(q)], prompt + i, true);
          const auto t0 = Clock::now();
          stacks[v]->forward(b, kv, logits);
          secs_sum[v] += secs(t0);
        }
        nsteps[v] += per;
        m0[v] += mods[v]->table().table_stats(0);
        m1[v] += mods[v]->table().table_stats(1);
      }
    const double ram_ms = secs_sum[0] / static_cast<double>(nsteps[0]) * 1e3;
    for (size_t v = 0; v < mods.size(); ++v) {
      const double n = static_cast<double>(nsteps[v]), ms = secs_sum[v] / n * 1e3;
      const std::string m0s = reads_cell(m0[v], n);
      std::printf("| %s | %d | %s | %.3f | %.2fx | %.3f (%.3f + %.3f) | %s | %.0f | %.1f |\n", graphs ? "on" : "off", batch, labels[v].c_str(), ms, ms / ram_ms,
                  static_cast<double>(m0[v].wait_ns + m1[v].wait_ns) / 1e6 / n, static_cast<double>(m0[v].wait_ns) / 1e6 / n,
                  static_cast<double>(m1[v].wait_ns) / 1e6 / n, m0s.c_str(), static_cast<double>(m0[v].reads + m1[v].reads) / n,
                  static_cast<double>(m0[v].rows_cached + m1[v].rows_cached) / n);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int64_t table_mib = 2048, decode_steps = 48, prefill = 2048, threads = 0, decode_rounds = 3;
    double zipf = 0;
    std::string text, tokenizer_dir = "fixtures/tiny-qwen3moe";
    std::string dir = "bench-ple-data", only;
    bool burst = false, gpu_mode = false;
    for (int i = 1; i < argc; i += 2) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("usage: bench_ple [--table-mib N] [--dir DIR] [--decode-steps N] [--prefill N] [--threads N] [--rounds N] [--zipf S] [--text FILE,... [--tokenizer DIR]]\n"
                    "                 [--variants LABEL,...] [--burst] [--gpu]\n"
                    "  writes DIR/model.safetensors and DIR/ple-table.hmoe (N MiB of tables; default 2048 in ./bench-ple-data)\n");
        return 0;
      }
      if (a == "--burst" || a == "--gpu") {
        (a == "--burst" ? burst : gpu_mode) = true;
        --i;
        continue;
      }
      if (i + 1 >= argc) fail(ErrorKind::invalid_argument, "option " + a + " needs a value");
      const std::string v = argv[i + 1];
      if (a == "--table-mib") table_mib = parse_int(a, v);
      else if (a == "--dir") dir = v;
      else if (a == "--decode-steps") decode_steps = parse_int(a, v);
      else if (a == "--prefill") prefill = parse_int(a, v);
      else if (a == "--threads") threads = parse_int(a, v);
      else if (a == "--rounds") decode_rounds = std::max<int64_t>(1, parse_int(a, v));
      else if (a == "--zipf") zipf = std::stod(v);
      else if (a == "--text") text = v;
      else if (a == "--tokenizer") tokenizer_dir = v;
      else if (a == "--variants") only = "," + v + ",";
      else fail(ErrorKind::invalid_argument, "unknown option " + a);
    }
    const int64_t rows_per_module = table_mib * (int64_t{1} << 20) / 2 / (kHeadDim * 2);
    make_checkpoint(dir, rows_per_module);
    const ModelConfig c = make_config();
    numa::ThreadPool pool(static_cast<int>(threads), true);
    Synthetic syn;
    const std::string table = dir + "/ple-table.hmoe";
    // The file backends with their defaults (io_uring: the finest O_DIRECT
    // block, module reads ordered), plus io_uring with both modules' reads at
    // once, with 4 KiB blocks, and with both (the design before).
    struct Variant {
      const char* label;
      const char* backend;
      int64_t block;
      bool ordered;
      int64_t cache_mib;  // -1: the default
      const char* issue = "driver";
      int64_t spin_us = 0;
      const char* ram_modules = "none";
    };
    const Variant all_variants[] = {{"ram", "ram", 0, true, -1},
                                {"io_uring", "io_uring", 0, true, -1},
                                {"io_uring no cache", "io_uring", 0, true, 0},
                                {"io_uring together", "io_uring", 0, false, -1},
                                {"io_uring 4k", "io_uring", 4096, true, -1},
                                {"io_uring 4k together", "io_uring", 4096, false, -1},
                                {"io_uring spin", "io_uring", 0, true, -1, "driver", 1000},
                                {"io_uring caller", "io_uring", 0, true, -1, "caller", 0},
                                {"io_uring sqpoll", "io_uring", 0, true, -1, "sqpoll", 0},
                                {"io_uring sqpoll spin", "io_uring", 0, true, -1, "sqpoll", 1000},
                                {"io_uring module 1 in RAM", "io_uring", 0, true, -1, "driver", 0, "0"},
                                {"pread", "pread", 0, true, -1},
                                {"mmap", "mmap", 0, true, -1}};
    std::vector<Variant> variants;
    for (const Variant& v : all_variants)
      if (only.empty() || v.label == std::string("ram") || only.find("," + std::string(v.label) + ",") != std::string::npos) variants.push_back(v);
    const TokenSource tokens(zipf);
    std::printf("token ids: %s\n", zipf > 0 ? ("Zipf, s = " + std::to_string(zipf)).c_str() : "uniform");
    std::vector<std::unique_ptr<io::TensorStore>> stores;
    std::vector<std::unique_ptr<EngramModules>> mods;
    for (const Variant& v : variants) {
      std::vector<std::string> none;
      Settings s = Settings::load(none);
      s.ple_backend = v.backend;
      s.ple_table = table;
      s.ple_read_block = v.block;
      s.ple_ordered_reads = v.ordered;
      if (v.cache_mib >= 0) s.ple_cache_mib = v.cache_mib;
      s.ple_uring_issue = v.issue;
      s.ple_spin_us = v.spin_us;
      s.ple_ram_modules = v.ram_modules;
      s.progress = "lines";
      stores.push_back(std::make_unique<io::TensorStore>(dir));
      WeightBinder bind(*stores.back());
      const auto t0 = Clock::now();
      mods.push_back(EngramModules::load(bind, c, dir, s, pool));
      const auto& t = mods.back()->table();
      std::printf("%-24s: opened in %.2f s, %u-byte read blocks%s%s\n", v.label, secs(t0), t.read_block(),
                  t.file_written() ? " (table file written)" : "", t.notice().empty() ? "" : (" notice: " + t.notice()).c_str());
      std::fflush(stdout);
    }
    if (!text.empty()) {  // only the text run: the row cache's hit rate on real token streams
      std::vector<std::string> none;
      const int64_t default_cache_mib = Settings::load(none).ple_cache_mib;
      const auto tk = tok::Tokenizer::from_dir(tokenizer_dir);
      std::vector<int32_t> ids;
      std::string names;
      for (size_t b = 0, e; b <= text.size(); b = e + 1) {
        e = text.find(',', b);
        if (e == std::string::npos) e = text.size();
        const std::string f = text.substr(b, e - b);
        std::ifstream in(f, std::ios::binary);
        if (!in) fail(ErrorKind::io, "cannot read " + f);
        const std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        for (int32_t id : tk->encode(body, false))
          if (id >= 0 && id < kVocab) ids.push_back(id);
        names += (names.empty() ? "" : " + ") + f;
      }
      text_hits(*mods[1], syn, pool, ids, names + " (tokenizer of " + tokenizer_dir + "), io_uring with the default " + std::to_string(default_cache_mib) + " MiB row cache");
      return 0;
    }
    if (gpu_mode) {
      std::vector<std::string> labels;
      for (const Variant& v : variants) labels.push_back(v.label);
      gpu_decode(mods, labels, *stores.front(), decode_steps, decode_rounds, tokens);
      return 0;
    }
    const uint32_t fine = mods.size() > 1 ? mods[1]->table().read_block() : 512;
    if (burst) {
      drop_cache(table);
      burst_test(table, fine, 16, 270, 800, 400);
      burst_test(table, fine, 128, 1200, 4000, 100);
      return 0;
    }
    std::vector<std::pair<uint32_t, io::ReadProbeResult>> raws;
    for (uint32_t blk : {fine, 4096u}) {
      if (!raws.empty() && raws.back().first == blk) continue;
      drop_cache(table);
      raws.push_back({blk, raw_uring(table, 3.0, blk)});
      const io::ReadProbeResult& raw = raws.back().second;
      std::printf("raw io_uring, O_DIRECT random %u-byte reads of %s (%.0f MiB): QD64 over 4 rings %.0f IOPS, %.1f MB/s; QD1 %.1f us per read\n", blk,
                  table.c_str(), static_cast<double>(std::filesystem::file_size(table)) / (1 << 20), raw.iops, raw.mbps, raw.qd1_us);
      std::fflush(stdout);
    }
    // Variants take turns in rounds so that load from other processes hits them alike.
    struct Scenario {
      int64_t batch, steps, prefill;
    };
    std::vector<Scenario> scenarios = {{1, decode_steps, 0}, {8, decode_steps, 0}};
    if (prefill > 0) scenarios.push_back({1, 1, prefill});
    // Each round starts at the next variant, so that none always runs first
    // after the disk sat idle (the in-RAM run) or last.
    std::vector<Row> rows;
    for (const auto& sc : scenarios) {
      std::vector<Row> acc(std::size(variants));
      const int64_t rounds = sc.prefill > 0 ? std::max<int64_t>(1, decode_rounds / 3) : decode_rounds;  // a 2k prefill takes seconds on a small box
      for (int64_t round = 0; round < rounds; ++round)
        for (size_t k = 0; k < std::size(variants); ++k) {
          const size_t b = (k + static_cast<size_t>(round)) % std::size(variants);
          drop_cache(table);
          const int64_t steps = sc.prefill > 0 ? sc.steps : std::max<int64_t>(1, sc.steps / rounds);
          Row r = run_scenario(*mods[b], syn, pool, tokens, round, variants[b].label, sc.batch, steps, sc.prefill);
          acc[b].backend = r.backend;
          acc[b].scenario = r.scenario;
          acc[b].add(r);
        }
      for (auto& r : acc) rows.push_back(r);
    }
    std::printf("\n| scenario | backend | step ms | vs ram | CPU cores busy | I/O wait ms/step (module 1 + 2) | module 1 reads us (issue + device) | hidden | cached rows/step | reads/step | KiB/step | IOPS | MB/s |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double ram_ms = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const Variant& v = variants[i % std::size(variants)];
      const double step_ms = r.seconds / static_cast<double>(r.steps) * 1e3;
      if (r.backend == "ram") ram_ms = step_ms;
      const double per = static_cast<double>(r.steps);
      std::string hidden = "-", iops = "-", mbps = "-";
      if (r.io.io_ns > 0) {
        // Time with reads in flight: ordered modules' reads follow each
        // other (sum); unordered ones overlap (about the longer of the two).
        const double io_s = (v.ordered ? static_cast<double>(r.io.io_ns) : static_cast<double>(std::max(r.m0.io_ns, r.m1.io_ns))) / 1e9;
        iops = std::to_string(static_cast<int64_t>(static_cast<double>(r.io.reads) / io_s));
        mbps = std::to_string(static_cast<int64_t>(static_cast<double>(r.io.bytes_read) / io_s / 1e6));
        hidden = std::to_string(static_cast<int>(r.io.hidden_fraction() * 100)) + "%";
      }
      const std::string m0 = reads_cell(r.m0, per);
      std::printf("| %s | %s | %.2f | %.2fx | %.1f | %.3f (%.3f + %.3f) | %s | %s | %.1f | %.0f | %.0f | %s | %s |\n", r.scenario.c_str(), r.backend.c_str(), step_ms,
                  ram_ms > 0 ? step_ms / ram_ms : 0.0, r.cpu_seconds / std::max(1e-9, r.seconds), static_cast<double>(r.io.wait_ns) / 1e6 / per,
                  static_cast<double>(r.m0.wait_ns) / 1e6 / per, static_cast<double>(r.m1.wait_ns) / 1e6 / per, m0.c_str(), hidden.c_str(),
                  static_cast<double>(r.io.rows_cached) / per, static_cast<double>(r.io.reads) / per, static_cast<double>(r.io.bytes_read) / 1024.0 / per, iops.c_str(), mbps.c_str());
    }
    std::printf("\n");
    for (const auto& [blk, raw] : raws)
      std::printf("raw io_uring QD64 on the same file, %u-byte random O_DIRECT reads: %.0f IOPS, %.1f MB/s; QD1 latency %.1f us\n", blk, raw.iops,
                  raw.mbps, raw.qd1_us);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_ple: %s\n", e.what());
    return 1;
  }
}
