#include "engine/layers/gpu_experts.h"

#include <algorithm>
#include <optional>

#include "configs/error.h"
#include "engine/layers/cpu_layers.h"
#include "engine/layers/gpu_upload.h"
#include "engine/loading/model_config.h"
#include "gpu/kernels.h"
#include "gpu/moe_stream.h"
#include "gpu/quant.h"

namespace hmoe {

namespace {
bool plain(const cpu::Mat& m) { return m.quant == cpu::Quant::none; }
bool gpu_takes(const cpu::Mat& m) { return !plain(m) && gpu::qformat_supported(m); }
}  // namespace

double gpu_expert_bytes_per_weight(const cpu::Mat& m, bool keep_quantized) {
  if (!keep_quantized || !gpu_takes(m)) return 2.0;
  return gpu::qformat_bytes_per_weight(m);
}

void set_expert_bytes_from(ModelConfig& c, WeightSource& src) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string e = "model.layers." + std::to_string(l) + ".mlp.experts.0.";
    const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
    if (!src.has(e + "gate_proj.weight") || !src.has(e + "up_proj.weight") || !src.has(e + "down_proj.weight")) return;
    const cpu::Mat m[3] = {src.mat(e + "gate_proj.weight", I, H), src.mat(e + "up_proj.weight", I, H), src.mat(e + "down_proj.weight", H, I)};
    const double weights = 3.0 * static_cast<double>(I * H);
    double cpu = 0, gpu = 0;
    bool all_quant = true;
    for (const cpu::Mat& x : m) {
      cpu += static_cast<double>(x.bytes());
      all_quant = all_quant && gpu_takes(x);
      if (gpu_takes(x)) gpu += gpu::qformat_bytes_per_weight(x) * static_cast<double>(x.rows * x.cols);
    }
    c.expert_bytes_per_weight = cpu / weights;
    c.gpu_expert_bytes_per_weight = all_quant ? gpu / weights : 2.0;  // one unquantized matrix puts the layer in bf16
    return;
  }
}

void moe_experts_gemm(gpu::Blas& blas, const uint16_t* x, int64_t n, int64_t H, int64_t I, int64_t E, int64_t K, const int32_t* offs,
                      const int32_t* pair_list, const float* weights, const ExpertWeightFn& weight, MoeGemmScratch& sc, float* out, gpu::Stream& s) {
  const int64_t P = n * K;
  auto fit = [](gpu::DeviceBuffer& b, int64_t bytes) { b.reserve(static_cast<size_t>(std::max<int64_t>(bytes, 16))); };
  fit(sc.xs, P * H * 2);
  fit(sc.gu, P * 2 * I * 4);
  fit(sc.act, P * I * 2);
  fit(sc.ys, P * H * 4);
  fit(sc.inv, P * 4);
  uint16_t* xs = sc.xs.as<uint16_t>();
  float* gu = sc.gu.as<float>();
  uint16_t* act = sc.act.as<uint16_t>();
  float* ys = sc.ys.as<float>();
  gpu::moe_gather_rows(x, H, K, pair_list, P, xs, s);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t off = offs[e], cnt = offs[e + 1] - offs[e];
    if (cnt > 0) blas.gemm(xs + off * H, cnt, weight(e, false), 2 * I, H, gu + off * 2 * I, 2 * I);
  }
  gpu::silu_mul(gu, P, I, act, nullptr, s);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t off = offs[e], cnt = offs[e + 1] - offs[e];
    if (cnt > 0) blas.gemm(act + off * I, cnt, weight(e, true), H, I, ys + off * H, H);
  }
  gpu::moe_combine_sorted(ys, pair_list, weights, n, K, H, sc.inv.as<int32_t>(), out, s);
}

struct GpuResidentExperts::Impl {
  int64_t E = 0, H = 0, I = 0;
  gpu::DeviceBuffer gate_up, down;  // bf16 residency
  std::optional<gpu::QDeviceMat> qgu, qdn;
};

