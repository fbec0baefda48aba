// The prefetch-window scheduler (see gpu_expert_stream.h and gpu/README.md).
#include "engine/layers/expert_stream.h"

#include "engine/layers/gpu_experts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

#include "configs/error.h"
#include "engine/layers/expert_stream_chunks.h"
#include "engine/layers/expert_stream_layout.h"
#include "engine/layers/host_residence.h"
#include "engine/layers/gpu_upload.h"
#include "engine/placement/placement.h"
#include "engine/placement/prefill_cost.h"
#include "gpu/quant.h"
#include "gpu/device.h"
#include "gpu/gguf_lowbit_units.h"
#include "gpu/memory_cap.h"
#include "gpu/moe_stream.h"
#include "io/dtype.h"
#include "numa/kernels.h"

namespace hmoe {

double measure_pinned_h2d_bandwidth(size_t bytes) {
  gpu::PinnedBuffer h(bytes);
  std::memset(h.as<char>(), 1, bytes);
  gpu::DeviceBuffer d(bytes);
  gpu::Stream s;
  gpu::Event a, b;
  gpu::copy_to_device(d.data(), h.as<char>(), bytes, s);  // warm-up
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    a.record(s);
    gpu::copy_to_device(d.data(), h.as<char>(), bytes, s);
    b.record(s);
    b.synchronize();
    best = std::max(best, static_cast<double>(bytes) / (b.elapsed_ms(a) * 1e-3));
  }
  return best;
}

double measure_device_copy_bandwidth(size_t bytes) {
  gpu::DeviceBuffer a(bytes), b(bytes);
  gpu::Stream s;
  gpu::Event e0, e1;
  gpu::memset_device(a.data(), 1, bytes, s);
  gpu::copy_on_device(b.data(), a.data(), bytes, s);  // warm-up
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    e0.record(s);
    gpu::copy_on_device(b.data(), a.data(), bytes, s);
    e1.record(s);
    e1.synchronize();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / (e1.elapsed_ms(e0) * 1e-3));
  }
  return best;
}

namespace {

// moe_experts_gemm over quantized slot matrices: a chunk of experts at a time
// (at most 256 MiB per matrix kind) dequantized to bf16 by `deq(down, first
// row, rows, out)`, then the cuBLAS products. The weight calls come in
// expert order per matrix kind.
using DequantFn = std::function<void(bool down, int64_t r0, int64_t rows, uint16_t* out)>;
void moe_experts_gemm_dequant(gpu::Blas& blas, const uint16_t* x, int64_t n, int64_t H, int64_t I, int64_t E, int64_t K, const int32_t* offs,
                              const int32_t* pair_list, const float* weights, const DequantFn& deq, gpu::DeviceBuffer& deq_gu,
                              gpu::DeviceBuffer& deq_dn, MoeGemmScratch& sc, float* out, gpu::Stream& s) {
  const int64_t gu_elems = 2 * I * H, dn_elems = H * I;
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(E, (256ll << 20) / (gu_elems * 2)));
  deq_gu.reserve(static_cast<size_t>(chunk * gu_elems) * 2);
  deq_dn.reserve(static_cast<size_t>(chunk * dn_elems) * 2);
  int64_t have[2] = {-1, -1};  // first expert of the chunk held, per kind
  moe_experts_gemm(blas, x, n, H, I, E, K, offs, pair_list, weights,
                   [&](int64_t e, bool down) -> const uint16_t* {
                     const int k = down ? 1 : 0;
                     const int64_t elems = down ? dn_elems : gu_elems, rows = down ? H : 2 * I;
                     gpu::DeviceBuffer& buf = down ? deq_dn : deq_gu;
                     if (have[k] < 0 || e < have[k] || e >= have[k] + chunk) {
                       have[k] = e;
                       deq(down, e * rows, std::min(chunk, E - e) * rows, buf.as<uint16_t>());
                     }
                     return buf.as<uint16_t>() + (e - have[k]) * elems;
                   },
                   sc, out, s);
}

std::string format_cost_line(const PrefillCost& cost, const char* cpu_note) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "CPU experts %.0f GFLOP/s (%s) and %.1f GB/s at %.4f bytes/weight, pinned PCIe %.1f GB/s at %.4f bytes/weight streamed, GPU experts %.0f "
                "TFLOP/s assumed",
                cost.cpu_expert_flops / 1e9, cpu_note, cost.cpu_bandwidth / 1e9, cost.cpu_bytes_per_weight, cost.pcie_bandwidth / 1e9,
                cost.stream_bytes_per_weight, cost.gpu_expert_flops / 1e12);
  return buf;
}

}  // namespace

