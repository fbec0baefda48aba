// Split decode and the GPU expert cache (see gpu_expert_cache.h).
#include "engine/layers/gpu_expert_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "configs/error.h"
#include "configs/settings.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/expert_stream_layout.h"
#include "engine/placement/placement.h"
#include "engine/placement/prefill_cost.h"
#include "gpu/device.h"
#include "gpu/gguf_lowbit_units.h"
#include "gpu/moe_stream.h"
#include "gpu/quant.h"

namespace hmoe {

int64_t parse_gpu_expert_cache(const std::string& v) {
  if (v == "auto" || v.empty()) return -1;
  if (v == "0") return 0;
  return static_cast<int64_t>(parse_bytes("--gpu-expert-cache (HMOE_GPU_EXPERT_CACHE)", v));
}

double parse_gpu_split_decode(const std::string& v) {
  if (v == "auto" || v.empty()) return -1;
  char* end = nullptr;
  const double f = std::strtod(v.c_str(), &end);
  if (!end || *end != '\0' || !(f >= 0 && f <= 1))
    fail(ErrorKind::invalid_argument, "--gpu-split-decode (HMOE_GPU_SPLIT_DECODE): '" + v + "' is not auto or a fraction between 0 and 1");
  return f;
}

namespace {

constexpr int64_t kMaxK = 16;  // gpu::gguf_moe_experts' top-k limit

struct Class {
  gpu::GgufType gu_type, dn_type;
  size_t gu_per = 0, dn_per = 0;  // bytes of one expert's gate/up and down blocks
  int64_t slots = 0;      // cache slots (the policy's)
  int64_t transient = 0;  // more slots after them for misses copied this step only (ExpertCacheSet)
  gpu::DeviceBuffer gu, dn;
  gpu::GgufWeight wgu, wdn;  // the pool as stacked experts (expert index = slot)
  uint64_t host_bytes = 0;  // of its layers, for the budget share
  int64_t layers = 0;
  ExpertCacheSet set;  // which expert each slot holds: the policy (expert_cache_policy.h)
};

struct CacheLayer {
  int64_t layer = 0;
  int cls = 0;
  size_t gu_off = 0, dn_off = 0;  // region offsets in the stream layout's slot
  std::vector<std::vector<StreamCopy>> by_expert;
};

}  // namespace

struct GpuExpertCache::Impl {
  const ModelConfig& c;
  gpu::Stream& step;
  gpu::Stream copy;
  GpuExpertCacheOptions o;
  StreamLayout lay;  // pins and copy lists (one layer slot each; rebased onto the pools)
  std::vector<Class> classes;
  std::map<int64_t, CacheLayer> layers;
  int64_t H = 0, I = 0;
  LayerSplit ls;  // scratch of split()
  // Per split() call of a step: pinned pair lists, their device copy, copy events.
  int64_t ncalls = 0;  // two micro-batches per layer at most
  int64_t calls = 0, max_tokens = 64;
  gpu::PinnedBuffer meta_h;
  gpu::DeviceBuffer meta_d, gu_scratch, gout;
  std::vector<gpu::Event> c0, c1;  // per call: copies start / end
  std::vector<char> copied;        // per call: copies enqueued
  std::vector<uint64_t> call_bytes;  // per call: bytes copied
  uint64_t cpu_bytes = 0;          // the last split's CPU experts, bytes
  static constexpr double kAlpha = 0.1;  // moving-average weight of a new measurement
  gpu::Event free_ev;              // after the last GPU share: slots may be overwritten
  bool free_recorded = false;
  int64_t last_n = 0, last_gpu = 0;
  std::vector<int32_t> cpu_ids;
  std::vector<float> cpu_w;
  int64_t cpu_k = 0;
  GpuExpertCacheStats stats;
  explicit Impl(const ModelConfig& cfg, gpu::Stream& s) : c(cfg), step(s) {}
  size_t meta_stride() const { return static_cast<size_t>(max_tokens * kMaxK) * 8; }
};

GpuExpertCache::GpuExpertCache(const ModelConfig& c, std::vector<Layer> in, const GpuExpertCacheOptions& o, gpu::Stream& step)
    : impl_(std::make_unique<Impl>(c, step)) {
  Impl& m = *impl_;
  m.o = o;
  m.H = c.hidden_size;
  m.I = c.moe_intermediate_size;
  m.max_tokens = std::max<int64_t>(1, o.max_tokens);
  std::vector<StreamLayerSource> src;
  bool all_registered = !in.empty();
  for (const Layer& l : in) {
    src.push_back({l.layer, l.experts, l.pieces, l.registered});
    all_registered = all_registered && l.registered;
  }
  StreamLayoutOptions lo;
  lo.quantized = true;
  lo.pin_in_place = o.pin_in_place;
  if (!o.quiet)
    std::fprintf(stderr, "hmoe: GPU expert cache: %s the host experts of %zu layers\n",
                 all_registered ? "laying out (node memory registered at load)" : o.pin_in_place ? "pinning in place" : "laying out (pageable, not pinned)", src.size());
  m.lay = build_stream_layout(c, src, lo, nullptr);
  if (!o.quiet)
    std::fprintf(stderr, "hmoe: GPU expert cache: host experts %s\n",
                 m.lay.in_place ? (m.lay.registered ? "in node memory registered at load (copy residence)" : m.lay.pageable ? "read in place as pageable memory" : "pinned in place")
                                : ("in pinned images (" + format_bytes(m.lay.image_bytes) + "): " + m.lay.why_image).c_str());
  std::map<std::pair<int, int>, int> cls_of;
  for (const StreamLayerLayout& L : m.lay.layers) {
    if (!L.native) fail(ErrorKind::internal, "GPU expert cache: layer " + std::to_string(L.layer) + " is not in native GGUF blocks");
    const auto key = std::make_pair(static_cast<int>(L.ngu.type), static_cast<int>(L.ndn.type));
    if (!cls_of.count(key)) {
      cls_of[key] = static_cast<int>(m.classes.size());
      Class k;
      k.gu_type = L.ngu.type;
      k.dn_type = L.ndn.type;
      k.gu_per = static_cast<size_t>(2 * m.I) * L.ngu.row_bytes();
      k.dn_per = static_cast<size_t>(m.H) * L.ndn.row_bytes();
      if (gpu::gguf_type_lowbit(k.gu_type) || gpu::gguf_type_lowbit(k.dn_type))
        gpu::detail::gguf::device_lowbit_tables();  // the IQ codebooks on the device now, not in a launch under graph capture
      m.classes.push_back(std::move(k));
    }
    CacheLayer cl;
    cl.layer = L.layer;
    cl.cls = cls_of[key];
    cl.gu_off = reinterpret_cast<uintptr_t>(L.ngu.data);
    cl.dn_off = reinterpret_cast<uintptr_t>(L.ndn.data);
    cl.by_expert = L.by_expert;
    Class& k = m.classes[static_cast<size_t>(cl.cls)];
    k.host_bytes += static_cast<uint64_t>(c.num_experts) * (k.gu_per + k.dn_per);
    ++k.layers;
    m.layers[cl.layer] = std::move(cl);
  }
  // Slots per class: the budget shared in proportion to host bytes.
  uint64_t host = 0;
  for (const Class& k : m.classes) host += k.host_bytes;
  const int64_t K = std::max<int64_t>(1, c.num_experts_per_tok);
  uint64_t budget = o.budget_bytes > 0 ? static_cast<uint64_t>(o.budget_bytes) : 0;
  if (o.budget_bytes < 0) {  // auto: an eighth of the host experts, >= 4 top-k sets per class, <= a quarter of free memory
    budget = host / 8;
    uint64_t floor = 0;
    for (const Class& k : m.classes) floor += static_cast<uint64_t>(4 * K) * (k.gu_per + k.dn_per);
    budget = std::max(budget, floor);
    const uint64_t free_b = gpu::memory_info().first;  // gpu::device_info() leaves free_bytes 0
    if (free_b > 0) budget = std::min<uint64_t>(budget, free_b / 4);
  }
  for (Class& k : m.classes) {
    const double share = host > 0 ? static_cast<double>(k.host_bytes) / static_cast<double>(host) : 0;
    const auto per = static_cast<double>(k.gu_per + k.dn_per);
    const int64_t total = std::min<int64_t>(static_cast<int64_t>(std::floor(static_cast<double>(budget) * share / per)),
                                            static_cast<int64_t>(k.host_bytes / (k.gu_per + k.dn_per)));
    if (total <= 0) continue;
    k.transient = transient_slots(o.policy, total, K);
    k.slots = total - k.transient;
    k.gu = gpu::DeviceBuffer(static_cast<size_t>(total) * k.gu_per + 16);  // 16 readable bytes past the end (gguf kernels' rule)
    k.dn = gpu::DeviceBuffer(static_cast<size_t>(total) * k.dn_per + 16);
    k.wgu = gpu::GgufWeight{k.gu_type, k.gu.data(), total * 2 * m.I, m.H};
    k.wdn = gpu::GgufWeight{k.dn_type, k.dn.data(), total * m.H, m.I};
    gpu::check_gguf_weight(k.wgu, "GPU expert cache gate/up pool");
    gpu::check_gguf_weight(k.wdn, "GPU expert cache down pool");
    m.stats.slots += k.slots;
    m.stats.device_bytes += k.gu.bytes() + k.dn.bytes();
  }
  // Each layer an even share of its class's slots, the policy within it (expert_cache_policy.h says why).
  std::vector<std::vector<int64_t>> of_class(m.classes.size());
  for (const auto& [layer, cl] : m.layers) of_class[static_cast<size_t>(cl.cls)].push_back(layer);
  for (size_t ci = 0; ci < m.classes.size(); ++ci)
    m.classes[ci].set = ExpertCacheSet(of_class[ci], m.classes[ci].slots, o.policy, true, m.classes[ci].transient);
  m.ncalls = 2 * c.num_hidden_layers + 2;
  m.meta_h = gpu::PinnedBuffer(m.meta_stride() * static_cast<size_t>(m.ncalls));
  m.meta_d = gpu::DeviceBuffer(m.meta_stride() * static_cast<size_t>(m.ncalls));
  m.gu_scratch = gpu::DeviceBuffer(static_cast<size_t>(m.max_tokens * kMaxK * 2 * m.I) * 4);
  m.gout = gpu::DeviceBuffer(static_cast<size_t>(m.max_tokens * m.H) * 4);
  m.stats.device_bytes += m.meta_d.bytes() + m.gu_scratch.bytes() + m.gout.bytes();
  m.c0.resize(static_cast<size_t>(m.ncalls));
  m.c1.resize(static_cast<size_t>(m.ncalls));
  m.copied.assign(static_cast<size_t>(m.ncalls), 0);
  m.call_bytes.assign(static_cast<size_t>(m.ncalls), 0);
  m.stats.layers = static_cast<int64_t>(m.layers.size());
  m.stats.pcie_bandwidth = o.cost.pcie_bandwidth;
  m.stats.host_bandwidth = o.cost.host_bandwidth;
}

GpuExpertCache::~GpuExpertCache() = default;

bool GpuExpertCache::covers(int64_t layer) const {
  const auto it = impl_->layers.find(layer);
  return it != impl_->layers.end() && impl_->classes[static_cast<size_t>(it->second.cls)].set.covers(layer);
}
int64_t GpuExpertCache::max_tokens() const { return impl_->max_tokens; }
const int32_t* GpuExpertCache::cpu_ids() const { return impl_->cpu_ids.data(); }
const float* GpuExpertCache::cpu_weights() const { return impl_->cpu_w.data(); }
int64_t GpuExpertCache::cpu_k() const { return impl_->cpu_k; }
const GpuExpertCacheStats& GpuExpertCache::stats() const {
  Impl& m = *impl_;
  m.stats.slots_used = 0;
  for (const Class& k : m.classes) m.stats.slots_used += k.set.used();
  return m.stats;
}
void GpuExpertCache::reset_stats() {
  Impl& m = *impl_;
  const GpuExpertCacheStats keep = m.stats;
  m.stats = GpuExpertCacheStats{};
  m.stats.slots = keep.slots;
  m.stats.device_bytes = keep.device_bytes;
  m.stats.layers = keep.layers;
  m.stats.pcie_bandwidth = keep.pcie_bandwidth;
  m.stats.host_bandwidth = keep.host_bandwidth;
}

int64_t GpuExpertCache::split(int64_t layer, const gpu::bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* w) {
  Impl& m = *impl_;
  const auto lit = m.layers.find(layer);
  if (lit == m.layers.end()) fail(ErrorKind::internal, "GPU expert cache: layer " + std::to_string(layer) + " is not one of its layers");
  if (n > m.max_tokens || k > kMaxK || m.calls >= m.ncalls)
    fail(ErrorKind::internal, "GPU expert cache: split of " + std::to_string(n) + " tokens x " + std::to_string(k) + " beyond its sizes");
  CacheLayer& L = lit->second;
  Class& cls = m.classes[static_cast<size_t>(L.cls)];
  const int64_t E = m.c.num_experts, call = m.calls++;
  // The policy's decision (the code hmoe bench cache-sim replays): hits, the misses to copy now, the rest on the CPU.
  LayerSplit& ls = m.ls;
  cls.set.split(layer, ids, n * k, E, cls.gu_per + cls.dn_per, m.o.cost, ls, m.stats.c);
  std::vector<int64_t> slot_of(static_cast<size_t>(E), -1);
  for (size_t i = 0; i < ls.experts.size(); ++i) slot_of[static_cast<size_t>(ls.experts[i])] = ls.slot[i];
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (size_t i : ls.copied) {
    const int32_t e = ls.experts[i];
    const int64_t s = ls.slot[i];
    for (const StreamCopy& op : L.by_expert[static_cast<size_t>(e)]) {
      char* dst;
      if (op.dst >= L.dn_off) dst = cls.dn.as<char>() + static_cast<size_t>(s) * cls.dn_per + (op.dst - L.dn_off - static_cast<size_t>(e) * cls.dn_per);
      else dst = cls.gu.as<char>() + static_cast<size_t>(s) * cls.gu_per + (op.dst - L.gu_off - static_cast<size_t>(e) * cls.gu_per);
      dsts.push_back(dst);
      srcs.push_back(op.src);
      sizes.push_back(op.bytes);
    }
  }
  int64_t cpu_experts = 0;
  for (int64_t sl : ls.slot) cpu_experts += sl < 0;
  m.cpu_bytes = static_cast<uint64_t>(cpu_experts) * (cls.gu_per + cls.dn_per);
  // Pair lists: GPU pairs (slot ids) and CPU pairs (expert ids), compacted per token, weight-0 pads.
  int64_t kg = 0, kc = 0, gpu_pairs = 0;
  int32_t any_slot = -1, any_cpu = -1;
  for (int64_t t = 0; t < n; ++t) {
    int64_t g = 0, cc = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (slot_of[static_cast<size_t>(e)] >= 0) {
        ++g;
        any_slot = static_cast<int32_t>(slot_of[static_cast<size_t>(e)]);
      } else {
        ++cc;
        any_cpu = e;
      }
    }
    kg = std::max(kg, g);
    kc = std::max(kc, cc);
    gpu_pairs += g;
  }
  ++m.stats.steps;
  m.cpu_k = kc;
  m.cpu_ids.assign(static_cast<size_t>(n * kc), any_cpu);
  m.cpu_w.assign(static_cast<size_t>(n * kc), 0.0f);
  int32_t* gid = reinterpret_cast<int32_t*>(m.meta_h.as<char>() + static_cast<size_t>(call) * m.meta_stride());
  float* gw = reinterpret_cast<float*>(gid + n * std::max<int64_t>(kg, 1));
  for (int64_t t = 0; t < n; ++t) {
    int64_t g = 0, cc = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      const int64_t s = slot_of[static_cast<size_t>(e)];
      if (s >= 0) {
        gid[t * kg + g] = static_cast<int32_t>(s);
        gw[t * kg + g] = w[t * k + j];
        ++g;
      } else {
        m.cpu_ids[static_cast<size_t>(t * kc + cc)] = e;
        m.cpu_w[static_cast<size_t>(t * kc + cc)] = w[t * k + j];
        ++cc;
      }
    }
    for (; g < kg; ++g) {
      gid[t * kg + g] = any_slot;
      gw[t * kg + g] = 0.0f;
    }
  }
  m.last_n = n;
  m.last_gpu = gpu_pairs;
  if (gpu_pairs == 0) return 0;
  if (!dsts.empty()) {
    if (m.free_recorded) m.copy.wait(m.free_ev);  // slots a previous GPU share reads may be overwritten now
    m.c0[static_cast<size_t>(call)].record(m.copy);
    gpu::copy_batch_to_device(dsts.data(), srcs.data(), sizes.data(), dsts.size(), m.copy);
    m.c1[static_cast<size_t>(call)].record(m.copy);
    m.copied[static_cast<size_t>(call)] = 1;
    uint64_t b = 0;
    for (size_t z : sizes) b += z;
    m.call_bytes[static_cast<size_t>(call)] = b;
  }
  char* md = m.meta_d.as<char>() + static_cast<size_t>(call) * m.meta_stride();
  gpu::copy_to_device(md, gid, static_cast<size_t>(n * kg) * 8, m.step);
  if (!dsts.empty()) m.step.wait(m.c1[static_cast<size_t>(call)]);
  gpu::gguf_moe_experts(x, n, kg, reinterpret_cast<const int32_t*>(md), reinterpret_cast<const float*>(md + static_cast<size_t>(n * kg) * 4), cls.wgu,
                        cls.wdn, m.I, m.gu_scratch.as<float>(), m.gout.as<float>(), m.step);
  m.free_ev.record(m.step);
  m.free_recorded = true;
  return gpu_pairs;
}

