// The DeepSeek-V3 GPU step (see blocks_gpu_mla.h). Host code only: kernels
// are gpu/mla.cu (MLA, routing) and gpu/*.cu (norms, products, experts).
// Per layer: norm, fused [q_a | kv_a] product, q_a norm + q_b, latent cache
// store (norm + rope), q rope, latent and/or expanded attention, o_proj,
// norm, then the FFN - dense MLP, or router + shared expert + routed experts
// (resident: grouped kernels; else a round trip to the CPU expert engine).
#include "engine/blocks_gpu_mla.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "configs/error.h"
#include "engine/gpu_experts.h"
#include "engine/gpu_upload.h"
#include "engine/kv_storage_gpu.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/mla.h"

namespace hmoe {

namespace {

using gpu::bf16_t;

// Expanded K/V of one step above this many bytes: expanded_prefill attends in the latent space.
constexpr int64_t kMaxExpandBytes = int64_t{1} << 30;


}  // namespace

struct GpuMlaStack::Impl {
  struct LayerW {
    gpu::DeviceBuffer in_norm, post_norm, qkv_a, q_a_norm, q_b, kv_a_norm, kv_b, uk_t, o;
    gpu::DeviceBuffer router, bias, sh_gate_up, sh_down, gate_up, down;  // gate_up/down: dense MLP
    std::unique_ptr<GpuResidentExperts> experts;                         // resident MoE layers
    bool moe = false, resident = false;
    std::vector<numa::ExpertWeights> cpu_experts;
    std::unique_ptr<numa::ExpertEngine> engine;
  };

  const ModelConfig& c;
  MlaMode mode;
  bool split = true;  // split_inputs
  gpu::Stream stream;
  gpu::Blas blas{stream};
  ExpertScratch expert_scratch;  // big passes of the resident layers, shared
  gpu::DeviceBuffer embed, lm_head, final_norm, inv_freq;
  gpu::MlaRopeArgs rope;
  std::vector<LayerW> layers;
  uint64_t weight_bytes = 0;
  gpu::DeviceBuffer x, d, d2, hb, hf, a, qa_b, q, qlat, olat, lat_work, attn, attn_f, exp_lat, exp_kv, gu, act_b, router_l, topk_ids, topk_w, route_off, pair_list,
      moe_act, moe_partial, logits_d, meta;
  gpu::PinnedBuffer meta_h, hf_h, ids_h, w_h, out_h, logits_h;
  std::vector<gpu::Event> events;  // 4 per layer: D2H start/end, H2D start/end
  GpuStepTimes times;
  std::unique_ptr<ExpertStream> xstream;  // streamed non-resident experts for big passes (null: off)