ExpertStreamOptions expert_stream_options(const ModelConfig& c, const Settings& s, numa::NodePools& pools, const numa::ExpertWeights* sample,
                                          bool quiet) {
  ExpertStreamOptions o;
  o.window = parse_prefetch_window(s);
  o.quiet = quiet;
  o.quantized = s.gpu_quantized_experts;
  o.max_tokens = s.max_num_batched_tokens;
  o.pin_in_place = host_residence_of(s) != HostResidence::off;
  const int64_t mb = parse_prefill_min_batch(s);
  if (mb >= 0) {
    o.min_batch = mb;
    return o;
  }
  PrefillCost cost;
  cost.cpu_expert_flops = sample ? measure_cpu_expert_flops(*sample, pools, numa::EngineOptions::from_settings(s))
                                 : measure_cpu_expert_flops(c, &pools.pool(0));
  cost.cpu_bandwidth = measure_host_read_bandwidth(&pools.pool(0));
  cost.pcie_bandwidth = measure_pinned_h2d_bandwidth(64u << 20);
  cost.gpu_expert_flops = kAssumedGpuExpertFlops;
  cost.cpu_bytes_per_weight = expert_cpu_bytes_per_weight(c);
  cost.stream_bytes_per_weight = expert_stream_bytes_per_weight(c, o.quantized);
  const int64_t be = prefill_break_even(c, cost);
  o.min_batch = be > 0 ? std::max(be, kAutoMinBatchFloor) : 0;
  if (!quiet)
    std::fprintf(stderr, "hmoe: --gpu-prefill-min-batch-size auto -> %lld tokens (break-even %lld, floor %lld; %s)\n", static_cast<long long>(o.min_batch),
                 static_cast<long long>(be), static_cast<long long>(kAutoMinBatchFloor),
                 format_cost_line(cost, sample ? "one of the model's experts, measured" : "bf16 probe, measured").c_str());
  return o;
}

std::string prefill_plan_report(const ModelConfig& c, const Settings& s, double cpu_bandwidth, double pcie_bandwidth, int64_t streamed_layers,
                                uint64_t gpu_left, uint64_t gpu_total, const numa::ExpertWeights* sample) {
  const int window = parse_prefetch_window(s);
  const int64_t set = parse_prefill_min_batch(s);
  char buf[1024];
  std::string out;
  ExpertStreamOptions o;
  o.window = window;
  o.quantized = s.gpu_quantized_experts;
  o.max_tokens = s.max_num_batched_tokens;
  o.shared_scratch = true;  // as the GPU runtime runs its stream (GpuRuntime::enable_expert_streaming)
  const bool quant = o.quantized && c.gpu_expert_bytes_per_weight > 0 && c.gpu_expert_bytes_per_weight < 2.0;
  std::snprintf(buf, sizeof buf, "prefill streaming of non-resident experts: window %d (%s), %lld device slots of %s = %s on the GPU when on (%s)\n",
                window, s.origin("gpu_prefetch_window").c_str(), static_cast<long long>(expert_stream_slots(o, streamed_layers)),
                format_bytes(expert_stream_slot_size(c, o)).c_str(), format_bytes(expert_stream_slot_bytes(c, o, streamed_layers)).c_str(),
                quant ? "experts streamed in their GPU quantized format, stored blocks as they are where the GPU takes them"
                      : "experts streamed as bf16");
  out += buf;
  std::string why;
  if (set != 0 && !expert_stream_fits_in(c, o, streamed_layers, gpu_left, gpu_total, &why)) out += "  NOT ON with this plan: " + why + "\n";
  if (set >= 0) {
    std::snprintf(buf, sizeof buf, "  passes of >= %lld tokens stream (%s)%s\n", static_cast<long long>(set), s.origin("gpu_prefill_min_batch_size").c_str(),
                  set == 0 ? ": never" : "");
    return out + buf;
  }
  std::string pcie_note = "given";
  if (pcie_bandwidth <= 0) {
    if (gpu::device_count() > 0) {
      pcie_bandwidth = measure_pinned_h2d_bandwidth(64u << 20);
      pcie_note = "measured here";
    } else {
      pcie_bandwidth = 25e9;
      pcie_note = "assumed (PCIe 4.0 x16); pass --pcie-bandwidth";
    }
  }
  PrefillCost cost;
  if (sample) {
    numa::NodePools pools(numa::PoolOptions::from_settings(s));
    cost.cpu_expert_flops = measure_cpu_expert_flops(*sample, pools, numa::EngineOptions::from_settings(s));
  } else {
    numa::ThreadPool pool(0);
    cost.cpu_expert_flops = measure_cpu_expert_flops(c, &pool);
  }
  cost.cpu_bandwidth = cpu_bandwidth;
  cost.pcie_bandwidth = pcie_bandwidth;
  cost.gpu_expert_flops = kAssumedGpuExpertFlops;
  cost.cpu_bytes_per_weight = expert_cpu_bytes_per_weight(c);
  cost.stream_bytes_per_weight = expert_stream_bytes_per_weight(c, o.quantized);
  const int64_t be = prefill_break_even(c, cost);
  const std::string cpu_note = std::string(sample ? "one of the model's experts" : "bf16 probe") + ", measured here";
  std::snprintf(buf, sizeof buf, "  auto: break-even %lld tokens -> passes of >= %lld tokens stream (floor %lld; PCIe %s; %s)\n", static_cast<long long>(be),
                static_cast<long long>(be > 0 ? std::max(be, kAutoMinBatchFloor) : 0), static_cast<long long>(kAutoMinBatchFloor), pcie_note.c_str(),
                format_cost_line(cost, cpu_note.c_str()).c_str());
  out += buf;
  // What one streamed layer costs each way at a few prompt sizes (the model above).
  out += "  per streamed layer, CPU experts vs streamed:";
  for (int64_t n : {128, 512, 2048, 4096}) {
    std::snprintf(buf, sizeof buf, " %lld tokens %.2f vs %.2f ms;", static_cast<long long>(n), cpu_expert_seconds(c, cost, n) * 1e3,
                  streamed_expert_seconds(c, cost, n) * 1e3);
    out += buf;
  }
  out.back() = '\n';
  return out;
}

