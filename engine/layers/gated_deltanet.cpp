// Gated DeltaNet on the CPU (see gated_deltanet.h).
#include "engine/layers/gated_deltanet.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "configs/error.h"
#include "engine/ops/delta_rule.h"

namespace hmoe {

namespace {

constexpr int64_t kChunk = kDeltaNetChunk;

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }  // torch's threshold 20
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x / (1.0f + std::exp(-x)); }

std::vector<float> to_floats(const cpu::Mat& m) {
  std::vector<float> f(static_cast<size_t>(m.rows * m.cols));
  cpu::to_f32(m.dtype, m.data, f.data(), m.rows * m.cols);
  return f;
}

class GatedDeltaNet : public AttentionBlock {
 public:
  GatedDeltaNet(WeightBinder& bind, const ModelConfig& c, int64_t state_index, const std::string& p, numa::ThreadPool& pool,
                const cpu::GemmOptions& gemm)
      : h_(c.hybrid), state_index_(state_index), eps_(c.rms_norm_eps), pool_(pool), gemm_(gemm) {
    const int64_t H = c.hidden_size;
    nk_ = h_.linear_num_key_heads;
    nv_ = h_.linear_num_value_heads;
    dk_ = h_.linear_key_head_dim;
    dv_ = h_.linear_value_head_dim;
    ck_ = h_.linear_conv_kernel_dim;
    cdim_ = h_.conv_dim();
    w_qkvz_ = bind.mat(p + "in_proj_qkvz.weight", 2 * h_.key_dim() + 2 * h_.value_dim(), H);
    w_ba_ = bind.mat(p + "in_proj_ba.weight", 2 * nv_, H);
    conv_ = to_floats(bind.mat_shaped(p + "conv1d.weight", {cdim_, 1, ck_}));
    dt_bias_ = to_floats(bind.vec(p + "dt_bias", nv_));
    a_neg_ = to_floats(bind.vec(p + "A_log", nv_));
    for (float& x : a_neg_) x = -std::exp(x);
    norm_ = to_floats(bind.vec(p + "norm.weight", dv_));
    w_out_ = bind.mat(p + "out_proj.weight", H, h_.value_dim());
  }

