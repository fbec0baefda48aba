// Model loading (see model.h): the checkpoint, the placement plan, and the
// one runtime the plan names.
#include "engine/loading/model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>

#include "configs/error.h"
#include "engine/layers/engram.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/gpu_experts.h"
#include "engine/layers/host_residence.h"
#include "engine/layers/routing_trace.h"
#include "engine/layers/weights.h"
#include "engine/loading/gguf_model.h"
#include "engine/loading/progress.h"
#include "engine/loading/quant_config.h"
#include "engine/models/model_graph.h"
#include "engine/placement/auto_fit.h"
#include "engine/placement/placement.h"
#include "engine/placement/prefill_cost.h"
#include "engine/runtime/cpu_runtime.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/device.h"
#include "gpu/memory_cap.h"
#include "numa/quant_gguf_amx.h"

namespace hmoe {

namespace {

bool quiet_load(const Settings& s) { return s.progress == "none"; }

// A /proc/self/status field in kB (VmRSS: resident set, VmHWM: its peak), in bytes; 0 when unknown.
uint64_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return std::stoull(line.substr(n)) * 1024;
  return 0;
}

// The placement plan's answer for this model: nullopt for the CPU path,
// else the per-layer residency of the GPU path (checked to fit before
// anything is allocated). Prints one line each saying so on stderr unless
// progress is "none".
std::optional<Plan> plan_gpu(const ModelConfig& c, const Settings& s, numa::ThreadPool& pool) {
  const bool quiet = s.progress == "none";
  for (const auto& n : s.notices)
    if (n.find("GPU_RESIDENT") != std::string::npos) std::fprintf(stderr, "%s\n", n.c_str());
  std::string why;
  if (!resolve_device(s, why)) {
    if (!quiet) std::fprintf(stderr, "hmoe: %s\n", why.c_str());
    return std::nullopt;
  }
  const gpu::DeviceInfo info = gpu::device_info(0);
  const GpuTarget target{info.name, info.total_bytes, 0, false};
  // auto: the automatic fit (engine/placement/auto_fit.h) on measured bandwidths, unless every layer fits anyway.
  Settings sp = s;
  uint64_t fit_cache_bytes = 0, fit_stream_bytes = 0;
  int64_t fit_kv_blocks = 0;
  if (parse_layer_spec(s.origin("gpu_resident_moe_layers"), s.gpu_resident_moe_layers, c.num_hidden_layers).mode == LayerSpec::Mode::automatic) {
    Settings all = s;
    all.gpu_resident_moe_layers = "all";
    bool fits_all = true;
    try {
      make_plan(c, all, target);
    } catch (const Error&) {
      fits_all = false;
    }
    if (!fits_all) {
      FitInputs in;
      in.gpu_bandwidth = measure_device_copy_bandwidth();
      in.pcie_bandwidth = measure_pinned_h2d_bandwidth(64u << 20);
      in.cpu_bandwidth = measure_host_read_bandwidth(&pool);
      in.stream_slots = parse_prefill_min_batch(s) != 0;
      in.window = parse_prefetch_window(s);
      in.server_kv = true;  // reserve the KV blocks the server will allocate (default_kv_blocks), then hand them to it
      std::optional<RoutingTrace> trace;  // --fit-routing-trace: hit rates simulated on it instead of uniform routing
      if (!s.fit_routing_trace.empty()) {
        trace = read_routing_trace(s.fit_routing_trace);
        in.trace = &*trace;
      }
      const FitChoice fit = auto_fit(c, s, target, in);
      sp.gpu_resident_moe_layers = first_moe_layers(c, fit.chosen().resident);
      fit_cache_bytes = fit.chosen().cache_bytes;
      fit_kv_blocks = fit.chosen().kv_blocks;
      fit_stream_bytes = fit.chosen().slot_bytes;
      if (!quiet)
        std::fprintf(stderr, "hmoe: --gpu-resident-moe-layers auto -> %s (decode bound %.1f tok/s at batch 1; GPU %.0f GB/s, host %.1f GB/s, PCIe %.1f GB/s "
                             "measured; expert cache room %s, hit rate %.1f%% from %s; `hmoe plan` prints the options)\n",
                     sp.gpu_resident_moe_layers.c_str(), fit.chosen().tok_s, in.gpu_bandwidth / 1e9, in.cpu_bandwidth / 1e9, in.pcie_bandwidth / 1e9,
                     format_bytes(fit.chosen().cache_bytes).c_str(), 100.0 * fit.chosen().hit_rate,
                     trace ? ("the routing trace " + s.fit_routing_trace).c_str() : "uniform routing");
    }
  }
  Plan plan = make_plan(c, sp, target);  // throws out_of_memory before any allocation
  plan.spec = s.gpu_resident_moe_layers;
  plan.expert_cache_bytes = fit_cache_bytes;
  plan.fit_kv_blocks = fit_kv_blocks;
  plan.fit_stream_bytes = fit_stream_bytes;
  // --gpu-memory / --gpu-memory-utilization: every GPU allocation from here on counts against the budget
  // (without either, no cap: a cap left by an earlier load in the process is lifted).
  if (gpu_memory_capped(s)) gpu::memory_ledger().set_cap(plan.gpu_budget, gpu_memory_budget_origin(s, target));
  else gpu::memory_ledger().set_cap(0, "");
  if (!quiet)
    std::fprintf(stderr, "hmoe: %s; %lld of %lld MoE layers resident (%s of experts on the GPU, %s on the CPU)\n", why.c_str(),
                 static_cast<long long>(plan.resident_moe_layers()), static_cast<long long>(plan.moe_layers()),
                 format_bytes(plan.gpu_expert_bytes).c_str(), format_bytes(plan.cpu_expert_bytes).c_str());
  return plan;
}

// Speculative decoding: the MTP head runs, with one more KV layer, and its weights count as used.
void enable_mtp(ModelGraph& g, const Settings& s, const std::string& dir) {
  const int64_t n = s.speculative_tokens;
  if (n == 0) return;
  if (n < 0 || n > 3) fail(ErrorKind::invalid_argument, "--speculative-tokens must be 0..3, got " + std::to_string(n));
  if (!g.mtp)
    fail(ErrorKind::invalid_argument, "--speculative-tokens " + std::to_string(n) + ": " + dir +
                                          " has no multi-token-prediction head (mtp.* weights) to draft with; use --speculative-tokens 0");
  g.mtp->block.kv_layer = g.kv.layers++;
  std::erase(g.unused_prefixes, std::string("mtp."));
}

}  // namespace

