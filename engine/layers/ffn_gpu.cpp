// Feed-forward layers on the GPU: the dense SwiGLU MLP, and the MoE layer
// (router, optional shared expert, routed experts in their home).
#include <algorithm>

#include "configs/error.h"
#include "engine/layers/gpu_factories.h"
#include "gpu/decode_fused.h"
#include "gpu/deltanet.h"
#include "gpu/mla.h"

namespace hmoe {

namespace {

using gpu::bf16_t;

// SwiGLU on rows: gate_up [2I, H], down [H, I], as GpuDense (bf16, or GGUF
// blocks as stored: Q4_K..Q8_0 and the low-bit types of the dynamic quants,
// when the uploader keeps them). split_down: the down product's input is a
// bf16 hi + lo pair.
struct SwiGlu {
  GpuDense gate_up, down;
  int64_t H = 0, I = 0;
  bool split_down = false;

  void bind(GpuUploader& up, const std::string& p, int64_t hidden, int64_t inter) {
    WeightBinder& b = up.bind();
    H = hidden;
    I = inter;
    if (H % 8 != 0 || I % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden and MLP sizes must be multiples of 8");
    gate_up = up.dense(std::vector<cpu::Mat>{b.mat(p + "gate_proj.weight", I, H), b.mat(p + "up_proj.weight", I, H)});
    down = up.dense(b.mat(p + "down_proj.weight", H, I));
  }
  void reserve(GpuScratch& sc, int64_t n) const {
    sc.fit("mlp.gu", n * 2 * I * 4);
    sc.fit("mlp.act", n * 2 * I * 2);
    sc.fit("mlp.y", n * 2 * H * 4);
    sc.fit("mlp.deq", static_cast<int64_t>(std::max(gate_up.scratch_bytes(n), down.scratch_bytes(2 * n))));
  }
  // x: rn rows of bf16 -> out rows (overwritten).
  void enqueue(GpuCtx& ctx, const bf16_t* x, int64_t rn, float* out) const {
    float* gu = ctx.scratch.get<float>("mlp.gu");
    bf16_t* act = ctx.scratch.get<bf16_t>("mlp.act");
    void* deq = ctx.scratch.get<void>("mlp.deq");
    gate_up.gemm(ctx.blas, x, rn, gu, 2 * I, deq, ctx.s);
    gpu::silu_mul(gu, rn, I, act, split_down ? act + rn * I : nullptr, ctx.s);
    if (!split_down) return down.gemm(ctx.blas, act, rn, out, H, deq, ctx.s);
    float* y = ctx.scratch.get<float>("mlp.y");
    down.gemm(ctx.blas, act, 2 * rn, y, H, deq, ctx.s);
    gpu::add(y, y + rn * H, rn * H, out, ctx.s);
  }
};

class DenseMlpGpu : public GpuFfn {
 public:
  DenseMlpGpu(GpuUploader& up, const ModelConfig& c, const std::string& p, int64_t inter, bool split_down) {
    const uint64_t before = up.bytes();
    mlp_.bind(up, p, c.hidden_size, inter);
    mlp_.split_down = split_down;
    bytes_ = up.bytes() - before;
  }
  void reserve(GpuCtx& ctx) override { mlp_.reserve(ctx.scratch, ctx.step.n); }
  void enqueue(GpuCtx& ctx, const Rows& r, bool) override { mlp_.enqueue(ctx, ctx.a.hb + r.r0 * mlp_.H, r.rn, ctx.a.d + r.r0 * mlp_.H); }
  uint64_t bytes() const override { return bytes_; }

