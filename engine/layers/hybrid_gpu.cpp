// Qwen3-Next's Gated DeltaNet and gated full attention on the GPU (see
// hybrid_gpu.h).
#include "engine/layers/hybrid_gpu.h"

#include <algorithm>
#include <cmath>

#include "configs/error.h"
#include "engine/ops/cpu_ops.h"

namespace hmoe {

namespace {

using gpu::bf16_t;

// An fp32 vector on the GPU, each value through f (zero-centred weights, -exp(A_log)).
template <class F>
gpu::DeviceBuffer upload_f32_map(GpuUploader& up, const cpu::Mat& m, F f) {
  std::vector<float> v = mat_f32(m);
  for (float& x : v) x = f(x);
  up.bind().release(m);
  return up.raw(v.data(), v.size() * sizeof(float));
}

// Split inputs (setting gpu_hybrid_precise): a product (hi + lo) W^T in fp32
// of bf16 halves. Below `cols / 4` rows, where reading W dominates, it runs
// stacked: one product over the rows [hi; lo] (W read once) into an fp32
// buffer of 2rn rows, the halves added; from there on, hi's product, then
// lo's added in place (W read twice, but 12 bytes per output value move
// instead of 20: no 2rn-row buffer, no add pass).
bool split_stacked(int64_t rn, int64_t cols) { return 4 * rn < cols; }
// The stacked buffer's rows for a step of n (and micro-batches of at most n) rows.
int64_t split_stacked_rows(int64_t n, int64_t cols) { return std::min(n, cols / 4); }

// y [rn, rows] = hi W^T + lo W^T for the halves stacked at hl ([hi; lo], rn rows each, row stride cols); y2: the
// stacked product's scratch (2 split_stacked_rows(rn, cols) rows of `rows` floats).
void split_product(GpuCtx& ctx, const bf16_t* hl, int64_t rn, const bf16_t* w, int64_t rows, int64_t cols, float* y, float* y2) {
  if (split_stacked(rn, cols)) {
    ctx.blas.gemm(hl, 2 * rn, w, rows, cols, y2, rows);
    gpu::add(y2, y2 + rn * rows, rn * rows, y, ctx.s);
    return;
  }
  ctx.blas.gemm(hl, rn, w, rows, cols, y, rows);
  ctx.blas.gemm_add(hl + rn * cols, rn, w, rows, cols, y, rows);
}

// The same for a block's normed input: hi is hb (bf16 of hf), lo from hf; x2: 2rn rows of cols bf16.
void split_input_product(GpuCtx& ctx, const Rows& r, const bf16_t* w, int64_t rows, int64_t cols, float* y, bf16_t* x2, float* y2) {
  const float* hf = ctx.a.hf + r.r0 * cols;
  if (split_stacked(r.rn, cols)) {
    gpu::split_bf16(hf, r.rn * cols, x2, x2 + r.rn * cols, ctx.s);
    return split_product(ctx, x2, r.rn, w, rows, cols, y, y2);
  }
  ctx.blas.gemm(ctx.a.hb + r.r0 * cols, r.rn, w, rows, cols, y, rows);
  gpu::split_bf16(hf, r.rn * cols, nullptr, x2, ctx.s);
  ctx.blas.gemm_add(x2, r.rn, w, rows, cols, y, rows);
}

class GatedDeltaNetGpu : public GpuAttention {
 public:
  GatedDeltaNetGpu(GpuUploader& up, const ModelConfig& c, int64_t state_index, const std::string& p, bool split)
      : sh_(deltanet_shape(c.hybrid)), H_(c.hidden_size), eps_(static_cast<float>(c.rms_norm_eps)), split_(split) {
    if (H_ % 8 != 0 || sh_.value_dim() % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden and linear-attention value sizes must be multiples of 8");
    if (sh_.nk <= 0 || sh_.nv % sh_.nk != 0)
      fail(ErrorKind::bad_model, "linear_num_value_heads must be a multiple of linear_num_key_heads");
    WeightBinder& b = up.bind();
    const uint64_t before = up.bytes();
    const int64_t K = sh_.key_dim(), V = sh_.value_dim(), nv = sh_.nv;
    w_in_ = up.bf16({b.mat(p + "in_proj_qkvz.weight", 2 * K + 2 * V, H_), b.mat(p + "in_proj_ba.weight", 2 * nv, H_)});
    w_out_ = up.bf16({b.mat(p + "out_proj.weight", H_, V)});
    conv_ = up.f32(b.mat_shaped(p + "conv1d.weight", {sh_.conv_dim(), 1, sh_.conv_k}));
    dt_bias_ = up.f32(b.vec(p + "dt_bias", nv));
    a_neg_ = upload_f32_map(up, b.vec(p + "A_log", nv), [](float x) { return -std::exp(x); });
    norm_ = up.f32(b.vec(p + "norm.weight", sh_.dv));
    state_off_ = state_index * gpu::deltanet_layer_state_bytes(sh_);
    gpu::deltanet_configure(sh_);  // the chunked kernel's shared memory, before any graph capture
    bytes_ = up.bytes() - before;
  }

  void reserve(GpuCtx& ctx) override {
    const int64_t n = ctx.step.n;
    ctx.scratch.fit("gdn.proj", n * sh_.proj_cols() * 4);
    ctx.scratch.fit("gdn.conv", n * sh_.conv_dim() * 4);
    ctx.scratch.fit("gdn.gate", n * sh_.nv * 4);
    ctx.scratch.fit("gdn.beta", n * sh_.nv * 4);
    ctx.scratch.fit("gdn.core", n * sh_.value_dim() * 4);
    ctx.scratch.fit("gdn.o", n * sh_.value_dim() * 2 * (split_ ? 2 : 1));
    if (ctx.step.deltanet && ctx.step.deltanet->plan().multi) {
      const int64_t b = gpu::deltanet_chunked_scratch_bytes(sh_, gpu::deltanet_kernel(), 0, n, ctx.step.deltanet->count());
      if (b > 0) ctx.scratch.fit("gdn.v2", b);
    }
    if (split_) {
      ctx.scratch.fit("gdn.x2", n * 2 * H_ * 2);
      const int64_t y2 = std::max(split_stacked_rows(n, H_) * sh_.proj_cols(), split_stacked_rows(n, sh_.value_dim()) * H_);
      ctx.scratch.fit("gdn.y2", 2 * y2 * 4);
    }
  }
  bool fp32_input() const override { return split_; }
  void key(const GpuStepInfo& st, std::vector<int64_t>& k) const override {
    if (!st.deltanet) return;
    k.push_back(st.deltanet->count() * 4 + (st.deltanet->plan().multi ? 2 : 0) + (st.deltanet->plan().single ? 1 : 0));
    k.push_back(reinterpret_cast<int64_t>(st.deltanet->device_address()));
  }
  uint64_t bytes() const override { return bytes_; }

  void enqueue(GpuCtx& ctx, const Rows& r) override {
    const GpuStepInfo& st = ctx.step;
    if (!st.deltanet) fail(ErrorKind::internal, "gated deltanet (GPU): the step has no sequence states");
    const DeltaNetStep& ds = *st.deltanet;
    gpu::Stream& s = ctx.s;
    int64_t g0 = 0, gn = 0;
    ds.range(r, st.n, g0, gn);
    const bool whole = r.r0 == 0 && r.rn == st.n;
    const int64_t tok0 = whole ? 0 : r.r0, ntok = whole ? st.n : r.rn;
    const int64_t P = sh_.proj_cols(), V = sh_.value_dim();
    const gpu::DeltaNetGroups& gr = ds.groups();
    float* proj = ctx.scratch.get<float>("gdn.proj");
    float* conv = ctx.scratch.get<float>("gdn.conv");
    float* gate = ctx.scratch.get<float>("gdn.gate");
    float* beta = ctx.scratch.get<float>("gdn.beta");
    float* core = ctx.scratch.get<float>("gdn.core");
    bf16_t* o = ctx.scratch.get<bf16_t>("gdn.o");
    bf16_t* x2 = split_ ? ctx.scratch.get<bf16_t>("gdn.x2") : nullptr;
    float* y2 = split_ ? ctx.scratch.get<float>("gdn.y2") : nullptr;
    if (split_) split_input_product(ctx, r, w_in_.as<bf16_t>(), P, H_, proj + r.r0 * P, x2, y2);
    else ctx.blas.gemm(ctx.a.hb + r.r0 * H_, r.rn, w_in_.as<bf16_t>(), P, H_, proj + r.r0 * P, P);
    gpu::deltanet_prepare(proj, P, gr, tok0, ntok, sh_, conv_.as<float>(), a_neg_.as<float>(), dt_bias_.as<float>(), state_off_, conv, gate, beta, s);
    gpu::deltanet_conv_window(proj, P, gr, g0, gn, sh_, state_off_, s);
    if (ds.plan().multi) {
      const gpu::DeltaNetKernel k = gpu::deltanet_kernel();
      void* v2 = gpu::deltanet_chunked_scratch_bytes(sh_, k, 0, st.n, ds.count()) > 0 ? ctx.scratch.get<float>("gdn.v2") : nullptr;
      gpu::deltanet_chunked(conv, gate, beta, gr, g0, gn, sh_, state_off_, 1, 0, core, s, v2 ? k : gpu::DeltaNetKernel::v1, st.n, v2);
    }
    if (ds.plan().single) gpu::deltanet_recurrent(conv, gate, beta, gr, g0, gn, sh_, state_off_, 1, core, s);
    if (!split_) {
      gpu::deltanet_gated_norm(core, proj, P, gr, tok0, ntok, sh_, norm_.as<float>(), eps_, o, s);
      ctx.blas.gemm(o + r.r0 * V, r.rn, w_out_.as<bf16_t>(), H_, V, ctx.a.d + r.r0 * H_, H_);
      return;
    }
    // The micro-batch's rows r0.. as hi rows [0, rn) and lo rows [rn, 2rn) of o.
    gpu::deltanet_gated_norm(core, proj, P, gr, tok0, ntok, sh_, norm_.as<float>(), eps_, o, s, o + r.rn * V, r.r0);
    split_product(ctx, o, r.rn, w_out_.as<bf16_t>(), H_, V, ctx.a.d + r.r0 * H_, y2);
  }

 private:
  gpu::DeltaNetShape sh_;
  int64_t H_;
  float eps_;
  bool split_;  // setting gpu_hybrid_precise: in_proj and out_proj take a bf16 hi + lo input
  int64_t state_off_ = 0;
  gpu::DeviceBuffer w_in_, w_out_, conv_, dt_bias_, a_neg_, norm_;
  uint64_t bytes_ = 0;
};

class GatedAttentionGpu : public GpuAttention {
 public:
  GatedAttentionGpu(GpuUploader& up, const ModelConfig& c, int64_t kv_layer, const std::string& p, bool split)
      : split_(split),
        kv_layer_(kv_layer), H_(c.hidden_size), nh_(c.num_attention_heads), kvh_(c.num_key_value_heads), hd_(c.head_dim),
        rot_(static_cast<int64_t>(static_cast<double>(c.head_dim) * c.hybrid.partial_rotary_factor)), eps_(static_cast<float>(c.rms_norm_eps)) {
    if (c.attention_bias) fail(ErrorKind::unsupported, "GPU path: attention_bias=true is not supported");
    if (hd_ % 32 != 0 || hd_ <= 0 || hd_ > gpu::attention_max_head_dim)
      fail(ErrorKind::unsupported, "GPU path: head_dim " + std::to_string(hd_) + " (supported: multiples of 32 up to 256)");
    if (rot_ % 2 != 0 || rot_ <= 0) fail(ErrorKind::unsupported, "GPU path: partial_rotary_factor gives " + std::to_string(rot_) + " rotary dimensions (must be even)");
    if (H_ % 8 != 0) fail(ErrorKind::unsupported, "GPU path: hidden size must be a multiple of 8");
    WeightBinder& b = up.bind();
    const uint64_t before = up.bytes();
    qkv_ = up.bf16({b.mat(p + "q_proj.weight", 2 * nh_ * hd_, H_), b.mat(p + "k_proj.weight", kvh_ * hd_, H_), b.mat(p + "v_proj.weight", kvh_ * hd_, H_)});
    o_ = up.bf16({b.mat(p + "o_proj.weight", H_, nh_ * hd_)});
    q_norm_ = upload_f32_map(up, b.vec(p + "q_norm.weight", hd_), [](float x) { return 1.0f + x; });
    k_norm_ = upload_f32_map(up, b.vec(p + "k_norm.weight", hd_), [](float x) { return 1.0f + x; });
    const ops::Rope rope(rot_, c.rope_theta);
    inv_freq_ = up.raw(rope.inv_freq.data(), rope.inv_freq.size() * sizeof(float));
    bytes_ = up.bytes() - before;
  }

