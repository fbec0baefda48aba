// Engram modules: binding, n-gram hashing, and the CPU forward of each module.
#include "engine/layers/engram.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "configs/error.h"
#include "engine/layers/cpu_layers.h"
#include "engine/ops/cpu_ops.h"
#include "engine/placement/placement.h"

namespace hmoe {

struct EngramModules::Module {
  int64_t layer = 0;
  std::vector<int64_t> mult, sizes, offsets;
  cpu::Mat key_w, value_w, key_norm, query_norm, conv_norm;
  std::vector<float> key_b, value_b, conv_w;  // conv_w: [hidden, kernel_size]
};

namespace {

std::vector<float> to_f32_vec(const cpu::Mat& m) {
  std::vector<float> v(static_cast<size_t>(m.rows * m.cols));
  cpu::to_f32(m.dtype, m.data, v.data(), m.rows * m.cols);
  return v;
}

std::vector<int64_t> to_i64_vec(const io::TensorView& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(int64_t));
  return v;
}

}  // namespace

EngramModules::~EngramModules() = default;

std::unique_ptr<EngramModules> EngramModules::load(WeightBinder& bind, const ModelConfig& c, const std::string& model_dir, const Settings& s,
                                                   numa::ThreadPool& pool) {
  std::unique_ptr<EngramModules> e(new EngramModules());
  const EngramConfig& g = c.engram;
  e->cfg_ = g;
  e->pool_ = &pool;
  const int64_t N = g.max_ngram_size, H = c.hidden_size, K = g.kernel_size;
  e->hidden_ = H;
  e->heads_ = (N - 1) * g.n_head_per_ngram;
  e->head_dim_ = g.n_embed_per_ngram / g.n_head_per_ngram;
  e->d_mem_ = (N - 1) * g.n_embed_per_ngram;
  e->window_ = std::max<int64_t>({N - 1, (K - 1) * N, 1});

  const io::TensorView& lk = bind.tensor("model.engram.token_lookup", {c.vocab_size}, DType::i64);
  e->lookup_ = to_i64_vec(lk);
  int64_t max_cid = 0;
  for (size_t i = 0; i < e->lookup_.size(); ++i) {
    if (e->lookup_[i] < 0)
      fail(ErrorKind::bad_model, *lk.file + ": model.engram.token_lookup[" + std::to_string(i) + "] is negative (" + std::to_string(e->lookup_[i]) + ")");
    max_cid = std::max(max_cid, e->lookup_[i]);
  }
  e->pad_cid_ = e->lookup_[static_cast<size_t>(g.pad_id)];

  std::vector<int64_t> layers = g.layer_ids;
  std::sort(layers.begin(), layers.end());
  std::vector<io::PleSource> sources;
  for (int64_t layer : layers) {
    const std::string p = "model.layers." + std::to_string(layer) + ".engram.";
    auto m = std::make_unique<Module>();
    m->layer = layer;
    const io::TensorView& mt = bind.tensor(p + "multipliers", {N}, DType::i64);
    m->mult = to_i64_vec(mt);
    for (int64_t k = 0; k < N; ++k) {
      const int64_t mk = m->mult[static_cast<size_t>(k)];
      if (mk <= 0 || (max_cid > 0 && mk > std::numeric_limits<int64_t>::max() / max_cid))
        fail(ErrorKind::bad_model, *mt.file + ": " + p + "multipliers[" + std::to_string(k) + "] = " + std::to_string(mk) +
                                       " is not positive or overflows int64 with compressed ids up to " + std::to_string(max_cid));
    }
    const io::TensorView& hs = bind.tensor(p + "head_sizes", {e->heads_}, DType::i64);
    m->sizes = to_i64_vec(hs);
    int64_t total = 0;
    for (auto sz : m->sizes) {
      if (sz <= 0 || sz > (int64_t{1} << 40)) fail(ErrorKind::bad_model, *hs.file + ": " + p + "head_sizes holds " + std::to_string(sz));
      m->offsets.push_back(total);
      total += sz;
    }
    const cpu::Mat table = bind.mat(p + "table.weight", total, e->head_dim_);
    io::PleSource src;
    src.name = p + "table.weight";
    src.dtype = table.dtype;
    src.rows = total;
    src.cols = e->head_dim_;
    src.data = static_cast<const uint8_t*>(table.data);
    sources.push_back(src);
    m->key_w = bind.mat(p + "key_proj.weight", H, e->d_mem_);
    m->key_b = to_f32_vec(bind.vec(p + "key_proj.bias", H));
    m->value_w = bind.mat(p + "value_proj.weight", H, e->d_mem_);
    m->value_b = to_f32_vec(bind.vec(p + "value_proj.bias", H));
    m->key_norm = bind.vec(p + "key_norm.weight", H);
    m->query_norm = bind.vec(p + "query_norm.weight", H);
    m->conv_norm = bind.vec(p + "conv_norm.weight", H);
    m->conv_w = to_f32_vec(bind.mat(p + "conv.weight", H, K));
    e->mods_.push_back(std::move(m));
  }
  e->slot_bytes_ = 16 + static_cast<int64_t>(e->mods_.size()) * H * static_cast<int64_t>(sizeof(float));

  io::PleOptions opt;
  opt.backend = io::parse_ple_backend("--ple-backend / HMOE_PLE_BACKEND", s.ple_backend);
  opt.path = s.ple_table.empty() ? model_dir + "/ple-table.hmoe" : s.ple_table;
  if (s.ple_queue_depth < 1 || s.ple_queue_depth > 4096)
    fail(ErrorKind::invalid_argument, "--ple-queue-depth / HMOE_PLE_QUEUE_DEPTH must be in 1..4096, got " + std::to_string(s.ple_queue_depth));
  if (s.ple_pread_threads < 1 || s.ple_pread_threads > 256)
    fail(ErrorKind::invalid_argument, "--ple-pread-threads / HMOE_PLE_PREAD_THREADS must be in 1..256, got " + std::to_string(s.ple_pread_threads));
  if (s.ple_uring_rings < 1 || s.ple_uring_rings > 64)
    fail(ErrorKind::invalid_argument, "--ple-uring-rings / HMOE_PLE_URING_RINGS must be in 1..64, got " + std::to_string(s.ple_uring_rings));
  opt.queue_depth = static_cast<unsigned>(s.ple_queue_depth);
  opt.uring_rings = static_cast<unsigned>(s.ple_uring_rings);
  opt.uring_issue = io::parse_uring_issue("--ple-uring-issue / HMOE_PLE_URING_ISSUE", s.ple_uring_issue);
  if (s.ple_spin_us < 0 || s.ple_spin_us > 100000)
    fail(ErrorKind::invalid_argument, "--ple-spin-us / HMOE_PLE_SPIN_US must be in 0..100000, got " + std::to_string(s.ple_spin_us));
  opt.spin_us = static_cast<unsigned>(s.ple_spin_us);
  opt.pread_threads = static_cast<int>(s.ple_pread_threads);
  opt.direct = s.ple_direct;
  opt.read_align = s.ple_read_block;  // checked by PleTable::open
  opt.ordered = s.ple_ordered_reads;
  if (s.ple_cache_mib < 0 || s.ple_cache_mib > (int64_t{1} << 22))
    fail(ErrorKind::invalid_argument, "--ple-cache-mib / HMOE_PLE_CACHE_MIB must be in 0..4194304, got " + std::to_string(s.ple_cache_mib));
  opt.cache_bytes = static_cast<size_t>(s.ple_cache_mib) << 20;
  opt.ram_tables = ple_ram_modules(s, static_cast<int64_t>(sources.size()));
  opt.progress = s.progress;
  e->table_ = io::PleTable::open(sources, opt);
  return e;
}

