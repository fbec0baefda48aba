// Qwen3-Next's gated full attention, MoE with a gated shared expert and
// zero-centred norms on the CPU (see hybrid_blocks.h).
#include "engine/layers/hybrid_blocks.h"

#include <cmath>

#include "configs/error.h"
#include "numa/kernels.h"

namespace hmoe {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The options of the products whose input the GPU splits in its precise mode.
cpu::GemmOptions split_options(const cpu::GemmOptions& g) {
  cpu::GemmOptions o = g;
  o.split_inputs = g.hybrid_precise;
  return o;
}
// x, or a copy rounded to bf16 where the GPU's bf16 mode rounds a router's input.
const float* router_input(const float* x, int64_t count, const cpu::GemmOptions& g, std::vector<float>& tmp) {
  if (!g.round_bf16 || g.hybrid_precise) return x;
  tmp.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tmp[static_cast<size_t>(i)] = cpu::round_bf16(x[i]);
  return tmp.data();
}

class GatedAttention : public AttentionBlock {
 public:
  GatedAttention(WeightBinder& bind, const ModelConfig& c, int64_t kv_layer, const std::string& p, numa::ThreadPool& pool,
                 const cpu::GemmOptions& gemm)
      : c_(c),
        kv_layer_(kv_layer),
        pool_(pool),
        gemm_(gemm),
        split_(split_options(gemm)),
        rot_(static_cast<int64_t>(static_cast<double>(c.head_dim) * c.hybrid.partial_rotary_factor)),
        rope_(rot_, c.rope_theta) {
    const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
    if (c.attention_bias) fail(ErrorKind::unsupported, "attention_bias=true is not supported yet");
    wq_ = bind.mat(p + "q_proj.weight", 2 * nh * hd, H);
    wk_ = bind.mat(p + "k_proj.weight", kvh * hd, H);
    wv_ = bind.mat(p + "v_proj.weight", kvh * hd, H);
    wo_ = bind.mat(p + "o_proj.weight", H, nh * hd);
    q_norm_ = norms_.bind(bind, p + "q_norm.weight", hd, true);
    k_norm_ = norms_.bind(bind, p + "k_norm.weight", hd, true);
  }

  void forward(const float* x, int64_t n, const ops::TokenSlot* slots, KvCache& kv, float* out, Workspace& ws) override {
    const int64_t nh = c_.num_attention_heads, kvh = c_.num_key_value_heads, hd = c_.head_dim;
    qg_.resize(static_cast<size_t>(n * 2 * nh * hd));
    gate_.resize(static_cast<size_t>(n * nh * hd));
    float* q = ws.q.data();
    float* k = ws.k.data();
    float* v = ws.v.data();
    cpu::gemm_split_input(x, n, wq_, qg_.data(), &pool_, split_);
    cpu::gemm_split_input(x, n, wk_, k, &pool_, split_);
    cpu::gemm_split_input(x, n, wv_, v, &pool_, split_);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const float* src = qg_.data() + (t * nh + h) * 2 * hd;
        std::copy(src, src + hd, q + (t * nh + h) * hd);
        std::copy(src + hd, src + 2 * hd, gate_.data() + (t * nh + h) * hd);
      }
    ops::rms_norm(q, n * nh, hd, q_norm_, c_.rms_norm_eps, q);
    ops::rms_norm(k, n * kvh, hd, k_norm_, c_.rms_norm_eps, k);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < nh; ++h) rope_.apply(q + (t * nh + h) * hd, 1, slots[t].pos);
      for (int64_t h = 0; h < kvh; ++h) rope_.apply(k + (t * kvh + h) * hd, 1, slots[t].pos);
      kv.store(kv_layer_, slots[t].seq, slots[t].pos, k + t * kvh * hd, v + t * kvh * hd);
    }
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    float* attn = ws.attn.data();
    ops::attention(q, n, nh, kvh, hd, slots, kv, kv_layer_, scale, attn, &pool_);
    if (gemm_.round_bf16)  // the GPU's attention output is bf16 before the gate
      for (int64_t i = 0; i < n * nh * hd; ++i) attn[i] = cpu::round_bf16(attn[i]);
    for (int64_t i = 0; i < n * nh * hd; ++i) attn[i] *= sigmoid(gate_[static_cast<size_t>(i)]);
    cpu::gemm_split_input(attn, n, wo_, out, &pool_, split_);
  }

 private:
  const ModelConfig& c_;
  int64_t kv_layer_;
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  cpu::GemmOptions split_;  // q/k/v and o_proj: hi + lo inputs in the precise mode
  int64_t rot_;
  ops::Rope rope_;  // over the first rot_ dimensions of each head
  NormStore norms_;
  cpu::Mat wq_, wk_, wv_, wo_, q_norm_, k_norm_;
  std::vector<float> qg_, gate_;
};

