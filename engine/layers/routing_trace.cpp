// Routing traces (see routing_trace.h).
#include "engine/layers/routing_trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include "configs/error.h"

namespace hmoe {

namespace {

constexpr char kMagic[8] = {'H', 'M', 'O', 'E', 'R', 'T', '0', '1'};
constexpr uint32_t kVersion = 1;

void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> header_bytes(const RoutingTraceHeader& h) {
  std::vector<uint8_t> b(kMagic, kMagic + 8);
  for (uint32_t v : {kVersion, h.layers, h.experts, h.topk, h.hidden, h.moe_intermediate}) put_u32(b, v);
  return b;
}

void write_all(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n && std::fwrite(p, 1, n, f) != n) fail(ErrorKind::internal, "routing trace " + path + ": write failed: " + std::strerror(errno));
}

}  // namespace

RoutingTraceWriter::RoutingTraceWriter(const std::string& path, const RoutingTraceHeader& h) : path_(path), h_(h) {
  if (h.experts == 0 || h.experts > 65535)
    fail(ErrorKind::unsupported, "routing trace: " + std::to_string(h.experts) + " experts per layer (the format holds 1..65535)");
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) fail(ErrorKind::invalid_argument, "routing trace file '" + path + "' cannot be written: " + std::strerror(errno));
  const auto b = header_bytes(h);
  write_all(f_, b.data(), b.size(), path_);
}

RoutingTraceWriter::~RoutingTraceWriter() {
  if (f_) std::fclose(f_);
}

void RoutingTraceWriter::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  ++step_;
}

void RoutingTraceWriter::record(int64_t layer, int64_t tokens, int64_t k, const int32_t* ids) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t head[4] = {static_cast<uint32_t>(std::max<int64_t>(step_, 0)), static_cast<uint32_t>(layer), static_cast<uint32_t>(tokens),
                            static_cast<uint32_t>(k)};
  buf_.resize(static_cast<size_t>(tokens * k));
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= h_.experts)
      fail(ErrorKind::internal, "routing trace: expert id " + std::to_string(ids[i]) + " of layer " + std::to_string(layer) + " out of range");
    buf_[static_cast<size_t>(i)] = static_cast<uint16_t>(ids[i]);
  }
  write_all(f_, head, sizeof head, path_);
  write_all(f_, buf_.data(), buf_.size() * 2, path_);
  ++records_;
}

void RoutingTraceWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (f_ && std::fflush(f_) != 0) fail(ErrorKind::internal, "routing trace " + path_ + ": flush failed: " + std::strerror(errno));
}

RoutingTrace read_routing_trace(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::invalid_argument, "routing trace '" + path + "' cannot be opened: " + std::strerror(errno));
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&](size_t off, const std::string& what) {
    fail(ErrorKind::invalid_argument, "routing trace '" + path + "' at byte " + std::to_string(off) + ": " + what);
  };
  auto u32 = [&](size_t off) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[off + static_cast<size_t>(i)]) << (8 * i);
    return v;
  };
  if (b.size() < 32) bad(0, "shorter than the 32-byte header (" + std::to_string(b.size()) + " bytes)");
  if (std::memcmp(b.data(), kMagic, 8) != 0) bad(0, "not an hmoe routing trace (magic is not HMOERT01)");
  if (u32(8) != kVersion) bad(8, "version " + std::to_string(u32(8)) + " (this build reads version 1)");
  RoutingTrace t;
  t.header = {u32(12), u32(16), u32(20), u32(24), u32(28)};
  const RoutingTraceHeader& h = t.header;
  if (h.layers == 0 || h.experts == 0 || h.experts > 65535 || h.topk == 0 || h.topk > h.experts)
    bad(12, "header has layers " + std::to_string(h.layers) + ", experts " + std::to_string(h.experts) + ", topk " + std::to_string(h.topk) +
                " (need layers >= 1, 1 <= topk <= experts <= 65535)");
  size_t off = 32;
  int64_t last_step = -1;
  while (off < b.size()) {
    if (b.size() - off < 16) bad(off, "truncated record header");
    RoutingRecord r{u32(off), u32(off + 4), u32(off + 8), u32(off + 12), {}};
    if (r.layer >= h.layers) bad(off + 4, "layer " + std::to_string(r.layer) + " is beyond the header's " + std::to_string(h.layers) + " layers");
    if (r.k == 0 || r.k > h.topk) bad(off + 12, "k " + std::to_string(r.k) + " is not in 1..topk (" + std::to_string(h.topk) + ")");
    if (static_cast<int64_t>(r.step) < last_step) bad(off, "step " + std::to_string(r.step) + " after step " + std::to_string(last_step));
    last_step = r.step;
    off += 16;
    const uint64_t n = static_cast<uint64_t>(r.tokens) * r.k;
    if ((b.size() - off) / 2 < n) bad(off, "truncated: record of " + std::to_string(r.tokens) + " tokens x " + std::to_string(r.k) + " ids");
    r.ids.resize(n);
    std::memcpy(r.ids.data(), b.data() + off, n * 2);
    for (uint64_t i = 0; i < n; ++i)
      if (r.ids[i] >= h.experts) bad(off + 2 * i, "expert id " + std::to_string(r.ids[i]) + " >= experts (" + std::to_string(h.experts) + ")");
    off += n * 2;
    t.records.push_back(std::move(r));
  }
  return t;
}

