// Multi-head latent attention: projections, yarn rope, the latent KV cache
// and its two attention paths (see blocks_mla.h).
#include "engine/layers/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "configs/error.h"

namespace hmoe {

MlaMode parse_mla_mode(const std::string& s) {
  if (s == "auto") return MlaMode::automatic;
  if (s == "latent") return MlaMode::latent;
  if (s == "expanded") return MlaMode::expanded;
  if (s == "expanded_prefill") return MlaMode::expanded_prefill;
  fail(ErrorKind::invalid_argument, "--mla-attention / HMOE_MLA_ATTENTION must be auto, latent, expanded or expanded_prefill, got '" + s + "'");
}

KvLayout mla_kv_layout(const ModelConfig& c) {
  KvLayout l{c.num_hidden_layers, 1, c.mla.kv_token_floats()};
  l.k_token_floats = c.mla.kv_token_floats();
  l.v_token_floats = 0;
  return l;
}

// ---- rope ---------------------------------------------------------------------
namespace {
double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }
}  // namespace

MlaRope::MlaRope(const ModelConfig& c) : dim(c.mla.qk_rope_head_dim), interleave(c.mla.rope_interleave) {
  const MlaConfig& m = c.mla;
  const int64_t half = dim / 2;
  const double base = c.rope_theta;
  // pos_freqs = base ** (arange(0, dim, 2) / dim), in fp32 as torch has it.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freqs[static_cast<size_t>(i)] = static_cast<float>(std::pow(base, static_cast<double>(expo)));
  }
  inv_freq.resize(static_cast<size_t>(half));
  if (m.rope_scaling_type != "yarn") {
    for (int64_t i = 0; i < half; ++i) inv_freq[static_cast<size_t>(i)] = 1.0f / pos_freqs[static_cast<size_t>(i)];
    return;
  }
  const double factor = m.yarn_factor;
  if (m.yarn_attention_factor > 0) attention_factor = static_cast<float>(m.yarn_attention_factor);
  else if (m.yarn_mscale != 0 && m.yarn_mscale_all_dim != 0)
    attention_factor = static_cast<float>(yarn_mscale(factor, m.yarn_mscale) / yarn_mscale(factor, m.yarn_mscale_all_dim));
  else
    attention_factor = static_cast<float>(yarn_mscale(factor, 1.0));
  const double orig = static_cast<double>(m.yarn_original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(m.yarn_beta_fast), high = correction_dim(m.yarn_beta_slow);
  if (m.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
  for (int64_t i = 0; i < half; ++i) {
    const float pf = pos_freqs[static_cast<size_t>(i)];
    const float extrapolation = 1.0f / pf;
    const float interpolation = 1.0f / (static_cast<float>(factor) * pf);
    const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
    const float extra_factor = 1.0f - ramp;
    inv_freq[static_cast<size_t>(i)] = interpolation * (1.0f - extra_factor) + extrapolation * extra_factor;
  }
}

void MlaRope::apply(float* x, int64_t heads, int64_t stride, int64_t pos) const {
  const int64_t half = dim / 2;
  float cs[256], sn[256], tmp[512];
  if (half > 256) fail(ErrorKind::unsupported, "qk_rope_head_dim above 512 is not supported");
  for (int64_t i = 0; i < half; ++i) {
    const float f = static_cast<float>(pos) * inv_freq[static_cast<size_t>(i)];
    cs[i] = static_cast<float>(std::cos(static_cast<double>(f))) * attention_factor;
    sn[i] = static_cast<float>(std::sin(static_cast<double>(f))) * attention_factor;
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * stride;
    if (interleave) {  // (x0, x1, x2, ...) -> (x0, x2, ..., x1, x3, ...)
      for (int64_t i = 0; i < half; ++i) {
        tmp[i] = v[2 * i];
        tmp[i + half] = v[2 * i + 1];
      }
      std::copy(tmp, tmp + dim, v);
    }
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

double mla_softmax_scale(const ModelConfig& c) {
  double s = 1.0 / std::sqrt(static_cast<double>(c.mla.qk_head_dim()));
  if (c.mla.rope_scaling_type == "yarn" && c.mla.yarn_mscale_all_dim != 0) {
    const double m = yarn_mscale(c.mla.yarn_factor, c.mla.yarn_mscale_all_dim);
    s = s * m * m;
  }
  return s;
}

MlaWeights bind_mla_weights(WeightBinder& bind, const ModelConfig& c, const std::string& p) {
  const MlaConfig& m = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  if (c.attention_bias) fail(ErrorKind::unsupported, "attention_bias=true is not supported for multi-head latent attention");
  MlaWeights w;
  if (m.q_lora_rank > 0) {
    w.q_a = bind.mat(p + "q_a_proj.weight", m.q_lora_rank, H);
    w.q_a_norm = bind.vec(p + "q_a_layernorm.weight", m.q_lora_rank);
    w.q_b = bind.mat(p + "q_b_proj.weight", nh * m.qk_head_dim(), m.q_lora_rank);
  } else {
    w.q_proj = bind.mat(p + "q_proj.weight", nh * m.qk_head_dim(), H);
  }
  w.kv_a = bind.mat(p + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, H);
  w.kv_a_norm = bind.vec(p + "kv_a_layernorm.weight", m.kv_lora_rank);
  w.kv_b = bind.mat(p + "kv_b_proj.weight", nh * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
  w.o_proj = bind.mat(p + "o_proj.weight", H, nh * m.v_head_dim);
  return w;
}

// ---- the block ----------------------------------------------------------------
namespace {

// y += a * x, vectorised where the CPU has AVX2 (the kernels' ISA choice).
__attribute__((target("avx2,fma"))) void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void axpy(float a, const float* x, float* y, int64_t n) {
  if (cpu::best_isa() != cpu::Isa::scalar) return axpy_avx2(a, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// W_UK[h]^T for every head, [heads * kv_lora, nope]: kv_b's K half
// transposed so that absorbing it into the query is a gemm. Same dtype as
// kv_b when plain (bf16 / f16 / f32), fp32 for quantized kv_b.
struct TransposedUk {
  std::vector<uint16_t> half;
  std::vector<float> full;
  cpu::Mat view;
  TransposedUk() = default;
  TransposedUk(const cpu::Mat& kv_b, int64_t heads, int64_t nope, int64_t v, int64_t r) {
    const int64_t ew = nope + v;
    const bool plain16 = kv_b.quant == cpu::Quant::none && (kv_b.dtype == DType::bf16 || kv_b.dtype == DType::f16);
    if (plain16) half.resize(static_cast<size_t>(heads * r * nope));
    else full.resize(static_cast<size_t>(heads * r * nope));
    std::vector<float> row(static_cast<size_t>(r));
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < nope; ++i) {
        const int64_t src = h * ew + i;
        if (plain16) {
          const auto* in = reinterpret_cast<const uint16_t*>(kv_b.row(src));
          for (int64_t j = 0; j < r; ++j) half[static_cast<size_t>((h * r + j) * nope + i)] = in[j];
        } else {
          cpu::row_to_f32(kv_b, src, row.data());
          for (int64_t j = 0; j < r; ++j) full[static_cast<size_t>((h * r + j) * nope + i)] = row[static_cast<size_t>(j)];
        }
      }
    view = plain16 ? cpu::Mat{kv_b.dtype, half.data(), heads * r, nope} : cpu::Mat{DType::f32, full.data(), heads * r, nope};
  }
  TransposedUk(TransposedUk&&) = default;
  TransposedUk& operator=(TransposedUk&&) = default;
};

// Under MlaMode::expanded_prefill a sequence is expanded only while its expanded
// K/V fit in this many floats (256 MiB); longer contexts stay latent.
constexpr int64_t kMaxAutoExpandFloats = int64_t{64} << 20;

class MlaAttention : public AttentionBlock {
 public:
  MlaAttention(const MlaWeights& w, const ModelConfig& c, int64_t layer, numa::ThreadPool& pool, MlaMode mode, const cpu::GemmOptions& gemm)
      : w_(w),
        layer_(layer),
        pool_(pool),
        mode_(mode),
        gemm_(gemm),
        rope_(c),
        scale_(static_cast<float>(mla_softmax_scale(c))),
        eps_(c.rms_norm_eps),
        nh_(c.num_attention_heads),
        nope_(c.mla.qk_nope_head_dim),
        rope_dim_(c.mla.qk_rope_head_dim),
        vd_(c.mla.v_head_dim),
        r_(c.mla.kv_lora_rank),
        q_lora_(c.mla.q_lora_rank),
        layers_(c.num_hidden_layers) {
    uk_t_ = TransposedUk(w_.kv_b, nh_, nope_, vd_, r_);
    kv_norm_.resize(static_cast<size_t>(r_));
    cpu::to_f32(w_.kv_a_norm.dtype, w_.kv_a_norm.data, kv_norm_.data(), r_);
  }

  void forward(const float* x, int64_t n, const ops::TokenSlot* slots, KvCache& kv, float* out, Workspace&) override {
    const int64_t qk = nope_ + rope_dim_, lw = r_ + rope_dim_;
    if (kv.layout().k_floats() != lw || kv.layout().layers != layers_)
      fail(ErrorKind::internal, "KV cache layout does not fit multi-head latent attention (build it with Model::kv_layout())");
    q_.resize(static_cast<size_t>(n * nh_ * qk));
    if (q_lora_ > 0) {
      qa_.resize(static_cast<size_t>(n * q_lora_));
      cpu::gemm_split_input(x, n, w_.q_a, qa_.data(), &pool_, gemm_);
      ops::rms_norm(qa_.data(), n, q_lora_, w_.q_a_norm, eps_, qa_.data());
      cpu::gemm_split_input(qa_.data(), n, w_.q_b, q_.data(), &pool_, gemm_);
    } else {
      cpu::gemm_split_input(x, n, w_.q_proj, q_.data(), &pool_, gemm_);
    }
    ckv_.resize(static_cast<size_t>(n * lw));
    cpu::gemm_split_input(x, n, w_.kv_a, ckv_.data(), &pool_, gemm_);
    for (int64_t t = 0; t < n; ++t) {
      float* row = ckv_.data() + t * lw;
      double ss = 0;
      for (int64_t i = 0; i < r_; ++i) ss += static_cast<double>(row[i]) * row[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(r_) + eps_));
      for (int64_t i = 0; i < r_; ++i) row[i] = kv_norm_[static_cast<size_t>(i)] * (row[i] * inv);
      rope_.apply(q_.data() + t * nh_ * qk + nope_, nh_, qk, slots[t].pos);
      rope_.apply(row + r_, 1, lw, slots[t].pos);
      if (gemm_.round_bf16)  // the GPU's latent cache is bf16
        for (int64_t i = 0; i < lw; ++i) row[i] = cpu::round_bf16(row[i]);
      std::copy(row, row + lw, kv.k(layer_, slots[t].seq, slots[t].pos));
    }

    // Per sequence in this step: tokens, and the context the expansion would cover.
    std::map<int, std::pair<int64_t, int64_t>> per_seq;
    for (int64_t t = 0; t < n; ++t) {
      auto& e = per_seq[slots[t].seq];
      ++e.first;
      e.second = std::max(e.second, slots[t].pos + 1);
    }
    std::vector<int64_t> expanded, latent;
    for (int64_t t = 0; t < n; ++t) {
      const auto& e = per_seq[slots[t].seq];
      const bool expand = mode_ == MlaMode::expanded ||
                          (mode_ == MlaMode::expanded_prefill && e.first > 1 && e.second * nh_ * (nope_ + vd_) <= kMaxAutoExpandFloats);
      (expand ? expanded : latent).push_back(t);
    }
    attn_.resize(static_cast<size_t>(n * nh_ * vd_));
    if (!expanded.empty()) attend_expanded(expanded, slots, kv);
    if (!latent.empty()) attend_latent(latent, slots, kv);
    cpu::gemm_split_input(attn_.data(), n, w_.o_proj, out, &pool_, gemm_);
  }

 private:
  // kv_b applied to every cached latent of each sequence, then attention.
  void attend_expanded(const std::vector<int64_t>& tokens, const ops::TokenSlot* slots, KvCache& kv) {
    const int64_t qk = nope_ + rope_dim_, ew = nope_ + vd_, lw = r_ + rope_dim_;
    std::map<int, std::vector<int64_t>> by_seq;
    for (auto t : tokens) by_seq[slots[t].seq].push_back(t);
    for (const auto& entry : by_seq) {
      const int seq = entry.first;
      const std::vector<int64_t>& ts = entry.second;
      int64_t len = 0;
      for (auto t : ts) len = std::max(len, slots[t].pos + 1);
      lat_.resize(static_cast<size_t>(len * r_));
      kpe_.resize(static_cast<size_t>(len * rope_dim_));
      for (int64_t j = 0; j < len; ++j) {
        const float* c = kv.k(layer_, seq, j);
        std::copy(c, c + r_, lat_.begin() + j * r_);
        std::copy(c + r_, c + lw, kpe_.begin() + j * rope_dim_);
      }
      exp_.resize(static_cast<size_t>(len * nh_ * ew));
      cpu::gemm(lat_.data(), len, w_.kv_b, exp_.data(), &pool_, gemm_);
      const int64_t jobs = static_cast<int64_t>(ts.size()) * nh_;
      pool_.parallel_for(jobs, [&](int64_t b, int64_t e, int) {
        std::vector<float> p;
        for (int64_t job = b; job < e; ++job) {
          const int64_t t = ts[static_cast<size_t>(job / nh_)], h = job % nh_;
          const float* qn = q_.data() + (t * nh_ + h) * qk;
          const float* qr = qn + nope_;
          const int64_t n_ctx = slots[t].pos + 1;
          p.resize(static_cast<size_t>(n_ctx));
          float mx = -INFINITY;
          for (int64_t j = 0; j < n_ctx; ++j) {
            const float* kn = exp_.data() + (j * nh_ + h) * ew;
            const float* kr = kpe_.data() + j * rope_dim_;
            float s = 0;
            for (int64_t i = 0; i < nope_; ++i) s += qn[i] * kn[i];
            for (int64_t i = 0; i < rope_dim_; ++i) s += qr[i] * kr[i];
            s *= scale_;
            p[static_cast<size_t>(j)] = s;
            mx = std::max(mx, s);
          }
          const float inv = softmax_in_place(p, mx);
          float* o = attn_.data() + (t * nh_ + h) * vd_;
          std::fill(o, o + vd_, 0.0f);
          for (int64_t j = 0; j < n_ctx; ++j) {
            const float pj = p[static_cast<size_t>(j)] * inv;
            const float* vj = exp_.data() + (j * nh_ + h) * ew + nope_;
            for (int64_t i = 0; i < vd_; ++i) o[i] += pj * vj[i];
          }
        }
      });
    }
  }

  // Attention in the latent space with kv_b absorbed on both sides. Per
  // token: qcat[h] = [W_UK[h]^T q_nope[h], q_pe[h]] (kv_lora + rope floats),
  // scores over each cache block as one small gemm (the block's tokens are
  // contiguous rows of [latent, rope key]), o_lat = sum_j p_j c_j, then
  // out[h] = W_UV[h] o_lat[h].
  void attend_latent(const std::vector<int64_t>& tokens, const ops::TokenSlot* slots, KvCache& kv) {
    const int64_t qk = nope_ + rope_dim_, ew = nope_ + vd_, lw = r_ + rope_dim_, m = static_cast<int64_t>(tokens.size());
    const int64_t bs = kv.block_size();
    qg_.resize(static_cast<size_t>(m * nh_ * qk));
    for (int64_t k = 0; k < m; ++k)
      std::copy(q_.begin() + tokens[static_cast<size_t>(k)] * nh_ * qk, q_.begin() + (tokens[static_cast<size_t>(k)] + 1) * nh_ * qk,
                qg_.begin() + k * nh_ * qk);
    qcat_.resize(static_cast<size_t>(m * nh_ * lw));
    pool_.parallel_for(nh_, [&](int64_t b, int64_t e, int) {
      for (int64_t h = b; h < e; ++h) {
        cpu::gemm_rows(qg_.data() + h * qk, nh_ * qk, m, uk_t_.view.slice_rows(h * r_, (h + 1) * r_), 0, r_, qcat_.data() + h * lw, nh_ * lw);
        for (int64_t k = 0; k < m; ++k)
          std::copy(qg_.begin() + (k * nh_ + h) * qk + nope_, qg_.begin() + (k * nh_ + h + 1) * qk, qcat_.begin() + (k * nh_ + h) * lw + r_);
      }
    });
    olat_.resize(static_cast<size_t>(m * nh_ * r_));
    for (int64_t k = 0; k < m; ++k) {
      const int64_t t = tokens[static_cast<size_t>(k)], n_ctx = slots[t].pos + 1, blocks = (n_ctx + bs - 1) / bs;
      const int seq = slots[t].seq;
      scores_.resize(static_cast<size_t>(nh_ * n_ctx));
      // scores[h, j] for every block of the context.
      pool_.parallel_for(blocks, [&](int64_t b0, int64_t b1, int) {
        for (int64_t blk = b0; blk < b1; ++blk) {
          const int64_t j0 = blk * bs, rows = std::min(bs, n_ctx - j0);
          const cpu::Mat cache{DType::f32, kv.k(layer_, seq, j0), rows, lw};
          cpu::gemm_rows(qcat_.data() + k * nh_ * lw, lw, nh_, cache, 0, rows, scores_.data() + j0, n_ctx);
        }
      });
      pool_.parallel_for(nh_, [&](int64_t b, int64_t e, int) {
        for (int64_t h = b; h < e; ++h) {
          float* p = scores_.data() + h * n_ctx;
          float mx = -INFINITY;
          for (int64_t j = 0; j < n_ctx; ++j) {
            p[j] *= scale_;
            mx = std::max(mx, p[j]);
          }
          double sum = 0;
          for (int64_t j = 0; j < n_ctx; ++j) {
            p[j] = std::exp(p[j] - mx);
            sum += p[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          float* ol = olat_.data() + (k * nh_ + h) * r_;
          std::fill(ol, ol + r_, 0.0f);
          for (int64_t j = 0; j < n_ctx; ++j) axpy(p[j] * inv, kv.k(layer_, seq, j), ol, r_);
        }
      });
    }
    // out[t_k, h] = W_UV[h] o_lat[k, h]
    ov_.resize(static_cast<size_t>(m * nh_ * vd_));
    pool_.parallel_for(nh_, [&](int64_t b, int64_t e, int) {
      for (int64_t h = b; h < e; ++h) {
        const cpu::Mat w_uv = w_.kv_b.slice_rows(h * ew + nope_, h * ew + ew);
        cpu::gemm_rows(olat_.data() + h * r_, nh_ * r_, m, w_uv, 0, vd_, ov_.data() + h * vd_, nh_ * vd_);
      }
    });
    for (int64_t k = 0; k < m; ++k)
      std::copy(ov_.begin() + k * nh_ * vd_, ov_.begin() + (k + 1) * nh_ * vd_,
                attn_.begin() + tokens[static_cast<size_t>(k)] * nh_ * vd_);
  }

  // p[j] = exp(p[j] - mx); returns 1 / sum.
  static float softmax_in_place(std::vector<float>& p, float mx) {
    double sum = 0;
    for (auto& v : p) {
      v = std::exp(v - mx);
      sum += v;
    }
    return static_cast<float>(1.0 / sum);
  }

  MlaWeights w_;
  int64_t layer_;
  numa::ThreadPool& pool_;
  MlaMode mode_;
  cpu::GemmOptions gemm_;
  MlaRope rope_;
  float scale_;
  double eps_;
  int64_t nh_, nope_, rope_dim_, vd_, r_, q_lora_, layers_;
  std::vector<float> kv_norm_;
  TransposedUk uk_t_;
  std::vector<float> qa_, q_, ckv_, attn_, lat_, kpe_, exp_, qg_, qcat_, scores_, olat_, ov_;
};

}  // namespace

std::unique_ptr<AttentionBlock> make_mla_attention(const MlaWeights& w, const ModelConfig& c, int64_t layer, numa::ThreadPool& pool,
                                                   MlaMode mode, const cpu::GemmOptions& gemm) {
  return std::make_unique<MlaAttention>(w, c, layer, pool, mode, gemm);
}

}  // namespace hmoe