Model::~Model() = default;

int64_t Model::weight_bytes() const {
  return static_cast<int64_t>(store_ ? store_->total_bytes() : source_->total_bytes());
}

uint64_t Model::host_weight_bytes() const { return binder_->host_bytes(); }

std::unique_ptr<Model> Model::load(const std::string& dir, const Settings& settings) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> m(new Model());
  m->report_.rss_before = status_bytes("VmRSS:");
  m->report_.peak_rss_before = status_bytes("VmHWM:");
  m->dir_ = dir;
  // MODEL is a Hugging Face directory or a .gguf file (engine/loading/gguf_model.h).
  if (is_gguf_path(dir)) m->source_ = open_gguf_source(dir, m->config_);
  else m->config_ = ModelConfig::from_dir(dir);
  const ModelConfig& c = m->config_;
  if (!m->source_) {
    m->store_ = std::make_unique<io::TensorStore>(dir);
    m->source_ = open_hf_quant_source(dir, *m->store_);  // null unless config.json has a quantization_config
    if (m->source_) set_expert_bytes_from(m->config_, *m->source_);
  }
  m->binder_ = std::make_unique<WeightBinder>(m->store_.get(), m->source_.get());
  WeightBinder& bind = *m->binder_;
  bind.set_dtype(parse_weight_dtype(settings.weight_dtype));
  ModelGraph graph = model_graph(c, [&bind](const std::string& name) { return bind.has(name); });
  enable_mtp(graph, settings, dir);
  m->spec_tokens_ = settings.speculative_tokens;

  // probe (and self-check) AMX before the weights take memory; the 8-bit GGUF
  // path's tile kernels use AMX-INT8 where it is granted
  if (settings.cpu_amx_min_tokens > 0 || settings.cpu_gguf_int8) cpu::amx_mode();
  m->pools_ = std::make_unique<numa::NodePools>(numa::PoolOptions::from_settings(settings));
  m->pool_ = &m->pools_->pool(0);
  if (graph.engram) m->engram_ = EngramModules::load(bind, c, dir, settings, *m->pool_);
  m->kv_layout_ = graph.kv;
  if (m->engram_) m->kv_layout_.seq_state_bytes = m->engram_->seq_state_bytes();
  m->kv_layout_.dtype = resolve_kv_dtype(settings.kv_cache_dtype, is_gguf_path(dir), graph.kv.k_token_floats >= 0);  // latent (MLA) caches: own widths, fp32

  if (!settings.routing_trace.empty()) {
    RoutingTraceHeader th{static_cast<uint32_t>(c.num_hidden_layers), static_cast<uint32_t>(c.num_experts),
                          static_cast<uint32_t>(c.num_experts_per_tok), static_cast<uint32_t>(c.hidden_size),
                          static_cast<uint32_t>(c.moe_intermediate_size)};
    m->trace_ = std::make_unique<RoutingTraceWriter>(settings.routing_trace, th);
  }
  const std::optional<Plan> plan = plan_gpu(c, settings, *m->pool_);
  if (plan && settings.speculative_tokens > 0)
    fail(ErrorKind::unsupported, "--speculative-tokens " + std::to_string(settings.speculative_tokens) +
                                     ": speculative decoding runs on the CPU runtime only for now (use --device cpu, or --speculative-tokens 0)");
  if (plan) {
    GpuRuntimeOptions o = GpuRuntimeOptions::from_settings(settings);
    o.experts.trace = m->trace_.get();
    o.resident = plan->resident();
    o.devices = plan->devices();
    m->fit_kv_blocks_ = plan->fit_kv_blocks;
    // auto cache size under the fit: the room it left after weights, KV and streaming slots.
    if (plan->expert_cache_bytes > 0 && o.expert_cache.budget_bytes < 0) o.expert_cache.budget_bytes = static_cast<int64_t>(plan->expert_cache_bytes);
    // Where the host experts live for the GPU's DMA: one registered copy in node memory when it fits (engine/layers/host_residence.h).
    const bool host_layers = plan->resident_moe_layers() < plan->moe_layers();
    const bool gpu_reads = host_layers && (parse_prefill_min_batch(settings) != 0 || o.expert_cache.budget_bytes != 0);
    const auto kv_host = static_cast<uint64_t>(std::max(0.0, settings.kv_offloading_size) * 1073741824.0);  // the pinned KV host pool
    const HostResidenceChoice residence =
        choose_host_residence(host_residence_of(settings), gpu_reads, plan->cpu_expert_bytes, kv_host, mem_available_bytes());
    o.experts.residence = residence.chosen;
    o.expert_cache.pin_in_place = residence.chosen != HostResidence::off;
    // The cache's default (auto) ran on a GPU only under the copy residence; under off / map (asked for, or copy
    // falling back for want of memory) it stays off unless a size is given (its first run, under map, hung).
    if (o.expert_cache.budget_bytes < 0 && residence.chosen != HostResidence::copy && settings.origin("gpu_expert_cache") == "default") {
      o.expert_cache.budget_bytes = 0;
      if (!quiet_load(settings))
        std::fprintf(stderr, "hmoe: GPU expert cache off: host experts are not in the copy residence (--gpu-pin-host-experts %s); --gpu-expert-cache auto or BYTES turns it on\n",
                     host_residence_name(residence.chosen));
    }
    m->report_.host_residence = host_residence_name(residence.chosen);
    m->report_.host_residence_why = residence.why;
    if (!quiet_load(settings)) std::fprintf(stderr, "hmoe: %s\n", residence.describe().c_str());
    m->gpu_ = std::make_unique<GpuRuntime>(c, graph, bind, *m->pools_, o, m->engram_.get());
    if (residence.chosen == HostResidence::copy) {
      const HostResidenceStats& st = m->gpu_->host_residence_stats();
      m->report_.residence_copied_bytes = st.copied_bytes;
      m->report_.residence_registered_bytes = st.registered_bytes;
      m->report_.residence_dropped_bytes = st.dropped_bytes;
      m->report_.residence_copy_s = st.copy_s;
      m->report_.residence_register_s = st.register_s;
      if (!quiet_load(settings)) std::fprintf(stderr, "hmoe: %s\n", st.describe().c_str());
    }
    // Linear-attention states live on the GPU: the host keeps only their token counts.
    if (m->gpu_->seq_state_bytes() > 0) m->kv_layout_.seq_state_bytes = m->gpu_->seq_state_bytes();
    m->kv_layout_.state_align = 0;  // the GPU layers take no state checkpoints: no prefix caching for hybrid models there
    // Long prompts stream the host experts to the GPU (bf16, or quantized checkpoints in their GPU format).
    if (plan->resident_moe_layers() < plan->moe_layers()) {
      ExpertStreamOptions so = expert_stream_options(c, settings, *m->pools_, m->gpu_->host_expert_sample(), settings.progress == "none");
      so.reserved_bytes = plan->fit_stream_bytes;
      so.pin_in_place = m->report_.host_residence != "off";  // the load's residence (a copy that did not fit reads pageable memory)
      m->gpu_->enable_expert_streaming(so);
    }
  } else {
    m->report_.host_residence_why = "a CPU run: the GPU reads no host experts, nothing copied or registered (the expert engine keeps its views, or its node copies on several NUMA nodes)";
    CpuRuntimeOptions o = CpuRuntimeOptions::from_settings(settings);
    o.experts.trace = m->trace_.get();
    m->cpu_ = std::make_unique<CpuRuntime>(c, graph, bind, *m->pools_, o, m->engram_.get());
  }
  for (const std::string& p : graph.unused_prefixes) bind.skip_prefix(p);
  bind.check_all_used(dir);

  if (!m->store_) {  // GGUF: the source reads its own map
    m->source_->touch("loading " + dir, settings.progress);
  } else {
    // Read every weight the host uses once so that the first request does
    // not pay for page faults, with a progress display. Not: what went to
    // the GPU (released), the PLE tables (served from their own file).
    std::set<std::string> untouched;
    if (m->engram_)
      for (const auto& name : m->engram_->table_tensor_names()) untouched.insert(name);
    uint64_t touch_bytes = 0;
    for (const auto& [name, t] : m->store_->all())
      if (!untouched.count(name) && !bind.released(t->data)) touch_bytes += t->nbytes;
    Progress progress("loading " + dir, touch_bytes, settings.progress);
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : m->store_->all()) {
      if (untouched.count(name) || bind.released(t->data)) continue;
      uint8_t acc = 0;
      for (size_t off = 0; off < t->nbytes; off += 4096) acc ^= t->data[off];
      sink = sink ^ acc;
      progress.add(t->nbytes);
    }
    progress.finish();
  }
  LoadReport& r = m->report_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rss_after = status_bytes("VmRSS:");
  r.peak_rss_after = status_bytes("VmHWM:");
  r.gpu_weight_bytes = m->gpu_ ? m->gpu_->weight_bytes() : 0;
  r.host_weight_bytes = bind.host_bytes();
  r.weight_dtype = settings.weight_dtype;
  if (settings.progress != "none")
    std::fprintf(stderr,
                 "hmoe: loaded in %.1f s on the %s; weights: %s on the GPU, %s in host memory (dtype %s); "
                 "host RSS %s before loading (peak %s), %s after (peak %s); host experts for GPU DMA: %s%s\n",
                 r.seconds, m->gpu_ ? "GPU" : "CPU", format_bytes(r.gpu_weight_bytes).c_str(), format_bytes(r.host_weight_bytes).c_str(),
                 r.weight_dtype.c_str(), format_bytes(r.rss_before).c_str(), format_bytes(r.peak_rss_before).c_str(),
                 format_bytes(r.rss_after).c_str(), format_bytes(r.peak_rss_after).c_str(), m->gpu_ ? r.host_residence.c_str() : "none (a CPU run)",
                 r.host_residence == "copy" ? (" (" + format_bytes(r.residence_copied_bytes) + " copied in " + std::to_string(r.residence_copy_s).substr(0, 5) +
                                               " s, registered in " + std::to_string(r.residence_register_s).substr(0, 5) + " s)").c_str()
                                            : "");
  return m;
}

