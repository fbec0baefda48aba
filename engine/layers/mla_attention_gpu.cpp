// Multi-head latent attention on the GPU (see mla_attention.h for the math
// and MlaMode). Per rows: fused [q_a | kv_a] product, q_a norm + q_b,
// latent cache store (norm + rope), q rope, latent and/or expanded
// attention, o_proj. The three plain products are GpuDense (GGUF blocks
// kept as stored, e.g. a dynamic quant's low-bit q_b and o_proj); kv_b,
// read per head, is bf16. With split inputs the products take a bf16 hi + lo
// pair of their input (one product over 2n rows, halves added): the tiny
// fixture's routing rides on near-ties that one bf16 rounding flips
// (bench/README.md, "DeepSeek-V3 GPU top-1").
#include <algorithm>

#include "configs/error.h"
#include "engine/layers/gpu_factories.h"
#include "gpu/mla.h"

namespace hmoe {

namespace {

using gpu::bf16_t;

// Expanded K/V of one step above this many bytes: expanded_prefill attends in the latent space.
constexpr int64_t kMaxExpandBytes = int64_t{1} << 30;

class MlaAttentionGpu : public GpuAttention {
 public:
  MlaAttentionGpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& a, MlaMode mode, bool split)
      : ml_(c.mla), layer_(layer), H_(c.hidden_size), nh_(c.num_attention_heads), mode_(mode), split_(split),
        eps_(static_cast<float>(c.rms_norm_eps)), scale_(static_cast<float>(mla_softmax_scale(c))) {
    const int64_t nope = ml_.qk_nope_head_dim, qk = ml_.qk_head_dim(), vd = ml_.v_head_dim, r = ml_.kv_lora_rank, lw = ml_.kv_token_floats();
    const int64_t ew = nope + vd;
    if (c.attention_bias) fail(ErrorKind::unsupported, "GPU path: attention_bias=true is not supported");
    if (H_ % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden and MLP sizes must be multiples of 8");
    if (r % 8 != 0 || ml_.qk_rope_head_dim % 8 != 0 || nope % 8 != 0 || r > 1024 || vd > 128 || qk > 1024)
      fail(ErrorKind::unsupported, "GPU path: kv_lora_rank, qk_rope_head_dim and qk_nope_head_dim must be multiples of 8, kv_lora_rank <= 1024, "
                                   "v_head_dim <= 128 (kv_lora_rank " + std::to_string(r) + ", qk_rope_head_dim " +
                                       std::to_string(ml_.qk_rope_head_dim) + ", qk_nope_head_dim " + std::to_string(nope) + ", v_head_dim " +
                                       std::to_string(vd) + ")");
    WeightBinder& b = up.bind();
    const uint64_t before = up.bytes();
    const cpu::Mat kv_a = b.mat(a + "kv_a_proj_with_mqa.weight", lw, H_);
    if (ml_.q_lora_rank > 0) {
      qkv_a_ = up.dense(std::vector<cpu::Mat>{b.mat(a + "q_a_proj.weight", ml_.q_lora_rank, H_), kv_a});
      q_a_norm_ = up.bf16({b.vec(a + "q_a_layernorm.weight", ml_.q_lora_rank)});
      q_b_ = up.dense(b.mat(a + "q_b_proj.weight", nh_ * qk, ml_.q_lora_rank));
    } else {
      qkv_a_ = up.dense(std::vector<cpu::Mat>{b.mat(a + "q_proj.weight", nh_ * qk, H_), kv_a});
    }
    kv_a_norm_ = up.bf16({b.vec(a + "kv_a_layernorm.weight", r)});
    const cpu::Mat kv_b = b.mat(a + "kv_b_proj.weight", nh_ * ew, r);
    if (mode != MlaMode::expanded) {  // W_UK^T per head, [heads][r][nope], for the absorbed query
      std::vector<bf16_t> t(static_cast<size_t>(nh_ * r * nope));
      std::vector<float> row(static_cast<size_t>(r));
      for (int64_t h = 0; h < nh_; ++h)
        for (int64_t i = 0; i < nope; ++i) {
          cpu::row_to_f32(kv_b, h * ew + i, row.data());
          for (int64_t j = 0; j < r; ++j) t[static_cast<size_t>((h * r + j) * nope + i)] = f32_to_bf16(row[static_cast<size_t>(j)]);
        }
      uk_t_ = up.raw(t.data(), t.size() * 2);
    }
    kv_b_ = up.bf16({kv_b});
    o_ = up.dense(b.mat(a + "o_proj.weight", H_, nh_ * vd));
    const MlaRope rope(c);
    inv_freq_ = upload(rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float), up.stream());
    rope_ = {inv_freq_.as<float>(), rope.dim, rope.attention_factor, rope.interleave};
    bytes_ = up.bytes() - before;
  }