  void forward(const float* x, int64_t n, const ops::TokenSlot* slots, KvCache& kv, float* out, Workspace&) override {
    group_by_sequence(slots, n, kv);
    const int64_t K = h_.key_dim(), V = h_.value_dim(), r = nv_ / nk_;
    const int64_t wq = 2 * K + 2 * V;
    fit(proj_, n * wq);
    fit(ba_, n * 2 * nv_);
    cpu::GemmOptions split = gemm_;  // the GPU's precise mode splits these inputs (GemmOptions::hybrid_precise)
    split.split_inputs = gemm_.hybrid_precise;
    cpu::gemm_split_input(x, n, w_qkvz_, proj_.data(), &pool_, split);
    cpu::gemm_split_input(x, n, w_ba_, ba_.data(), &pool_, split);
    // Row i of the working buffers is token order_[i] (sequences contiguous).
    fit(mixed_, n * cdim_);
    fit(conv_out_, n * cdim_);
    fit(z_, n * V);
    fit(g_, n * nv_);
    fit(beta_, n * nv_);
    const int64_t group = 2 * dk_ + 2 * r * dv_;
    pool_.parallel_for(n, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* src = proj_.data() + order_[static_cast<size_t>(i)] * wq;
        const float* ba = ba_.data() + order_[static_cast<size_t>(i)] * 2 * nv_;
        float* m = mixed_.data() + i * cdim_;
        for (int64_t gk = 0; gk < nk_; ++gk) {
          const float* s = src + gk * group;
          std::memcpy(m + gk * dk_, s, static_cast<size_t>(dk_) * 4);
          std::memcpy(m + K + gk * dk_, s + dk_, static_cast<size_t>(dk_) * 4);
          std::memcpy(m + 2 * K + gk * r * dv_, s + 2 * dk_, static_cast<size_t>(r * dv_) * 4);
          std::memcpy(z_.data() + i * V + gk * r * dv_, s + 2 * dk_ + r * dv_, static_cast<size_t>(r * dv_) * 4);
          for (int64_t j = 0; j < r; ++j) {
            const int64_t hv = gk * r + j;
            beta_[static_cast<size_t>(i * nv_ + hv)] = sigmoid(ba[gk * 2 * r + j]);
            g_[static_cast<size_t>(i * nv_ + hv)] = a_neg_[static_cast<size_t>(hv)] * softplus(ba[gk * 2 * r + r + j] + dt_bias_[static_cast<size_t>(hv)]);
          }
        }
      }
    }, 16);
    convolve(kv);
    normalise_qk(n);
    fit(core_, n * V);
    // The delta rule per (sequence, value head).
    const int64_t items = static_cast<int64_t>(groups_.size()) * nv_;
    pool_.parallel_for(items, [&](int64_t b, int64_t e, int) {
      for (int64_t it = b; it < e; ++it) {
        const Group& gr = groups_[static_cast<size_t>(it / nv_)];
        const int64_t hv = it % nv_, hk = hv / r;
        ops::DeltaRuleArgs a;
        a.q = conv_out_.data() + gr.row * cdim_ + hk * dk_;
        a.k = conv_out_.data() + gr.row * cdim_ + K + hk * dk_;
        a.ld_qk = cdim_;
        a.v = conv_out_.data() + gr.row * cdim_ + 2 * K + hv * dv_;
        a.ld_v = cdim_;
        a.g = g_.data() + gr.row * nv_ + hv;
        a.beta = beta_.data() + gr.row * nv_ + hv;
        a.ld_gb = nv_;
        a.out = core_.data() + gr.row * V + hv * dv_;
        a.ld_o = V;
        a.tokens = gr.count;
        a.dk = dk_;
        a.dv = dv_;
        float* S = recurrent_state(kv, gr.seq) + hv * dk_ * dv_;
        // Pieces end at absolute multiples of the chunk and at checkpoints, so a
        // prompt's result does not depend on where a step split it (prefix caching).
        int64_t done = 0;
        size_t next_cp = gr.cp_begin;
        while (done < gr.count) {
          const int64_t p = gr.start + done;
          int64_t end = std::min((p / kChunk + 1) * kChunk, gr.start + gr.count);
          if (next_cp < gr.cp_end) end = std::min(end, cps_[next_cp].pos);
          ops::DeltaRuleArgs piece = a;
          piece.q += done * cdim_;
          piece.k += done * cdim_;
          piece.v += done * cdim_;
          piece.g += done * nv_;
          piece.beta += done * nv_;
          piece.out += done * V;
          piece.tokens = end - p;
          if (piece.tokens == 1) ops::delta_rule_recurrent(piece, S);
          else ops::delta_rule_chunked(piece, S, kChunk);
          done = end - gr.start;
          for (; next_cp < gr.cp_end && cps_[next_cp].pos == end; ++next_cp)
            std::memcpy(checkpoint_recurrent(cps_[next_cp].dst) + hv * dk_ * dv_, S, static_cast<size_t>(dk_ * dv_) * 4);
        }
      }
    }, 1, 1);
    for (const Group& gr : groups_) header(kv, gr.seq) += gr.count;
    for (const StateCheckpoint& cp : cps_) *reinterpret_cast<int64_t*>(cp.dst + state_index_ * h_.state_bytes_per_layer()) = cp.pos;
    // Gated RMSNorm per (token, value head), then out_proj; rows back in batch order.
    pool_.parallel_for(n, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t hv = 0; hv < nv_; ++hv) {
          float* o = core_.data() + i * V + hv * dv_;
          const float* z = z_.data() + i * V + hv * dv_;
          double ss = 0;
          for (int64_t j = 0; j < dv_; ++j) ss += static_cast<double>(o[j]) * o[j];
          const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dv_) + eps_));
          for (int64_t j = 0; j < dv_; ++j) o[j] = norm_[static_cast<size_t>(j)] * (o[j] * inv) * silu(z[j]);
        }
    }, 16);
    const int64_t H = w_out_.rows;
    fit(proj_, n * H);
    float* tmp = proj_.data();
    cpu::gemm_split_input(core_.data(), n, w_out_, tmp, &pool_, split);
    for (int64_t i = 0; i < n; ++i) std::memcpy(out + order_[static_cast<size_t>(i)] * H, tmp + i * H, static_cast<size_t>(H) * 4);
  }

 private:
  struct Group {
    int seq;
    int64_t row, count;  // rows [row, row + count) of the working buffers
    int64_t start;       // position of the first (tokens consumed before the step)
    size_t cp_begin, cp_end;  // its checkpoints in cps_, by position
  };

  static void fit(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  }
  uint8_t* state(KvCache& kv, int seq) const {
    uint8_t* s = kv.seq_state(seq);
    const int64_t per = h_.state_bytes_per_layer();
    if (!s || kv.layout().seq_state_bytes < (state_index_ + 1) * per)
      fail(ErrorKind::internal, "gated deltanet: the KV cache has no recurrent state for linear-attention layer " + std::to_string(state_index_));
    return s + state_index_ * per;
  }
  int64_t& header(KvCache& kv, int seq) const { return *reinterpret_cast<int64_t*>(state(kv, seq)); }
  float* conv_state(KvCache& kv, int seq) const { return reinterpret_cast<float*>(state(kv, seq) + 64); }
  float* recurrent_state(KvCache& kv, int seq) const { return conv_state(kv, seq) + (ck_ - 1) * cdim_; }
  // This layer's part of a checkpoint buffer (same layout as seq_state).
  float* checkpoint_conv(uint8_t* dst) const { return reinterpret_cast<float*>(dst + state_index_ * h_.state_bytes_per_layer() + 64); }
  float* checkpoint_recurrent(uint8_t* dst) const { return checkpoint_conv(dst) + (ck_ - 1) * cdim_; }

  // Orders the batch's tokens by sequence (first appearance), each
  // sequence's tokens in batch order, and checks that they continue its
  // state; gathers each sequence's checkpoints inside its tokens.
  void group_by_sequence(const ops::TokenSlot* slots, int64_t n, KvCache& kv) {
    groups_.clear();
    order_.clear();
    cps_.clear();
    std::vector<std::vector<int64_t>> rows;
    std::vector<int> seqs;
    for (int64_t t = 0; t < n; ++t) {
      auto it = std::find(seqs.begin(), seqs.end(), slots[t].seq);
      if (it == seqs.end()) {
        seqs.push_back(slots[t].seq);
        rows.emplace_back();
        it = seqs.end() - 1;
      }
      rows[static_cast<size_t>(it - seqs.begin())].push_back(t);
    }
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t consumed = header(kv, seqs[s]);
      for (size_t j = 0; j < rows[s].size(); ++j)
        if (slots[rows[s][j]].pos != consumed + static_cast<int64_t>(j))
          fail(ErrorKind::internal, "gated deltanet: sequence " + std::to_string(seqs[s]) + " gets position " +
                                        std::to_string(slots[rows[s][j]].pos) + " but its recurrent state stands at " +
                                        std::to_string(consumed + static_cast<int64_t>(j)) + " (linear attention runs its tokens in order)");
      const int64_t count = static_cast<int64_t>(rows[s].size());
      const size_t cp_begin = cps_.size();
      for (const StateCheckpoint& cp : kv.state_checkpoints())
        if (cp.seq == seqs[s] && cp.pos > consumed && cp.pos <= consumed + count) cps_.push_back(cp);
      std::sort(cps_.begin() + static_cast<std::ptrdiff_t>(cp_begin), cps_.end(),
                [](const StateCheckpoint& a, const StateCheckpoint& b) { return a.pos < b.pos; });
      groups_.push_back({seqs[s], static_cast<int64_t>(order_.size()), count, consumed, cp_begin, cps_.size()});
      order_.insert(order_.end(), rows[s].begin(), rows[s].end());
    }
  }

  // Causal depthwise conv over [window, new rows] per sequence, then silu;
  // the window keeps the last K - 1 inputs.
  void convolve(KvCache& kv) {
    const int64_t W = ck_ - 1;
    for (const Group& gr : groups_) {
      float* win = conv_state(kv, gr.seq);
      const float* in = mixed_.data() + gr.row * cdim_;
      float* o = conv_out_.data() + gr.row * cdim_;
      const int64_t m = gr.count;
      pool_.parallel_for(cdim_, [&](int64_t c0, int64_t c1, int) {
        std::vector<float> ext(static_cast<size_t>(W + m));
        for (int64_t c = c0; c < c1; ++c) {
          for (int64_t j = 0; j < W; ++j) ext[static_cast<size_t>(j)] = win[j * cdim_ + c];
          for (int64_t t = 0; t < m; ++t) ext[static_cast<size_t>(W + t)] = in[t * cdim_ + c];
          const float* w = conv_.data() + c * ck_;
          for (int64_t t = 0; t < m; ++t) {
            float s = 0;
            for (int64_t j = 0; j < ck_; ++j) s += w[j] * ext[static_cast<size_t>(t + j)];
            o[t * cdim_ + c] = silu(s);
          }
          for (int64_t j = 0; j < W; ++j) win[j * cdim_ + c] = ext[static_cast<size_t>(m + j)];
          for (size_t q = gr.cp_begin; q < gr.cp_end; ++q) {  // the window after cp.pos tokens
            float* cw = checkpoint_conv(cps_[q].dst);
            const int64_t at = cps_[q].pos - gr.start;
            for (int64_t j = 0; j < W; ++j) cw[j * cdim_ + c] = ext[static_cast<size_t>(at + j)];
          }
        }
      }, 64);
    }
  }

  // q and k per head: x / sqrt(sum x^2 + 1e-6); q also / sqrt(dk).
  void normalise_qk(int64_t n) {
    const float qscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk_)));
    pool_.parallel_for(n, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t h = 0; h < 2 * nk_; ++h) {
          float* v = conv_out_.data() + i * cdim_ + h * dk_;
          float ss = 0;
          for (int64_t j = 0; j < dk_; ++j) ss += v[j] * v[j];
          const float inv = 1.0f / std::sqrt(ss + 1e-6f) * (h < nk_ ? qscale : 1.0f);
          for (int64_t j = 0; j < dk_; ++j) v[j] *= inv;
        }
    }, 16);
  }

  const HybridConfig& h_;
  int64_t state_index_;
  double eps_;
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  int64_t nk_ = 0, nv_ = 0, dk_ = 0, dv_ = 0, ck_ = 0, cdim_ = 0;
  cpu::Mat w_qkvz_, w_ba_, w_out_;
  std::vector<float> conv_, dt_bias_, a_neg_, norm_;
  std::vector<float> proj_, ba_, mixed_, conv_out_, z_, g_, beta_, core_;
  std::vector<Group> groups_;
  std::vector<int64_t> order_;
  std::vector<StateCheckpoint> cps_;
};

}  // namespace

std::unique_ptr<AttentionBlock> make_gated_deltanet(WeightBinder& bind, const ModelConfig& c, int64_t state_index, const std::string& prefix,
                                                    numa::ThreadPool& pool, const cpu::GemmOptions& gemm) {
  return std::make_unique<GatedDeltaNet>(bind, c, state_index, prefix, pool, gemm);
}

}  // namespace hmoe