class SharedGatedMoe : public FfnBlock {
 public:
  SharedGatedMoe(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& p, int64_t shared_inter, numa::NodePools& pools,
                 ExpertHomeOptions& opt, const cpu::GemmOptions& gemm)
      : c_(c), pool_(pools.pool(0)), gemm_(gemm) {
    const int64_t H = c.hidden_size;
    router_ = bind.mat(p + "gate.weight", c.num_experts, H);
    experts_ = std::make_unique<RoutedExperts>(bind, c, layer, p, RoutedExperts::Home::host, pools, opt);
    if (shared_inter > 0) {
      const std::string sp = p + "shared_expert.";
      shared_ = {bind.mat(sp + "gate_proj.weight", shared_inter, H), bind.mat(sp + "up_proj.weight", shared_inter, H),
                 bind.mat(sp + "down_proj.weight", H, shared_inter)};
      shared_gate_ = bind.mat(p + "shared_expert_gate.weight", 1, H);
      has_shared_ = true;
    }
  }
  bool is_moe() const override { return true; }

  void forward(const float* x, int64_t n, float* out, Workspace& ws) override {
    const int64_t E = c_.num_experts, K = c_.num_experts_per_tok, H = c_.hidden_size;
    const float* xr = router_input(x, n * H, gemm_, xr_);
    cpu::gemm_exact(xr, n, router_, ws.router.data(), &pool_);
    for (int64_t t = 0; t < n; ++t)
      ops::softmax_topk(ws.router.data() + t * E, E, K, c_.norm_topk_prob, ws.topk_ids.data() + t * K, ws.topk_w.data() + t * K);
    std::fill(out, out + n * H, 0.0f);
    experts_->run_host(x, n, ws.topk_ids.data(), ws.topk_w.data(), K, out);
    if (!has_shared_) return;
    shared_out_.assign(static_cast<size_t>(n * H), 0.0f);
    gate_.resize(static_cast<size_t>(n));
    numa::mlp_forward(x, n, shared_, shared_out_.data(), &pool_, gemm_);
    cpu::gemm_exact(xr, n, shared_gate_, gate_.data(), &pool_);
    for (int64_t t = 0; t < n; ++t) {
      const float s = sigmoid(gate_[static_cast<size_t>(t)]);
      for (int64_t i = 0; i < H; ++i) out[t * H + i] += s * shared_out_[static_cast<size_t>(t * H + i)];
    }
  }

 private:
  const ModelConfig& c_;
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  cpu::Mat router_, shared_gate_;
  std::unique_ptr<RoutedExperts> experts_;
  numa::ExpertWeights shared_;
  bool has_shared_ = false;
  std::vector<float> shared_out_, gate_, xr_;
};

}  // namespace

cpu::Mat NormStore::bind(WeightBinder& b, const std::string& name, int64_t n, bool zero_centred, bool round_bf16) {
  const cpu::Mat w = b.vec(name, n);
  if (!zero_centred) return w;
  auto f = std::make_unique<std::vector<float>>(static_cast<size_t>(n));
  cpu::to_f32(w.dtype, w.data, f->data(), n);
  for (float& x : *f) x = round_bf16 ? cpu::round_bf16(1.0f + x) : 1.0f + x;
  const cpu::Mat m{DType::f32, f->data(), 1, n};
  owned_.push_back(std::move(f));
  return m;
}

std::unique_ptr<AttentionBlock> make_gated_attention(WeightBinder& bind, const ModelConfig& c, int64_t kv_layer, const std::string& prefix,
                                                     numa::ThreadPool& pool, const cpu::GemmOptions& gemm) {
  return std::make_unique<GatedAttention>(bind, c, kv_layer, prefix, pool, gemm);
}

std::unique_ptr<FfnBlock> make_shared_gated_moe(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix,
                                                int64_t shared_inter, numa::NodePools& pools, ExpertHomeOptions& opt,
                                                const cpu::GemmOptions& gemm) {
  return std::make_unique<SharedGatedMoe>(bind, c, layer, prefix, shared_inter, pools, opt, gemm);
}

}  // namespace hmoe
