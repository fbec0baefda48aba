// GQA attention on the GPU: fused QKV product, q/k RMSNorm + rotary, KV
// store into the paged cache, attention (per token and head, or, when the
// step has prefill query tiles, on tensor cores), o_proj.
#include <algorithm>
#include <cmath>

#include "configs/error.h"
#include "engine/layers/gpu_factories.h"
#include "engine/ops/cpu_ops.h"
#include "gpu/decode_fused.h"

namespace hmoe {

namespace {

using gpu::bf16_t;

class GqaAttentionGpu : public GpuAttention {
 public:
  GqaAttentionGpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& p)
      : layer_(layer), H_(c.hidden_size), nh_(c.num_attention_heads), kvh_(c.num_key_value_heads), hd_(c.head_dim),
        eps_(static_cast<float>(c.rms_norm_eps)) {
    if (c.attention_bias) fail(ErrorKind::unsupported, "GPU path: attention_bias=true is not supported");
    if (hd_ % 32 != 0 || hd_ <= 0 || hd_ > gpu::attention_max_head_dim)
      fail(ErrorKind::unsupported, "GPU path: head_dim " + std::to_string(hd_) + " (supported: multiples of 32 up to 256)");
    if (H_ % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden and expert sizes must be multiples of 8");
    WeightBinder& b = up.bind();
    const uint64_t before = up.bytes();
    const cpu::Mat q = b.mat(p + "q_proj.weight", nh_ * hd_, H_), k = b.mat(p + "k_proj.weight", kvh_ * hd_, H_),
                   v = b.mat(p + "v_proj.weight", kvh_ * hd_, H_);
    // GGUF blocks as stored: q, k and v stacked where their types agree, else
    // q+k and v, or three products (Q4_K_M stores some layers' v as Q6_K).
    auto native = [&](const cpu::Mat& m) { return up.keep_gguf() && gpu::gguf_native_supported(m); };
    if (native(q) || native(k) || native(v)) {
      if (q.ext == k.ext && k.ext == v.ext) {
        q_ = up.dense(std::vector<cpu::Mat>{q, k, v});
      } else if (q.ext == k.ext) {
        q_ = up.dense(std::vector<cpu::Mat>{q, k});
        v_ = up.dense(v);
      } else {
        q_ = up.dense(q);
        k_ = up.dense(k);
        v_ = up.dense(v);
      }
    } else {
      qkv_ = up.bf16({q, k, v});
    }
    o_ = up.dense(b.mat(p + "o_proj.weight", H_, nh_ * hd_));
    q_norm_ = up.bf16({b.vec(p + "q_norm.weight", hd_)});
    k_norm_ = up.bf16({b.vec(p + "k_norm.weight", hd_)});
    const ops::Rope rope(hd_, c.rope_theta);
    inv_freq_ = upload(rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float), up.stream());
    bytes_ = up.bytes() - before;
    norm_count_ = gpu::DeviceBuffer(16);  // gpu::add_rms_norm_gguf_gemv's block counter, 0 between launches
    gpu::memset_device(norm_count_.data(), 0, norm_count_.bytes(), up.stream());
    up.stream().synchronize();
  }

  void reserve(GpuCtx& ctx) override {
    const int64_t n = ctx.step.n;
    ctx.scratch.fit("gqa.qkv", n * ld() * 4);
    ctx.scratch.fit("gqa.attn", n * nh_ * hd_ * 2);
    ctx.scratch.fit("gqa.scratch", gpu::attention_scratch_floats(n, nh_, hd_, ctx.step.max_len) * 4);
    size_t deq = o_.scratch_bytes(n);
    for (const GpuDense* d : {&q_, &k_, &v_}) deq = std::max(deq, d->scratch_bytes(n));
    ctx.scratch.fit("dense.deq", static_cast<int64_t>(deq));
  }
  void key(const GpuStepInfo& st, std::vector<int64_t>& k) const override {
    for (int64_t rn : st.mb_rows) k.push_back(gpu::attention_splits(rn, nh_, st.max_len));
    k.push_back(fused(st) ? 1 : 0);
  }
  uint64_t bytes() const override { return bytes_; }