std::vector<bool> ple_ram_modules(const Settings& s, int64_t modules) {
  const LayerSpec ram = parse_layer_spec("--ple-ram-modules / HMOE_PLE_RAM_MODULES", s.ple_ram_modules, modules);
  if (ram.mode == LayerSpec::Mode::automatic)
    fail(ErrorKind::invalid_argument, "--ple-ram-modules / HMOE_PLE_RAM_MODULES: 'auto' is not supported; give module indices (e.g. 0 or 0-1), all or none");
  std::vector<bool> out(static_cast<size_t>(modules), ram.mode == LayerSpec::Mode::all);
  for (int64_t m : ram.layers) out[static_cast<size_t>(m)] = true;
  return out;
}

std::string ple_plan_report(const ModelConfig& c, const io::TensorStore& store, const Settings& s, double tokens_per_s) {
  const EngramConfig& g = c.engram;
  if (c.arch != Arch::qwen3_moe_engram || g.layer_ids.empty()) return {};
  std::vector<int64_t> layers = g.layer_ids;
  std::sort(layers.begin(), layers.end());
  const int64_t modules = static_cast<int64_t>(layers.size());
  const int64_t rows_per_token = (g.max_ngram_size - 1) * g.n_head_per_ngram;
  const bool ram_backend = s.ple_backend == "ram";
  const std::vector<bool> in_ram = ple_ram_modules(s, modules);
  std::string out = "\nPLE n-gram tables (--ple-backend " + s.ple_backend + "): " + std::to_string(modules) + " modules, " + std::to_string(rows_per_token) +
                    " table rows per token and module\n";
  uint64_t ram_bytes = 0;
  int64_t file_modules = 0;
  std::vector<uint64_t> bytes(static_cast<size_t>(modules));
  for (int64_t m = 0; m < modules; ++m) {
    const std::string name = "model.layers." + std::to_string(layers[static_cast<size_t>(m)]) + ".engram.table.weight";
    const io::TensorView* t = store.find(name);
    if (!t) fail(ErrorKind::bad_model, "Engram checkpoint lacks " + name);
    bytes[static_cast<size_t>(m)] = t->nbytes;
    const bool mem = ram_backend || in_ram[static_cast<size_t>(m)];
    if (mem) ram_bytes += t->nbytes;
    else ++file_modules;
    out += "  module " + std::to_string(m) + " before layer " + std::to_string(layers[static_cast<size_t>(m)]) + ": " + format_bytes(t->nbytes) + ", " +
           (ram_backend ? "in RAM (ram backend)" : mem ? "in RAM (--ple-ram-modules)" : "read from the table file") + "\n";
  }
  const uint64_t cache = ram_backend ? 0 : static_cast<uint64_t>(std::max<int64_t>(0, s.ple_cache_mib)) << 20;
  out += "  host memory: tables in RAM " + format_bytes(ram_bytes) + " + row cache " + format_bytes(cache) + " (--ple-cache-mib)\n";
  if (file_modules > 0 && tokens_per_s > 0) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "  the table file serves up to %lld random reads per token (fewer as the row cache hits): %.0f reads/s at the estimated %.1f tokens/s (batch b: up to b times as many)\n",
                  static_cast<long long>(file_modules * rows_per_token), static_cast<double>(file_modules * rows_per_token) * tokens_per_s, tokens_per_s);
    out += buf;
  }
  if (!ram_backend && !in_ram[0] && layers[0] <= 2)
    out += "  module 0 has " + std::to_string(layers[0]) + " layer(s) in front of it to hide its " + std::to_string(rows_per_token) +
           " reads; on a disk slower than that, --ple-ram-modules 0 keeps its table (" + format_bytes(bytes[0]) + ") in memory (bench/README.md)\n";
  return out;
}