 private:
  SwiGlu mlp_;
  uint64_t bytes_ = 0;
};

class MoeGpu : public GpuFfn {
 public:
  MoeGpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& f, RouterKind router, int64_t shared_inter, RoutedExperts::Home home,
         numa::NodePools& pools, ExpertHomeOptions& opt, bool shared_gate, bool fp32_router)
      : c_(c), router_kind_(router), fp32_router_(fp32_router && router == RouterKind::softmax_topk), H_(c.hidden_size), E_(c.num_experts),
        K_(c.num_experts_per_tok) {
    if (H_ % 8 != 0 || c.moe_intermediate_size % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden and expert sizes must be multiples of 8");
    WeightBinder& b = up.bind();
    const uint64_t before = up.bytes();
    if (fp32_router_) {
      router_ = up.f32(b.mat(f + "gate.weight", E_, H_));
    } else if (router == RouterKind::softmax_topk) {
      router_ = up.bf16({b.mat(f + "gate.weight", E_, H_)});
      router_count_ = gpu::DeviceBuffer(16);  // gpu::router_gemv_topk's block counter, 0 between launches
      gpu::memset_device(router_count_.data(), 0, router_count_.bytes(), up.stream());
      up.stream().synchronize();
    } else {  // fp32, as in the reference: bf16 rounding flips group-limited top-k choices
      router_ = up.f32(b.mat(f + "gate.weight", E_, H_));
      bias_ = up.f32(b.vec(f + "gate.e_score_correction_bias", E_));
    }
    if (shared_inter > 0) shared_.bind(up, f + (shared_gate ? "shared_expert." : "shared_experts."), H_, shared_inter);
    if (shared_inter > 0 && shared_gate)
      shared_gate_ = fp32_router_ ? up.f32(b.mat(f + "shared_expert_gate.weight", 1, H_)) : up.bf16({b.mat(f + "shared_expert_gate.weight", 1, H_)});
    experts_ = std::make_unique<RoutedExperts>(b, c, layer, f, home, pools, opt, &up.stream());
    bytes_ = up.bytes() - before + experts_->gpu_bytes();
  }

  bool fp32_input() const override { return router_kind_ == RouterKind::deepseek_grouped || fp32_router_ || host_experts(); }
  bool host_experts() const override { return experts_->home() == RoutedExperts::Home::host; }
  const std::vector<numa::ExpertWeights>* host_expert_weights() const override { return host_experts() ? &experts_->host_weights() : nullptr; }
  const std::vector<std::vector<numa::ExpertWeights>>* host_expert_pieces() const override { return host_experts() ? experts_->host_pieces() : nullptr; }
  bool host_experts_registered() const override { return host_experts() && experts_->host_registered(); }
  int64_t topk() const override { return K_; }
  uint64_t bytes() const override { return bytes_; }
  uint64_t routed_expert_bytes() const override { return experts_->gpu_bytes(); }

  void reserve(GpuCtx& ctx) override {
    const int64_t n = ctx.step.n;
    ctx.scratch.fit("moe.logits", n * E_ * 4);
    if (shared_.I > 0) {
      shared_.reserve(ctx.scratch, n);
      ctx.scratch.fit("moe.shared", n * H_ * 4);
      ctx.scratch.fit("moe.sgate", n * 4);
    }
    experts_->reserve(ctx, K_);
  }

  void enqueue(GpuCtx& ctx, const Rows& r, bool handoff) override { enqueue_with(ctx, r, nullptr, 0, handoff); }
  bool fuses_norm(const GpuCtx& ctx, const Rows& r) const override {
    return ctx.step.fused && router_kind_ == RouterKind::softmax_topk && !fp32_router_ && gpu::norm_router_fits(r.rn, H_, E_);
  }
  void enqueue_with_norm(GpuCtx& ctx, const Rows& r, const bf16_t* norm_w, float eps, bool handoff) override {
    enqueue_with(ctx, r, norm_w, eps, handoff);
  }

  // norm_w: the post-attention add + RMSNorm runs in the router's launch (fuses_norm).
  void enqueue_with(GpuCtx& ctx, const Rows& r, const bf16_t* norm_w, float eps, bool handoff) {
    gpu::Stream& s = ctx.s;
    float* logits = ctx.scratch.get<float>("moe.logits");
    int32_t* ids = ctx.a.ids + r.r0 * K_;
    float* wts = ctx.a.wts + r.r0 * K_;
    const bf16_t* x = ctx.a.hb + r.r0 * H_;
    if (fp32_router_) {
      ctx.blas.gemm_f32(ctx.a.hf + r.r0 * H_, r.rn, router_.as<float>(), E_, H_, logits, E_);
      gpu::router_topk(logits, r.rn, E_, K_, c_.norm_topk_prob, ids, wts, s);
    } else if (norm_w) {
      gpu::add_rms_norm_router_topk(ctx.a.x + r.r0 * H_, ctx.a.d + r.r0 * H_, r.rn, H_, norm_w, eps, ctx.a.hb + r.r0 * H_,
                                    fp32_input() ? ctx.a.hf + r.r0 * H_ : nullptr, router_.as<bf16_t>(), E_, K_, c_.norm_topk_prob, logits,
                                    router_count_.as<int32_t>(), ids, wts, s);
    } else if (router_kind_ == RouterKind::softmax_topk && ctx.step.fused && r.rn <= gpu::router_gemv_max_tokens() && E_ <= 1024) {  // decode: one launch
      gpu::router_gemv_topk(x, r.rn, router_.as<bf16_t>(), E_, H_, K_, c_.norm_topk_prob, logits, router_count_.as<int32_t>(), ids, wts, s);
    } else if (router_kind_ == RouterKind::softmax_topk) {
      ctx.blas.gemm(x, r.rn, router_.as<bf16_t>(), E_, H_, logits, E_);
      gpu::router_topk(logits, r.rn, E_, K_, c_.norm_topk_prob, ids, wts, s);
    } else {
      const MlaConfig& ml = c_.mla;
      ctx.blas.gemm_f32(ctx.a.hf + r.r0 * H_, r.rn, router_.as<float>(), E_, H_, logits, E_);
      gpu::deepseek_topk(logits, bias_.as<float>(), r.rn, E_, K_, ml.n_group, ml.topk_group, c_.norm_topk_prob,
                         static_cast<float>(ml.routed_scaling_factor), ids, wts, s);
    }
    if (handoff) return;
    enqueue_during_handoff(ctx, r);
    experts_->enqueue(ctx, x, r.rn, K_, ids, wts, ctx.a.d + r.r0 * H_);
    enqueue_after_handoff(ctx, r);
  }
  void enqueue_during_handoff(GpuCtx& ctx, const Rows& r) override {
    if (shared_.I == 0) return;
    shared_.enqueue(ctx, ctx.a.hb + r.r0 * H_, r.rn, ctx.scratch.get<float>("moe.shared") + r.r0 * H_);
    if (shared_gate_.data() && fp32_router_)
      ctx.blas.gemm_f32(ctx.a.hf + r.r0 * H_, r.rn, shared_gate_.as<float>(), 1, H_, ctx.scratch.get<float>("moe.sgate") + r.r0, 1);
    else if (shared_gate_.data())
      ctx.blas.gemm(ctx.a.hb + r.r0 * H_, r.rn, shared_gate_.as<bf16_t>(), 1, H_, ctx.scratch.get<float>("moe.sgate") + r.r0, 1);
  }
  void enqueue_after_handoff(GpuCtx& ctx, const Rows& r) override {
    if (shared_.I == 0) return;
    float* d = ctx.a.d + r.r0 * H_;
    if (shared_gate_.data())
      gpu::add_sigmoid_scaled(d, ctx.scratch.get<float>("moe.shared") + r.r0 * H_, ctx.scratch.get<float>("moe.sgate") + r.r0, r.rn, H_, ctx.s);
    else
      gpu::add(d, ctx.scratch.get<float>("moe.shared") + r.r0 * H_, r.rn * H_, d, ctx.s);
  }
  void run_host(const float* x, int64_t n, const int32_t* ids, const float* w, float* out) override { experts_->run_host(x, n, ids, w, K_, out); }
  void run_host_pairs(const float* x, int64_t n, const int32_t* ids, const float* w, int64_t k, float* out) override {
    experts_->run_host(x, n, ids, w, k, out, /*record=*/false);
  }
  void record_routing(int64_t n, const int32_t* ids, int64_t k) override { experts_->record_routing(n, ids, k); }

 private:
  const ModelConfig& c_;
  RouterKind router_kind_;
  bool fp32_router_;  // softmax router and shared-expert gate in fp32 on hf (make_moe_gpu)
  int64_t H_, E_, K_;
  gpu::DeviceBuffer router_, bias_, shared_gate_;  // shared_gate_: [1, H] bf16 (Qwen3-Next)
  SwiGlu shared_;
  std::unique_ptr<RoutedExperts> experts_;
  gpu::DeviceBuffer router_count_;  // the decode router's block counter (gpu/decode_fused.h)
  uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<GpuFfn> make_dense_mlp_gpu(GpuUploader& up, const ModelConfig& c, const std::string& prefix, int64_t inter, bool split_down) {
  return std::make_unique<DenseMlpGpu>(up, c, prefix, inter, split_down);
}

std::unique_ptr<GpuFfn> make_moe_gpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& prefix, RouterKind router,
                                     int64_t shared_inter, RoutedExperts::Home home, numa::NodePools& pools, ExpertHomeOptions& opt,
                                     bool shared_gate, bool fp32_router) {
  return std::make_unique<MoeGpu>(up, c, layer, prefix, router, shared_inter, home, pools, opt, shared_gate, fp32_router);
}

}  // namespace hmoe
