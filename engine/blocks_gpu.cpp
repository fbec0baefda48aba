// The GPU step (see blocks_gpu.h). Host code only: kernels are gpu/*.cu.
// Per layer: norm, fused QKV product, q/k norm + rotary, KV store,
// attention, o_proj, norm, then the FFN - dense MLP, resident experts
// (grouped kernels) or a round trip to the CPU expert engine.
#include "engine/blocks_gpu.h"
#include "engine/blocks_gpu_mla.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "configs/error.h"
#include "engine/ops/cpu_ops.h"
#include "engine/gpu_experts.h"
#include "engine/gpu_upload.h"
#include "engine/kv_storage_gpu.h"
#include "engine/engram_gpu.h"
#include "engine/gpu_graphs.h"
#include "engine/placement.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "numa/expert_engine.h"

namespace hmoe {

namespace {

using gpu::bf16_t;


}  // namespace

struct GpuStack::Impl {
  struct LayerW {
    gpu::DeviceBuffer in_norm, post_norm, qkv, o, q_norm, k_norm;
    gpu::DeviceBuffer router, gate_up, down;  // gate_up/down: dense MLP
    std::unique_ptr<GpuResidentExperts> experts;  // resident MoE layers
    bool moe = false, resident = false;
    std::vector<numa::ExpertWeights> cpu_experts;  // non-resident MoE layers
    std::unique_ptr<numa::ExpertEngine> engine;    // over cpu_experts
  };

  const ModelConfig& c;
  numa::NodePools& pools;
  gpu::Stream stream;
  gpu::Blas blas{stream};
  gpu::DeviceBuffer embed, lm_head, final_norm, inv_freq;
  std::vector<LayerW> layers;
  uint64_t weight_bytes = 0;
  // Activations.
  gpu::DeviceBuffer x, d, hb, hf, qkv, attn, attn_scratch, gu, act_b, router_l, topk_ids, topk_w, route_off, pair_list, moe_act, moe_partial, logits_d,
      meta;
  gpu::PinnedBuffer meta_h, hf_h, ids_h, w_h, out_h, logits_h;
  std::vector<float> cpu_out;
  std::vector<gpu::Event> events;  // 8 per layer: per micro-batch D2H start/end, H2D start/end
  GpuStepTimes times;
  static constexpr int64_t kGraphMaxTokens = 64;  // larger steps are launched plainly
  bool use_graphs = false;
  SegmentGraphs seg_graphs;
  bool overlap = false;         // two micro-batches for decode steps with hand-offs
  bool tiled_attention = true;  // prefill steps: gpu::attention_tiles
  ExpertScratch expert_scratch;  // big passes of the resident layers, shared
  int64_t overlap_b_rows = 0;   // rows of the second micro-batch; 0: half
  int64_t hybrid_count = 0;
  std::unique_ptr<ExpertStream> xstream;  // streamed non-resident experts for big passes (null: off)
  std::unique_ptr<GpuEngram> engram;      // qwen3_moe_engram modules (null: none)