void write_routing_trace(const std::string& path, const RoutingTrace& t) {
  RoutingTraceWriter w(path, t.header);
  int64_t step = -1;
  std::vector<int32_t> ids;
  for (const RoutingRecord& r : t.records) {
    while (step < static_cast<int64_t>(r.step)) {
      w.begin_step();
      ++step;
    }
    ids.assign(r.ids.begin(), r.ids.end());
    w.record(r.layer, r.tokens, r.k, ids.data());
  }
  w.flush();
}

RoutingTrace zipf_routing_trace(double s, int64_t experts, int64_t topk, int64_t layers, int64_t tokens, int64_t batch, uint64_t seed,
                                int64_t hidden, int64_t moe_intermediate) {
  if (experts < 1 || experts > 65535 || topk < 1 || topk > experts || layers < 1 || layers > 100000 || tokens < 1 || batch < 1 || s < 0 ||
      s > 10 || hidden < 1 || moe_intermediate < 1)
    fail(ErrorKind::invalid_argument, "zipf trace: need 1 <= topk <= experts <= 65535, 1 <= layers <= 100000, tokens >= 1, batch >= 1, 0 <= s <= 10");
  RoutingTrace t;
  t.header = {static_cast<uint32_t>(layers), static_cast<uint32_t>(experts), static_cast<uint32_t>(topk), static_cast<uint32_t>(hidden),
              static_cast<uint32_t>(moe_intermediate)};
  std::mt19937_64 rng(seed);
  // Per layer: expert of popularity rank r (0-based) is perm[r].
  std::vector<std::vector<uint16_t>> perm(static_cast<size_t>(layers));
  for (auto& p : perm) {
    p.resize(static_cast<size_t>(experts));
    std::iota(p.begin(), p.end(), uint16_t{0});
    std::shuffle(p.begin(), p.end(), rng);
  }
  // Cumulative rank weights; k distinct draws by rejection (k << E in practice; falls back to a scan).
  std::vector<double> cdf(static_cast<size_t>(experts));
  double acc = 0;
  for (int64_t r = 0; r < experts; ++r) cdf[static_cast<size_t>(r)] = acc += std::pow(static_cast<double>(r + 1), -s);
  std::uniform_real_distribution<double> u(0.0, acc);
  std::vector<char> taken(static_cast<size_t>(experts));
  const int64_t steps = (tokens + batch - 1) / batch;
  for (int64_t st = 0; st < steps; ++st) {
    const int64_t n = std::min(batch, tokens - st * batch);
    for (int64_t l = 0; l < layers; ++l) {
      RoutingRecord r{static_cast<uint32_t>(st), static_cast<uint32_t>(l), static_cast<uint32_t>(n), static_cast<uint32_t>(topk), {}};
      r.ids.reserve(static_cast<size_t>(n * topk));
      for (int64_t i = 0; i < n; ++i) {
        std::vector<int64_t> picked;
        for (int64_t tries = 0; static_cast<int64_t>(picked.size()) < topk && tries < 64 * topk; ++tries) {
          const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin();
          const int64_t rk = std::min(rank, experts - 1);
          if (!taken[static_cast<size_t>(rk)]) taken[static_cast<size_t>(rk)] = 1, picked.push_back(rk);
        }
        for (int64_t rk = 0; static_cast<int64_t>(picked.size()) < topk; ++rk)
          if (!taken[static_cast<size_t>(rk)]) taken[static_cast<size_t>(rk)] = 1, picked.push_back(rk);
        for (int64_t rk : picked) {
          taken[static_cast<size_t>(rk)] = 0;
          r.ids.push_back(perm[static_cast<size_t>(l)][static_cast<size_t>(rk)]);
        }
      }
      t.records.push_back(std::move(r));
    }
  }
  return t;
}

RoutingReplay::RoutingReplay(const RoutingTrace& t) : header_(t.header) {
  if (t.records.empty()) fail(ErrorKind::invalid_argument, "routing replay: the trace has no records");
  rows_.resize(t.header.layers);
  k_.assign(t.header.layers, 0);
  next_.assign(t.header.layers, 0);
  for (const RoutingRecord& r : t.records) {
    if (r.layer >= t.header.layers) continue;  // read_routing_trace refuses these already
    auto& v = rows_[r.layer];
    if (k_[r.layer] == 0) k_[r.layer] = r.k;
    if (r.k != k_[r.layer]) fail(ErrorKind::invalid_argument, "routing replay: layer " + std::to_string(r.layer) + " has records of k " + std::to_string(r.k) +
                                                                  " and " + std::to_string(k_[r.layer]));
    v.insert(v.end(), r.ids.begin(), r.ids.end());
  }
}

void RoutingReplay::apply(int64_t layer, int32_t* ids, int64_t n, int64_t k) {
  if (layer < 0 || layer >= static_cast<int64_t>(rows_.size()) || rows_[static_cast<size_t>(layer)].empty())
    fail(ErrorKind::invalid_argument, "routing replay: the trace has no records of layer " + std::to_string(layer));
  const auto l = static_cast<size_t>(layer);
  if (k != static_cast<int64_t>(k_[l]))
    fail(ErrorKind::invalid_argument, "routing replay: the trace routes " + std::to_string(k_[l]) + " experts per token in layer " + std::to_string(layer) +
                                          ", the model " + std::to_string(k));
  const std::vector<uint16_t>& v = rows_[l];
  const size_t nrows = v.size() / static_cast<size_t>(k);
  for (int64_t t = 0; t < n; ++t) {
    const size_t row = next_[l];
    next_[l] = (row + 1) % nrows;
    for (int64_t j = 0; j < k; ++j) ids[t * k + j] = v[row * static_cast<size_t>(k) + static_cast<size_t>(j)];
  }
}

}  // namespace hmoe