  Impl(const ModelConfig& cfg, MlaMode m) : c(cfg), mode(m) {}
};

GpuMlaStack::GpuMlaStack(const ModelConfig& c, const std::vector<bool>& resident, const WeightLookup& get, numa::NodePools& pools, MlaMode mode,
                         const numa::EngineOptions& experts_opt, bool keep_quantized)
    : impl_(std::make_unique<Impl>(c, mode)) {
  Impl& m = *impl_;
  gpu::Stream& s = m.stream;
  const MlaConfig& ml = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t nope = ml.qk_nope_head_dim, qk = ml.qk_head_dim(), vd = ml.v_head_dim, r = ml.kv_lora_rank, lw = ml.kv_token_floats();
  const int64_t ew = nope + vd;
  if (c.attention_bias) fail(ErrorKind::unsupported, "GPU path: attention_bias=true is not supported");
  if (H % 8 != 0 || I % 8 != 0 || c.intermediate_size % 8 != 0)
    fail(ErrorKind::unsupported, "GPU path: hidden and MLP sizes must be multiples of 8");
  if (r % 8 != 0 || ml.qk_rope_head_dim % 8 != 0 || nope % 8 != 0 || r > 1024 || vd > 128 || qk > 1024)
    fail(ErrorKind::unsupported, "GPU path: kv_lora_rank, qk_rope_head_dim and qk_nope_head_dim must be multiples of 8, kv_lora_rank <= 1024, "
                                 "v_head_dim <= 128 (kv_lora_rank " + std::to_string(r) + ", qk_rope_head_dim " +
                                     std::to_string(ml.qk_rope_head_dim) + ", qk_nope_head_dim " + std::to_string(nope) + ", v_head_dim " +
                                     std::to_string(vd) + ")");
  if (static_cast<int64_t>(resident.size()) != c.num_hidden_layers) fail(ErrorKind::internal, "placement has the wrong number of layers");
  numa::EngineOptions eopt = experts_opt;

  auto mat = [&](const std::string& name, int64_t rows, int64_t cols) { return get(name, {rows, cols}); };
  auto vec = [&](const std::string& name, int64_t n) {
    cpu::Mat t = get(name, {n});
    return cpu::Mat{t.dtype, t.data, 1, n};
  };
  auto up = [&](std::vector<cpu::Mat> parts) {
    auto b = upload_bf16(parts, s);
    m.weight_bytes += b.bytes();
    return b;
  };
  m.embed = up({mat("model.embed_tokens.weight", c.vocab_size, H)});
  m.final_norm = up({vec("model.norm.weight", H)});
  m.lm_head = up({c.tie_word_embeddings ? mat("model.embed_tokens.weight", c.vocab_size, H) : mat("lm_head.weight", c.vocab_size, H)});
  const MlaRope rope(c);
  m.inv_freq = upload(rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float), s);
  m.rope = {m.inv_freq.as<float>(), rope.dim, rope.attention_factor, rope.interleave};

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.", f = p + "mlp.";
    Impl::LayerW w;
    w.in_norm = up({vec(p + "input_layernorm.weight", H)});
    w.post_norm = up({vec(p + "post_attention_layernorm.weight", H)});
    const cpu::Mat kv_a = mat(a + "kv_a_proj_with_mqa.weight", lw, H);
    if (ml.q_lora_rank > 0) {
      w.qkv_a = up({mat(a + "q_a_proj.weight", ml.q_lora_rank, H), kv_a});
      w.q_a_norm = up({vec(a + "q_a_layernorm.weight", ml.q_lora_rank)});
      w.q_b = up({mat(a + "q_b_proj.weight", nh * qk, ml.q_lora_rank)});
    } else {
      w.qkv_a = up({mat(a + "q_proj.weight", nh * qk, H), kv_a});
    }
    w.kv_a_norm = up({vec(a + "kv_a_layernorm.weight", r)});
    const cpu::Mat kv_b = mat(a + "kv_b_proj.weight", nh * ew, r);
    w.kv_b = up({kv_b});
    if (mode != MlaMode::expanded) {  // W_UK^T per head, [heads][r][nope], for the absorbed query
      std::vector<bf16_t> t(static_cast<size_t>(nh * r * nope));
      std::vector<float> row(static_cast<size_t>(r));
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t i = 0; i < nope; ++i) {
          cpu::row_to_f32(kv_b, h * ew + i, row.data());
          for (int64_t j = 0; j < r; ++j) t[static_cast<size_t>((h * r + j) * nope + i)] = f32_to_bf16(row[static_cast<size_t>(j)]);
        }
      w.uk_t = upload(t.data(), t.size() * 2, s);
      m.weight_bytes += w.uk_t.bytes();
    }
    w.o = up({mat(a + "o_proj.weight", H, nh * vd)});
    w.moe = c.is_moe_layer(l);
    if (!w.moe) {
      const int64_t Id = c.intermediate_size;
      w.gate_up = up({mat(f + "gate_proj.weight", Id, H), mat(f + "up_proj.weight", Id, H)});
      w.down = up({mat(f + "down_proj.weight", H, Id)});
      m.layers.push_back(std::move(w));
      continue;
    }
    {  // the router runs in fp32, as in the reference: bf16 rounding flips group-limited top-k choices
      const std::vector<float> gf = mat_f32(mat(f + "gate.weight", E, H));
      w.router = upload(gf.data(), gf.size() * 4, s);
      m.weight_bytes += w.router.bytes();
    }
    {
      const std::vector<float> bf = mat_f32(vec(f + "gate.e_score_correction_bias", E));
      w.bias = upload(bf.data(), bf.size() * 4, s);
    }
    if (ml.n_shared_experts > 0) {
      const int64_t S = I * ml.n_shared_experts;
      const std::string sp = f + "shared_experts.";
      w.sh_gate_up = up({mat(sp + "gate_proj.weight", S, H), mat(sp + "up_proj.weight", S, H)});
      w.sh_down = up({mat(sp + "down_proj.weight", H, S)});
    }
    std::vector<numa::ExpertWeights> ex;
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = f + "experts." + std::to_string(e) + ".";
      ex.push_back({mat(ep + "gate_proj.weight", I, H), mat(ep + "up_proj.weight", I, H), mat(ep + "down_proj.weight", H, I)});
    }
    w.resident = resident[static_cast<size_t>(l)];
    if (w.resident) {
      w.experts = std::make_unique<GpuResidentExperts>(ex, keep_quantized, s, "layer " + std::to_string(l) + " routed experts");
      m.weight_bytes += w.experts->bytes();
    } else {
      w.cpu_experts = std::move(ex);
      eopt.name = "layer " + std::to_string(l) + " routed experts (CPU)";
      w.engine = std::make_unique<numa::ExpertEngine>(w.cpu_experts, pools, eopt);
      eopt.print_memory = false;  // the first hybrid layer speaks for all
    }
    m.layers.push_back(std::move(w));
  }
  for (int64_t i = 0; i < 4 * c.num_hidden_layers; ++i) m.events.emplace_back();
}

