#include "engine/gpu_experts.h"

#include <optional>

#include "configs/error.h"
#include "engine/blocks.h"
#include "engine/model_config.h"
#include "engine/gpu_upload.h"
#include "gpu/kernels.h"
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
                             const int32_t* pair_list, uint16_t* act, float* partial, float* out, gpu::Stream& s) const {
  const Impl& m = *impl_;
  if (m.qgu)
    gpu::quant_moe_experts(x, n, m.H, m.I, m.E, K, wts, route_off, pair_list, m.qgu->weight(), m.qdn->weight(), act, partial, out, s);
  else
    gpu::moe_experts(x, n, m.H, m.I, m.E, K, ids, wts, route_off, pair_list, m.gate_up.as<uint16_t>(), m.down.as<uint16_t>(), act, partial, out,
                     s);
}

}  // namespace hmoe
