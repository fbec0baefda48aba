// The CPU step executor (see cpu_runtime.h).
#include "engine/runtime/cpu_runtime.h"

#include "configs/error.h"
#include "engine/layers/deepseek_moe.h"
#include "engine/layers/engram.h"
#include "engine/layers/expert_deferral.h"
#include "engine/layers/gated_deltanet.h"

namespace hmoe {

CpuRuntimeOptions CpuRuntimeOptions::from_settings(const Settings& s) {
  CpuRuntimeOptions o;
  o.experts.engine = numa::EngineOptions::from_settings(s);
  o.mla_mode = parse_mla_mode(s.mla_attention);
  o.gemm = gemm_options(s);
  o.defer_experts = s.defer_experts;
  return o;
}

CpuRuntime::CpuRuntime(const ModelConfig& c, const ModelGraph& g, WeightBinder& bind, numa::NodePools& pools, const CpuRuntimeOptions& o,
                       EngramModules* engram)
    : c_(c), pool_(pools.pool(0)), engram_(engram), gemm_(o.gemm) {
  const int64_t H = c.hidden_size;
  const bool round_norms = o.gemm.round_bf16 && !o.gemm.hybrid_precise;  // emulating the GPU's bf16 (1 + w)
  embed_ = bind.mat(g.embed, c.vocab_size, H);
  final_norm_ = norms_.bind(bind, g.final_norm, H, g.zero_centred_norms, round_norms);
  lm_head_ = g.lm_head == g.embed ? embed_ : bind.mat(g.lm_head, c.vocab_size, H);
  ExpertHomeOptions homes = o.experts;
  // Deferred experts run in the step's thread here (the pools are the attention's too): the semantics, no overlap.
  if (o.defer_experts > 0) deferral_ = std::make_unique<ExpertDeferral>(o.defer_experts, H, false);
  homes.deferral = deferral_.get();
  for (const BlockDesc& d : g.blocks) blocks_.push_back(make_block(d, g, bind, pools, homes, o));
  for (size_t l = 0; l < blocks_.size(); ++l) may_defer_.push_back(blocks_[l].ffn->is_moe() && l + 1 < blocks_.size() && blocks_[l + 1].ffn->is_moe());
  if (g.mtp && g.mtp->block.kv_layer >= 0) {
    mtp_ = std::make_unique<Mtp>();
    mtp_->fc = bind.mat(g.mtp->fc, H, 2 * H);
    mtp_->norm_embedding = norms_.bind(bind, g.mtp->norm_embedding, H, g.zero_centred_norms, round_norms);
    mtp_->norm_hidden = norms_.bind(bind, g.mtp->norm_hidden, H, g.zero_centred_norms, round_norms);
    mtp_->final_norm = norms_.bind(bind, g.mtp->final_norm, H, g.zero_centred_norms, round_norms);
    ExpertHomeOptions own = o.experts;  // not deferred, not traced: the head is no layer of the model
    own.deferral = nullptr;
    own.trace = nullptr;
    mtp_->block = make_block(g.mtp->block, g, bind, pools, own, o);
  }
}

CpuRuntime::Block CpuRuntime::make_block(const BlockDesc& d, const ModelGraph& g, WeightBinder& bind, numa::NodePools& pools,
                                         ExpertHomeOptions& homes, const CpuRuntimeOptions& o) {
  const ModelConfig& c = c_;
  const int64_t H = c.hidden_size;
  const bool round_norms = o.gemm.round_bf16 && !o.gemm.hybrid_precise;
  Block b;
  b.input_norm = norms_.bind(bind, d.input_norm, H, g.zero_centred_norms, round_norms);
  b.post_norm = norms_.bind(bind, d.post_norm, H, g.zero_centred_norms, round_norms);
  const int64_t kv_layer = d.kv_layer >= 0 ? d.kv_layer : d.layer;
  switch (d.attention) {
    case AttentionKind::gqa: b.attn = make_gqa_attention(bind, c, kv_layer, d.attention_prefix, pool_, o.gemm); break;
    case AttentionKind::mla: b.attn = make_mla_attention(bind_mla_weights(bind, c, d.attention_prefix), c, kv_layer, pool_, o.mla_mode, o.gemm); break;
    case AttentionKind::gated_gqa: b.attn = make_gated_attention(bind, c, kv_layer, d.attention_prefix, pool_, o.gemm); break;
    case AttentionKind::gated_deltanet: b.attn = make_gated_deltanet(bind, c, d.state_index, d.attention_prefix, pool_, o.gemm); break;
  }
  if (!d.ffn.moe) b.ffn = make_dense_mlp(bind, H, d.ffn.inter, d.ffn.prefix, pool_, o.gemm);
  else if (d.ffn.shared_gate) b.ffn = make_shared_gated_moe(bind, c, d.layer, d.ffn.prefix, d.ffn.shared_inter, pools, homes, o.gemm);
  else if (d.ffn.router == RouterKind::deepseek_grouped) b.ffn = make_deepseek_moe(bind, c, d.layer, d.ffn.prefix, pools, homes, o.gemm);
  else b.ffn = make_moe_block(bind, c, d.layer, d.ffn.prefix, pools, homes, o.gemm);
  return b;
}

CpuRuntime::~CpuRuntime() = default;

void CpuRuntime::forward(const Batch& b, KvCache& kv, std::vector<float>& logits) {
  const int64_t n = static_cast<int64_t>(b.tokens.size()), H = c_.hidden_size;
  ws_.resize(n, c_);
  float* x = ws_.hidden.data();
  // Row-wise work of a prompt chunk (embedding, norms, residual adds) split over the pool.
  auto rows = [&](int64_t count, const auto& fn) {
    if (count >= 64) pool_.parallel_for(count, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); }, 8);
    else fn(0, count);
  };
  rows(n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) cpu::row_to_f32(embed_, b.tokens[static_cast<size_t>(i)], x + i * H);
  });
  if (engram_) engram_->begin_step(b, kv);  // starts the PLE row reads for every module
  if (deferral_) deferral_->begin_step(may_defer_);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    if (engram_)
      if (int em = engram_->module_before(static_cast<int64_t>(l)); em >= 0) engram_->apply(em, x, b, kv);
    run_block(blocks_[l], n, b.slots.data(), kv);
  }
  if (deferral_) deferral_->end_step();
  if (mtp_) {
    hidden_.resize(static_cast<size_t>(n * H));
    rows(n, [&](int64_t r0, int64_t r1) { ops::rms_norm(x + r0 * H, r1 - r0, H, final_norm_, c_.rms_norm_eps, hidden_.data() + r0 * H); });
  }
  const int64_t m = static_cast<int64_t>(b.logit_rows.size());
  std::vector<float> last(static_cast<size_t>(m * H));
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + b.logit_rows[static_cast<size_t>(i)] * H;
    std::copy(src, src + H, last.begin() + i * H);
  }
  ops::rms_norm(last.data(), m, H, final_norm_, c_.rms_norm_eps, last.data());
  logits.resize(static_cast<size_t>(m * c_.vocab_size));
  cpu::gemm(last.data(), m, lm_head_, logits.data(), &pool_, gemm_);
}