const std::vector<float>& Model::hidden() const {
  if (!cpu_ || !cpu_->has_mtp()) fail(ErrorKind::internal, "Model::hidden() without speculative decoding");
  return cpu_->hidden();
}

void Model::forward_mtp(const Batch& b, const float* hidden, KvCache& kv, std::vector<float>& logits, std::vector<float>& hidden_out) {
  if (!cpu_ || !cpu_->has_mtp()) fail(ErrorKind::internal, "Model::forward_mtp() without speculative decoding");
  check_batch(b, kv);
  if (b.tokens.empty()) {
    logits.clear();
    hidden_out.clear();
    return;
  }
  cpu_->forward_mtp(b, hidden, kv, logits, hidden_out);
}

void Model::check_batch(const Batch& b, KvCache& kv) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(b.tokens.size());
  if (b.slots.size() != b.tokens.size()) fail(ErrorKind::internal, "batch tokens and slots differ in length");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = b.tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= c.vocab_size)
      fail(ErrorKind::invalid_argument, "token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) + ")");
    const auto& s = b.slots[static_cast<size_t>(i)];
    if (s.pos < 0 || s.pos >= kv.capacity(s.seq))
      fail(ErrorKind::internal, "position " + std::to_string(s.pos) + " has no KV slot reserved");
  }
  for (auto r : b.logit_rows)
    if (r < 0 || r >= n) fail(ErrorKind::internal, "logit row outside the batch");
}

void Model::forward(const Batch& b, KvCache& kv, std::vector<float>& logits) {
  check_batch(b, kv);
  if (b.tokens.empty()) {
    logits.clear();
    return;
  }
  if (trace_) trace_->begin_step();
  if (gpu_) gpu_->forward(b, kv, logits);
  else cpu_->forward(b, kv, logits);
  if (trace_) trace_->flush();
}

}  // namespace hmoe