  bool fp32_input() const override { return split_; }
  uint64_t bytes() const override { return bytes_; }

  // Tokens that attend over expanded K/V this step.
  int64_t expanded(const GpuStepInfo& st) const {
    const int64_t ew = ml_.qk_nope_head_dim + ml_.v_head_dim;
    if (mode_ == MlaMode::expanded) return st.n;
    if (mode_ != MlaMode::expanded_prefill || st.list_len * nh_ * ew * 4 > kMaxExpandBytes) return 0;
    return st.multi_tokens;
  }
  void key(const GpuStepInfo& st, std::vector<int64_t>& k) const override {
    k.push_back(st.list_len);
    k.push_back(expanded(st));
  }

  void reserve(GpuCtx& ctx) override {
    const GpuStepInfo& st = ctx.step;
    const int64_t n = st.n, n2 = split_ ? 2 * n : n, ql = ml_.q_lora_rank, r = ml_.kv_lora_rank, qk = ml_.qk_head_dim(), vd = ml_.v_head_dim;
    const int64_t ew = ml_.qk_nope_head_dim + vd;
    ctx.scratch.fit("mla.in", n2 * H_ * 2);
    ctx.scratch.fit("mla.y", n2 * H_ * 4);
    ctx.scratch.fit("mla.a", n2 * rows_a() * 4);
    ctx.scratch.fit("mla.qa_b", n2 * std::max<int64_t>(ql, 1) * 2);
    ctx.scratch.fit("mla.q", n2 * nh_ * qk * 4);
    ctx.scratch.fit("mla.qlat", n * nh_ * r * 4);
    ctx.scratch.fit("mla.olat", n * nh_ * r * 4);
    ctx.scratch.fit("mla.attn", n2 * nh_ * vd * 2);
    ctx.scratch.fit("mla.attn_f", n * nh_ * vd * 4);
    ctx.scratch.fit("mla.deq", static_cast<int64_t>(std::max({qkv_a_.scratch_bytes(n2), q_b_.scratch_bytes(n2), o_.scratch_bytes(n2)})));
    const int64_t ne = expanded(st);
    if (ne < n) ctx.scratch.fit("mla.lat_work", gpu::mla_attention_latent_workspace(n, nh_, r, ml_.qk_rope_head_dim) * 4);
    if (ne > 0) {
      ctx.scratch.fit("mla.exp_lat", st.list_len * r * 2);
      ctx.scratch.fit("mla.exp_kv", st.list_len * nh_ * ew * 4);
    }
  }