  Impl(const ModelConfig& cfg, numa::NodePools& p) : c(cfg), pools(p) {}
};

GpuStack::GpuStack(const ModelConfig& c, const std::vector<bool>& resident, const WeightLookup& get, numa::NodePools& pools,
                   const numa::EngineOptions& experts_opt, bool keep_quantized)
    : impl_(std::make_unique<Impl>(c, pools)) {
  numa::EngineOptions eopt = experts_opt;
  Impl& m = *impl_;
  gpu::Stream& s = m.stream;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size;
  if (c.attention_bias) fail(ErrorKind::unsupported, "GPU path: attention_bias=true is not supported");
  if (hd % 32 != 0 || hd > 128) fail(ErrorKind::unsupported, "GPU path: head_dim " + std::to_string(hd) + " (supported: 32, 64, 96, 128)");
  if (H % 8 != 0 || I % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden and expert sizes must be multiples of 8");
  if (static_cast<int64_t>(resident.size()) != c.num_hidden_layers) fail(ErrorKind::internal, "placement has the wrong number of layers");

  auto up1 = [&](const std::string& name, std::vector<int64_t> shape) {
    cpu::Mat t = get(name, shape);
    if (shape.size() == 1) t = cpu::Mat{t.dtype, t.data, 1, shape[0]};
    auto b = upload_bf16({t}, s);
    m.weight_bytes += b.bytes();
    return b;
  };
  m.embed = up1("model.embed_tokens.weight", {c.vocab_size, H});
  m.final_norm = up1("model.norm.weight", {H});
  if (c.tie_word_embeddings) {
    cpu::Mat t = get("model.embed_tokens.weight", {c.vocab_size, H});
    m.lm_head = upload_bf16({t}, s);
  } else {
    m.lm_head = up1("lm_head.weight", {c.vocab_size, H});
  }
  ops::Rope rope(hd, c.rope_theta);
  m.inv_freq = upload(rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float), s);

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Impl::LayerW w;
    w.in_norm = up1(p + "input_layernorm.weight", {H});
    w.post_norm = up1(p + "post_attention_layernorm.weight", {H});
    const std::string a = p + "self_attn.";
    cpu::Mat q = get(a + "q_proj.weight", {nh * hd, H}), k = get(a + "k_proj.weight", {kvh * hd, H}), v = get(a + "v_proj.weight", {kvh * hd, H});
    w.qkv = upload_bf16({q, k, v}, s);
    w.o = up1(a + "o_proj.weight", {H, nh * hd});
    w.q_norm = up1(a + "q_norm.weight", {hd});
    w.k_norm = up1(a + "k_norm.weight", {hd});
    m.weight_bytes += w.qkv.bytes();
    const std::string f = p + "mlp.";
    w.moe = c.is_moe_layer(l);
    if (!w.moe) {
      const int64_t Id = c.intermediate_size;
      cpu::Mat g = get(f + "gate_proj.weight", {Id, H}), u = get(f + "up_proj.weight", {Id, H}), dn = get(f + "down_proj.weight", {H, Id});
      w.gate_up = upload_bf16({g, u}, s);
      w.down = upload_bf16({dn}, s);
      m.weight_bytes += w.gate_up.bytes() + w.down.bytes();
    } else {
      w.router = up1(f + "gate.weight", {E, H});
      w.resident = resident[static_cast<size_t>(l)];
      std::vector<numa::ExpertWeights> ex;
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = f + "experts." + std::to_string(e) + ".";
        ex.push_back({get(ep + "gate_proj.weight", {I, H}), get(ep + "up_proj.weight", {I, H}), get(ep + "down_proj.weight", {H, I})});
      }
      if (w.resident) {
        w.experts = std::make_unique<GpuResidentExperts>(ex, keep_quantized, s, "layer " + std::to_string(l) + " routed experts");
        m.weight_bytes += w.experts->bytes();
      } else {
        w.cpu_experts = std::move(ex);
        ++m.hybrid_count;
        eopt.name = "layer " + std::to_string(l) + " routed experts (CPU)";
        w.engine = std::make_unique<numa::ExpertEngine>(w.cpu_experts, pools, eopt);
        eopt.print_memory = false;  // the first hybrid layer speaks for all
      }
    }
    m.layers.push_back(std::move(w));
  }
  for (int64_t i = 0; i < 8 * c.num_hidden_layers; ++i) m.events.emplace_back();
}