void GpuExpertCache::observe_cpu(double seconds) {
  Impl& m = *impl_;
  // Below 1 MiB a layer's time is mostly fixed costs: no bandwidth to learn from it.
  if (m.cpu_bytes < (1u << 20) || !(seconds > 0) || m.o.cost.share >= 0) {
    m.cpu_bytes = 0;
    return;
  }
  const double bw = static_cast<double>(m.cpu_bytes) / seconds;
  m.o.cost.host_bandwidth = m.o.cost.host_bandwidth > 0 ? (1 - Impl::kAlpha) * m.o.cost.host_bandwidth + Impl::kAlpha * bw : bw;
  m.stats.host_bandwidth = m.o.cost.host_bandwidth;
  m.cpu_bytes = 0;
}

void GpuExpertCache::add_gpu_share(float* d, gpu::Stream& s) {
  Impl& m = *impl_;
  if (m.last_gpu > 0) gpu::add(d, m.gout.as<float>(), m.last_n * m.H, d, s);
  m.last_gpu = 0;
}

void GpuExpertCache::begin_step() {
  Impl& m = *impl_;
  m.calls = 0;
  std::fill(m.copied.begin(), m.copied.end(), 0);
  m.last_gpu = 0;
  m.cpu_bytes = 0;
}

void GpuExpertCache::end_step() {
  Impl& m = *impl_;
  for (int64_t i = 0; i < m.calls; ++i)
    if (m.copied[static_cast<size_t>(i)]) {
      const double sec = m.c1[static_cast<size_t>(i)].elapsed_ms(m.c0[static_cast<size_t>(i)]) * 1e-3;
      m.stats.copy_s += sec;
      m.copied[static_cast<size_t>(i)] = 0;
      if (sec > 0 && m.o.cost.share < 0 && m.call_bytes[static_cast<size_t>(i)] >= (1u << 20)) {  // the copies' bandwidth as measured
        const double bw = static_cast<double>(m.call_bytes[static_cast<size_t>(i)]) / sec;
        m.o.cost.pcie_bandwidth = m.o.cost.pcie_bandwidth > 0 ? (1 - Impl::kAlpha) * m.o.cost.pcie_bandwidth + Impl::kAlpha * bw : bw;
        m.stats.pcie_bandwidth = m.o.cost.pcie_bandwidth;
      }
    }
  m.calls = 0;
}