std::string EngramModules::stats_line() const {
  const io::PleStats& st = table_->stats();
  const double steps = static_cast<double>(std::max<int64_t>(1, st.steps / std::max<int64_t>(1, modules())));
  char hidden[32] = "hidden n/a";  // mmap: the kernel reads ahead unseen; only the faults show as wait
  if (table_->backend() != io::PleBackend::mmap) std::snprintf(hidden, sizeof(hidden), "%.0f%% hidden", st.hidden_fraction() * 100);
  int in_ram = 0;
  for (int t = 0; t < static_cast<int>(table_->tables()); ++t) in_ram += table_->table_in_ram(t) ? 1 : 0;
  char backend[96];
  if (table_->backend() != io::PleBackend::ram && in_ram > 0)
    std::snprintf(backend, sizeof(backend), "%s, %d of %lld modules in RAM", io::ple_backend_name(table_->backend()), in_ram, static_cast<long long>(table_->tables()));
  else
    std::snprintf(backend, sizeof(backend), "%s", io::ple_backend_name(table_->backend()));
  char buf[384];
  std::snprintf(buf, sizeof(buf), "PLE table (%s, %u-byte blocks): %lld rows requested, %lld distinct, %lld from the row cache, %lld reads, %.1f MiB read, I/O wait %.3f ms/step, %s",
                backend, table_->read_block(), static_cast<long long>(st.rows_requested), static_cast<long long>(st.rows_unique),
                static_cast<long long>(st.rows_cached), static_cast<long long>(st.reads), static_cast<double>(st.bytes_read) / (1 << 20), static_cast<double>(st.wait_ns) / 1e6 / steps,
                hidden);
  return buf;
}