GpuStack::~GpuStack() = default;
const GpuStepTimes& GpuStack::times() const { return impl_->times; }
void GpuStack::reset_times() { impl_->times = GpuStepTimes{}; }
void GpuStack::set_cuda_graphs(bool on) {
  impl_->use_graphs = on;
  impl_->seg_graphs.clear();
}
void GpuStack::set_tiled_attention(bool on) { impl_->tiled_attention = on; }
void GpuStack::set_cpu_overlap(bool on, int64_t second_rows) {
  impl_->overlap = on;
  impl_->overlap_b_rows = std::max<int64_t>(second_rows, 0);
}
size_t GpuStack::graph_captures() const { return impl_->seg_graphs.captures(); }
uint64_t GpuStack::weight_bytes() const { return impl_->weight_bytes; }
const ExpertStream* GpuStack::expert_stream() const { return impl_->xstream.get(); }
ExpertStream* GpuStack::expert_stream() { return impl_->xstream.get(); }
void GpuStack::attach_engram(EngramModules& host, const WeightLookup& get) {
  impl_->engram = std::make_unique<GpuEngram>(impl_->c, host, get, impl_->stream);
  impl_->weight_bytes += impl_->engram->weight_bytes();
}
void GpuStack::enable_expert_streaming(const ExpertStreamOptions& o) {
  Impl& m = *impl_;
  m.xstream.reset();
  m.xstream = make_expert_stream(m.c, streamed_layers(m.layers), o, m.stream, m.blas);
}

