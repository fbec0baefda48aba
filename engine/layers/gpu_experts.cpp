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
// A GPU quantized format takes m: repacked (gpu::QDeviceMat) or, for the GGUF
// types with kernels on the stored blocks (the low-bit ones have only
// those), as stored.
bool repack_takes(const cpu::Mat& m) { return !plain(m) && gpu::qformat_supported(m); }
bool gpu_takes(const cpu::Mat& m) { return repack_takes(m) || gpu::gguf_native_supported(m); }
// Bytes per weight the GPU holds for m kept quantized: the file's bytes when
// the layer's experts are all GGUF types with kernels on the stored blocks
// (GpuResidentExperts holds them so), else the repacked format's (bf16 when
// there is none).
double held_bytes_per_weight(const cpu::Mat& m, bool layer_native) {
  if (layer_native) return static_cast<double>(m.row_bytes()) / static_cast<double>(m.cols);
  return repack_takes(m) ? gpu::qformat_bytes_per_weight(m) : 2.0;
}
}  // namespace

double gpu_expert_bytes_per_weight(const cpu::Mat& m, bool keep_quantized, bool layer_native) {
  if (!keep_quantized || !gpu_takes(m)) return 2.0;
  return held_bytes_per_weight(m, layer_native && gpu::gguf_native_supported(m));
}

double gpu_expert_bytes_per_weight(const cpu::Mat& m, bool keep_quantized) {
  return gpu_expert_bytes_per_weight(m, keep_quantized, gpu::gguf_native_supported(m));
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
    bool repack = true, native = true;
    for (const cpu::Mat& x : m) native = native && gpu::gguf_native_supported(x);
    for (const cpu::Mat& x : m) {
      cpu += static_cast<double>(x.bytes());
      repack = repack && repack_takes(x);
      gpu += held_bytes_per_weight(x, native) * static_cast<double>(x.rows * x.cols);
    }
    c.expert_bytes_per_weight = cpu / weights;
    c.gpu_expert_bytes_per_weight = native || repack ? gpu / weights : 2.0;  // a matrix no GPU format takes puts the layer in bf16
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
  std::optional<gpu::GgufDeviceMat> ngu, ndn;  // GGUF blocks as stored
  bool grouped(int64_t n) const;
};

