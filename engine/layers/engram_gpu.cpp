// GpuEngram (see engram_gpu.h): weights, pinned staging of the table rows,
// the GPU history rows, and the per-module launches.
#include "engine/layers/engram_gpu.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "configs/error.h"
#include "engine/layers/gpu_upload.h"
#include "gpu/engram.h"
#include "io/dtype.h"

namespace hmoe {

struct GpuEngram::Impl {
  struct ModW {
    gpu::DeviceBuffer kv_w;  // [2*hidden, d_mem] bf16: key_proj rows, then value_proj rows
    gpu::DeviceBuffer vecs;  // fp32: key_b, value_b, key_norm, query_norm, conv_norm [hidden] each, conv_w [hidden, kernel]
  };
  EngramModules& host;
  int64_t H = 0, N = 0, K = 0, D = 0, heads = 0, d_mem = 0, window = 0, modules = 0;
  float eps = 0, conv_eps = 0;
  std::vector<ModW> mods;
  uint64_t weight_bytes = 0;
  gpu::Stream copy_stream;
  std::vector<gpu::Event> rows_ready;  // one per module, recorded on copy_stream
  // Per step.
  int64_t n = 0;
  gpu::PinnedBuffer rows_h, meta_h;  // rows: [modules][n][d_mem] bf16; meta: src [n*K], dst [n]
  gpu::DeviceBuffer rows_d, meta_d, proj, v, vn;
  // History: [hist_rows][modules][hidden] fp32, row = seq * window + pos % window.
  gpu::DeviceBuffer hist;
  int64_t hist_rows = 0;
  std::vector<int32_t> meta;
  std::vector<bool> staged;  // module's rows uploaded this step