int64_t EngramModules::seq_state_bytes() const { return window_ * slot_bytes_; }

int EngramModules::module_before(int64_t layer) const {
  for (size_t m = 0; m < mods_.size(); ++m)
    if (mods_[m]->layer == layer) return static_cast<int>(m);
  return -1;
}

std::vector<std::string> EngramModules::table_tensor_names() const {
  std::vector<std::string> out;
  for (const auto& m : mods_) out.push_back("model.layers." + std::to_string(m->layer) + ".engram.table.weight");
  return out;
}

int64_t EngramModules::find_in_batch(int seq, int64_t pos) const {
  const uint64_t key = (static_cast<uint64_t>(seq) << 40) | static_cast<uint64_t>(pos);
  auto it = std::lower_bound(batch_index_.begin(), batch_index_.end(), std::make_pair(key, int64_t{-1}));
  return it != batch_index_.end() && it->first == key ? it->second : -1;
}

uint8_t* EngramModules::slot(KvCache& kv, int seq, int64_t pos) const {
  uint8_t* st = kv.seq_state(seq);
  if (!st || kv.layout().seq_state_bytes < seq_state_bytes())
    fail(ErrorKind::internal, "KV cache has no Engram state (build it with Model::kv_layout())");
  return st + (pos % window_) * slot_bytes_;
}

namespace {
[[noreturn]] void history_gone(int seq, int64_t pos) {
  fail(ErrorKind::internal, "Engram state of sequence " + std::to_string(seq) + " has no entry for position " + std::to_string(pos) +
                                " (positions must follow on from the previous step; the sequence may have been rewound)");
}
}  // namespace