GpuResidentExperts::GpuResidentExperts(const std::vector<numa::ExpertWeights>& ex, bool keep_quantized, gpu::Stream& s, const std::string& what)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (ex.empty()) fail(ErrorKind::internal, what + ": no experts");
  m.E = static_cast<int64_t>(ex.size());
  m.I = ex[0].gate.rows;
  m.H = ex[0].gate.cols;
  bool quant = keep_quantized;
  for (const auto& e : ex) {
    if (e.gate.rows != m.I || e.up.rows != m.I || e.gate.cols != m.H || e.up.cols != m.H || e.down.rows != m.H || e.down.cols != m.I)
      fail(ErrorKind::bad_model, what + ": experts differ in shape");
    // One format per stacked matrix: gate and up together, down on its own.
    quant = quant && gpu_takes(e.gate) && gpu_takes(e.up) && gpu_takes(e.down) && e.gate.quant == ex[0].gate.quant && e.gate.ext == ex[0].gate.ext &&
            e.up.quant == e.gate.quant && e.up.ext == e.gate.ext && e.down.quant == ex[0].down.quant && e.down.ext == ex[0].down.ext;
  }
  if (quant) {
    std::vector<cpu::Mat> gu, dn;
    for (const auto& e : ex) {
      gu.push_back(e.gate);
      gu.push_back(e.up);
      dn.push_back(e.down);
    }
    m.qgu.emplace(gu, s, what + " gate/up");
    m.qdn.emplace(dn, s, what + " down");
    return;
  }
  // bf16: [E][2I][H] gate then up rows per expert, [E][H][I] down; an expert at a time.
  const int64_t E = m.E, H = m.H, I = m.I;
  m.gate_up = gpu::DeviceBuffer(static_cast<size_t>(E * 2 * I * H) * 2);
  m.down = gpu::DeviceBuffer(static_cast<size_t>(E * H * I) * 2);
  std::vector<uint16_t> gu, dn;
  for (int64_t e = 0; e < E; ++e) {
    gu.clear();
    dn.clear();
    append_bf16(gu, ex[static_cast<size_t>(e)].gate);
    append_bf16(gu, ex[static_cast<size_t>(e)].up);
    append_bf16(dn, ex[static_cast<size_t>(e)].down);
    gpu::copy_to_device(m.gate_up.as<uint16_t>() + e * 2 * I * H, gu.data(), gu.size() * 2, s);
    gpu::copy_to_device(m.down.as<uint16_t>() + e * H * I, dn.data(), dn.size() * 2, s);
    s.synchronize();
  }
}

GpuResidentExperts::~GpuResidentExperts() = default;

bool GpuResidentExperts::quantized() const { return impl_->qgu.has_value(); }

uint64_t GpuResidentExperts::bytes() const {
  const Impl& m = *impl_;
  if (m.qgu) return m.qgu->weight().bytes() + m.qdn->weight().bytes();
  return m.gate_up.bytes() + m.down.bytes();
}

std::string GpuResidentExperts::format() const {
  const Impl& m = *impl_;
  if (!m.qgu) return "bf16";
  const std::string a = gpu::qformat_name(m.qgu->weight().format), b = gpu::qformat_name(m.qdn->weight().format);
  return a == b ? a : a + " / " + b;
}

void GpuResidentExperts::run(const uint16_t* x, int64_t n, int64_t K, const int32_t* ids, const float* wts, const int32_t* route_off,
                             const int32_t* pair_list, uint16_t* act, float* partial, float* out, gpu::Blas& blas, ExpertScratch& sc,
                             gpu::Stream& s) {
  Impl& m = *impl_;
  if (n > 64 && n * K >= 16 * m.E) {  // > 64 tokens: never inside a captured decode graph
    sc.offs_h.reserve(static_cast<size_t>(m.E + 1) * 4);
    gpu::copy_to_host(sc.offs_h.as<int32_t>(), route_off, static_cast<size_t>(m.E + 1) * 4, s);
    sc.offs_ev.record(s);
    sc.offs_ev.synchronize();
    const int64_t gu_elems = 2 * m.I * m.H, dn_elems = m.H * m.I;
    if (!m.qgu) {
      const uint16_t *gu = m.gate_up.as<uint16_t>(), *dn = m.down.as<uint16_t>();
      moe_experts_gemm(blas, x, n, m.H, m.I, m.E, K, sc.offs_h.as<int32_t>(), pair_list, wts,
                       [&](int64_t e, bool down) { return down ? dn + e * dn_elems : gu + e * gu_elems; }, sc.gemm, out, s);
      return;
    }
    // Dequantize a chunk of experts at a time (the weight calls come in expert order per matrix kind).
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(m.E, (256ll << 20) / (gu_elems * 2)));
    sc.deq_gu.reserve(static_cast<size_t>(chunk * gu_elems) * 2);
    sc.deq_dn.reserve(static_cast<size_t>(chunk * dn_elems) * 2);
    int64_t have[2] = {-1, -1};  // first expert of the chunk held, per kind
    moe_experts_gemm(blas, x, n, m.H, m.I, m.E, K, sc.offs_h.as<int32_t>(), pair_list, wts,
                     [&](int64_t e, bool down) -> const uint16_t* {
                       const int k = down ? 1 : 0;
                       const int64_t elems = down ? dn_elems : gu_elems, rows = down ? m.H : 2 * m.I;
                       gpu::DeviceBuffer& buf = down ? sc.deq_dn : sc.deq_gu;
                       if (have[k] < 0 || e < have[k] || e >= have[k] + chunk) {
                         have[k] = e;
                         const int64_t cnt = std::min(chunk, m.E - e);
                         gpu::quant_dequant(down ? m.qdn->weight() : m.qgu->weight(), e * rows, cnt * rows, buf.as<uint16_t>(), s);
                       }
                       return buf.as<uint16_t>() + (e - have[k]) * elems;
                     },
                     sc.gemm, out, s);
    return;
  }
  if (m.qgu)
    gpu::quant_moe_experts(x, n, m.H, m.I, m.E, K, wts, route_off, pair_list, m.qgu->weight(), m.qdn->weight(), act, partial, out, s);
  else
    gpu::moe_experts(x, n, m.H, m.I, m.E, K, ids, wts, route_off, pair_list, m.gate_up.as<uint16_t>(), m.down.as<uint16_t>(), act, partial, out,
                     s);
}

}  // namespace hmoe
