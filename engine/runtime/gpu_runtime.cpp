// The GPU step executor (see gpu_runtime.h). Host code only: the layers'
// device work is in engine/layers/*_gpu.cpp, kernels in gpu/*.cu.
#include "engine/runtime/gpu_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "configs/error.h"
#include "engine/layers/routing_trace.h"
#include "engine/kv/kv_storage_gpu.h"
#include "engine/layers/engram.h"
#include "engine/layers/engram_gpu.h"
#include "engine/layers/expert_deferral.h"
#include "engine/layers/gpu_experts.h"
#include "engine/layers/gpu_factories.h"
#include "engine/layers/hybrid_gpu.h"
#include "engine/placement/placement.h"
#include "engine/runtime/segment_graphs.h"
#include "engine/runtime/zero_copy_handoff.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/memory_cap.h"

namespace hmoe {

using gpu::bf16_t;

GpuRuntimeOptions GpuRuntimeOptions::from_settings(const Settings& s) {
  GpuRuntimeOptions o;
  o.experts.engine = numa::EngineOptions::from_settings(s);
  o.experts.keep_quantized = s.gpu_quantized_experts;
  o.mla_mode = parse_mla_mode(s.mla_attention);
  o.split_inputs = s.gpu_mla_split_inputs;
  o.hybrid_precise = s.gpu_hybrid_precise;
  o.hybrid_precise_act = s.gpu_hybrid_precise_act;
  o.cuda_graphs = s.cuda_graphs;
  o.cpu_overlap = s.gpu_cpu_overlap;
  std::string handoff = s.gpu_handoff;
  std::transform(handoff.begin(), handoff.end(), handoff.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (handoff == "zero-copy") o.zero_copy_handoff = true;
  else if (handoff != "copy") fail(ErrorKind::invalid_argument, "--gpu-handoff / HMOE_GPU_HANDOFF must be copy or zero-copy, got '" + s.gpu_handoff + "'");
  o.handoff_timeout_s = s.gpu_handoff_timeout;
  o.tiled_attention = s.gpu_tiled_attention;
  o.quantized_dense = s.gpu_quantized_dense;
  o.programmatic_launch = s.gpu_programmatic_launch;
  o.decode_fusion = s.gpu_decode_fusion;
  if (s.gpu_gguf_decode_kernel == "dense") o.gguf_decode_kernel = gpu::GgufDecodeKernel::dense;
  else if (s.gpu_gguf_decode_kernel == "direct") o.gguf_decode_kernel = gpu::GgufDecodeKernel::direct;
  else if (s.gpu_gguf_decode_kernel == "staged") o.gguf_decode_kernel = gpu::GgufDecodeKernel::staged;
  else fail(ErrorKind::invalid_argument, "--gpu-gguf-decode-kernel / HMOE_GPU_GGUF_DECODE_KERNEL must be dense, direct or staged, got '" + s.gpu_gguf_decode_kernel + "'");
  if (s.gpu_gguf_prefill_kernel == "simple") o.gguf_prefill_kernel = gpu::GgufPrefillKernel::simple;
  else if (s.gpu_gguf_prefill_kernel == "pipelined") o.gguf_prefill_kernel = gpu::GgufPrefillKernel::pipelined;
  else if (s.gpu_gguf_prefill_kernel == "pipelined64") o.gguf_prefill_kernel = gpu::GgufPrefillKernel::pipelined64;
  else if (s.gpu_gguf_prefill_kernel == "pipelined128") o.gguf_prefill_kernel = gpu::GgufPrefillKernel::pipelined128;
  else
    fail(ErrorKind::invalid_argument, "--gpu-gguf-prefill-kernel / HMOE_GPU_GGUF_PREFILL_KERNEL must be simple, pipelined, pipelined64 or pipelined128, got '" +
                                          s.gpu_gguf_prefill_kernel + "'");
  if (s.gpu_deltanet_kernel == "v1") o.deltanet_kernel = gpu::DeltaNetKernel::v1;
  else if (s.gpu_deltanet_kernel == "v2") o.deltanet_kernel = gpu::DeltaNetKernel::v2;
  else if (s.gpu_deltanet_kernel == "v4") o.deltanet_kernel = gpu::DeltaNetKernel::v4;
  else if (s.gpu_deltanet_kernel == "v5") o.deltanet_kernel = gpu::DeltaNetKernel::v5;
  else if (s.gpu_deltanet_kernel == "v3")
    fail(ErrorKind::invalid_argument, "--gpu-deltanet-kernel / HMOE_GPU_DELTANET_KERNEL v3 was withdrawn: its first GPU run gave wrong outputs; use v4 (the default), v5, v2 or v1");
  else fail(ErrorKind::invalid_argument, "--gpu-deltanet-kernel / HMOE_GPU_DELTANET_KERNEL must be v1, v2, v4 or v5, got '" + s.gpu_deltanet_kernel + "'");
  o.attention_tiles_kernel = static_cast<int>(s.gpu_attention_tiles_kernel);
  o.defer_experts = s.defer_experts;
  o.expert_cache.budget_bytes = parse_gpu_expert_cache(s.gpu_expert_cache);
  o.expert_cache.cost.share = parse_gpu_split_decode(s.gpu_split_decode);
  o.expert_cache.policy = parse_cache_policy(s.origin("gpu_expert_cache_policy"), s.gpu_expert_cache_policy);
  o.expert_cache.quiet = s.progress == "none";
  // Model::load narrows this to the load's choice (choose_host_residence: a GPU that reads host experts, room in MemAvailable).
  o.experts.residence = host_residence_of(s);
  o.expert_cache.pin_in_place = o.experts.residence != HostResidence::off;
  return o;
}

struct GpuRuntime::Impl {
  struct Block {
    gpu::DeviceBuffer in_norm, post_norm;  // bf16, or fp32 when norm_f32
    std::unique_ptr<GpuAttention> attn;
    std::unique_ptr<GpuFfn> ffn;
  };
  const ModelConfig& c;
  KvLayout kv_layout;
  gpu::Stream stream;
  gpu::Blas blas{stream};
  gpu::DeviceBuffer embed, final_norm;
  GpuDense lm_head;
  std::vector<Block> blocks;
  bool split_act = false;  // ExpertHomeOptions::split_act, also for streamed experts
  bool norm_f32 = false;  // norm weights in fp32 (zero-centred under gpu_hybrid_precise): never fused into a layer's launch
  uint64_t weight_bytes = 0;
  uint64_t dense_bytes = 0;                 // GPU weights but the embedding table and the resident experts
  std::vector<uint64_t> expert_layer_bytes;  // per resident MoE layer: all its experts' bytes
  int64_t topk = 1;
  GpuScratch scratch;
  ExpertScratch expert_scratch;  // big passes of the resident layers, shared
  gpu::DeviceBuffer meta;
  gpu::PinnedBuffer meta_h, hf_h, ids_h, w_h, out_h, logits_h;
  std::vector<gpu::Event> events;  // 8 per layer: per micro-batch D2H start/end, H2D start/end
  bool part_profile = false;
  std::vector<gpu::Event> part_events;  // start, after the embedding, per layer after attention and after the FFN, after the tail
  GpuPartTimes part_times;
  GpuStepTimes times;
  static constexpr int64_t kGraphMaxTokens = 64;  // larger steps are launched plainly
  bool use_graphs = false, overlap = false, tiled_attention = true, decode_fusion = false, programmatic_launch = true;
  int64_t overlap_b_rows = 0;
  SegmentGraphs seg_graphs;
  bool zero_copy = false;                      // setting gpu_handoff
  ZeroCopyHandoff zc;                          // its buffers and flags
  std::function<bool(int64_t)> handoff_hook;   // tests (set_handoff_test_hook)
  std::string broken;                          // non-empty: a zero-copy step's GPU work did not drain; every forward() fails with this
  std::unique_ptr<ExpertStream> xstream;  // streamed host experts for big passes (null: off)
  std::unique_ptr<GpuEngram> engram;      // n-gram memory modules (null: none)
  std::unique_ptr<GpuExpertCache> xcache; // split decode / expert cache of the host layers (null: off)
  std::unique_ptr<RoutingReplay> replay;  // benchmarks: host layers' ids from a trace (null: the router's)
  numa::NodePools* pools = nullptr;       // the host experts' pools (builds the streaming images)
  std::unique_ptr<ExpertDeferral> deferral;  // null: off
  std::unique_ptr<DeltaNetStep> deltanet;  // linear-attention layers' sequence states (null: none)
  HostResidenceStats residence;            // what the host layers' copy residence took

  explicit Impl(const ModelConfig& cfg) : c(cfg) {}
};

namespace {

// The placement's device per layer, checked against the machine before the
// runtime allocates anything (Impl's stream is on GPU 0: the one device
// check_layer_devices admits today).
std::vector<int> checked_layer_devices(const ModelConfig& c, const GpuRuntimeOptions& o) {
  if (static_cast<int64_t>(o.resident.size()) != c.num_hidden_layers ||
      (!o.devices.empty() && static_cast<int64_t>(o.devices.size()) != c.num_hidden_layers))
    fail(ErrorKind::internal, "placement has the wrong number of layers");
  std::vector<int> d = o.devices.empty() ? std::vector<int>(static_cast<size_t>(c.num_hidden_layers), 0) : o.devices;
  check_layer_devices(d, gpu::device_count());
  return d;
}

}  // namespace

GpuRuntime::GpuRuntime(const ModelConfig& c, const ModelGraph& g, WeightBinder& bind, numa::NodePools& pools, const GpuRuntimeOptions& o,
                       EngramModules* engram)
    : devices_(checked_layer_devices(c, o)), impl_(std::make_unique<Impl>(c)) {
  Impl& m = *impl_;
  const int64_t H = c.hidden_size;
  m.kv_layout = g.kv;
  m.pools = &pools;
  m.use_graphs = o.cuda_graphs;
  m.overlap = o.cpu_overlap;
  m.overlap_b_rows = std::max<int64_t>(o.overlap_second_rows, 0);
  m.tiled_attention = o.tiled_attention;
  m.programmatic_launch = o.programmatic_launch;
  m.decode_fusion = o.decode_fusion;
  m.zero_copy = o.zero_copy_handoff;
  m.zc.set_timeout(o.handoff_timeout_s);
  gpu::set_gguf_decode_kernel(o.gguf_decode_kernel);
  gpu::set_gguf_prefill_kernel(o.gguf_prefill_kernel);
  gpu::set_deltanet_kernel(o.deltanet_kernel);
  gpu::set_attention_tiles_kernel(o.attention_tiles_kernel);
  gpu::MemoryUse use_weights("the weights (embedding, lm_head, norms)");
  GpuUploader up(bind, m.stream);
  up.set_keep_gguf(o.quantized_dense);
  m.embed = up.bf16({bind.mat(g.embed, c.vocab_size, H)});
  m.norm_f32 = g.zero_centred_norms && o.hybrid_precise;
  m.final_norm = upload_norm(up, bind.vec(g.final_norm, H), g.zero_centred_norms, m.norm_f32);
  m.lm_head = up.dense(bind.mat(g.lm_head, c.vocab_size, H));
  ExpertHomeOptions homes = o.experts;
  // Qwen3-Next under gpu_hybrid_precise: bf16 experts' decode-sized passes (resident and streamed) keep their activation as hi + lo.
  homes.split_act = o.hybrid_precise && o.hybrid_precise_act && std::any_of(g.blocks.begin(), g.blocks.end(), [](const BlockDesc& d) { return d.attention == AttentionKind::gated_deltanet; });
  m.split_act = homes.split_act;
  if (o.defer_experts > 0) m.deferral = std::make_unique<ExpertDeferral>(o.defer_experts, H, true);
  homes.deferral = m.deferral.get();
  homes.residence_stats = &m.residence;
  uint64_t expert_bytes = 0;
  int64_t state_layers = 0;
  for (const BlockDesc& d : g.blocks) {
    Impl::Block b;
    gpu::MemoryUse use_layer("layer " + std::to_string(d.layer) + "'s weights");
    b.in_norm = upload_norm(up, bind.vec(d.input_norm, H), g.zero_centred_norms, m.norm_f32);
    b.post_norm = upload_norm(up, bind.vec(d.post_norm, H), g.zero_centred_norms, m.norm_f32);
    const bool split = o.split_inputs && d.ffn.precise;
    const int64_t kv_layer = d.kv_layer >= 0 ? d.kv_layer : d.layer;
    if (d.attention == AttentionKind::gqa) b.attn = make_gqa_attention_gpu(up, c, kv_layer, d.attention_prefix);
    else if (d.attention == AttentionKind::gated_gqa) b.attn = make_gated_attention_gpu(up, c, kv_layer, d.attention_prefix, o.hybrid_precise);
    else if (d.attention == AttentionKind::gated_deltanet) {
      b.attn = make_gated_deltanet_gpu(up, c, d.state_index, d.attention_prefix, o.hybrid_precise);
      state_layers = std::max(state_layers, d.state_index + 1);
    } else b.attn = make_mla_attention_gpu(up, c, d.layer, d.attention_prefix, o.mla_mode, split);
    if (!d.ffn.moe) {
      b.ffn = make_dense_mlp_gpu(up, c, d.ffn.prefix, d.ffn.inter, split);
    } else {
      const auto home = o.resident[static_cast<size_t>(d.layer)] ? RoutedExperts::Home::gpu : RoutedExperts::Home::host;
      b.ffn = make_moe_gpu(up, c, d.layer, d.ffn.prefix, d.ffn.router, d.ffn.shared_inter, home, pools, homes, d.ffn.shared_gate,
                           d.ffn.shared_gate && o.hybrid_precise);
      m.topk = std::max(m.topk, b.ffn->topk());
      if (home == RoutedExperts::Home::gpu) expert_bytes += b.ffn->bytes();
    }
    m.blocks.push_back(std::move(b));
  }
  m.weight_bytes = up.bytes() + expert_bytes;
  if (state_layers > 0) m.deltanet = std::make_unique<DeltaNetStep>(state_layers * gpu::deltanet_layer_state_bytes(deltanet_shape(c.hybrid)));
  if (engram) {
    WeightLookup get = [&bind](const std::string& name, const std::vector<int64_t>& shape) {
      return shape.size() == 1 ? bind.vec(name, shape[0]) : bind.mat(name, shape[0], shape[1]);
    };
    m.engram = std::make_unique<GpuEngram>(c, *engram, get, m.stream);
    m.weight_bytes += m.engram->weight_bytes();
  }
  for (int64_t i = 0; i < 8 * c.num_hidden_layers; ++i) m.events.emplace_back();
  enable_expert_cache(o.expert_cache);
  m.dense_bytes = up.bytes() - m.embed.bytes();  // decode_weight_bytes
  for (const Impl::Block& b : m.blocks)
    if (const uint64_t x = b.ffn->routed_expert_bytes()) m.expert_layer_bytes.push_back(x);
}

std::unique_ptr<GpuRuntime> GpuRuntime::from_lookup(const ModelConfig& c, const WeightLookup& get, numa::NodePools& pools, const GpuRuntimeOptions& o,
                                                    EngramModules* engram) {
  WeightBinder bind(get);
  const ModelGraph g = model_graph(c, [&bind](const std::string& name) { return bind.has(name); });
  return std::make_unique<GpuRuntime>(c, g, bind, pools, o, engram);
}

GpuRuntime::~GpuRuntime() = default;
const GpuStepTimes& GpuRuntime::times() const { return impl_->times; }
void GpuRuntime::reset_times() { impl_->times = GpuStepTimes{}; }
void GpuRuntime::set_cuda_graphs(bool on) {
  impl_->use_graphs = on;
  impl_->seg_graphs.clear();
}
void GpuRuntime::set_tiled_attention(bool on) { impl_->tiled_attention = on; }
void GpuRuntime::set_zero_copy_handoff(bool on, double timeout_s) {
  impl_->zero_copy = on;
  impl_->zc.set_timeout(timeout_s);
}
void GpuRuntime::set_handoff_test_hook(std::function<bool(int64_t)> hook) { impl_->handoff_hook = std::move(hook); }
void GpuRuntime::set_cpu_overlap(bool on, int64_t second_rows) {
  impl_->overlap = on;
  impl_->overlap_b_rows = std::max<int64_t>(second_rows, 0);
}
size_t GpuRuntime::graph_captures() const { return impl_->seg_graphs.captures(); }
void GpuRuntime::set_part_profile(bool on) {
  Impl& m = *impl_;
  m.part_profile = on;
  if (!on) return;
  const size_t L = m.blocks.size();
  m.part_times = GpuPartTimes{};
  m.part_times.attn_ms.assign(L, 0.0);
  m.part_times.ffn_ms.assign(L, 0.0);
  while (m.part_events.size() < 2 * L + 3) m.part_events.emplace_back();
}
const GpuPartTimes& GpuRuntime::part_times() const { return impl_->part_times; }
size_t GpuRuntime::last_step_graphs() const { return impl_->seg_graphs.last_graphs(); }
std::vector<std::string> GpuRuntime::last_step_kernels() const { return impl_->seg_graphs.last_kernels(); }
double expected_experts_touched(int64_t e, int64_t k, int64_t tokens) {
  if (e <= 0 || k <= 0 || tokens <= 0) return 0;
  const double E = static_cast<double>(e), K = static_cast<double>(std::min(k, e));
  if (tokens == 1) return K;
  return E * (1.0 - std::pow(1.0 - K / E, static_cast<double>(tokens)));
}

double GpuRuntime::decode_weight_bytes(int64_t tokens) const {
  const Impl& m = *impl_;
  const ModelConfig& c = m.c;
  const double E = static_cast<double>(std::max<int64_t>(c.num_experts, 1));
  const double touched = expected_experts_touched(c.num_experts, c.num_experts_per_tok, tokens);
  double b = static_cast<double>(m.dense_bytes) + static_cast<double>(tokens * c.hidden_size * 2);
  for (uint64_t x : m.expert_layer_bytes) b += static_cast<double>(x) * touched / E;
  return b;
}
uint64_t GpuRuntime::weight_bytes() const { return impl_->weight_bytes; }
int64_t GpuRuntime::seq_state_bytes() const { return impl_->deltanet ? kDeltaNetHostStateBytes : 0; }
uint64_t GpuRuntime::kv_bytes_per_token() const {
  const KvLayout& l = impl_->kv_layout;
  return static_cast<uint64_t>(l.layers * (l.k_floats() + l.v_floats())) * 2;
}
const ExpertStream* GpuRuntime::expert_stream() const { return impl_->xstream.get(); }
ExpertStream* GpuRuntime::expert_stream() { return impl_->xstream.get(); }
void GpuRuntime::set_routing_replay(const RoutingTrace* t) {
  Impl& m = *impl_;
  m.replay.reset();
  if (!t) return;
  const RoutingTraceHeader& h = t->header;
  if (h.layers != static_cast<uint32_t>(m.c.num_hidden_layers) || h.experts != static_cast<uint32_t>(m.c.num_experts) ||
      h.topk != static_cast<uint32_t>(m.c.num_experts_per_tok))
    fail(ErrorKind::invalid_argument, "routing replay: the trace is for " + std::to_string(h.layers) + " layers of " + std::to_string(h.experts) +
                                          " experts, top-" + std::to_string(h.topk) + "; the model has " + std::to_string(m.c.num_hidden_layers) + " of " +
                                          std::to_string(m.c.num_experts) + ", top-" + std::to_string(m.c.num_experts_per_tok));
  m.replay = std::make_unique<RoutingReplay>(*t);
}

const HostResidenceStats& GpuRuntime::host_residence_stats() const { return impl_->residence; }
const GpuExpertCache* GpuRuntime::expert_cache() const { return impl_->xcache.get(); }
GpuExpertCache* GpuRuntime::expert_cache() { return impl_->xcache.get(); }

void GpuRuntime::enable_expert_cache(const GpuExpertCacheOptions& o) {
  Impl& m = *impl_;
  m.xcache.reset();
  std::vector<GpuExpertCache::Layer> layers;
  for (size_t l = 0; l < m.blocks.size(); ++l)
    if (const auto* w = m.blocks[l].ffn->host_expert_weights())
      layers.push_back({static_cast<int64_t>(l), w, m.blocks[l].ffn->host_expert_pieces(), m.blocks[l].ffn->host_experts_registered()});
  if (layers.empty()) return;
  GpuExpertCacheOptions opt = o;
  opt.max_tokens = Impl::kGraphMaxTokens;
  m.xcache = make_gpu_expert_cache(m.c, std::move(layers), opt, m.stream, &m.pools->pool(0));
}

const numa::ExpertWeights* GpuRuntime::host_expert_sample() const {
  for (const Impl::Block& b : impl_->blocks)
    if (const auto* w = b.ffn->host_expert_weights(); w && !w->empty()) return &(*w)[0];
  return nullptr;
}

void GpuRuntime::enable_expert_streaming(const ExpertStreamOptions& o) {
  Impl& m = *impl_;
  m.xstream.reset();
  std::vector<ExpertStream::Layer> layers;
  for (size_t l = 0; l < m.blocks.size(); ++l)
    if (const auto* w = m.blocks[l].ffn->host_expert_weights())
      layers.push_back({static_cast<int64_t>(l), w, m.blocks[l].ffn->host_expert_pieces(), m.blocks[l].ffn->host_experts_registered()});
  gpu::MemoryUse use("the expert streaming slots");
  ExpertStreamOptions so = o;
  so.split_act = m.split_act;
  // The passes run on m.stream between the resident layers' big passes: they share that scratch (the plan counts it).
  m.xstream = make_expert_stream(m.c, std::move(layers), so, m.stream, m.blas, &m.pools->pool(0), &m.expert_scratch);
}

void GpuRuntime::forward(const Batch& b, KvCache& kv, std::vector<float>& logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  gpu::Stream& s = m.stream;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(b.tokens.size()), mrows = static_cast<int64_t>(b.logit_rows.size());
  const int64_t H = c.hidden_size, V = c.vocab_size, K = m.topk;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (!m.broken.empty()) fail(ErrorKind::device, m.broken);
  if (kv.layout().k_floats() != m.kv_layout.k_floats() || kv.layout().v_floats() != m.kv_layout.v_floats() ||
      kv.layout().layers != m.kv_layout.layers)
    fail(ErrorKind::internal, "KV cache layout does not fit this model (build it with Model::kv_layout())");
  // The KV cache on the GPU: the cache's GpuKvStorage ([layer][slot][width] bf16 keys, and values where the layout has them).
  GpuKvStorage& kvs = [&]() -> GpuKvStorage& {
    gpu::MemoryUse use("the KV cache (" + std::to_string(kv.num_blocks()) + " blocks)");
    return gpu_kv_storage(kv, m.kv_layout.k_floats(), m.kv_layout.v_floats());
  }();

  // Sequences of the step: (list offset, context length, tokens in the step).
  struct SeqInfo {
    int32_t off = 0;
    int64_t len = 0, tokens = 0;
  };
  std::map<int, SeqInfo> seqs;
  GpuStepInfo st;
  st.n = n;
  st.mrows = mrows;
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    auto& e = seqs[sl.seq];
    e.len = std::max(e.len, sl.pos + 1);
    ++e.tokens;
    st.max_len = std::max(st.max_len, sl.pos + 1);
  }
  for (auto& [seq, e] : seqs) {
    e.off = static_cast<int32_t>(st.list_len);
    st.list_len += e.len;
  }
  // Step metadata in one upload: tokens, pos, slot, list offset, length, multi-token flag, logit rows, slot lists, query tiles.
  std::vector<int32_t> meta(static_cast<size_t>(6 * n + mrows + st.list_len));
  int32_t* mt = meta.data();
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    const SeqInfo& e = seqs[sl.seq];
    mt[i] = b.tokens[static_cast<size_t>(i)];
    mt[n + i] = static_cast<int32_t>(sl.pos);
    mt[2 * n + i] = static_cast<int32_t>(kv.slot_index(sl.seq, sl.pos));
    mt[3 * n + i] = e.off;
    mt[4 * n + i] = static_cast<int32_t>(sl.pos + 1);
    mt[5 * n + i] = e.tokens > 1;
    st.multi_tokens += e.tokens > 1;
  }
  for (int64_t r = 0; r < mrows; ++r) mt[6 * n + r] = static_cast<int32_t>(b.logit_rows[static_cast<size_t>(r)]);
  for (const auto& [seq, e] : seqs)
    for (int64_t p = 0; p < e.len; ++p) mt[6 * n + mrows + e.off + p] = static_cast<int32_t>(kv.slot_index(seq, p));
  // Prefill-sized steps (never captured as graphs) may attend in query tiles on tensor cores.
  if (m.tiled_attention && n > Impl::kGraphMaxTokens) {
    const std::vector<int32_t> tiles = gpu::attention_tile_list(mt + 3 * n, n);
    st.ntiles = static_cast<int64_t>(tiles.size() / 2);
    meta.insert(meta.end(), tiles.begin(), tiles.end());
    mt = meta.data();
  }
  const size_t meta_bytes = meta.size() * sizeof(int32_t);
  if (meta_bytes > m.meta.bytes()) {  // with headroom: a replayed graph needs the same address
    m.meta_h.reserve(meta_bytes * 2);
    m.meta.reserve(meta_bytes * 2);
  }
  s.synchronize();  // the previous step no longer reads meta_h
  if (m.deltanet) {  // checks that the positions continue each sequence's state, before anything is enqueued
    m.deltanet->begin(b, kv, kvs, s);
    st.deltanet = m.deltanet.get();
  }
  if (m.xcache) m.xcache->begin_step();
  if (m.engram) m.engram->begin_step(b, kv, s);  // hashes the n-grams, starts the PLE row reads
  std::memcpy(m.meta_h.as<int32_t>(), meta.data(), meta_bytes);
  gpu::copy_to_device(m.meta.data(), m.meta_h.as<int32_t>(), meta_bytes, s);
  kvs.begin_step(s);  // queued block copies and restores from the host pool, before this step's work
  st.tok = m.meta.as<int32_t>();
  st.pos = st.tok + n;
  st.slot = st.tok + 2 * n;
  st.off = st.tok + 3 * n;
  st.len = st.tok + 4 * n;
  st.multi = st.tok + 5 * n;
  st.rows = st.tok + 6 * n;
  st.lists = st.rows + mrows;
  st.tiles = st.lists + st.list_len;
  st.kv = &kvs;
  st.stream_pass = m.xstream && m.xstream->wants(n);
  st.fused = m.decode_fusion;
  // Programmatic launch for decode-sized steps only: prefill passes are few
  // long kernels (and streamed passes wait on copy events), nothing to gain.
  s.set_programmatic_launch(m.programmatic_launch && n <= Impl::kGraphMaxTokens && !st.stream_pass);