GpuMlaStack::~GpuMlaStack() = default;
const GpuStepTimes& GpuMlaStack::times() const { return impl_->times; }
void GpuMlaStack::reset_times() { impl_->times = GpuStepTimes{}; }
void GpuMlaStack::set_split_inputs(bool on) { impl_->split = on; }
const ExpertStream* GpuMlaStack::expert_stream() const { return impl_->xstream.get(); }

void GpuMlaStack::enable_expert_streaming(const ExpertStreamOptions& o) {
  Impl& m = *impl_;
  m.xstream.reset();
  m.xstream = make_expert_stream(m.c, streamed_layers(m.layers), o, m.stream, m.blas);
}
uint64_t GpuMlaStack::weight_bytes() const { return impl_->weight_bytes; }
uint64_t GpuMlaStack::kv_bytes_per_token() const {
  return static_cast<uint64_t>(impl_->c.num_hidden_layers * impl_->c.mla.kv_token_floats()) * 2;
}

void GpuMlaStack::forward(const Batch& b, KvCache& kv, std::vector<float>& logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  const MlaConfig& ml = c.mla;
  gpu::Stream& s = m.stream;
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(b.tokens.size()), mrows = static_cast<int64_t>(b.logit_rows.size());
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, V = c.vocab_size, E = std::max<int64_t>(c.num_experts, 1);
  const int64_t K = c.num_experts_per_tok, I = c.moe_intermediate_size, Id = c.intermediate_size;
  const int64_t S = I * ml.n_shared_experts, F = std::max(Id, S);
  const int64_t nope = ml.qk_nope_head_dim, rd = ml.qk_rope_head_dim, qk = ml.qk_head_dim(), vd = ml.v_head_dim, r = ml.kv_lora_rank;
  const int64_t lw = ml.kv_token_floats(), ew = nope + vd, ql = ml.q_lora_rank;
  const int64_t qa_rows = ql > 0 ? ql : nh * qk, rows_a = qa_rows + lw;
  const float eps = static_cast<float>(c.rms_norm_eps), scale = static_cast<float>(mla_softmax_scale(c));
  if (kv.layout().k_floats() != lw || kv.layout().layers != c.num_hidden_layers)
    fail(ErrorKind::internal, "KV cache layout does not fit multi-head latent attention (build it with Model::kv_layout())");

  // The latent cache lives in the KvCache's GpuKvStorage ([layer][slot][kv_lora + rope] bf16, no values),
  // so prefix sharing, block copies and the pinned host pool move it as on the Qwen3 path.
  GpuKvStorage& kvs = gpu_kv_storage(kv, lw, 0);

  // Sequences of the step: (list offset, context length, tokens in the step).
  struct SeqInfo {
    int32_t off = 0;
    int64_t len = 0, tokens = 0;
  };
  std::map<int, SeqInfo> seqs;
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    auto& e = seqs[sl.seq];
    e.len = std::max(e.len, sl.pos + 1);
    ++e.tokens;
  }
  int64_t list_len = 0;
  for (auto& [seq, e] : seqs) {
    e.off = static_cast<int32_t>(list_len);
    list_len += e.len;
  }
  // Which tokens attend over expanded K/V.
  std::vector<int32_t> expand(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto& e = seqs[b.slots[static_cast<size_t>(i)].seq];
    expand[static_cast<size_t>(i)] = m.mode == MlaMode::expanded || (m.mode == MlaMode::expanded_prefill && e.tokens > 1);
  }
  if (m.mode == MlaMode::expanded_prefill && list_len * nh * ew * 4 > kMaxExpandBytes) std::fill(expand.begin(), expand.end(), 0);
  const int64_t n_expanded = std::count(expand.begin(), expand.end(), 1);
  const bool any_expanded = n_expanded > 0, any_latent = n_expanded < n;

  // Step metadata in one upload: tokens, pos, slot, list offset, length, expand flag, logit rows, slot lists.
  std::vector<int32_t> meta(static_cast<size_t>(6 * n + mrows + list_len));
  int32_t* mt = meta.data();
  for (int64_t i = 0; i < n; ++i) {
    const auto& sl = b.slots[static_cast<size_t>(i)];
    mt[i] = b.tokens[static_cast<size_t>(i)];
    mt[n + i] = static_cast<int32_t>(sl.pos);
    mt[2 * n + i] = static_cast<int32_t>(kv.slot_index(sl.seq, sl.pos));
    mt[3 * n + i] = seqs[sl.seq].off;
    mt[4 * n + i] = static_cast<int32_t>(sl.pos + 1);
    mt[5 * n + i] = expand[static_cast<size_t>(i)];
  }
  for (int64_t r2 = 0; r2 < mrows; ++r2) mt[6 * n + r2] = static_cast<int32_t>(b.logit_rows[static_cast<size_t>(r2)]);
  for (const auto& [seq, e] : seqs)
    for (int64_t p = 0; p < e.len; ++p) mt[6 * n + mrows + e.off + p] = static_cast<int32_t>(kv.slot_index(seq, p));
  const size_t meta_bytes = meta.size() * sizeof(int32_t);
  s.synchronize();  // the previous step no longer reads meta_h
  m.meta_h.reserve(meta_bytes);
  m.meta.reserve(meta_bytes);
  std::memcpy(m.meta_h.as<int32_t>(), meta.data(), meta_bytes);
  gpu::copy_to_device(m.meta.data(), m.meta_h.as<int32_t>(), meta_bytes, s);
  kvs.begin_step(s);  // queued block copies and host-pool restores, before this step's work
  const int32_t* d_tok = m.meta.as<int32_t>();
  const int32_t *d_pos = d_tok + n, *d_slot = d_tok + 2 * n, *d_off = d_tok + 3 * n, *d_len = d_tok + 4 * n, *d_exp = d_tok + 5 * n,
                *d_rows = d_tok + 6 * n, *d_lists = d_tok + 6 * n + mrows;

  auto fit = [](gpu::DeviceBuffer& buf, int64_t bytes) { buf.reserve(static_cast<size_t>(std::max<int64_t>(bytes, 16))); };
  // Split inputs: the products' inputs are [hi; lo] (2n rows) and their outputs 2n rows before the halves are added.
  const int64_t n2 = m.split ? 2 * n : n;
  fit(m.x, n * H * 4);
  fit(m.d, n2 * H * 4);
  fit(m.d2, n * H * 4);
  fit(m.hb, n2 * H * 2);
  fit(m.hf, n * H * 4);
  fit(m.a, n2 * rows_a * 4);
  fit(m.qa_b, n2 * std::max<int64_t>(ql, 1) * 2);
  fit(m.q, n2 * nh * qk * 4);
  fit(m.qlat, n * nh * r * 4);
  fit(m.olat, n * nh * r * 4);
  if (any_latent) fit(m.lat_work, gpu::mla_attention_latent_workspace(n, nh, r, rd) * 4);
  fit(m.attn, n2 * nh * vd * 2);
  if (m.split) fit(m.attn_f, n * nh * vd * 4);
  if (any_expanded) {
    fit(m.exp_lat, list_len * r * 2);
    fit(m.exp_kv, list_len * nh * ew * 4);
  }
  fit(m.gu, n * 2 * F * 4);
  fit(m.act_b, n2 * F * 2);
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
  float* d2 = m.d2.as<float>();
  bf16_t* hb = m.hb.as<bf16_t>();
  float* a = m.a.as<float>();
  double cpu_s = 0;
  std::vector<int64_t> hybrid_layers;
  // y[n, rows] = x W^T for a split input: x is [hi; lo] (2n rows), y has room for 2n rows.
  auto gemm_in = [&](const bf16_t* x_in, const gpu::DeviceBuffer& w, int64_t rows, int64_t cols, float* y) {
    m.blas.gemm(x_in, n2, w.as<bf16_t>(), rows, cols, y, rows);
    if (m.split) gpu::add(y, y + n * rows, n * rows, y, s);
  };
  // SwiGLU MLP on hb: gate_up [2F', H], down [H, F'] -> out; split_down: the
  // down product's input is split (dense layers; out has room for 2n rows).
  auto mlp = [&](const gpu::DeviceBuffer& gate_up, const gpu::DeviceBuffer& down, int64_t inter, float* out, bool split_down) {
    m.blas.gemm(hb, n, gate_up.as<bf16_t>(), 2 * inter, H, m.gu.as<float>(), 2 * inter);
    bf16_t* act = m.act_b.as<bf16_t>();
    gpu::silu_mul(m.gu.as<float>(), n, inter, act, split_down && m.split ? act + n * inter : nullptr, s);
    if (split_down) gemm_in(act, down, H, inter, out);
    else m.blas.gemm(act, n, down.as<bf16_t>(), H, inter, out, H);
  };

  // Passes of >= the prefill minimum stream the non-resident layers' experts to the GPU (no CPU experts).
  const bool stream_pass = m.xstream && m.xstream->wants(n);
  if (stream_pass) m.xstream->begin(n);  // the first window's copies start now
  gpu::embedding(m.embed.as<bf16_t>(), d_tok, n, H, x, s);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    Impl::LayerW& w = m.layers[l];
    bf16_t* cache = kvs.keys(static_cast<int64_t>(l));
    gpu::add_rms_norm(x, l > 0 ? d : nullptr, nullptr, n, H, w.in_norm.as<bf16_t>(), eps, hb, m.split ? m.hf.as<float>() : nullptr, s);
    if (m.split) gpu::split_bf16(m.hf.as<float>(), n * H, hb, hb + n * H, s);
    gemm_in(hb, w.qkv_a, rows_a, H, a);
    float* q = a;
    int64_t ldq = rows_a;
    if (ql > 0) {
      bf16_t* qa_b = m.qa_b.as<bf16_t>();
      gpu::rms_norm_rows(a, rows_a, n, ql, w.q_a_norm.as<bf16_t>(), eps, qa_b, m.split ? qa_b + n * ql : nullptr, s);
      q = m.q.as<float>();
      ldq = nh * qk;
      gemm_in(qa_b, w.q_b, nh * qk, ql, q);
    }
    gpu::mla_kv_store(a + qa_rows, rows_a, n, r, w.kv_a_norm.as<bf16_t>(), eps, m.rope, d_pos, d_slot, cache, s);
    gpu::mla_rope(q + nope, ldq, qk, n, nh, m.rope, d_pos, s);
    if (any_latent) {
      gpu::head_matmul(q, ldq, qk, n, nh, nope, r, w.uk_t.as<bf16_t>(), r * nope, m.qlat.as<float>(), nullptr, nh * r, r, s);
      gpu::mla_attention_latent(m.qlat.as<float>(), q + nope, ldq, qk, n, nh, r, rd, cache, d_lists, d_off, d_len, any_expanded ? d_exp : nullptr,
                                scale, m.olat.as<float>(), m.lat_work.as<float>(), s);
      gpu::head_matmul(m.olat.as<float>(), nh * r, r, n, nh, r, vd, w.kv_b.as<bf16_t>() + nope * r, ew * r, m.split ? m.attn_f.as<float>() : nullptr,
                       m.split ? nullptr : m.attn.as<bf16_t>(), nh * vd, vd, s);
      if (m.split) gpu::split_bf16(m.attn_f.as<float>(), n * nh * vd, m.attn.as<bf16_t>(), m.attn.as<bf16_t>() + n * nh * vd, s);
    }
    if (any_expanded) {
      gpu::gather_rows(cache, lw, d_lists, list_len, r, m.exp_lat.as<bf16_t>(), s);
      m.blas.gemm(m.exp_lat.as<bf16_t>(), list_len, w.kv_b.as<bf16_t>(), nh * ew, r, m.exp_kv.as<float>(), nh * ew);
      gpu::mla_attention_expanded(q, ldq, n, nh, nope, rd, vd, m.exp_kv.as<float>(), cache, lw, r, d_lists, d_off, d_len,
                                  any_latent ? d_exp : nullptr, scale, m.attn.as<bf16_t>(), m.split ? m.attn.as<bf16_t>() + n * nh * vd : nullptr, s);
    }
    gemm_in(m.attn.as<bf16_t>(), w.o, H, nh * vd, d);
    gpu::add_rms_norm(x, d, nullptr, n, H, w.post_norm.as<bf16_t>(), eps, hb, w.moe ? m.hf.as<float>() : nullptr, s);
    if (!w.moe) {
      mlp(w.gate_up, w.down, Id, d, true);
      continue;
    }
    m.blas.gemm_f32(m.hf.as<float>(), n, w.router.as<float>(), E, H, m.router_l.as<float>(), E);
    gpu::deepseek_topk(m.router_l.as<float>(), w.bias.as<float>(), n, E, K, ml.n_group, ml.topk_group, c.norm_topk_prob,
                       static_cast<float>(ml.routed_scaling_factor), m.topk_ids.as<int32_t>(), m.topk_w.as<float>(), s);
    if (w.resident) {
      if (S > 0) mlp(w.sh_gate_up, w.sh_down, S, d2, false);
      gpu::moe_route(m.topk_ids.as<int32_t>(), n * K, E, m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(), s);
      w.experts->run(hb, n, K, m.topk_ids.as<int32_t>(), m.topk_w.as<float>(), m.route_off.as<int32_t>(), m.pair_list.as<int32_t>(),
                     m.moe_act.as<bf16_t>(), m.moe_partial.as<float>(), d, m.blas, m.expert_scratch, s);
      if (S > 0) gpu::add(d, d2, n * H, d, s);
      continue;
    }
    if (stream_pass) {
      if (S > 0) mlp(w.sh_gate_up, w.sh_down, S, d2, false);
      m.xstream->layer(static_cast<int64_t>(l), hb, n, m.topk_ids.as<int32_t>(), m.topk_w.as<float>(), d);
      if (S > 0) gpu::add(d, d2, n * H, d, s);
      continue;
    }
    // Hybrid layer: normed hidden (fp32) and routing down; the GPU runs the
    // shared expert while the CPU runs the routed ones; their sum comes back.
    m.hf_h.reserve(static_cast<size_t>(n * H * 4));
    m.out_h.reserve(static_cast<size_t>(n * H * 4));
    m.ids_h.reserve(static_cast<size_t>(n * K * 4));
    m.w_h.reserve(static_cast<size_t>(n * K * 4));
    gpu::Event* ev = &m.events[4 * l];
    ev[0].record(s);
    gpu::copy_to_host(m.hf_h.as<float>(), m.hf.as<float>(), static_cast<size_t>(n * H * 4), s);
    gpu::copy_to_host(m.ids_h.as<int32_t>(), m.topk_ids.as<int32_t>(), static_cast<size_t>(n * K * 4), s);
    gpu::copy_to_host(m.w_h.as<float>(), m.topk_w.as<float>(), static_cast<size_t>(n * K * 4), s);
    ev[1].record(s);
    if (S > 0) mlp(w.sh_gate_up, w.sh_down, S, d2, false);
    ev[1].synchronize();
    const auto c0 = std::chrono::steady_clock::now();
    float* out = m.out_h.as<float>();
    std::memset(out, 0, static_cast<size_t>(n * H * 4));
    w.engine->forward(m.hf_h.as<float>(), n, m.ids_h.as<int32_t>(), m.w_h.as<float>(), K, out);
    cpu_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    ev[2].record(s);
    gpu::copy_to_device(d, out, static_cast<size_t>(n * H * 4), s);
    ev[3].record(s);
    if (S > 0) gpu::add(d, d2, n * H, d, s);
    hybrid_layers.push_back(static_cast<int64_t>(l));
  }
  gpu::add(x, d, n * H, x, s);
  gpu::add_rms_norm(x, nullptr, d_rows, mrows, H, m.final_norm.as<bf16_t>(), eps, hb, nullptr, s);
  m.blas.gemm(hb, mrows, m.lm_head.as<bf16_t>(), V, H, m.logits_d.as<float>(), V);
  m.logits_h.reserve(static_cast<size_t>(std::max<int64_t>(mrows * V * 4, 16)));
  gpu::copy_to_host(m.logits_h.as<float>(), m.logits_d.as<float>(), static_cast<size_t>(mrows * V * 4), s);
  s.synchronize();
  if (stream_pass) m.xstream->end();
  kvs.end_step();
  logits.assign(m.logits_h.as<float>(), m.logits_h.as<float>() + mrows * V);

  double transfer_s = 0;
  for (int64_t l : hybrid_layers) {
    gpu::Event* ev = &m.events[4 * static_cast<size_t>(l)];
    transfer_s += (ev[1].elapsed_ms(ev[0]) + ev[3].elapsed_ms(ev[2])) * 1e-3;
  }
  m.times.total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  m.times.cpu_experts_s += cpu_s;
  m.times.transfer_s += transfer_s;
  m.times.steps += 1;
}

}  // namespace hmoe