  void enqueue(GpuCtx& ctx, const Rows& r) override { enqueue_with(ctx, r, nullptr, 0, nullptr); }
  bool fuses_norm(const GpuCtx& ctx, const Rows& r) const override { return ctx.step.fused && q_.rows() > 0 && q_.normed_fits(r.rn); }
  void enqueue_with_norm(GpuCtx& ctx, const Rows& r, const bf16_t* norm_w, float eps, const float* delta) override {
    enqueue_with(ctx, r, norm_w, eps, delta);
  }

  // norm_w: the block's input add + RMSNorm runs in the first product's launch (fuses_norm).
  void enqueue_with(GpuCtx& ctx, const Rows& r, const bf16_t* norm_w, float eps, const float* delta) {
    const GpuStepInfo& st = ctx.step;
    gpu::Stream& s = ctx.s;
    const int64_t ld = this->ld();
    bf16_t *kc = st.kv->keys(layer_), *vc = st.kv->values(layer_);
    float* q = ctx.scratch.get<float>("gqa.qkv");
    bf16_t* attn = ctx.scratch.get<bf16_t>("gqa.attn");
    const int32_t* pos = st.pos + r.r0;
    void* deq = ctx.scratch.get<void>("dense.deq");
    const bf16_t* hr = ctx.a.hb + r.r0 * H_;
    if (q_.rows() > 0) {  // the products' rows land in order: q, k, v columns of the row
      if (norm_w)
        q_.gemm_normed(ctx.a.x + r.r0 * H_, delta ? delta + r.r0 * H_ : nullptr, r.rn, norm_w, eps, ctx.a.hb + r.r0 * H_, q, ld,
                       norm_count_.as<int32_t>(), s);
      else
        q_.gemm(ctx.blas, hr, r.rn, q, ld, deq, s);
      if (k_.rows() > 0) k_.gemm(ctx.blas, hr, r.rn, q + nh_ * hd_, ld, deq, s);
      if (v_.rows() > 0) v_.gemm(ctx.blas, hr, r.rn, q + (nh_ + kvh_) * hd_, ld, deq, s);
    } else {
      ctx.blas.gemm(hr, r.rn, qkv_.as<bf16_t>(), ld, H_, q, ld);
    }
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd_)));
    if (fused(st)) {  // decode: norms, rotary, KV store and attention in one launch
      gpu::norm_rope_store_attention(q, ld, r.rn, nh_, kvh_, hd_, q_norm_.as<bf16_t>(), k_norm_.as<bf16_t>(), eps_, pos, inv_freq_.as<float>(),
                                     st.slot + r.r0, kc, vc, st.lists, st.off + r.r0, st.len + r.r0, st.max_len, scale,
                                     ctx.scratch.get<float>("gqa.scratch"), attn, s);
      return o_.gemm(ctx.blas, attn, r.rn, ctx.a.d + r.r0 * H_, H_, deq, s);
    }
    gpu::qkv_norm_rope_store(q, r.rn, ld, nh_, kvh_, hd_, q_norm_.as<bf16_t>(), k_norm_.as<bf16_t>(), eps_, pos, inv_freq_.as<float>(), st.slot + r.r0,
                             kc, vc, s);
    if (gpu::attention_tiles_takes(hd_) && st.ntiles > 0 && r.r0 == 0 && r.rn == st.n)
      gpu::attention_tiles(q, ld, st.ntiles, st.tiles, nh_, kvh_, hd_, kc, vc, st.lists, st.off, st.len, scale, attn, s);
    else
      gpu::attention(q, ld, r.rn, nh_, kvh_, hd_, kc, vc, st.lists, st.off + r.r0, st.len + r.r0, st.max_len, scale,
                     ctx.scratch.get<float>("gqa.scratch"), attn, s);
    o_.gemm(ctx.blas, attn, r.rn, ctx.a.d + r.r0 * H_, H_, deq, s);
  }

 private:
  int64_t ld() const { return (nh_ + 2 * kvh_) * hd_; }
  // Decode steps (every sequence one token, no prefill tiles) take the fused attention launch.
  static bool fused(const GpuStepInfo& st) { return st.fused && st.multi_tokens == 0 && st.ntiles == 0; }
  int64_t layer_, H_, nh_, kvh_, hd_;
  float eps_;
  gpu::DeviceBuffer qkv_, q_norm_, k_norm_, inv_freq_, norm_count_;
  GpuDense q_, k_, v_, o_;
  uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<GpuAttention> make_gqa_attention_gpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& prefix) {
  return std::make_unique<GqaAttentionGpu>(up, c, layer, prefix);
}

}  // namespace hmoe