  // The step is GPU segments separated by host work: hand-offs (blocks
  // whose routed experts are in host memory; such a block's GPU part ends
  // with its router) and Engram modules (the host waits for the module's
  // table rows, then queues it). Segment i covers layers
  // (cuts[i-1].after, cuts[i].after]. Streamed passes have no hand-offs.
  struct Cut {
    size_t after;  // the segment ends after this layer
    bool handoff;  // ... with this layer's CPU experts
    int module;    // ... then Engram module `module` (before layer after + 1), or -1
  };
  const size_t L = m.blocks.size();
  std::vector<Cut> cuts;
  for (size_t l = 0; l < L; ++l) {
    const bool h = m.blocks[l].ffn->host_experts() && !st.stream_pass;
    const int em = m.engram && l + 1 < L ? m.engram->module_before(static_cast<int64_t>(l + 1)) : -1;
    if (h || em >= 0) cuts.push_back({l, h, em});
  }
  const size_t nseg = cuts.size() + 1;
  const bool handoffs = std::any_of(cuts.begin(), cuts.end(), [](const Cut& x) { return x.handoff; });
  // Micro-batches of rows [r0, r0 + rn): decode steps of >= 2 sequences with
  // hand-offs may run as two, so that the CPU experts of one overlap the GPU
  // work of the other; per token the math is the same.
  std::vector<Rows> mbs = {{0, n}};
  if (m.overlap && handoffs && n >= 2 && static_cast<int64_t>(seqs.size()) == n) {
    const int64_t nb = m.overlap_b_rows > 0 ? std::min(m.overlap_b_rows, n - 1) : n / 2;
    mbs = {{0, n - nb}, {n - nb, nb}};
  }
  for (const Rows& r : mbs) st.mb_rows.push_back(r.rn);
  // Part profiling: all-GPU steps of one micro-batch only (see set_part_profile).
  const bool prof = m.part_profile && !handoffs && mbs.size() == 1 && !st.stream_pass && !m.engram;
  // Expert deferral: a hand-off layer whose next layer hands off too (no
  // Engram module between them) defers into that one; the deferred experts
  // run on the deferral's thread while the GPU runs the next segment.
  if (m.deferral) {
    std::vector<bool> may(L, false);
    if (mbs.size() == 1)
      for (size_t i = 0; i + 1 < cuts.size(); ++i)
        if (cuts[i].handoff && cuts[i].module < 0 && cuts[i + 1].handoff && cuts[i + 1].after == cuts[i].after + 1) may[cuts[i].after] = true;
    m.deferral->begin_step(std::move(may));
  }