uint64_t expert_stream_slot_size(const ModelConfig& c, const ExpertStreamOptions& o) {
  const double w = 3.0 * static_cast<double>(c.num_experts) * static_cast<double>(c.moe_intermediate_size) * static_cast<double>(c.hidden_size);
  return static_cast<uint64_t>(w * expert_stream_bytes_per_weight(c, o.quantized));
}

int64_t expert_stream_slots(const ExpertStreamOptions& o, int64_t layers) {
  return o.serial ? 1 : std::min<int64_t>(o.window + 1, std::max<int64_t>(layers, 1));
}

uint64_t expert_stream_slot_bytes(const ModelConfig& c, const ExpertStreamOptions& o, int64_t layers) {
  return expert_stream_slot_size(c, o) * static_cast<uint64_t>(expert_stream_slots(o, layers));
}

bool expert_stream_fits(const ModelConfig& c, const ExpertStreamOptions& o, int64_t layers, std::string* why) {
  const auto [free_b, total_b] = gpu::memory_info();
  // Under a cap (--gpu-memory, gpu/memory_cap.h) the slots fit in what the cap leaves.
  const gpu::MemoryLedger& cap = gpu::memory_ledger();
  const uint64_t f = std::min<uint64_t>(free_b, cap.room()), t = cap.cap() ? std::min<uint64_t>(total_b, cap.cap()) : total_b;
  return expert_stream_fits_in(c, o, layers, f, t, why);
}

uint64_t expert_stream_step_room(const ModelConfig& c, const ExpertStreamOptions& o, uint64_t total_b) {
  const uint64_t H = static_cast<uint64_t>(std::max<int64_t>(c.hidden_size, 1)), I = static_cast<uint64_t>(std::max<int64_t>(c.moe_intermediate_size, 1));
  const uint64_t K = static_cast<uint64_t>(std::max<int64_t>(c.num_experts_per_tok, 1)), E = static_cast<uint64_t>(std::max<int64_t>(c.num_experts, 1));
  // Per routed pair (ExpertStream::begin / layer): pair list and inverse 4 + 4, gate/up fp32 8 I, the activation
  // bf16 2 I (a hi + lo pair under split_act: 4 I), the expert outputs fp32 4 H.
  const uint64_t per_pair = 8 + 8 * I + (o.split_act ? 4 : 2) * I + 4 * H;
  const uint64_t tokens = static_cast<uint64_t>(std::max<int64_t>(o.max_tokens, 0));
  const uint64_t lists = (E + 1) * 4 + tokens * K * 4;  // route offsets, pair list (the stream's own)
  uint64_t pass = 0;
  if (!o.shared_scratch) pass = tokens > 0 ? tokens * K * per_pair : uint64_t{1} << 30;
  // moe_experts_gemm_dequant's two 256 MiB chunks: the plan's workspace does not count them, shared or not.
  if (o.dequant_chunks) pass += uint64_t{512} << 20;
  return lists + pass + (uint64_t{128} << 20) + total_b / 200;
}

bool expert_stream_fits_in(const ModelConfig& c, const ExpertStreamOptions& o, int64_t layers, uint64_t free_b, uint64_t total_b, std::string* why) {
  const uint64_t need = expert_stream_slot_bytes(c, o, layers), room = expert_stream_step_room(c, o, total_b);
  if (need + room <= free_b) return true;
  if (why)
    *why = "the expert slots need " + format_bytes(need) + " and the step " + format_bytes(room) + ", the GPU has " + format_bytes(free_b) +
           " free: prefill runs the non-resident experts on the CPU (keep fewer layers resident, lower --gpu-prefetch-window, or set "
           "--gpu-prefill-min-batch-size 0 to silence this)";
  return false;
}