void GpuStack::forward(const Batch& b, KvCache& kv, std::vector<float>& logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  gpu::Stream& s = m.stream;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(b.tokens.size()), mrows = static_cast<int64_t>(b.logit_rows.size());
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim, V = c.vocab_size;
  const int64_t E = std::max<int64_t>(c.num_experts, 1), K = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const int64_t Id = c.intermediate_size, ld = (nh + 2 * kvh) * hd, kvw = kvh * hd;
  const float eps = static_cast<float>(c.rms_norm_eps);

  // KV cache on the GPU: the cache's GpuKvStorage ([layer][slot][kv_heads*head_dim] keys and values).
  GpuKvStorage& kvs = gpu_kv_storage(kv, kvw, kvw);

  // Step metadata in one upload: tokens, pos, own slot, attention offsets, lens, logit rows, slot lists.
  std::vector<int32_t> meta(static_cast<size_t>(5 * n + mrows));
  std::map<int, std::pair<int32_t, int64_t>> seq_list;  // seq -> (offset, length)
  int64_t list_len = 0, max_len = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    auto& e = seq_list[sl.seq];
    e.second = std::max(e.second, sl.pos + 1);
    max_len = std::max(max_len, sl.pos + 1);
  }
  for (auto& [seq, e] : seq_list) {
    e.first = static_cast<int32_t>(list_len);
    list_len += e.second;
  }
  meta.resize(static_cast<size_t>(5 * n + mrows + list_len));
  int32_t* mt = meta.data();
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    mt[i] = b.tokens[static_cast<size_t>(i)];
    mt[n + i] = static_cast<int32_t>(sl.pos);
    mt[2 * n + i] = static_cast<int32_t>(kv.slot_index(sl.seq, sl.pos));
    mt[3 * n + i] = seq_list[sl.seq].first;
    mt[4 * n + i] = static_cast<int32_t>(sl.pos + 1);
  }
  for (int64_t r = 0; r < mrows; ++r) mt[5 * n + r] = static_cast<int32_t>(b.logit_rows[static_cast<size_t>(r)]);
  for (const auto& [seq, e] : seq_list)
    for (int64_t p = 0; p < e.second; ++p) mt[5 * n + mrows + e.first + p] = static_cast<int32_t>(kv.slot_index(seq, p));
  // Prefill-sized steps (never captured as graphs) run attention in query tiles on tensor cores.
  int64_t ntiles = 0;
  if (m.tiled_attention && n > 64 && (hd == 64 || hd == 128)) {
    const std::vector<int32_t> tiles = gpu::attention_tile_list(mt + 3 * n, n);
    ntiles = static_cast<int64_t>(tiles.size() / 2);
    meta.insert(meta.end(), tiles.begin(), tiles.end());
    mt = meta.data();
  }
  const size_t meta_bytes = meta.size() * sizeof(int32_t);
  if (meta_bytes > m.meta.bytes()) {  // with headroom: a replayed graph needs the same address
    m.meta_h.reserve(meta_bytes * 2);
    m.meta.reserve(meta_bytes * 2);
  }
  s.synchronize();  // the previous step no longer reads meta_h
  if (m.engram) m.engram->begin_step(b, kv, s);  // hashes the n-grams, starts the PLE row reads
  std::memcpy(m.meta_h.as<int32_t>(), meta.data(), meta_bytes);
  gpu::copy_to_device(m.meta.data(), m.meta_h.as<int32_t>(), meta_bytes, s);
  kvs.begin_step(s);  // queued block copies and restores from the host pool, before this step's work
  const int32_t* d_tok = m.meta.as<int32_t>();
  const int32_t *d_pos = d_tok + n, *d_slot = d_tok + 2 * n, *d_off = d_tok + 3 * n, *d_len = d_tok + 4 * n, *d_rows = d_tok + 5 * n,
                *d_lists = d_tok + 5 * n + mrows, *d_tiles = d_lists + list_len;

  // Scratch, grown to this step's size.
  auto fit = [](gpu::DeviceBuffer& buf, int64_t bytes) { buf.reserve(static_cast<size_t>(std::max<int64_t>(bytes, 16))); };
  fit(m.x, n * H * 4);
  fit(m.d, n * H * 4);
  fit(m.hb, n * H * 2);
  fit(m.hf, n * H * 4);
  fit(m.qkv, n * ld * 4);
  fit(m.attn, n * nh * hd * 2);
  fit(m.attn_scratch, gpu::attention_scratch_floats(n, nh, hd, max_len) * 4);
  fit(m.gu, n * 2 * Id * 4);
  fit(m.act_b, n * Id * 2);
  fit(m.router_l, n * E * 4);
  fit(m.topk_ids, n * K * 4);
  fit(m.topk_w, n * K * 4);
  fit(m.route_off, (E + 1) * 4);
  fit(m.pair_list, n * K * 4);
  fit(m.moe_act, n * K * I * 2);
  fit(m.moe_partial, n * K * H * 4);
  fit(m.logits_d, mrows * V * 4);

  float* x = m.x.as<float>();
  float* d = m.d.as<float>();
  bf16_t* hb = m.hb.as<bf16_t>();
  float* qkv = m.qkv.as<float>();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  double cpu_s = 0;

  // The step is GPU segments separated by host work: hand-offs (layers
  // whose experts run on the CPU; such a layer's GPU part ends with its
  // router) and Engram modules (the host waits for the module's table rows,
  // then queues the module; engine/engram_gpu.h). Segment i covers layers
  // (cuts[i-1].after, cuts[i].after]. Passes of >= the prefill minimum
  // stream the CPU layers' experts to the GPU instead (no hand-offs).
  const bool stream_pass = m.xstream && m.xstream->wants(n);
  struct Cut {
    size_t after;         // the segment ends after this layer
    bool handoff;         // ... with this layer's CPU experts
    int module;           // ... then Engram module `module` (before layer after + 1), or -1
  };
  std::vector<Cut> cuts;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const bool h = m.layers[l].moe && !m.layers[l].resident && !stream_pass;
    const int em = m.engram && l + 1 < m.layers.size() ? m.engram->module_before(static_cast<int64_t>(l + 1)) : -1;
    if (h || em >= 0) cuts.push_back({l, h, em});
  }
  const size_t nseg = cuts.size() + 1;
  const bool handoffs = std::any_of(cuts.begin(), cuts.end(), [](const Cut& c) { return c.handoff; });
  // Micro-batches of rows [r0, r0 + rn). Decode steps of >= 2 sequences with
  // hand-offs may run as two (sequence split), so that the CPU experts of one
  // overlap the GPU work of the other; per token the math is the same.
  struct Rows {
    int64_t r0, rn;
  };
  std::vector<Rows> mbs = {{0, n}};
  if (m.overlap && handoffs && n >= 2 && static_cast<int64_t>(seq_list.size()) == n) {
    const int64_t nb = m.overlap_b_rows > 0 ? std::min(m.overlap_b_rows, n - 1) : n / 2;
    mbs = {{0, n - nb}, {n - nb, nb}};
  }
  for (const Rows& r : mbs) fit(m.attn_scratch, gpu::attention_scratch_floats(r.rn, nh, hd, max_len) * 4);
  if (handoffs) {
    m.hf_h.reserve(static_cast<size_t>(n * H * 4));
    m.out_h.reserve(static_cast<size_t>(n * H * 4));
    m.ids_h.reserve(static_cast<size_t>(n * K * 4));
    m.w_h.reserve(static_cast<size_t>(n * K * 4));
  }

  // GPU work of layer l for rows [r0, r0 + rn); scratch buffers are shared
  // (one stream runs the micro-batches one after the other).
  auto enqueue_layer = [&](size_t l, int64_t r0, int64_t rn) {
    Impl::LayerW& w = m.layers[l];
    bf16_t *kc = kvs.keys(static_cast<int64_t>(l)), *vc = kvs.values(static_cast<int64_t>(l));
    float *xr = x + r0 * H, *dr = d + r0 * H, *qr = qkv + r0 * ld;
    bf16_t *hr = hb + r0 * H, *attn = m.attn.as<bf16_t>() + r0 * nh * hd;
    int32_t* ids = m.topk_ids.as<int32_t>() + r0 * K;
    float* wts = m.topk_w.as<float>() + r0 * K;
    // Engram module before l: x += d, then x += its output. Before layer 0
    // it runs here; before later layers, between segments (see cuts).
    const int em = m.engram ? m.engram->module_before(static_cast<int64_t>(l)) : -1;
    if (em >= 0 && l == 0) m.engram->apply(em, xr, nullptr, r0, rn, m.blas, s);
    gpu::add_rms_norm(xr, l > 0 && em < 0 ? dr : nullptr, nullptr, rn, H, w.in_norm.as<bf16_t>(), eps, hr, nullptr, s);
    m.blas.gemm(hr, rn, w.qkv.as<bf16_t>(), ld, H, qr, ld);
    gpu::qk_norm_rope(qr, rn, ld, nh, hd, w.q_norm.as<bf16_t>(), eps, d_pos + r0, m.inv_freq.as<float>(), s);
    gpu::qk_norm_rope(qr + nh * hd, rn, ld, kvh, hd, w.k_norm.as<bf16_t>(), eps, d_pos + r0, m.inv_freq.as<float>(), s);
    gpu::kv_store(qr + nh * hd, qr + (nh + kvh) * hd, ld, rn, kvw, d_slot + r0, kc, vc, s);
    if (ntiles > 0 && r0 == 0 && rn == n)
      gpu::attention_tiles(qr, ld, ntiles, d_tiles, nh, kvh, hd, kc, vc, d_lists, d_off, d_len, scale, attn, s);
    else
      gpu::attention(qr, ld, rn, nh, kvh, hd, kc, vc, d_lists, d_off + r0, d_len + r0, max_len, scale, m.attn_scratch.as<float>(), attn, s);
    m.blas.gemm(attn, rn, w.o.as<bf16_t>(), H, nh * hd, dr, H);
    const bool hybrid = w.moe && !w.resident;
    gpu::add_rms_norm(xr, dr, nullptr, rn, H, w.post_norm.as<bf16_t>(), eps, hr, hybrid ? m.hf.as<float>() + r0 * H : nullptr, s);
    if (!w.moe) {
      m.blas.gemm(hr, rn, w.gate_up.as<bf16_t>(), 2 * Id, H, m.gu.as<float>(), 2 * Id);
      gpu::silu_mul(m.gu.as<float>(), rn, Id, m.act_b.as<bf16_t>(), nullptr, s);
      m.blas.gemm(m.act_b.as<bf16_t>(), rn, w.down.as<bf16_t>(), H, Id, dr, H);
      return;
    }
    m.blas.gemm(hr, rn, w.router.as<bf16_t>(), E, H, m.router_l.as<float>(), E);
    gpu::router_topk(m.router_l.as<float>(), rn, E, K, c.norm_topk_prob, ids, wts, s);
    if (w.resident) {
      gpu::moe_route(ids, rn * K, E, m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(), s);
      w.experts->run(hr, rn, K, ids, wts, m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(), m.moe_act.as<bf16_t>(), m.moe_partial.as<float>(), dr,
                     m.blas, m.expert_scratch, s);
    } else if (stream_pass) {
      m.xstream->layer(static_cast<int64_t>(l), hr, rn, ids, wts, dr);
    }
  };
  auto enqueue_tail = [&] {
    gpu::add_rms_norm(x, nullptr, d_rows, mrows, H, m.final_norm.as<bf16_t>(), eps, hb, nullptr, s);
    m.blas.gemm(hb, mrows, m.lm_head.as<bf16_t>(), V, H, m.logits_d.as<float>(), V);
  };
  auto enqueue_segment = [&](size_t i, const Rows& r, bool tail) {
    if (i == 0) gpu::embedding(m.embed.as<bf16_t>(), d_tok + r.r0, r.rn, H, x + r.r0 * H, s);
    const size_t first = i == 0 ? 0 : cuts[i - 1].after + 1, last = i + 1 < nseg ? cuts[i].after + 1 : m.layers.size();
    for (size_t l = first; l < last; ++l) enqueue_layer(l, r.r0, r.rn);
    if (i + 1 == nseg) gpu::add(x + r.r0 * H, d + r.r0 * H, r.rn * H, x + r.r0 * H, s);
    if (tail) enqueue_tail();
  };
  // Decode-sized steps replay each segment as a CUDA graph while the shape
  // (tokens, logit rows, micro-batches, attention splits, hand-offs) and
  // every buffer address hold.
  // With Engram modules the segments end at each module (its host wait and
  // kernels run between graphs), except for a module before layer 0.
  const bool graphs = m.use_graphs && n <= Impl::kGraphMaxTokens && !stream_pass && !(m.engram && m.engram->module_before(0) >= 0);
  if (stream_pass) m.xstream->begin(n);  // the first window's copies start now
  std::vector<const void*> key;
  if (graphs) {
    auto v = [](int64_t i) { return reinterpret_cast<const void*>(i); };
    key = {v(n), v(mrows), v(static_cast<int64_t>(mbs.size())), v(mbs.back().r0), m.meta.data(), m.x.data(), m.d.data(), m.hb.data(), m.hf.data(),
           m.qkv.data(), m.attn.data(), m.attn_scratch.data(), m.gu.data(), m.act_b.data(), m.router_l.data(), m.topk_ids.data(), m.topk_w.data(),
           m.route_off.data(), m.pair_list.data(), m.moe_act.data(), m.moe_partial.data(), m.logits_d.data()};
    for (const Rows& r : mbs) key.push_back(v(gpu::attention_splits(r.rn, nh, max_len)));
    for (size_t l = 0; l < m.layers.size(); ++l) {
      key.push_back(kvs.keys(static_cast<int64_t>(l)));
      key.push_back(kvs.values(static_cast<int64_t>(l)));
    }
    for (const Cut& c : cuts) key.push_back(v(static_cast<int64_t>(c.after) * 2 + (c.handoff ? 1 : 0)));
  }
  auto run_segment = [&](size_t i, size_t mb, bool tail) {
    if (!graphs) return enqueue_segment(i, mbs[mb], tail);
    m.seg_graphs.run(key, i * 2 + mb, s, [&] { enqueue_segment(i, mbs[mb], tail); });
  };
  // Hand-off of layer l for micro-batch mb: normed hidden (fp32) and routing
  // down; then (host) wait, CPU experts, expert sums back into d.
  std::vector<std::pair<size_t, size_t>> handed;  // (layer, micro-batch), for the transfer times
  auto down = [&](size_t l, size_t mb) {
    const Rows& r = mbs[mb];
    gpu::Event* ev = &m.events[8 * l + 4 * mb];
    ev[0].record(s);
    gpu::copy_to_host(m.hf_h.as<float>() + r.r0 * H, m.hf.as<float>() + r.r0 * H, static_cast<size_t>(r.rn * H * 4), s);
    gpu::copy_to_host(m.ids_h.as<int32_t>() + r.r0 * K, m.topk_ids.as<int32_t>() + r.r0 * K, static_cast<size_t>(r.rn * K * 4), s);
    gpu::copy_to_host(m.w_h.as<float>() + r.r0 * K, m.topk_w.as<float>() + r.r0 * K, static_cast<size_t>(r.rn * K * 4), s);
    ev[1].record(s);
  };
  auto cpu_and_up = [&](size_t l, size_t mb) {
    const Rows& r = mbs[mb];
    gpu::Event* ev = &m.events[8 * l + 4 * mb];
    ev[1].synchronize();
    const auto c0 = std::chrono::steady_clock::now();
    float* out = m.out_h.as<float>() + r.r0 * H;
    std::memset(out, 0, static_cast<size_t>(r.rn * H * 4));
    m.layers[l].engine->forward(m.hf_h.as<float>() + r.r0 * H, r.rn, m.ids_h.as<int32_t>() + r.r0 * K, m.w_h.as<float>() + r.r0 * K, K, out);
    cpu_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    ev[2].record(s);
    gpu::copy_to_device(d + r.r0 * H, out, static_cast<size_t>(r.rn * H * 4), s);
    ev[3].record(s);
    handed.emplace_back(l, mb);
  };
  // With two micro-batches A, B the stream holds seg_i(A), down(A), seg_i(B),
  // down(B); the host runs A's CPU experts while the GPU runs seg_i(B), then
  // B's while the GPU runs seg_i+1(A).
  const bool one = mbs.size() == 1;
  for (size_t mb = 0; mb < mbs.size(); ++mb) {
    run_segment(0, mb, one && nseg == 1);
    if (nseg > 1 && cuts[0].handoff) down(cuts[0].after, mb);
  }
  for (size_t i = 1; i < nseg; ++i)
    for (size_t mb = 0; mb < mbs.size(); ++mb) {
      const Cut& c = cuts[i - 1];
      if (c.handoff) cpu_and_up(c.after, mb);
      if (c.module >= 0) m.engram->apply(c.module, x + mbs[mb].r0 * H, d + mbs[mb].r0 * H, mbs[mb].r0, mbs[mb].rn, m.blas, s);
      run_segment(i, mb, one && i + 1 == nseg);
      if (i + 1 < nseg && cuts[i].handoff) down(cuts[i].after, mb);
    }
  if (!one) enqueue_tail();
  if (m.engram) m.engram->end_step(b, kv, s);  // history rows for the next steps
  m.logits_h.reserve(static_cast<size_t>(std::max<int64_t>(mrows * V * 4, 16)));
  gpu::copy_to_host(m.logits_h.as<float>(), m.logits_d.as<float>(), static_cast<size_t>(mrows * V * 4), s);
  s.synchronize();
  if (stream_pass) m.xstream->end();
  kvs.end_step();
  logits.assign(m.logits_h.as<float>(), m.logits_h.as<float>() + mrows * V);

  double transfer_s = 0;
  for (const auto& [l, mb] : handed) {
    gpu::Event* ev = &m.events[8 * l + 4 * mb];
    transfer_s += (ev[1].elapsed_ms(ev[0]) + ev[3].elapsed_ms(ev[2])) * 1e-3;
  }
  m.times.total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  m.times.cpu_experts_s += cpu_s;
  m.times.transfer_s += transfer_s;
  m.times.steps += 1;
}