void CpuRuntime::run_block(Block& blk, int64_t n, const ops::TokenSlot* slots, KvCache& kv) {
  const int64_t H = c_.hidden_size;
  float* x = ws_.hidden.data();
  float* h = ws_.normed.data();
  float* o = ws_.block_out.data();
  auto rows = [&](int64_t count, const auto& fn) {
    if (count >= 64) pool_.parallel_for(count, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); }, 8);
    else fn(0, count);
  };
  rows(n, [&](int64_t r0, int64_t r1) { ops::rms_norm(x + r0 * H, r1 - r0, H, blk.input_norm, c_.rms_norm_eps, h + r0 * H); });
  blk.attn->forward(h, n, slots, kv, o, ws_);
  rows(n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * H; i < r1 * H; ++i) x[i] += o[i];
    ops::rms_norm(x + r0 * H, r1 - r0, H, blk.post_norm, c_.rms_norm_eps, h + r0 * H);
  });
  blk.ffn->forward(h, n, o, ws_);
  rows(n, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * H; i < r1 * H; ++i) x[i] += o[i];
  });
}

void CpuRuntime::forward_mtp(const Batch& b, const float* hidden_in, KvCache& kv, std::vector<float>& logits, std::vector<float>& hidden_out) {
  if (!mtp_) fail(ErrorKind::internal, "forward_mtp without an MTP head");
  const int64_t n = static_cast<int64_t>(b.tokens.size()), H = c_.hidden_size;
  ws_.resize(n, c_);
  mtp_in_.resize(static_cast<size_t>(n * 2 * H));
  float* e = mtp_in_.data();
  for (int64_t i = 0; i < n; ++i) {
    cpu::row_to_f32(embed_, b.tokens[static_cast<size_t>(i)], e + i * 2 * H);
    ops::rms_norm(e + i * 2 * H, 1, H, mtp_->norm_embedding, c_.rms_norm_eps, e + i * 2 * H);
    ops::rms_norm(hidden_in + i * H, 1, H, mtp_->norm_hidden, c_.rms_norm_eps, e + i * 2 * H + H);
  }
  cpu::gemm(e, n, mtp_->fc, ws_.hidden.data(), &pool_, gemm_);
  run_block(mtp_->block, n, b.slots.data(), kv);
  const int64_t m = static_cast<int64_t>(b.logit_rows.size());
  hidden_out.resize(static_cast<size_t>(m * H));
  for (int64_t i = 0; i < m; ++i)
    ops::rms_norm(ws_.hidden.data() + b.logit_rows[static_cast<size_t>(i)] * H, 1, H, mtp_->final_norm, c_.rms_norm_eps, hidden_out.data() + i * H);
  logits.resize(static_cast<size_t>(m * c_.vocab_size));
  cpu::gemm(hidden_out.data(), m, lm_head_, logits.data(), &pool_, gemm_);
}

}  // namespace hmoe