GpuResidentExperts::GpuResidentExperts(const std::vector<numa::ExpertWeights>& ex, bool keep_quantized, gpu::Stream& s, const std::string& what)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (ex.empty()) fail(ErrorKind::internal, what + ": no experts");
  m.E = static_cast<int64_t>(ex.size());
  m.I = ex[0].gate.rows;
  m.H = ex[0].gate.cols;
  bool same = keep_quantized, repack = true, native = true;
  for (const auto& e : ex) {
    if (e.gate.rows != m.I || e.up.rows != m.I || e.gate.cols != m.H || e.up.cols != m.H || e.down.rows != m.H || e.down.cols != m.I)
      fail(ErrorKind::bad_model, what + ": experts differ in shape");
    // One format per stacked matrix: gate and up together, down on its own.
    same = same && e.gate.quant == ex[0].gate.quant && e.gate.ext == ex[0].gate.ext && e.up.quant == e.gate.quant && e.up.ext == e.gate.ext &&
           e.down.quant == ex[0].down.quant && e.down.ext == ex[0].down.ext;
    repack = repack && repack_takes(e.gate) && repack_takes(e.up) && repack_takes(e.down);
    native = native && gpu::gguf_native_supported(e.gate) && gpu::gguf_native_supported(e.up) && gpu::gguf_native_supported(e.down);
  }
  // GGUF Q4_K/Q5_K/Q6_K/Q8_0 and the low-bit types: the file's blocks, read by the native kernels.
  native = native && same;
  const bool quant = same && repack;
  if (native) {
    std::vector<cpu::Mat> gu, dn;
    for (const auto& e : ex) {
      gu.push_back(e.gate);
      gu.push_back(e.up);
      dn.push_back(e.down);
    }
    m.ngu.emplace(gu, s, what + " gate/up");
    m.ndn.emplace(dn, s, what + " down");
    return;
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

bool GpuResidentExperts::quantized() const { return impl_->qgu.has_value() || impl_->ngu.has_value(); }

namespace {
bool big_pass(int64_t n, int64_t K, int64_t E) { return n > 64 && n * K >= 16 * E; }  // > 64 tokens: never inside a captured decode graph
}  // namespace

// GGUF experts of passes over 64 tokens: the grouped tensor-core product on the blocks.
bool GpuResidentExperts::Impl::grouped(int64_t n) const {
  return ngu && n > 64 && gpu::gguf_moe_gemm_supported(ngu->weight(), 2 * I) && gpu::gguf_moe_gemm_supported(ndn->weight(), H);
}

bool GpuResidentExperts::needs_routing(int64_t n, int64_t K) const { return !impl_->ngu || impl_->grouped(n) || big_pass(n, K, impl_->E); }

uint64_t GpuResidentExperts::bytes() const {
  const Impl& m = *impl_;
  if (m.ngu) return m.ngu->weight().bytes() + m.ndn->weight().bytes();
  if (m.qgu) return m.qgu->weight().bytes() + m.qdn->weight().bytes();
  return m.gate_up.bytes() + m.down.bytes();
}

std::string GpuResidentExperts::format() const {
  const Impl& m = *impl_;
  if (m.ngu) {
    const std::string a = gpu::gguf_type_name(m.ngu->weight().type), b = gpu::gguf_type_name(m.ndn->weight().type);
    return a == b ? a : a + " / " + b;
  }
  if (!m.qgu) return "bf16";
  const std::string a = gpu::qformat_name(m.qgu->weight().format), b = gpu::qformat_name(m.qdn->weight().format);
  return a == b ? a : a + " / " + b;
}

void GpuResidentExperts::run(const uint16_t* x, int64_t n, int64_t K, const int32_t* ids, const float* wts, const int32_t* route_off,
                             const int32_t* pair_list, uint16_t* act, float* partial, float* out, gpu::Blas& blas, ExpertScratch& sc,
                             gpu::Stream& s, uint16_t* act_lo) {
  Impl& m = *impl_;
  if (m.grouped(n)) {  // gate/up, SwiGLU, down, weighted sum: four launches, no host synchronisation
    const int64_t P = n * K;
    MoeGemmScratch& g = sc.gemm;
    g.gu.reserve(static_cast<size_t>(P * 2 * m.I) * 4);
    g.act.reserve(static_cast<size_t>(P * m.I) * 2);
    g.ys.reserve(static_cast<size_t>(P * m.H) * 4);
    g.inv.reserve(static_cast<size_t>(P) * 4);
    gpu::gguf_moe_gemm(x, pair_list, K, P, route_off, m.E, m.ngu->weight(), 2 * m.I, g.gu.as<float>(), s);
    gpu::silu_mul(g.gu.as<float>(), P, m.I, g.act.as<uint16_t>(), nullptr, s);
    gpu::gguf_moe_gemm(g.act.as<uint16_t>(), nullptr, 1, P, route_off, m.E, m.ndn->weight(), m.H, g.ys.as<float>(), s);
    gpu::moe_combine_sorted(g.ys.as<float>(), pair_list, wts, n, K, m.H, g.inv.as<int32_t>(), out, s);
    return;
  }
  if (big_pass(n, K, m.E)) {
    sc.offs_h.reserve(static_cast<size_t>(m.E + 1) * 4);
    gpu::copy_to_host(sc.offs_h.as<int32_t>(), route_off, static_cast<size_t>(m.E + 1) * 4, s);
    sc.offs_ev.record(s);
    sc.offs_ev.synchronize();
    const int64_t gu_elems = 2 * m.I * m.H, dn_elems = m.H * m.I;
    if (!m.qgu && !m.ngu) {
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
                         if (m.ngu)
                           gpu::gguf_dequant(down ? m.ndn->weight() : m.ngu->weight(), e * rows, cnt * rows, buf.as<uint16_t>(), s);
                         else
                           gpu::quant_dequant(down ? m.qdn->weight() : m.qgu->weight(), e * rows, cnt * rows, buf.as<uint16_t>(), s);
                       }
                       return buf.as<uint16_t>() + (e - have[k]) * elems;
                     },
                     sc.gemm, out, s);
    return;
  }
  if (m.ngu)  // partial holds the [n*K, 2I] gate/up products (RoutedExperts::reserve sizes it)
    gpu::gguf_moe_experts(x, n, K, ids, wts, m.ngu->weight(), m.ndn->weight(), m.I, partial, out, s);
  else if (m.qgu)
    gpu::quant_moe_experts(x, n, m.H, m.I, m.E, K, wts, route_off, pair_list, m.qgu->weight(), m.qdn->weight(), act, partial, out, s);
  else
    gpu::moe_experts(x, n, m.H, m.I, m.E, K, ids, wts, route_off, pair_list, m.gate_up.as<uint16_t>(), m.down.as<uint16_t>(), act, partial, out,
                     s, act_lo);
}

}  // namespace hmoe