  // Activations and scratch, grown to this step's size before anything is enqueued.
  gpu::MemoryUse use_scratch("the step's activations and scratch (" + std::to_string(n) + " tokens)");
  GpuScratch& sc = m.scratch;
  sc.fit("act.x", n * H * 4);
  sc.fit("act.d", n * H * 4);
  sc.fit("act.hb", n * H * 2);
  sc.fit("act.hf", n * H * 4);
  sc.fit("act.ids", n * K * 4);
  sc.fit("act.wts", n * K * 4);
  sc.fit("act.logits", mrows * V * 4);
  sc.fit("dense.deq", static_cast<int64_t>(m.lm_head.scratch_bytes(mrows)));
  GpuCtx ctx{s, m.blas, sc, m.expert_scratch, m.xstream.get(), st, {}};
  for (auto& blk : m.blocks) {
    blk.attn->reserve(ctx);
    blk.ffn->reserve(ctx);
  }
  ctx.a = {sc.get<float>("act.x"), sc.get<float>("act.d"), sc.get<float>("act.hf"), sc.get<bf16_t>("act.hb"), sc.get<int32_t>("act.ids"),
           sc.get<float>("act.wts")};
  const GpuActs& a = ctx.a;
  if (handoffs) {
    m.hf_h.reserve(static_cast<size_t>(n * H * 4));
    m.out_h.reserve(static_cast<size_t>(n * H * 4));
    m.ids_h.reserve(static_cast<size_t>(n * K * 4));
    m.w_h.reserve(static_cast<size_t>(n * K * 4));
  }