  void enqueue(GpuCtx& ctx, const Rows& rows) override {
    const GpuStepInfo& st = ctx.step;
    gpu::Stream& s = ctx.s;
    GpuScratch& sc = ctx.scratch;
    const int64_t rn = rows.rn, r0 = rows.r0, n2 = split_ ? 2 * rn : rn;
    const int64_t nope = ml_.qk_nope_head_dim, rd = ml_.qk_rope_head_dim, qk = ml_.qk_head_dim(), vd = ml_.v_head_dim, r = ml_.kv_lora_rank;
    const int64_t lw = ml_.kv_token_floats(), ew = nope + vd, ql = ml_.q_lora_rank, qa_rows = ql > 0 ? ql : nh_ * qk, ra = rows_a();
    const int64_t ne = expanded(st);
    const bool any_expanded = ne > 0, any_latent = ne < st.n;
    bf16_t* cache = st.kv->keys(layer_);
    const int32_t *pos = st.pos + r0, *off = st.off + r0, *len = st.len + r0, *multi = st.multi + r0;
    void* deq = sc.get<void>("mla.deq");
    // y[rn, rows] = x W^T for a split input x = [hi; lo] (2rn rows): the halves' products added.
    auto gemm_in = [&](const bf16_t* x, const GpuDense& w, int64_t out_rows, float* y) {
      w.gemm(ctx.blas, x, n2, y, out_rows, deq, s);
      if (split_) gpu::add(y, y + rn * out_rows, rn * out_rows, y, s);
    };
    const bf16_t* in = ctx.a.hb + r0 * H_;
    if (split_) {
      bf16_t* hs = sc.get<bf16_t>("mla.in");
      gpu::split_bf16(ctx.a.hf + r0 * H_, rn * H_, hs, hs + rn * H_, s);
      in = hs;
    }
    float* a = sc.get<float>("mla.a");
    gemm_in(in, qkv_a_, ra, a);
    float* q = a;
    int64_t ldq = ra;
    if (ql > 0) {
      bf16_t* qa_b = sc.get<bf16_t>("mla.qa_b");
      gpu::rms_norm_rows(a, ra, rn, ql, q_a_norm_.as<bf16_t>(), eps_, qa_b, split_ ? qa_b + rn * ql : nullptr, s);
      q = sc.get<float>("mla.q");
      ldq = nh_ * qk;
      gemm_in(qa_b, q_b_, nh_ * qk, q);
    }
    gpu::mla_kv_store(a + qa_rows, ra, rn, r, kv_a_norm_.as<bf16_t>(), eps_, rope_, pos, st.slot + r0, cache, s);
    gpu::mla_rope(q + nope, ldq, qk, rn, nh_, rope_, pos, s);
    bf16_t* attn = sc.get<bf16_t>("mla.attn");
    if (any_latent) {
      float *qlat = sc.get<float>("mla.qlat"), *olat = sc.get<float>("mla.olat"), *attn_f = sc.get<float>("mla.attn_f");
      gpu::head_matmul(q, ldq, qk, rn, nh_, nope, r, uk_t_.as<bf16_t>(), r * nope, qlat, nullptr, nh_ * r, r, s);
      gpu::mla_attention_latent(qlat, q + nope, ldq, qk, rn, nh_, r, rd, cache, st.lists, off, len, any_expanded ? multi : nullptr, scale_, olat,
                                sc.get<float>("mla.lat_work"), s);
      gpu::head_matmul(olat, nh_ * r, r, rn, nh_, r, vd, kv_b_.as<bf16_t>() + nope * r, ew * r, split_ ? attn_f : nullptr, split_ ? nullptr : attn,
                       nh_ * vd, vd, s);
      if (split_) gpu::split_bf16(attn_f, rn * nh_ * vd, attn, attn + rn * nh_ * vd, s);
    }
    if (any_expanded) {
      bf16_t* exp_lat = sc.get<bf16_t>("mla.exp_lat");
      float* exp_kv = sc.get<float>("mla.exp_kv");
      gpu::gather_rows(cache, lw, st.lists, st.list_len, r, exp_lat, s);
      ctx.blas.gemm(exp_lat, st.list_len, kv_b_.as<bf16_t>(), nh_ * ew, r, exp_kv, nh_ * ew);
      gpu::mla_attention_expanded(q, ldq, rn, nh_, nope, rd, vd, exp_kv, cache, lw, r, st.lists, off, len, any_latent ? multi : nullptr, scale_, attn,
                                  split_ ? attn + rn * nh_ * vd : nullptr, s);
    }
    float* d = ctx.a.d + r0 * H_;
    if (!split_) return o_.gemm(ctx.blas, attn, rn, d, H_, deq, s);
    float* y = sc.get<float>("mla.y");
    o_.gemm(ctx.blas, attn, n2, y, H_, deq, s);
    gpu::add(y, y + rn * H_, rn * H_, d, s);
  }

 private:
  int64_t rows_a() const { return (ml_.q_lora_rank > 0 ? ml_.q_lora_rank : nh_ * ml_.qk_head_dim()) + ml_.kv_token_floats(); }
  const MlaConfig ml_;
  int64_t layer_, H_, nh_;
  MlaMode mode_;
  bool split_;
  float eps_, scale_;
  GpuDense qkv_a_, q_b_, o_;  // bf16, or GGUF blocks as stored (GpuUploader::dense)
  gpu::DeviceBuffer q_a_norm_, kv_a_norm_, kv_b_, uk_t_, inv_freq_;
  gpu::MlaRopeArgs rope_;
  uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<GpuAttention> make_mla_attention_gpu(GpuUploader& up, const ModelConfig& c, int64_t layer, const std::string& prefix, MlaMode mode,
                                                     bool split) {
  return std::make_unique<MlaAttentionGpu>(up, c, layer, prefix, mode, split);
}

}  // namespace hmoe