std::string GpuExpertCache::describe() const {
  const Impl& m = *impl_;
  char buf[512];
  std::string cls;
  for (const Class& k : m.classes) {
    std::snprintf(buf, sizeof buf, "%s%s/%s %lld slots + %lld transient of %s", cls.empty() ? "" : ", ", gpu::gguf_type_name(k.gu_type),
                  gpu::gguf_type_name(k.dn_type), static_cast<long long>(k.slots), static_cast<long long>(k.transient), format_bytes(k.gu_per + k.dn_per).c_str());
    cls += buf;
  }
  const double share = split_pcie_share(m.o.cost);
  std::snprintf(buf, sizeof buf, "GPU expert cache: %lld host layers, %s of VRAM (%s), %s per layer; split decode %s (host read %.1f GB/s, pinned PCIe %.1f GB/s)",
                static_cast<long long>(m.layers.size()), format_bytes(m.stats.device_bytes).c_str(), cls.c_str(), cache_policy_name(m.o.policy),
                m.o.cost.share >= 0 ? ("copies a fixed " + std::to_string(share).substr(0, 4) + " of the misses").c_str()
                                    : ("balances the misses, ~" + std::to_string(static_cast<int>(std::lround(share * 100))) + "% of the bytes over PCIe").c_str(),
                m.o.cost.host_bandwidth / 1e9, m.o.cost.pcie_bandwidth / 1e9);
  return buf;
}