  void reserve(GpuCtx& ctx) override {
    const int64_t n = ctx.step.n;
    ctx.scratch.fit("gatt.x", n * ld() * 4);
    ctx.scratch.fit("gatt.q", n * nh_ * hd_ * 4);
    ctx.scratch.fit("gatt.attn", n * nh_ * hd_ * 2);
    if (split_) {
      ctx.scratch.fit("gatt.x2", n * 2 * std::max(H_, nh_ * hd_) * 2);
      const int64_t y2 = std::max(split_stacked_rows(n, H_) * ld(), split_stacked_rows(n, nh_ * hd_) * H_);
      ctx.scratch.fit("gatt.y2", 2 * y2 * 4);
    }
    ctx.scratch.fit("gatt.scratch", gpu::attention_scratch_floats(n, nh_, hd_, ctx.step.max_len) * 4);
  }
  void key(const GpuStepInfo& st, std::vector<int64_t>& k) const override {
    for (int64_t rn : st.mb_rows) k.push_back(gpu::attention_splits(rn, nh_, st.max_len));
  }
  uint64_t bytes() const override { return bytes_; }
  bool fp32_input() const override { return split_; }

  void enqueue(GpuCtx& ctx, const Rows& r) override {
    const GpuStepInfo& st = ctx.step;
    gpu::Stream& s = ctx.s;
    bf16_t *kc = st.kv->keys(kv_layer_), *vc = st.kv->values(kv_layer_);
    float* x = ctx.scratch.get<float>("gatt.x");
    float* q = ctx.scratch.get<float>("gatt.q");
    bf16_t* attn = ctx.scratch.get<bf16_t>("gatt.attn");
    bf16_t* x2 = split_ ? ctx.scratch.get<bf16_t>("gatt.x2") : nullptr;
    float* y2 = split_ ? ctx.scratch.get<float>("gatt.y2") : nullptr;
    if (split_) split_input_product(ctx, r, qkv_.as<bf16_t>(), ld(), H_, x, x2, y2);
    else ctx.blas.gemm(ctx.a.hb + r.r0 * H_, r.rn, qkv_.as<bf16_t>(), ld(), H_, x, ld());
    gpu::gated_qkv_prepare(x, r.rn, ld(), nh_, kvh_, hd_, rot_, q_norm_.as<float>(), k_norm_.as<float>(), eps_, st.pos + r.r0,
                           inv_freq_.as<float>(), st.slot + r.r0, kc, vc, q, s);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd_)));
    if (gpu::attention_tiles_takes(hd_) && st.ntiles > 0 && r.r0 == 0 && r.rn == st.n)
      gpu::attention_tiles(q, nh_ * hd_, st.ntiles, st.tiles, nh_, kvh_, hd_, kc, vc, st.lists, st.off, st.len, scale, attn, s);
    else
      gpu::attention(q, nh_ * hd_, r.rn, nh_, kvh_, hd_, kc, vc, st.lists, st.off + r.r0, st.len + r.r0, st.max_len, scale,
                     ctx.scratch.get<float>("gatt.scratch"), attn, s);
    if (!split_) {
      gpu::gated_attention_gate(attn, x, r.rn, ld(), nh_, hd_, s);
      ctx.blas.gemm(attn, r.rn, o_.as<bf16_t>(), H_, nh_ * hd_, ctx.a.d + r.r0 * H_, H_);
      return;
    }
    gpu::gated_attention_gate(attn, x, r.rn, ld(), nh_, hd_, s, x2, x2 + r.rn * nh_ * hd_);
    split_product(ctx, x2, r.rn, o_.as<bf16_t>(), H_, nh_ * hd_, ctx.a.d + r.r0 * H_, y2);
  }

 private:
  int64_t ld() const { return (2 * nh_ + 2 * kvh_) * hd_; }
  bool split_;  // setting gpu_hybrid_precise: q/k/v and o_proj take a bf16 hi + lo input
  int64_t kv_layer_, H_, nh_, kvh_, hd_, rot_;
  float eps_;
  gpu::DeviceBuffer qkv_, o_, q_norm_, k_norm_, inv_freq_;
  uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<GpuAttention> make_gated_deltanet_gpu(GpuUploader& up, const ModelConfig& c, int64_t state_index, const std::string& prefix,
                                                     bool split) {
  return std::make_unique<GatedDeltaNetGpu>(up, c, state_index, prefix, split);
}

std::unique_ptr<GpuAttention> make_gated_attention_gpu(GpuUploader& up, const ModelConfig& c, int64_t kv_layer, const std::string& prefix, bool split) {
  return std::make_unique<GatedAttentionGpu>(up, c, kv_layer, prefix, split);
}

}  // namespace hmoe