  explicit Impl(EngramModules& h) : host(h) {}
};

GpuEngram::GpuEngram(const ModelConfig& c, EngramModules& host, const WeightLookup& get, gpu::Stream& s)
    : impl_(std::make_unique<Impl>(host)) {
  Impl& m = *impl_;
  const EngramConfig& g = host.config();
  m.H = c.hidden_size;
  m.N = g.max_ngram_size;
  m.K = g.kernel_size;
  m.heads = host.heads();
  m.d_mem = (m.N - 1) * g.n_embed_per_ngram;
  m.D = m.d_mem / std::max<int64_t>(m.heads, 1);
  m.window = host.window();
  m.modules = host.modules();
  m.eps = static_cast<float>(g.norm_eps);
  m.conv_eps = static_cast<float>(g.conv_norm_eps);
  const int64_t H = m.H, dm = m.d_mem;
  for (int64_t i = 0; i < m.modules; ++i) {
    const std::string p = "model.layers." + std::to_string(host.layer_of(static_cast<int>(i))) + ".engram.";
    Impl::ModW w;
    std::vector<gpu::bf16_t> kvw(static_cast<size_t>(2 * H * dm));
    size_t at = 0;
    for (const char* name : {"key_proj.weight", "value_proj.weight"})
      for (float f : mat_f32(get(p + name, {H, dm}))) kvw[at++] = f32_to_bf16(f);
    w.kv_w = upload(kvw.data(), kvw.size() * 2, s);
    std::vector<float> vecs;
    for (const char* name : {"key_proj.bias", "value_proj.bias", "key_norm.weight", "query_norm.weight", "conv_norm.weight"}) {
      const auto v = mat_f32(get(p + name, {H}));
      vecs.insert(vecs.end(), v.begin(), v.end());
    }
    const auto cw = mat_f32(get(p + "conv.weight", {H, m.K}));
    vecs.insert(vecs.end(), cw.begin(), cw.end());
    w.vecs = upload(vecs.data(), vecs.size() * sizeof(float), s);
    m.weight_bytes += w.kv_w.bytes() + w.vecs.bytes();
    m.mods.push_back(std::move(w));
    m.rows_ready.emplace_back();
  }
}

GpuEngram::~GpuEngram() = default;
uint64_t GpuEngram::weight_bytes() const { return impl_->weight_bytes; }
int GpuEngram::module_before(int64_t layer) const { return impl_->host.module_before(layer); }

void GpuEngram::begin_step(const Batch& b, KvCache& kv, gpu::Stream& s) {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(b.tokens.size()), H = m.H, K = m.K;
  m.n = n;
  m.staged.assign(static_cast<size_t>(m.modules), false);
  m.host.begin_step(b, kv);  // the row reads of every module start here
  if (n == 0) return;

  // Conv sources, then the history row each batch row leaves (the latest
  // position of a sequence wins a row shared within the batch).
  m.meta.assign(static_cast<size_t>(n * K + n), -1);
  m.host.conv_sources(b, kv, m.meta.data());
  int32_t* dst = m.meta.data() + n * K;
  std::unordered_set<int64_t> taken;
  int64_t max_seq = 0;
  for (int64_t i = n - 1; i >= 0; --i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    const int64_t r = static_cast<int64_t>(sl.seq) * m.window + sl.pos % m.window;
    max_seq = std::max<int64_t>(max_seq, sl.seq);
    if (taken.insert(r).second) dst[i] = static_cast<int32_t>(r);
  }

  // History rows for every sequence id in the batch, kept when growing.
  const int64_t need = (max_seq + 1) * m.window, row_bytes = m.modules * H * static_cast<int64_t>(sizeof(float));
  if (need > m.hist_rows) {
    const int64_t rows = std::max(need, 2 * m.hist_rows);
    gpu::DeviceBuffer grown(static_cast<size_t>(rows * row_bytes));
    gpu::memset_device(grown.data(), 0, grown.bytes(), s);
    if (m.hist_rows > 0) gpu::copy_on_device(grown.data(), m.hist.data(), static_cast<size_t>(m.hist_rows * row_bytes), s);
    s.synchronize();
    m.hist = std::move(grown);
    m.hist_rows = rows;
  }

  auto fit = [](gpu::DeviceBuffer& buf, int64_t bytes) { buf.reserve(static_cast<size_t>(std::max<int64_t>(bytes, 16))); };
  const size_t meta_bytes = m.meta.size() * sizeof(int32_t);
  m.meta_h.reserve(meta_bytes);
  m.rows_h.reserve(static_cast<size_t>(m.modules * n * m.d_mem * 2));
  fit(m.meta_d, static_cast<int64_t>(meta_bytes));
  fit(m.rows_d, m.modules * n * m.d_mem * 2);
  fit(m.proj, n * 2 * H * 4);
  fit(m.v, n * H * 4);
  fit(m.vn, m.modules * n * H * 4);
  std::memcpy(m.meta_h.as<int32_t>(), m.meta.data(), meta_bytes);
  gpu::copy_to_device(m.meta_d.data(), m.meta_h.as<int32_t>(), meta_bytes, s);
}

void GpuEngram::apply(int mi, float* x, const float* d, int64_t r0, int64_t rn, gpu::Blas& blas, gpu::Stream& s) {
  Impl& m = *impl_;
  const int64_t n = m.n, H = m.H, D = m.D, dm = m.d_mem;
  if (mi < 0 || mi >= m.modules) fail(ErrorKind::internal, "GpuEngram::apply: no module " + std::to_string(mi));
  if (r0 < 0 || rn < 0 || r0 + rn > n) fail(ErrorKind::internal, "GpuEngram::apply: rows outside the step's batch");
  if (rn == 0) return;
  gpu::bf16_t* e = m.rows_d.as<gpu::bf16_t>() + mi * n * dm;
  if (!m.staged[static_cast<size_t>(mi)]) {
    m.staged[static_cast<size_t>(mi)] = true;
    m.host.wait_rows(mi);
    io::PleTable& t = m.host.table();
    const DType tdt = t.dtype(mi);
    gpu::bf16_t* rows = m.rows_h.as<gpu::bf16_t>() + mi * n * dm;
    std::vector<float> tmp(tdt == DType::bf16 ? 0 : static_cast<size_t>(D));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t h = 0; h < m.heads; ++h) {
        const uint8_t* src = t.row(mi, static_cast<size_t>(i * m.heads + h));
        gpu::bf16_t* out = rows + i * dm + h * D;
        if (tdt == DType::bf16) {
          std::memcpy(out, src, static_cast<size_t>(D) * 2);
          continue;
        }
        cpu::to_f32(tdt, src, tmp.data(), D);
        for (int64_t c = 0; c < D; ++c) out[c] = f32_to_bf16(tmp[static_cast<size_t>(c)]);
      }
    gpu::copy_to_device(e, rows, static_cast<size_t>(n * dm * 2), m.copy_stream);
    m.rows_ready[static_cast<size_t>(mi)].record(m.copy_stream);
    s.wait(m.rows_ready[static_cast<size_t>(mi)]);
  }

  const Impl::ModW& w = m.mods[static_cast<size_t>(mi)];
  float* proj = m.proj.as<float>() + r0 * 2 * H;
  blas.gemm(e + r0 * dm, rn, w.kv_w.as<gpu::bf16_t>(), 2 * H, dm, proj, 2 * H);
  const float* vecs = w.vecs.as<float>();
  float* v = m.v.as<float>() + r0 * H;
  float* vn = m.vn.as<float>() + mi * n * H;  // the module's rows, all of the batch
  gpu::engram_gate(x, d, proj, rn, H, vecs, vecs + H, vecs + 2 * H, vecs + 3 * H, vecs + 4 * H, m.eps, m.conv_eps, v, vn + r0 * H, s);
  const int32_t* src = m.meta_d.as<int32_t>() + r0 * m.K;
  gpu::engram_conv(v, vn, m.hist.as<float>() + mi * H, m.modules * H, src, vecs + 5 * H, rn, H, m.K, x, s);
}

void GpuEngram::end_step(const Batch& b, KvCache& kv, gpu::Stream& s) {
  Impl& m = *impl_;
  if (m.n == 0) return;
  const int32_t* dst = m.meta_d.as<int32_t>() + m.n * m.K;
  gpu::engram_store(m.vn.as<float>(), m.n, m.H, m.modules, dst, m.hist.as<float>(), m.modules * m.H, s);
  m.host.record_ids(b, kv);
}

}  // namespace hmoe