  // (Residual add +) RMSNorm with the model's norm weights (bf16, or fp32 when norm_f32).
  auto norm = [&](float* x, const float* delta, const int32_t* rows, int64_t cnt, const gpu::DeviceBuffer& w, bf16_t* y, float* y_f32) {
    if (m.norm_f32) gpu::add_rms_norm(x, delta, rows, cnt, H, w.as<float>(), eps, y, y_f32, s);
    else gpu::add_rms_norm(x, delta, rows, cnt, H, w.as<bf16_t>(), eps, y, y_f32, s);
  };
  // Block l's GPU work for rows r (up to its router when it hands off).
  auto enqueue_block = [&](size_t l, const Rows& r) {
    Impl::Block& blk = m.blocks[l];
    float *xr = a.x + r.r0 * H, *dr = a.d + r.r0 * H, *hfr = a.hf + r.r0 * H;
    bf16_t* hr = a.hb + r.r0 * H;
    // Engram module before l: x += d, then x += its output. Before layer 0
    // it runs here; before later layers, between segments (see cuts).
    const int em = m.engram ? m.engram->module_before(static_cast<int64_t>(l)) : -1;
    if (em >= 0 && l == 0) m.engram->apply(em, xr, nullptr, r.r0, r.rn, m.blas, s);
    const float* in_delta = l > 0 && em < 0 ? dr : nullptr;
    if (!m.norm_f32 && blk.attn->fuses_norm(ctx, r)) {
      blk.attn->enqueue_with_norm(ctx, r, blk.in_norm.as<bf16_t>(), eps, in_delta);
    } else {
      norm(xr, in_delta, nullptr, r.rn, blk.in_norm, hr, blk.attn->fp32_input() ? hfr : nullptr);
      blk.attn->enqueue(ctx, r);
    }
    if (prof) m.part_events[2 + 2 * l].record(s);
    const bool handoff = blk.ffn->host_experts() && !st.stream_pass;
    if (!m.norm_f32 && blk.ffn->fuses_norm(ctx, r)) {
      blk.ffn->enqueue_with_norm(ctx, r, blk.post_norm.as<bf16_t>(), eps, handoff);
    } else {
      norm(xr, dr, nullptr, r.rn, blk.post_norm, hr, blk.ffn->fp32_input() ? hfr : nullptr);
      blk.ffn->enqueue(ctx, r, handoff);
    }
    if (prof) m.part_events[3 + 2 * l].record(s);
  };
  auto enqueue_tail = [&] {
    norm(a.x, nullptr, st.rows, mrows, m.final_norm, a.hb, nullptr);
    m.lm_head.gemm(m.blas, a.hb, mrows, sc.get<float>("act.logits"), V, sc.get<void>("dense.deq"), s);
    if (prof) m.part_events[2 * L + 2].record(s);
  };
  auto enqueue_segment = [&](size_t i, const Rows& r, bool tail) {
    if (i == 0 && prof) m.part_events[0].record(s);
    if (i == 0) gpu::embedding(m.embed.as<bf16_t>(), st.tok + r.r0, r.rn, H, a.x + r.r0 * H, s);
    if (i == 0 && prof) m.part_events[1].record(s);
    if (i > 0 && cuts[i - 1].handoff) m.blocks[cuts[i - 1].after].ffn->enqueue_after_handoff(ctx, r);
    const size_t first = i == 0 ? 0 : cuts[i - 1].after + 1, last = i + 1 < nseg ? cuts[i].after + 1 : L;
    for (size_t l = first; l < last; ++l) enqueue_block(l, r);
    if (i + 1 == nseg) gpu::add(a.x + r.r0 * H, a.d + r.r0 * H, r.rn * H, a.x + r.r0 * H, s);
    if (tail) enqueue_tail();
  };
  // Decode-sized steps replay each segment as a CUDA graph while the key
  // (shape, micro-batches, hand-offs, every buffer address and what the
  // layers' launches depend on) holds. A module before layer 0 runs inside
  // the first segment: no graphs then.
  const bool graphs = m.use_graphs && !prof && n <= Impl::kGraphMaxTokens && !st.stream_pass && !(m.engram && m.engram->module_before(0) >= 0);
  // Zero-copy hand-off (zero_copy_handoff.h): the whole step as one graph
  // with the hand-offs through mapped host memory. Graph-sized steps of one
  // micro-batch whose only host work is the hand-offs' CPU experts.
  const bool zero_copy = m.zero_copy && graphs && handoffs && mbs.size() == 1 && !m.xcache && !m.deferral && !m.engram;
  // Every allocation before the graph runs: while the GPU spins on a
  // release, a call that synchronizes the device (cudaFreeHost) would never return.
  if (zero_copy) m.zc.reserve(static_cast<int64_t>(cuts.size()), n, H, K);
  m.logits_h.reserve(static_cast<size_t>(std::max<int64_t>(mrows * V * 4, 16)));
  if (st.stream_pass) m.xstream->begin(n);  // the first window's copies start now
  std::vector<const void*> key;
  if (graphs) {
    auto v = [](int64_t i) { return reinterpret_cast<const void*>(i); };
    key = {v(n), v(mrows), v(static_cast<int64_t>(mbs.size())), v(mbs.back().r0), m.meta.data()};
    sc.key(key);
    for (int64_t l = 0; l < m.kv_layout.layers; ++l) {
      key.push_back(kvs.keys(l));
      key.push_back(kvs.values(l));
    }
    for (const Cut& x : cuts) key.push_back(v(static_cast<int64_t>(x.after) * 2 + (x.handoff ? 1 : 0)));
    std::vector<int64_t> lk;
    for (const auto& blk : m.blocks) blk.attn->key(st, lk);
    for (int64_t x : lk) key.push_back(v(x));
    if (zero_copy) {
      m.zc.key(key);
      key.push_back(m.logits_h.as<void>());
    }
  }
  auto run_segment = [&](size_t i, size_t mb, bool tail) {
    if (!graphs) return enqueue_segment(i, mbs[mb], tail);
    m.seg_graphs.run(key, i * 2 + mb, s, [&] { enqueue_segment(i, mbs[mb], tail); });
  };
  // Hand-off of layer l for micro-batch mb: normed hidden (fp32) and routing
  // down, then the GPU work that overlaps the host's (a shared expert); then
  // (host) wait, CPU experts, expert sums back into d.
  double cpu_s = 0;
  std::vector<std::pair<size_t, size_t>> handed;  // (layer, micro-batch), for the transfer times
  auto down = [&](size_t l, size_t mb) {
    const Rows& r = mbs[mb];
    gpu::Event* ev = &m.events[8 * l + 4 * mb];
    ev[0].record(s);
    gpu::copy_to_host(m.hf_h.as<float>() + r.r0 * H, a.hf + r.r0 * H, static_cast<size_t>(r.rn * H * 4), s);
    gpu::copy_to_host(m.ids_h.as<int32_t>() + r.r0 * K, a.ids + r.r0 * K, static_cast<size_t>(r.rn * K * 4), s);
    gpu::copy_to_host(m.w_h.as<float>() + r.r0 * K, a.wts + r.r0 * K, static_cast<size_t>(r.rn * K * 4), s);
    ev[1].record(s);
    m.blocks[l].ffn->enqueue_during_handoff(ctx, r);
  };
  // Whether layer l's hand-off of rows r splits its experts with the GPU (split decode).
  auto splits = [&](size_t l, const Rows& r) {
    const GpuExpertCache* xc = m.xcache.get();
    return xc && r.rn <= xc->max_tokens() && xc->covers(static_cast<int64_t>(l));
  };
  // The CPU experts of layer l for rows r, from hf / ids / w in host memory
  // into out (overwritten). Returns the test hook's answer (false: withhold
  // a zero-copy release).
  auto host_experts = [&](size_t l, const Rows& r, const float* hf, int32_t* ids, const float* w, float* out) {
    const bool release = m.handoff_hook ? m.handoff_hook(static_cast<int64_t>(l)) : true;
    const auto c0 = std::chrono::steady_clock::now();
    std::memset(out, 0, static_cast<size_t>(r.rn * H * 4));
    if (m.replay) m.replay->apply(static_cast<int64_t>(l), ids, r.rn, K);
    GpuExpertCache* xc = m.xcache.get();
    // Distinct experts the CPU reads for this hand-off (the decode bound's cold bytes).
    auto count_cold = [&](const int32_t* e, const float* wt, int64_t pairs) {
      const std::vector<numa::ExpertWeights>* hw = m.blocks[l].ffn->host_expert_weights();
      if (!hw || hw->empty()) return;
      const numa::ExpertWeights& x = (*hw)[0];
      const uint64_t per = x.gate.bytes() + x.up.bytes() + x.down.bytes();
      std::vector<char> seen(hw->size(), 0);
      for (int64_t p = 0; p < pairs; ++p)
        if (e[p] >= 0 && static_cast<size_t>(e[p]) < seen.size() && wt[p] != 0.0f && !seen[static_cast<size_t>(e[p])]++) m.times.cold_bytes += per;
    };
    if (splits(l, r)) {  // cached experts and a balanced share of the others on the GPU (queued now), the rest on the CPU meanwhile
      m.blocks[l].ffn->record_routing(r.rn, ids, K);  // the whole routing: the CPU gets only a subset of the pairs below
      xc->split(static_cast<int64_t>(l), a.hb + r.r0 * H, r.rn, K, ids, w);
      count_cold(xc->cpu_ids(), xc->cpu_weights(), r.rn * xc->cpu_k());
      if (xc->cpu_k() > 0) {
        const auto h0 = std::chrono::steady_clock::now();
        m.blocks[l].ffn->run_host_pairs(hf, r.rn, xc->cpu_ids(), xc->cpu_weights(), xc->cpu_k(), out);
        xc->observe_cpu(std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count());
      }
    } else {
      count_cold(ids, w, r.rn * K);
      m.blocks[l].ffn->run_host(hf, r.rn, ids, w, out);
    }
    cpu_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    return release;
  };
  auto cpu_and_up = [&](size_t l, size_t mb) {
    const Rows& r = mbs[mb];
    gpu::Event* ev = &m.events[8 * l + 4 * mb];
    ev[1].synchronize();
    float* out = m.out_h.as<float>() + r.r0 * H;
    const bool split = splits(l, r);
    host_experts(l, r, m.hf_h.as<float>() + r.r0 * H, m.ids_h.as<int32_t>() + r.r0 * K, m.w_h.as<float>() + r.r0 * K, out);
    ev[2].record(s);
    gpu::copy_to_device(a.d + r.r0 * H, out, static_cast<size_t>(r.rn * H * 4), s);
    ev[3].record(s);
    if (split) m.xcache->add_gpu_share(a.d + r.r0 * H, s);
    handed.emplace_back(l, mb);
  };
  // With two micro-batches A, B the stream holds seg_i(A), down(A), seg_i(B),
  // down(B); the host runs A's CPU experts while the GPU runs seg_i(B), then
  // B's while the GPU runs seg_i+1(A).
  const bool one = mbs.size() == 1;
  if (zero_copy) {
    // One graph: segment i's GPU work ends with the hand-off kernel (and the
    // work that overlaps the host's: a shared expert); segment i + 1 starts
    // with the kernel that waits for the host's release and takes the sums;
    // the logits' copy and the end flag close it. Nothing else is launched
    // while the GPU may wait for the host (no kernel loaded lazily then).
    const Rows& r = mbs[0];
    m.zc.begin_step(cuts.size());
    try {
      m.seg_graphs.run(key, 0, s, [&] {
        for (size_t i = 0; i < nseg; ++i) {
          if (i > 0) m.zc.enqueue_wait_add(i - 1, a.d, n, s);
          enqueue_segment(i, r, i + 1 == nseg);
          if (i + 1 == nseg) break;
          m.zc.enqueue_down(i, a.hf, a.ids, a.wts, n, s);
          m.blocks[cuts[i].after].ffn->enqueue_during_handoff(ctx, r);
        }
        gpu::copy_to_host(m.logits_h.as<float>(), sc.get<float>("act.logits"), static_cast<size_t>(mrows * V * 4), s);
        m.zc.enqueue_end(s);
      });
      for (size_t j = 0; j < cuts.size(); ++j) {
        const size_t l = cuts[j].after;
        m.zc.wait_ready(j, static_cast<int64_t>(l), s);
        if (host_experts(l, r, m.zc.hf(), m.zc.ids(), m.zc.weights(), m.zc.out())) m.zc.release(j);
      }
      m.zc.wait_end(s);
    } catch (...) {
      // Never leave the GPU spinning: release what is left with the abort
      // value, wait (bounded) for the step to drain, discard it, rethrow.
      if (!m.zc.abort(s))
        m.broken = "GPU runtime: a zero-copy step's GPU work did not finish after its hand-offs were aborted (within " +
                   std::to_string(m.zc.timeout()) + " s); the runtime cannot run more steps";
      throw;
    }
  } else {
    for (size_t mb = 0; mb < mbs.size(); ++mb) {
      run_segment(0, mb, one && nseg == 1);
      if (nseg > 1 && cuts[0].handoff) down(cuts[0].after, mb);
    }
    for (size_t i = 1; i < nseg; ++i)
      for (size_t mb = 0; mb < mbs.size(); ++mb) {
        const Cut& x = cuts[i - 1];
        if (x.handoff) cpu_and_up(x.after, mb);
        if (x.module >= 0) m.engram->apply(x.module, a.x + mbs[mb].r0 * H, a.d + mbs[mb].r0 * H, mbs[mb].r0, mbs[mb].rn, m.blas, s);
        run_segment(i, mb, one && i + 1 == nseg);
        if (i + 1 < nseg && cuts[i].handoff) down(cuts[i].after, mb);
      }
    if (m.deferral) m.deferral->end_step();
    if (!one) enqueue_tail();
    if (m.engram) m.engram->end_step(b, kv, s);  // history rows for the next steps
    gpu::copy_to_host(m.logits_h.as<float>(), sc.get<float>("act.logits"), static_cast<size_t>(mrows * V * 4), s);
  }
  s.synchronize();
  if (st.stream_pass) m.xstream->end();
  if (m.xcache) m.xcache->end_step();
  kvs.end_step();
  if (m.deltanet) m.deltanet->end(kv);
  logits.assign(m.logits_h.as<float>(), m.logits_h.as<float>() + mrows * V);

  double transfer_s = zero_copy ? m.zc.step_seconds() : 0;
  for (const auto& [l, mb] : handed) {
    gpu::Event* ev = &m.events[8 * l + 4 * mb];
    transfer_s += (ev[1].elapsed_ms(ev[0]) + ev[3].elapsed_ms(ev[2])) * 1e-3;
  }
  if (prof) {
    GpuPartTimes& pt = m.part_times;
    const auto& e = m.part_events;
    pt.embed_ms += e[1].elapsed_ms(e[0]);
    for (size_t l = 0; l < L; ++l) {
      pt.attn_ms[l] += e[2 + 2 * l].elapsed_ms(e[1 + 2 * l]);
      pt.ffn_ms[l] += e[3 + 2 * l].elapsed_ms(e[2 + 2 * l]);
    }
    pt.tail_ms += e[2 * L + 2].elapsed_ms(e[2 * L + 1]);
    pt.steps += 1;
  }
  m.times.total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  m.times.cpu_experts_s += cpu_s;
  m.times.transfer_s += transfer_s;
  m.times.steps += 1;
  m.times.zero_copy_steps += zero_copy ? 1 : 0;
}

}  // namespace hmoe