void EngramModules::begin_step(const Batch& b, KvCache& kv) {
  const int64_t n = static_cast<int64_t>(b.tokens.size()), N = cfg_.max_ngram_size;
  last_wait_ns_ = 0;
  if (n > 0 && kv.layout().seq_state_bytes < seq_state_bytes())
    fail(ErrorKind::internal, "KV cache has no room for Engram state (build it with Model::kv_layout())");
  batch_index_.clear();
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    batch_index_.push_back({(static_cast<uint64_t>(sl.seq) << 40) | static_cast<uint64_t>(sl.pos), i});
  }
  std::sort(batch_index_.begin(), batch_index_.end());
  ctx_.assign(static_cast<size_t>(n * N), 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t p = sl.pos - k;
      int64_t cid;
      if (k == 0) cid = lookup_[static_cast<size_t>(b.tokens[static_cast<size_t>(i)])];
      else if (p < 0) cid = pad_cid_;
      else if (int64_t j = find_in_batch(sl.seq, p); j >= 0) cid = lookup_[static_cast<size_t>(b.tokens[static_cast<size_t>(j)])];
      else {
        const uint8_t* s = slot(kv, sl.seq, p);
        int64_t tag;
        std::memcpy(&tag, s, 8);
        if (tag != p + 1) history_gone(sl.seq, p);
        std::memcpy(&cid, s + 8, 8);
      }
      ctx_[static_cast<size_t>(i * N + k)] = cid;
    }
  }
  std::vector<int64_t> rows(static_cast<size_t>(n * heads_));
  for (size_t m = 0; m < mods_.size(); ++m) {
    const Module& mod = *mods_[m];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* x = ctx_.data() + i * N;
      int64_t h = 0;
      for (int64_t ng = 2; ng <= N; ++ng) {
        int64_t mix = x[0] * mod.mult[0];
        for (int64_t k = 1; k < ng; ++k) mix ^= x[k] * mod.mult[static_cast<size_t>(k)];
        for (int64_t r = 0; r < cfg_.n_head_per_ngram; ++r, ++h)
          rows[static_cast<size_t>(i * heads_ + h)] = mod.offsets[static_cast<size_t>(h)] + mix % mod.sizes[static_cast<size_t>(h)];
      }
    }
    table_->prefetch(static_cast<int>(m), rows.data(), rows.size());
  }
  vn_.resize(static_cast<size_t>(static_cast<int64_t>(mods_.size()) * n * hidden_));
}

int64_t EngramModules::layer_of(int m) const { return mods_.at(static_cast<size_t>(m))->layer; }

void EngramModules::wait_rows(int m) { last_wait_ns_ += table_->wait(m); }

void EngramModules::conv_sources(const Batch& b, KvCache& kv, int32_t* src) {
  const int64_t n = static_cast<int64_t>(b.tokens.size()), K = cfg_.kernel_size, N = cfg_.max_ngram_size;
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t back = (K - 1 - j) * N, p = sl.pos - back;
      int64_t where = -1;
      if (p < 0) where = -1;
      else if (back == 0) where = i;
      else if (int64_t bi = find_in_batch(sl.seq, p); bi >= 0) where = bi;
      else {
        const uint8_t* st = slot(kv, sl.seq, p);
        int64_t tag;
        std::memcpy(&tag, st, 8);
        if (tag != p + 1) history_gone(sl.seq, p);
        const int64_t r = static_cast<int64_t>(sl.seq) * window_ + p % window_;
        if (r > (int64_t{1} << 30)) fail(ErrorKind::internal, "Engram history row " + std::to_string(r) + " does not fit int32");
        where = -2 - r;
      }
      src[i * K + j] = static_cast<int32_t>(where);
    }
  }
}

void EngramModules::record_ids(const Batch& b, KvCache& kv) {
  const int64_t n = static_cast<int64_t>(b.tokens.size()), N = cfg_.max_ngram_size;
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    uint8_t* st = slot(kv, sl.seq, sl.pos);
    const int64_t tag = sl.pos + 1, cid = ctx_[static_cast<size_t>(i * N)];
    std::memcpy(st, &tag, 8);
    std::memcpy(st + 8, &cid, 8);
  }
}

