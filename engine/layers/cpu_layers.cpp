// Qwen3-style blocks: GQA attention with per-head q/k RMSNorm and rotary
// embeddings, routed experts with softmax top-k, dense SwiGLU MLP.
#include "engine/layers/cpu_layers.h"
#include "engine/layers/routed_experts.h"

#include <cmath>

#include "configs/error.h"

namespace hmoe {

cpu::GemmOptions gemm_options(const Settings& s) {
  cpu::GemmOptions o;
  o.round_bf16 = s.cpu_emulate_gpu_bf16;
  o.split_inputs = s.gpu_mla_split_inputs;
  o.hybrid_precise = s.gpu_hybrid_precise;
  o.gguf_int8 = s.cpu_gguf_int8;
  o.amx_min_tokens = s.cpu_amx_min_tokens;
  return o;
}

void Workspace::resize(int64_t n, const ModelConfig& c) {
  auto fit = [](auto& v, int64_t size) {
    if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
  };
  fit(hidden, n * c.hidden_size);
  fit(normed, n * c.hidden_size);
  fit(block_out, n * c.hidden_size);
  fit(q, n * c.num_attention_heads * c.head_dim);
  fit(attn, n * c.num_attention_heads * c.head_dim);
  fit(k, n * c.num_key_value_heads * c.head_dim);
  fit(v, n * c.num_key_value_heads * c.head_dim);
  fit(router, n * std::max<int64_t>(c.num_experts, 1));
  fit(topk_ids, n * c.num_experts_per_tok);
  fit(topk_w, n * c.num_experts_per_tok);
}

namespace {

class GqaAttention : public AttentionBlock {
 public:
  GqaAttention(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& p, numa::ThreadPool& pool, const cpu::GemmOptions& gemm)
      : c_(c), layer_(layer), pool_(pool), gemm_(gemm), rope_(c.head_dim, c.rope_theta) {
    const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
    if (c.attention_bias) fail(ErrorKind::unsupported, "attention_bias=true is not supported yet");
    wq_ = bind.mat(p + "q_proj.weight", nh * hd, H);
    wk_ = bind.mat(p + "k_proj.weight", kvh * hd, H);
    wv_ = bind.mat(p + "v_proj.weight", kvh * hd, H);
    wo_ = bind.mat(p + "o_proj.weight", H, nh * hd);
    q_norm_ = bind.vec(p + "q_norm.weight", hd);
    k_norm_ = bind.vec(p + "k_norm.weight", hd);
  }

  void forward(const float* x, int64_t n, const ops::TokenSlot* slots, KvCache& kv, float* out, Workspace& ws) override {
    const int64_t nh = c_.num_attention_heads, kvh = c_.num_key_value_heads, hd = c_.head_dim;
    float* q = ws.q.data();
    float* k = ws.k.data();
    float* v = ws.v.data();
    cpu::gemm(x, n, wq_, q, &pool_, gemm_);
    cpu::gemm(x, n, wk_, k, &pool_, gemm_);
    cpu::gemm(x, n, wv_, v, &pool_, gemm_);
    // Norms, rotary and cache writes per token, split over the pool for prompt
    // chunks (each token writes only its own cache row).
    auto per_token = [&](int64_t b, int64_t e, int) {
      ops::rms_norm(q + b * nh * hd, (e - b) * nh, hd, q_norm_, c_.rms_norm_eps, q + b * nh * hd);
      ops::rms_norm(k + b * kvh * hd, (e - b) * kvh, hd, k_norm_, c_.rms_norm_eps, k + b * kvh * hd);
      for (int64_t t = b; t < e; ++t) {
        rope_.apply(q + t * nh * hd, nh, slots[t].pos);
        rope_.apply(k + t * kvh * hd, kvh, slots[t].pos);
        kv.store(layer_, slots[t].seq, slots[t].pos, k + t * kvh * hd, v + t * kvh * hd);
      }
    };
    if (n >= 64) pool_.parallel_for(n, per_token, 8);
    else per_token(0, n, 0);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    // Prompt runs as blocked matrix products; each token's bits are those of
    // ops::attention (batch invariance, tests/server).
    ops::attention_prefill(q, n, nh, kvh, hd, slots, kv, layer_, scale, ws.attn.data(), &pool_);
    cpu::gemm(ws.attn.data(), n, wo_, out, &pool_, gemm_);
  }

 private:
  const ModelConfig& c_;
  int64_t layer_;
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  ops::Rope rope_;
  cpu::Mat wq_, wk_, wv_, wo_, q_norm_, k_norm_;
};

class MoeBlock : public FfnBlock {
 public:
  MoeBlock(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& p, numa::NodePools& pools, ExpertHomeOptions& opt,
           const cpu::GemmOptions& gemm)
      : c_(c), pool_(pools.pool(0)), gemm_(gemm) {
    router_ = bind.mat(p + "gate.weight", c.num_experts, c.hidden_size);
    experts_ = std::make_unique<RoutedExperts>(bind, c, layer, p, RoutedExperts::Home::host, pools, opt);
  }
  bool is_moe() const override { return true; }

  void forward(const float* x, int64_t n, float* out, Workspace& ws) override {
    const int64_t E = c_.num_experts, K = c_.num_experts_per_tok;
    cpu::gemm(x, n, router_, ws.router.data(), &pool_, gemm_);
    auto route = [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t)
        ops::softmax_topk(ws.router.data() + t * E, E, K, c_.norm_topk_prob, ws.topk_ids.data() + t * K, ws.topk_w.data() + t * K);
      std::fill(out + b * c_.hidden_size, out + e * c_.hidden_size, 0.0f);
    };
    if (n >= 64) pool_.parallel_for(n, route, 8);
    else route(0, n, 0);
    experts_->run_host(x, n, ws.topk_ids.data(), ws.topk_w.data(), K, out);
  }

 private:
  const ModelConfig& c_;
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  cpu::Mat router_;
  std::unique_ptr<RoutedExperts> experts_;
};

class DenseMlp : public FfnBlock {
 public:
  DenseMlp(WeightBinder& bind, int64_t H, int64_t I, const std::string& p, numa::ThreadPool& pool, const cpu::GemmOptions& gemm)
      : pool_(pool), gemm_(gemm) {
    w_ = {bind.mat(p + "gate_proj.weight", I, H), bind.mat(p + "up_proj.weight", I, H), bind.mat(p + "down_proj.weight", H, I)};
  }
  bool is_moe() const override { return false; }
  void forward(const float* x, int64_t n, float* out, Workspace&) override { numa::mlp_forward(x, n, w_, out, &pool_, gemm_); }

 private:
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  numa::ExpertWeights w_;
};

}  // namespace

std::unique_ptr<AttentionBlock> make_gqa_attention(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix,
                                                   numa::ThreadPool& pool, const cpu::GemmOptions& gemm) {
  return std::make_unique<GqaAttention>(bind, c, layer, prefix, pool, gemm);
}
std::unique_ptr<FfnBlock> make_moe_block(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix, numa::NodePools& pools,
                                         ExpertHomeOptions& opt, const cpu::GemmOptions& gemm) {
  return std::make_unique<MoeBlock>(bind, c, layer, prefix, pools, opt, gemm);
}
std::unique_ptr<FfnBlock> make_dense_mlp(WeightBinder& bind, int64_t hidden, int64_t intermediate, const std::string& prefix,
                                         numa::ThreadPool& pool, const cpu::GemmOptions& gemm) {
  return std::make_unique<DenseMlp>(bind, hidden, intermediate, prefix, pool, gemm);
}

}  // namespace hmoe