namespace {

// Whether make_expert_stream may stream these layers in chunks (the grouped GGUF product's formats and shapes).
bool expert_stream_chunkable(const ModelConfig& c, const std::vector<ExpertStream::Layer>& layers, const ExpertStreamOptions& o) {
  if (!o.quantized || o.compute == ExpertStreamOptions::Compute::kernel || o.serial) return false;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  if (H % 256 != 0 || I % 256 != 0 || (2 * I) % 128 != 0 || H % 128 != 0) return false;  // gguf_moe_gemm's shapes
  for (const auto& l : layers) {
    if (!l.experts || l.experts->empty()) return false;
    for (const auto& e : *l.experts)
      if (!gpu::gguf_native_supported(e.gate) || !gpu::gguf_native_supported(e.up) || !gpu::gguf_native_supported(e.down)) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<ExpertStream> make_expert_stream(const ModelConfig& c, std::vector<ExpertStream::Layer> layers, const ExpertStreamOptions& o,
                                                 gpu::Stream& step, gpu::Blas& blas, numa::ThreadPool* pool, ExpertScratch* shared) {
  if (o.min_batch <= 0 || layers.empty()) return nullptr;
  const bool chunkable = expert_stream_chunkable(c, layers, o);
  ExpertStreamOptions od = o;  // quantized layers outside the grouped GGUF product dequantize chunks of experts for cuBLAS
  od.dequant_chunks = o.quantized && o.compute != ExpertStreamOptions::Compute::kernel && !chunkable;
  od.shared_scratch = shared != nullptr;
  std::string why;
  const auto [free_b, total_b] = gpu::memory_info();
  const gpu::MemoryLedger& cap = gpu::memory_ledger();
  uint64_t f = std::min<uint64_t>(free_b, cap.room());
  const uint64_t t = cap.cap() ? std::min<uint64_t>(total_b, cap.cap()) : total_b;
  if (o.reserved_bytes > 0) f = std::min<uint64_t>(f, o.reserved_bytes);  // what the fit kept for the slots (the KV comes later)
  if (!expert_stream_fits_in(c, od, static_cast<int64_t>(layers.size()), f, t, &why)) {
    // Chunks of experts through the same ring, in the room left after the step's.
    const uint64_t step_room = expert_stream_step_room(c, od, t);
    const numa::ExpertWeights& x = (*layers[0].experts)[0];
    const uint64_t eb = x.gate.bytes() + x.up.bytes() + x.down.bytes();
    const StreamChunkPlan plan =
        plan_stream_chunks(c.num_experts, eb, o.window, static_cast<int64_t>(layers.size()), f > step_room ? f - step_room : 0, chunkable);
    if (!plan.fits() || plan.whole_layers()) {
      if (!o.quiet) std::fprintf(stderr, "hmoe: notice: %s; chunks of experts do not fit either (%s)\n", why.c_str(), plan.describe().c_str());
      return nullptr;
    }
    ExpertStreamOptions oc = od;
    oc.chunk_experts = plan.experts_per_slot;
    if (!o.quiet) std::fprintf(stderr, "hmoe: streamed prefill in chunks of experts: %s\n", plan.describe().c_str());
    return std::make_unique<ExpertStream>(c, std::move(layers), oc, step, blas, pool, shared);
  }
  return std::make_unique<ExpertStream>(c, std::move(layers), od, step, blas, pool, shared);
}

struct ExpertStream::Impl {
  ModelConfig c;
  ExpertStreamOptions opt;
  gpu::Stream& step;
  gpu::Blas& blas;
  gpu::Stream copy;
  int64_t H, I, E, K, S = 1;
  StreamLayout lay;
  std::map<int64_t, int64_t> index;
  std::vector<gpu::DeviceBuffer> slots;
  std::vector<gpu::Event> c0, c1, w0, k0, k1;  // per streamed layer
  gpu::Event offs_ev;
  std::vector<char> copied;
  std::vector<uint64_t> pass_bytes;
  gpu::DeviceBuffer route_off, pair_list;
  // The passes' buffers: gemm (per-expert cuBLAS passes; its act and ys also serve the grouped kernels) and deq_gu /
  // deq_dn (quantized experts dequantized for cuBLAS, a chunk of experts at a time); the stack's (shared) or own.
  ExpertScratch own;
  ExpertScratch& sc;
  gpu::PinnedBuffer offs_h;
  int64_t n = 0, next = 0;
  bool fill_all = true, use_gemm = false, in_pass = false;
  // Chunks (opt.chunk_experts): C experts a slot, nch chunks a layer; events and copies per unit j * nch + c.
  int64_t C = 0, nch = 1;
  size_t chunk_dn_off = 0;                          // a chunk slot: gate/up blocks at 0, down blocks here
  size_t slot_size = 0;                             // bytes of one slot
  std::vector<std::vector<StreamCopy>> chunk_ops;   // per unit: its experts' copies into a chunk slot
  ExpertStreamStats stats;

  Impl(const ModelConfig& cfg, const ExpertStreamOptions& o, gpu::Stream& st, gpu::Blas& b, ExpertScratch* shared)
      : c(cfg), opt(o), step(st), blas(b), H(cfg.hidden_size), I(cfg.moe_intermediate_size), E(cfg.num_experts), K(cfg.num_experts_per_tok),
        sc(shared ? *shared : own) {}

  void* slot(int64_t j) { return slots[static_cast<size_t>(j % S)].data(); }
  gpu::bf16_t* slot_gu(int64_t j) { return slots[static_cast<size_t>(j % S)].as<gpu::bf16_t>(); }
  gpu::bf16_t* slot_dn(int64_t j) { return reinterpret_cast<gpu::bf16_t*>(slots[static_cast<size_t>(j % S)].as<char>() + lay.down_off); }

  int64_t units() const { return static_cast<int64_t>(lay.layers.size()) * nch; }
  const std::vector<StreamCopy>& unit_ops(int64_t u) const {
    return nch > 1 ? chunk_ops[static_cast<size_t>(u)] : lay.layers[static_cast<size_t>(u)].all;
  }
  void enqueue_copy(int64_t j, const std::vector<StreamCopy>& ops, const gpu::Event* wait) {
    if (wait) copy.wait(*wait);
    c0[static_cast<size_t>(j)].record(copy);
    char* base = slots[static_cast<size_t>(j % S)].as<char>();
    uint64_t bytes = 0;
    for (const StreamCopy& op : ops) {
      gpu::copy_to_device(base + op.dst, op.src, op.bytes, copy);
      bytes += op.bytes;
    }
    c1[static_cast<size_t>(j)].record(copy);
    copied[static_cast<size_t>(j)] = 1;
    pass_bytes[static_cast<size_t>(j)] = bytes;
  }
};

ExpertStream::ExpertStream(const ModelConfig& c, std::vector<Layer> layers, const ExpertStreamOptions& opt, gpu::Stream& step, gpu::Blas& blas,
                           numa::ThreadPool* pool, ExpertScratch* shared)
    : impl_(std::make_unique<Impl>(c, opt, step, blas, shared)) {
  Impl& m = *impl_;
  if (opt.window < 1 || opt.window > 8) fail(ErrorKind::invalid_argument, "expert stream: window " + std::to_string(opt.window) + " (1 to 8)");
  if (m.E <= 0 || layers.empty()) fail(ErrorKind::internal, "expert stream: no streamed MoE layers");
  const int64_t N = static_cast<int64_t>(layers.size());
  m.S = expert_stream_slots(opt, N);
  std::vector<StreamLayerSource> src;
  for (const Layer& l : layers) src.push_back({l.layer, l.experts, l.pieces, l.registered});
  StreamLayoutOptions lo;
  lo.quantized = opt.quantized;
  lo.force_image = opt.source == ExpertStreamOptions::Source::copy;
  lo.skip_copies = opt.skip_copies;
  lo.pin_in_place = opt.source == ExpertStreamOptions::Source::in_place || (opt.source == ExpertStreamOptions::Source::automatic && opt.pin_in_place);
  m.lay = build_stream_layout(c, std::move(src), lo, pool);
  for (int64_t j = 0; j < N; ++j) m.index[m.lay.layers[static_cast<size_t>(j)].layer] = j;
  for (const StreamLayerLayout& L : m.lay.layers)
    if (L.native && (gpu::gguf_type_lowbit(L.ngu.type) || gpu::gguf_type_lowbit(L.ndn.type)))
      gpu::detail::gguf::device_lowbit_tables();  // the IQ codebooks on the device now, not in a launch under graph capture
  size_t slot_bytes = m.lay.slot_bytes;
  if (opt.chunk_experts > 0 && opt.chunk_experts < m.E) {
    for (const StreamLayerLayout& L : m.lay.layers)
      if (!L.native || !gpu::gguf_moe_gemm_supported(L.ngu, 2 * m.I) || !gpu::gguf_moe_gemm_supported(L.ndn, m.H) ||
          L.ngu.type != m.lay.layers[0].ngu.type || L.ndn.type != m.lay.layers[0].ndn.type)
        fail(ErrorKind::unsupported, "expert stream: chunks of experts need GGUF layers of one format the grouped product takes (layer " +
                                         std::to_string(L.layer) + ")");
    m.C = opt.chunk_experts;
    m.nch = (m.E + m.C - 1) / m.C;
    m.S = std::max<int64_t>(opt.window + 1, 2);
    const StreamLayerLayout& L0 = m.lay.layers[0];
    const size_t gu_per = static_cast<size_t>(2 * m.I) * L0.ngu.row_bytes(), dn_per = static_cast<size_t>(m.H) * L0.ndn.row_bytes();
    const size_t dn_base = (static_cast<size_t>(m.C) * gu_per + 16 + 255) / 256 * 256;  // 16 readable bytes past each region
    m.chunk_dn_off = dn_base;
    slot_bytes = dn_base + static_cast<size_t>(m.C) * dn_per + 16;
    for (const StreamLayerLayout& L : m.lay.layers) {
      const size_t gu_off = reinterpret_cast<uintptr_t>(L.ngu.data), dn_off = reinterpret_cast<uintptr_t>(L.ndn.data);
      for (int64_t ch = 0; ch < m.nch; ++ch) {
        std::vector<StreamCopy> ops;
        for (int64_t e = ch * m.C; e < std::min(m.E, (ch + 1) * m.C); ++e)
          for (StreamCopy op : L.by_expert[static_cast<size_t>(e)]) {
            const auto k = static_cast<size_t>(e - ch * m.C), eu = static_cast<size_t>(e);
            op.dst = op.dst >= dn_off ? dn_base + k * dn_per + (op.dst - dn_off - eu * dn_per) : k * gu_per + (op.dst - gu_off - eu * gu_per);
            ops.push_back(op);
          }
        coalesce_copies(ops);
        m.chunk_ops.push_back(std::move(ops));
      }
    }
  }
  m.slot_size = slot_bytes;
  for (int64_t s = 0; s < m.S; ++s) {
    m.slots.emplace_back(slot_bytes);
    if (opt.skip_copies) gpu::memset_device(m.slots.back().data(), 0, slot_bytes, m.copy);
  }
  for (int64_t j = 0; j < m.units(); ++j) {
    m.c0.emplace_back();
    m.c1.emplace_back();
    m.w0.emplace_back();
    m.k0.emplace_back();
    m.k1.emplace_back();
  }
  m.offs_h.reserve(static_cast<size_t>(m.E + 1) * 4);
  m.copy.synchronize();
  m.stats.pinned_bandwidth = measure_pinned_h2d_bandwidth(std::min<size_t>(m.slot_size, 64u << 20) + (1u << 20));
  m.stats.layers.resize(static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j) m.stats.layers[static_cast<size_t>(j)].layer = m.lay.layers[static_cast<size_t>(j)].layer;
  if (!opt.quiet) {
    std::fprintf(stderr,
                 "hmoe: streaming experts of %lld non-resident MoE layers to the GPU for passes of >= %lld tokens: %lld slots of %s on the GPU "
                 "(%s), window %d, pinned H2D %.1f GB/s; host experts %s\n",
                 static_cast<long long>(N), static_cast<long long>(opt.min_batch), static_cast<long long>(m.S), (format_bytes(m.slot_size) + (m.nch > 1 ? " (" + std::to_string(m.C) + " experts each, " + std::to_string(m.nch) + " chunks a layer)" : std::string())).c_str(),
                 m.lay.format.c_str(), opt.window, m.stats.pinned_bandwidth / 1e9,
                 opt.skip_copies    ? "not read (timing mode)"
                 : m.lay.in_place && m.lay.pageable ? "read in place as pageable memory (not registered: --gpu-pin-host-experts off)"
                 : m.lay.in_place && m.lay.registered ? "in node memory registered at load (copy residence), blocks copied as stored"
                 : m.lay.in_place   ? (m.lay.quantized ? "pinned in place, blocks copied as stored" : "pinned in place (no copy)")
                 : !m.lay.pins.empty()
                     ? ("pinned in place where the GPU takes the stored blocks, the rest in pinned images (" + format_bytes(m.lay.image_bytes) +
                        " more host memory: " + m.lay.why_image + ")").c_str()
                     : ("copied to pinned memory (" + format_bytes(m.lay.image_bytes) + " more host memory: " + m.lay.why_image + ")").c_str());
  }
}

ExpertStream::~ExpertStream() {
  if (impl_) {
    try {
      impl_->copy.synchronize();
    } catch (...) {
    }
  }
}

const ExpertStreamOptions& ExpertStream::options() const { return impl_->opt; }
bool ExpertStream::wants(int64_t tokens) const {
  // Chunks run the grouped product only, which takes passes of more than 64 tokens.
  return impl_->opt.min_batch > 0 && tokens >= impl_->opt.min_batch && (impl_->nch == 1 || tokens > 64);
}
int64_t ExpertStream::chunk_experts() const { return impl_->nch > 1 ? impl_->C : impl_->E; }
bool ExpertStream::streams(int64_t layer) const { return impl_->index.count(layer) != 0; }
const ExpertStreamStats& ExpertStream::stats() const { return impl_->stats; }
bool ExpertStream::host_registered() const { return impl_->lay.registered; }
bool ExpertStream::host_pageable() const { return impl_->lay.in_place && impl_->lay.pageable; }
uint64_t ExpertStream::pinned_copy_bytes() const { return impl_->lay.image_bytes; }
bool ExpertStream::quantized() const { return impl_->lay.quantized; }
const std::string& ExpertStream::format() const { return impl_->lay.format; }
void ExpertStream::reset_stats() {
  Impl& m = *impl_;
  const double bw = m.stats.pinned_bandwidth;
  std::vector<StreamLayerStats> ls = m.stats.layers;
  for (auto& l : ls) l = StreamLayerStats{l.layer};
  m.stats = ExpertStreamStats{};
  m.stats.pinned_bandwidth = bw;
  m.stats.layers = std::move(ls);
}
uint64_t ExpertStream::device_bytes() const {
  const Impl& m = *impl_;
  uint64_t b = static_cast<uint64_t>(m.S) * m.slot_size;
  for (const gpu::DeviceBuffer* d : {&m.route_off, &m.pair_list}) b += d->bytes();
  if (&m.sc == &m.own)  // a shared scratch is the stack's (its workspace)
    for (const gpu::DeviceBuffer* d : {&m.own.gemm.xs, &m.own.gemm.gu, &m.own.gemm.act, &m.own.gemm.ys, &m.own.gemm.inv, &m.own.deq_gu, &m.own.deq_dn})
      b += d->bytes();
  return b;
}

void ExpertStream::begin(int64_t tokens) {
  Impl& m = *impl_;
  const ExpertStreamOptions& o = m.opt;
  m.copy.synchronize();  // a pass that threw may have left copies in flight
  m.n = tokens;
  const int64_t P = tokens * m.K, E = m.E;
  const double covered = 1.0 - std::pow(std::max(0.0, 1.0 - static_cast<double>(m.K) / static_cast<double>(E)), static_cast<double>(tokens));
  m.fill_all = o.fill == ExpertStreamOptions::Fill::all || (o.fill == ExpertStreamOptions::Fill::automatic && covered >= 0.5);
  m.use_gemm = o.compute == ExpertStreamOptions::Compute::gemm || (o.compute == ExpertStreamOptions::Compute::automatic && P >= 16 * E);
  auto fit = [](gpu::DeviceBuffer& b, int64_t bytes) { b.reserve(static_cast<size_t>(std::max<int64_t>(bytes, 16))); };
  fit(m.route_off, (E + 1) * 4);
  fit(m.pair_list, P * 4);
  fit(m.sc.gemm.act, P * m.I * 2 * (o.split_act ? 2 : 1));
  fit(m.sc.gemm.ys, P * m.H * 4);
  if (m.nch > 1) m.fill_all = true;  // chunks: every expert of the chunk
  m.copied.assign(static_cast<size_t>(m.units()), 0);
  m.pass_bytes.assign(static_cast<size_t>(m.units()), 0);
  m.next = 0;
  m.in_pass = true;
  if (!o.serial && !o.skip_copies && m.fill_all)
    for (int64_t j = 0; j < std::min(m.S, m.units()); ++j) m.enqueue_copy(j, m.unit_ops(j), nullptr);
}

void ExpertStream::layer(int64_t layer, const gpu::bf16_t* x, int64_t n, const int32_t* ids, const float* weights, float* out) {
  Impl& m = *impl_;
  const ExpertStreamOptions& o = m.opt;
  auto it = m.index.find(layer);
  if (!m.in_pass || it == m.index.end() || it->second != m.next || n != m.n)
    fail(ErrorKind::internal, "expert stream: layer " + std::to_string(layer) + " out of order or outside begin()/end()");
  const int64_t j = m.next++, N = static_cast<int64_t>(m.lay.layers.size()), E = m.E, K = m.K, H = m.H, I = m.I, P = n * K;
  const size_t ju = static_cast<size_t>(j);
  gpu::Stream& s = m.step;
  gpu::moe_route(ids, P, E, m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(), s);
  if (m.nch > 1) {  // chunks of experts through the ring: units j * nch + c
    const StreamLayerLayout& L = m.lay.layers[ju];
    MoeGemmScratch& g = m.sc.gemm;
    g.gu.reserve(static_cast<size_t>(P * 2 * I) * 4);
    g.act.reserve(static_cast<size_t>(P * I) * 2);
    g.ys.reserve(static_cast<size_t>(P * H) * 4);
    g.inv.reserve(static_cast<size_t>(P) * 4);
    const int32_t* pl = m.pair_list.as<int32_t>();
    for (int64_t ch = 0; ch < m.nch; ++ch) {
      const int64_t u = j * m.nch + ch, e0 = ch * m.C, ce = std::min(m.C, E - e0);
      const auto uu = static_cast<size_t>(u);
      m.w0[uu].record(s);
      if (!o.skip_copies) s.wait(m.c1[uu]);
      m.k0[uu].record(s);
      char* slot = m.slots[static_cast<size_t>(u % m.S)].as<char>();
      const gpu::GgufWeight wgu{L.ngu.type, slot, ce * 2 * I, H}, wdn{L.ndn.type, slot + m.chunk_dn_off, ce * H, I};
      const int32_t* off = m.route_off.as<int32_t>() + e0;  // the chunk's experts' ranges of the sorted pairs (absolute positions)
      gpu::gguf_moe_gemm(x, pl, K, P, off, ce, wgu, 2 * I, g.gu.as<float>(), s);
      gpu::silu_mul(g.gu.as<float>(), P, I, g.act.as<uint16_t>(), nullptr, s);  // rows of other chunks are computed too, never read
      gpu::gguf_moe_gemm(g.act.as<uint16_t>(), nullptr, 1, P, off, ce, wdn, H, g.ys.as<float>(), s);
      m.k1[uu].record(s);
      if (!o.skip_copies && u + m.S < m.units()) m.enqueue_copy(u + m.S, m.unit_ops(u + m.S), &m.k1[uu]);
    }
    gpu::moe_combine_sorted(g.ys.as<float>(), pl, weights, n, K, H, g.inv.as<int32_t>(), out, s);
    return;
  }
  const bool routed = !o.serial && !o.skip_copies && !m.fill_all;
  const int32_t* offs = m.offs_h.as<int32_t>();
  const StreamLayerLayout& L = m.lay.layers[ju];
  // GGUF blocks of passes over 64 tokens: the grouped tensor-core product on the slot (device offsets, no host sync).
  const bool grouped = L.native && o.compute != ExpertStreamOptions::Compute::kernel && n > 64 &&
                       gpu::gguf_moe_gemm_supported(L.ngu, 2 * I) && gpu::gguf_moe_gemm_supported(L.ndn, H);
  if ((m.use_gemm && !grouped) || routed) {
    gpu::copy_to_host(m.offs_h.as<int32_t>(), m.route_off.as<int32_t>(), static_cast<size_t>(E + 1) * 4, s);
    m.offs_ev.record(s);
    m.offs_ev.synchronize();
  }
  if (o.serial && !o.skip_copies) {
    m.w0[ju].record(s);
    m.copy.wait(m.w0[ju]);
    m.enqueue_copy(j, m.lay.layers[ju].all, nullptr);
  } else if (routed) {
    std::vector<StreamCopy> ops;
    for (int64_t e = 0; e < E; ++e)
      if (offs[e + 1] > offs[e]) ops.insert(ops.end(), m.lay.layers[ju].by_expert[static_cast<size_t>(e)].begin(), m.lay.layers[ju].by_expert[static_cast<size_t>(e)].end());
    coalesce_copies(ops);
    m.enqueue_copy(j, ops, j >= m.S ? &m.k1[static_cast<size_t>(j - m.S)] : nullptr);
  }
  if (!o.serial || o.skip_copies) m.w0[ju].record(s);
  if (!o.skip_copies) s.wait(m.c1[ju]);
  m.k0[ju].record(s);
  if (L.native) {
    const gpu::GgufWeight ngu = L.at(L.ngu, m.slot(j)), ndn = L.at(L.ndn, m.slot(j));
    MoeGemmScratch& g = m.sc.gemm;
    if (grouped) {
      g.gu.reserve(static_cast<size_t>(P * 2 * I) * 4);
      g.act.reserve(static_cast<size_t>(P * I) * 2);
      g.ys.reserve(static_cast<size_t>(P * H) * 4);
      g.inv.reserve(static_cast<size_t>(P) * 4);
      const int32_t* pl = m.pair_list.as<int32_t>();
      gpu::gguf_moe_gemm(x, pl, K, P, m.route_off.as<int32_t>(), E, ngu, 2 * I, g.gu.as<float>(), s);
      gpu::silu_mul(g.gu.as<float>(), P, I, g.act.as<uint16_t>(), nullptr, s);
      gpu::gguf_moe_gemm(g.act.as<uint16_t>(), nullptr, 1, P, m.route_off.as<int32_t>(), E, ndn, H, g.ys.as<float>(), s);
      gpu::moe_combine_sorted(g.ys.as<float>(), pl, weights, n, K, H, g.inv.as<int32_t>(), out, s);
    } else if (m.use_gemm) {
      moe_experts_gemm_dequant(m.blas, x, n, H, I, E, K, offs, m.pair_list.as<int32_t>(), weights,
                               [&](bool down, int64_t r0, int64_t rows, uint16_t* dst) { gpu::gguf_dequant(down ? ndn : ngu, r0, rows, dst, s); },
                               m.sc.deq_gu, m.sc.deq_dn, m.sc.gemm, out, s);
    } else {
      g.gu.reserve(static_cast<size_t>(P * 2 * I) * 4);
      gpu::gguf_moe_experts(x, n, K, ids, weights, ngu, ndn, I, g.gu.as<float>(), out, s);
    }
    m.k1[ju].record(s);
    if (!o.serial && !o.skip_copies && m.fill_all && j + m.S < N) m.enqueue_copy(j + m.S, m.lay.layers[static_cast<size_t>(j + m.S)].all, &m.k1[ju]);
    return;
  }
  if (m.lay.quantized) {
    const gpu::QWeight qgu = L.at(L.gu, m.slot(j)), qdn = L.at(L.dn, m.slot(j));
    if (m.use_gemm)
      moe_experts_gemm_dequant(m.blas, x, n, H, I, E, K, offs, m.pair_list.as<int32_t>(), weights,
                               [&](bool down, int64_t r0, int64_t rows, uint16_t* dst) { gpu::quant_dequant(down ? qdn : qgu, r0, rows, dst, s); },
                               m.sc.deq_gu, m.sc.deq_dn, m.sc.gemm, out, s);
    else
      gpu::quant_moe_experts(x, n, H, I, E, K, weights, m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(), qgu, qdn, m.sc.gemm.act.as<gpu::bf16_t>(),
                             m.sc.gemm.ys.as<float>(), out, s);
    m.k1[ju].record(s);
    if (!o.serial && !o.skip_copies && m.fill_all && j + m.S < N) m.enqueue_copy(j + m.S, m.lay.layers[static_cast<size_t>(j + m.S)].all, &m.k1[ju]);
    return;
  }
  gpu::bf16_t *wgu = m.slot_gu(j), *wdn = m.slot_dn(j);
  if (m.use_gemm) {
    moe_experts_gemm(m.blas, x, n, H, I, E, K, offs, m.pair_list.as<int32_t>(), weights,
                     [&](int64_t e, bool down) -> const gpu::bf16_t* { return down ? wdn + e * H * I : wgu + e * 2 * I * H; }, m.sc.gemm, out, s);
  } else {
    gpu::bf16_t* act = m.sc.gemm.act.as<gpu::bf16_t>();
    gpu::moe_experts(x, n, H, I, E, K, ids, weights, m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(), wgu, wdn, act, m.sc.gemm.ys.as<float>(), out, s,
                     o.split_act ? act + n * K * I : nullptr);
  }
  m.k1[ju].record(s);
  if (!o.serial && !o.skip_copies && m.fill_all && j + m.S < N) m.enqueue_copy(j + m.S, m.lay.layers[static_cast<size_t>(j + m.S)].all, &m.k1[ju]);
}

void ExpertStream::end() {
  Impl& m = *impl_;
  if (!m.in_pass) return;
  m.in_pass = false;
  const int64_t N = static_cast<int64_t>(m.lay.layers.size());
  if (m.next != N) fail(ErrorKind::internal, "expert stream: a pass ended after " + std::to_string(m.next) + " of " + std::to_string(N) + " layers");
  m.copy.synchronize();
  for (int64_t j = 0; j < m.units(); ++j) {
    const size_t ju = static_cast<size_t>(j);
    StreamLayerStats& st = m.stats.layers[static_cast<size_t>(j / m.nch)];
    const double compute = m.k1[ju].elapsed_ms(m.k0[ju]) * 1e-3;
    double copy_s = 0, stall = 0;
    if (m.copied[ju]) {
      copy_s = m.c1[ju].elapsed_ms(m.c0[ju]) * 1e-3;
      stall = std::max(0.0, static_cast<double>(m.k0[ju].elapsed_ms(m.w0[ju])) * 1e-3);
    }
    st.bytes += m.pass_bytes[ju];
    st.copy_s += copy_s;
    st.compute_s += compute;
    st.stall_s += stall;
    m.stats.bytes += m.pass_bytes[ju];
    m.stats.copy_s += copy_s;
    m.stats.compute_s += compute;
    m.stats.stall_s += stall;
  }
  m.stats.passes += 1;
}

}  // namespace hmoe