std::unique_ptr<GpuExpertCache> make_gpu_expert_cache(const ModelConfig& c, std::vector<GpuExpertCache::Layer> layers, GpuExpertCacheOptions o,
                                                      gpu::Stream& step, numa::ThreadPool* pool) {
  if (o.budget_bytes == 0) return nullptr;
  std::vector<GpuExpertCache::Layer> native;
  for (const auto& l : layers) {
    bool ok = l.experts && !l.experts->empty();
    for (const auto& e : *l.experts)
      ok = ok && gpu::gguf_native_supported(e.gate) && gpu::gguf_native_supported(e.up) && gpu::gguf_native_supported(e.down) &&
           e.gate.ext == (*l.experts)[0].gate.ext && e.up.ext == e.gate.ext && e.down.ext == (*l.experts)[0].down.ext;
    if (ok) native.push_back(l);
  }
  if (native.empty() || c.num_experts_per_tok > kMaxK) return nullptr;
  if (o.cost.share != 0 && (o.cost.host_bandwidth <= 0 || o.cost.pcie_bandwidth <= 0)) {
    // Load progress (stderr, unless quiet): where a load stands if it stalls.
    if (!o.quiet) std::fprintf(stderr, "hmoe: GPU expert cache: measuring host read and pinned PCIe bandwidths\n");
    if (o.cost.host_bandwidth <= 0) o.cost.host_bandwidth = measure_host_read_bandwidth(pool);
    if (o.cost.pcie_bandwidth <= 0) o.cost.pcie_bandwidth = measure_pinned_h2d_bandwidth(64u << 20);
    if (!o.quiet)
      std::fprintf(stderr, "hmoe: GPU expert cache: host read %.1f GB/s, pinned PCIe %.1f GB/s\n", o.cost.host_bandwidth / 1e9, o.cost.pcie_bandwidth / 1e9);
  }
  auto cache = std::make_unique<GpuExpertCache>(c, std::move(native), o, step);
  if (cache->stats().slots == 0) {
    if (!o.quiet) std::fprintf(stderr, "hmoe: --gpu-expert-cache: the budget buys no slot; split decode and the expert cache are off\n");
    return nullptr;
  }
  if (!o.quiet) std::fprintf(stderr, "hmoe: %s\n", cache->describe().c_str());
  return cache;
}