void EngramModules::apply(int mi, float* x, const Batch& b, KvCache& kv) {
  const Module& mod = *mods_[static_cast<size_t>(mi)];
  const int64_t n = static_cast<int64_t>(b.tokens.size()), H = hidden_, D = head_dim_, K = cfg_.kernel_size, N = cfg_.max_ngram_size;
  wait_rows(mi);
  const DType tdt = table_->dtype(mi);
  e_.resize(static_cast<size_t>(n * d_mem_));
  key_.resize(static_cast<size_t>(n * H));
  q_.resize(static_cast<size_t>(n * H));
  v_.resize(static_cast<size_t>(n * H));
  conv_.resize(static_cast<size_t>(H));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads_; ++h) cpu::to_f32(tdt, table_->row(mi, static_cast<size_t>(i * heads_ + h)), e_.data() + i * d_mem_ + h * D, D);
  cpu::gemm(e_.data(), n, mod.key_w, key_.data(), pool_);
  cpu::gemm(e_.data(), n, mod.value_w, v_.data(), pool_);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < H; ++c) {
      key_[static_cast<size_t>(i * H + c)] += mod.key_b[static_cast<size_t>(c)];
      v_[static_cast<size_t>(i * H + c)] += mod.value_b[static_cast<size_t>(c)];
    }
  ops::rms_norm(key_.data(), n, H, mod.key_norm, cfg_.norm_eps, key_.data());
  ops::rms_norm(x, n, H, mod.query_norm, cfg_.norm_eps, q_.data());
  const float inv_sqrt_h = 1.0f / std::sqrt(static_cast<float>(H));
  for (int64_t i = 0; i < n; ++i) {
    float s = 0;
    for (int64_t c = 0; c < H; ++c) s += key_[static_cast<size_t>(i * H + c)] * q_[static_cast<size_t>(i * H + c)];
    s *= inv_sqrt_h;
    const float sign = s > 0 ? 1.0f : (s < 0 ? -1.0f : 0.0f);
    const float z = sign * std::sqrt(std::max(std::fabs(s), 1e-6f));
    const float gate = 1.0f / (1.0f + std::exp(-z));
    for (int64_t c = 0; c < H; ++c) v_[static_cast<size_t>(i * H + c)] *= gate;
  }
  float* vn = vn_.data() + static_cast<int64_t>(mi) * n * H;
  ops::rms_norm(v_.data(), n, H, mod.conv_norm, cfg_.conv_norm_eps, vn);
  const size_t vn_off = 16 + static_cast<size_t>(mi) * static_cast<size_t>(H) * sizeof(float);
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    std::fill(conv_.begin(), conv_.end(), 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t back = (K - 1 - j) * N, p = sl.pos - back;
      if (p < 0) continue;
      const float* src;
      if (back == 0) src = vn + i * H;
      else if (int64_t bi = find_in_batch(sl.seq, p); bi >= 0) src = vn + bi * H;
      else {
        const uint8_t* st = slot(kv, sl.seq, p);
        int64_t tag;
        std::memcpy(&tag, st, 8);
        if (tag != p + 1) history_gone(sl.seq, p);
        hist_.resize(static_cast<size_t>(H));
        std::memcpy(hist_.data(), st + vn_off, static_cast<size_t>(H) * sizeof(float));
        src = hist_.data();
      }
      for (int64_t c = 0; c < H; ++c) conv_[static_cast<size_t>(c)] += mod.conv_w[static_cast<size_t>(c * K + j)] * src[c];
    }
    float* xi = x + i * H;
    const float* vi = v_.data() + i * H;
    for (int64_t c = 0; c < H; ++c) {
      const float a = conv_[static_cast<size_t>(c)];
      xi[c] += vi[c] + a / (1.0f + std::exp(-a));
    }
  }
  if (static_cast<size_t>(mi) + 1 < mods_.size()) return;
  // The last module of the step: record ids and normalised values for the
  // steps that follow (in batch order, so a sequence's latest position wins).
  record_ids(b, kv);
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    uint8_t* st = slot(kv, sl.seq, sl.pos);
    for (size_t m = 0; m < mods_.size(); ++m)
      std::memcpy(st + 16 + m * static_cast<size_t>(H) * sizeof(float), vn_.data() + (static_cast<int64_t>(m) * n + i) * H,
                  static_cast<size_t>(H) * sizeof(float));
  }
}

}  // namespace hmoe