std::unique_ptr<GpuStep> make_gpu_stack(const ModelConfig& c, const io::TensorStore* store, WeightSource* source, const Settings& s,
                                        numa::NodePools& pools, EngramModules* engram) {
  const bool quiet = s.progress == "none";
  for (const auto& n : s.notices)
    if (n.find("GPU_RESIDENT") != std::string::npos) std::fprintf(stderr, "%s\n", n.c_str());
  std::string why;
  const bool want_gpu = resolve_device(s, why);
  const bool forced = s.device == "cuda" || s.device == "gpu";
  const bool has_graph = c.arch == Arch::qwen3_moe || c.arch == Arch::deepseek_v3 || (c.arch == Arch::qwen3_moe_engram && engram);
  const bool readable = store != nullptr || source != nullptr;
  if (want_gpu && (!has_graph || !readable)) {
    const std::string reason = !has_graph ? "model_type '" + c.model_type + "' has no GPU graph yet" : "no weights to read";
    if (forced) fail(ErrorKind::unsupported, s.origin("device") + "=" + s.device + ": " + reason);
    if (!quiet) std::fprintf(stderr, "hmoe: %s; running on the CPU\n", reason.c_str());
    return nullptr;
  }
  if (!want_gpu) {
    if (!quiet) std::fprintf(stderr, "hmoe: %s\n", why.c_str());
    return nullptr;
  }
  const gpu::DeviceInfo info = gpu::device_info(0);
  GpuTarget target{info.name, info.total_bytes, 0, false};
  const Plan plan = make_plan(c, s, target);  // throws out_of_memory before any allocation
  if (!quiet)
    std::fprintf(stderr, "hmoe: %s; %lld of %lld MoE layers resident (%s of experts on the GPU, %s on the CPU)\n", why.c_str(),
                 static_cast<long long>(plan.resident_moe_layers()), static_cast<long long>(plan.moe_layers()),
                 format_bytes(plan.gpu_expert_bytes).c_str(), format_bytes(plan.cpu_expert_bytes).c_str());
  WeightLookup get = [store, source](const std::string& name, const std::vector<int64_t>& shape) {
    if (!store) {  // GGUF / quantized: the source's view, any format (dequantized where it goes to the GPU)
      if (shape.size() == 1) return source->vec(name, shape[0]);
      if (shape.size() != 2) fail(ErrorKind::internal, "GPU weight lookup: tensor '" + name + "' asked with " + std::to_string(shape.size()) + " dims");
      return source->mat(name, shape[0], shape[1]);
    }
    const io::TensorView& t = store->get(name, shape);
    return cpu::Mat{t.dtype, t.data, shape.empty() ? 1 : shape[0], shape.size() > 1 ? shape[1] : 1};
  };
  if (c.arch == Arch::deepseek_v3) {
    auto mla = std::make_unique<GpuMlaStack>(c, plan.resident(), get, pools, parse_mla_mode(s.mla_attention), numa::EngineOptions::from_settings(s),
                                             s.gpu_quantized_experts);
    mla->set_split_inputs(s.gpu_mla_split_inputs);
    if (store && plan.resident_moe_layers() < plan.moe_layers()) mla->enable_expert_streaming(expert_stream_options(c, s, &pools.pool(0), quiet));
    return mla;
  }
  auto stack = std::make_unique<GpuStack>(c, plan.resident(), get, pools, numa::EngineOptions::from_settings(s), s.gpu_quantized_experts);
  stack->set_cuda_graphs(s.cuda_graphs);
  stack->set_cpu_overlap(s.gpu_cpu_overlap);
  stack->set_tiled_attention(s.gpu_tiled_attention);
  // Streaming uploads the CPU experts' bytes as bf16 matrices: plain checkpoints only.
  if (store && plan.resident_moe_layers() < plan.moe_layers()) stack->enable_expert_streaming(expert_stream_options(c, s, &pools.pool(0), quiet));
  if (engram) stack->attach_engram(*engram, get);
  return stack;
}

}  // namespace hmoe