std::string expert_cache_plan_report(const ModelConfig& c, const std::string& cache_setting, const std::string& split_setting,
                                     const std::string& policy_setting, double host_bandwidth,
                                     double pcie_bandwidth, int64_t host_layers, uint64_t expert_bytes) {
  char buf[1024];
  const int64_t budget = parse_gpu_expert_cache(cache_setting);
  SplitCost cost;
  cost.host_bandwidth = host_bandwidth;
  cost.pcie_bandwidth = pcie_bandwidth;
  cost.share = parse_gpu_split_decode(split_setting);
  const CachePolicy policy = parse_cache_policy("--gpu-expert-cache-policy (HMOE_GPU_EXPERT_CACHE_POLICY)", policy_setting);
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  const uint64_t host = static_cast<uint64_t>(host_layers * E) * expert_bytes;
  uint64_t bytes = budget > 0 ? static_cast<uint64_t>(budget) : 0;
  if (budget < 0) bytes = std::max<uint64_t>(host / 8, static_cast<uint64_t>(4 * K) * expert_bytes);
  const int64_t total = expert_bytes ? static_cast<int64_t>(std::min<uint64_t>(bytes / expert_bytes, host / std::max<uint64_t>(expert_bytes, 1))) : 0;
  const int64_t transient = transient_slots(policy, total, K), slots = total - transient;
  std::string out;
  if (budget == 0 || host_layers == 0 || slots == 0) {
    std::snprintf(buf, sizeof buf, "GPU expert cache and split decode: off (%s)\n",
                  host_layers == 0 ? "no MoE layer keeps its experts on the host" : "--gpu-expert-cache 0");
    return buf;
  }
  // Per token and host layer: K experts routed; with uniform routing a fraction slots/(layers*E) is cached.
  const double hit = static_cast<double>(slots) / static_cast<double>(host_layers * E);
  const auto misses = static_cast<int64_t>(std::llround(static_cast<double>(K) * (1 - hit)));
  const int64_t m = split_stream_count(misses, expert_bytes, slots + transient, cost);
  const double cpu_only = static_cast<double>(K * static_cast<int64_t>(expert_bytes)) / std::max(host_bandwidth, 1.0);
  const double split_t = std::max(static_cast<double>((misses - m) * static_cast<int64_t>(expert_bytes)) / std::max(host_bandwidth, 1.0),
                                  m > 0 ? cost.copy_latency_s + static_cast<double>(m * static_cast<int64_t>(expert_bytes)) / std::max(pcie_bandwidth, 1.0) : 0.0);
  std::snprintf(buf, sizeof buf,
                "GPU expert cache (decode, host layers' experts; %s per layer): %s of VRAM (%s), %lld slots of %s%s = %.1f%% of the %lld host layers' experts; "
                "hits expected %.1f%% with uniform routing\n",
                cache_policy_name(policy), format_bytes(static_cast<uint64_t>(total) * expert_bytes).c_str(),
                budget < 0 ? "auto: an eighth of the host experts, at least 4 top-k sets" : "given", static_cast<long long>(slots), format_bytes(expert_bytes).c_str(),
                transient > 0 ? (" (+" + std::to_string(transient) + " transient: misses the split copies that the policy does not cache)").c_str() : "", hit * 100,
                static_cast<long long>(host_layers), hit * 100);
  out += buf;
  if (misses == 0) {
    std::snprintf(buf, sizeof buf, "  split decode: every routed expert cached, the GPU computes them all (CPU-only reads would take %.0f us per layer)\n",
                  cpu_only * 1e6);
    return out + buf;
  }
  std::snprintf(buf, sizeof buf,
                "  split decode (%s): per host layer and token %lld of %lld experts routed, %lld missed: %lld copied over PCIe (%.1f GB/s) while the CPU "
                "reads %lld (%.1f GB/s): %.0f us instead of %.0f us CPU-only (%.2fx for the experts' reads)\n",
                cost.share >= 0 ? "fixed share, --gpu-split-decode" : "auto: balances the bandwidths", static_cast<long long>(K), static_cast<long long>(K),
                static_cast<long long>(misses), static_cast<long long>(m), pcie_bandwidth / 1e9, static_cast<long long>(misses - m), host_bandwidth / 1e9,
                split_t * 1e6, cpu_only * 1e6, split_t > 0 ? cpu_only / split_t : 0.0);
  out += buf;
  return out;
}

}  // namespace hmoe
