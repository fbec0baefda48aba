// DeepSeek-V3 routed + shared experts (see blocks_deepseek_moe.h).
#include "engine/layers/deepseek_moe.h"
#include "engine/layers/routed_experts.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "configs/error.h"

namespace hmoe {

void deepseek_route(const float* logits, const float* bias, const DeepseekRouting& r, int32_t* ids, float* weights) {
  const int64_t E = r.experts;
  if (E <= 0 || r.n_group <= 0 || E % r.n_group != 0 || r.topk_group <= 0 || r.topk_group > r.n_group || r.k <= 0 ||
      r.k > r.topk_group * (E / r.n_group))
    fail(ErrorKind::invalid_argument, "deepseek_route: inconsistent experts / k / n_group / topk_group");
  const int64_t per_group = E / r.n_group;
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    score[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + bias[e];
  }
  // Descending by value, ties to the lower index.
  auto by_value = [](const std::vector<float>& v) {
    return [&v](int64_t a, int64_t b) {
      return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)] || (v[static_cast<size_t>(a)] == v[static_cast<size_t>(b)] && a < b);
    };
  };
  std::vector<float> group_score(static_cast<size_t>(r.n_group));
  for (int64_t g = 0; g < r.n_group; ++g) {
    const float* c = choice.data() + g * per_group;
    float top1 = -INFINITY, top2 = -INFINITY;
    for (int64_t i = 0; i < per_group; ++i) {
      if (c[i] > top1) {
        top2 = top1;
        top1 = c[i];
      } else if (c[i] > top2) {
        top2 = c[i];
      }
    }
    group_score[static_cast<size_t>(g)] = per_group >= 2 ? top1 + top2 : top1;
  }
  std::vector<int64_t> groups(static_cast<size_t>(r.n_group));
  std::iota(groups.begin(), groups.end(), 0);
  std::partial_sort(groups.begin(), groups.begin() + r.topk_group, groups.end(), by_value(group_score));
  std::vector<float> masked(static_cast<size_t>(E), 0.0f);
  for (int64_t i = 0; i < r.topk_group; ++i) {
    const int64_t g = groups[static_cast<size_t>(i)];
    std::copy(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group, masked.begin() + g * per_group);
  }
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + r.k, order.end(), by_value(masked));
  float sum = 0;
  for (int64_t i = 0; i < r.k; ++i) {
    ids[i] = static_cast<int32_t>(order[static_cast<size_t>(i)]);
    weights[i] = score[static_cast<size_t>(order[static_cast<size_t>(i)])];
    sum += weights[i];
  }
  const float denom = r.norm_topk_prob ? sum + 1e-20f : 1.0f;
  const float scale = static_cast<float>(r.routed_scaling_factor);
  for (int64_t i = 0; i < r.k; ++i) weights[i] = (r.norm_topk_prob ? weights[i] / denom : weights[i]) * scale;
}

namespace {

class DeepseekMoe : public FfnBlock {
 public:
  DeepseekMoe(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& p, numa::NodePools& pools, ExpertHomeOptions& opt,
              const cpu::GemmOptions& gemm)
      : pool_(pools.pool(0)), gemm_(gemm), hidden_(c.hidden_size) {
    const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
    route_ = {c.num_experts, c.num_experts_per_tok, c.mla.n_group, c.mla.topk_group, c.norm_topk_prob, c.mla.routed_scaling_factor};
    router_ = bind.mat(p + "gate.weight", c.num_experts, H);
    const cpu::Mat b = bind.vec(p + "gate.e_score_correction_bias", c.num_experts);
    bias_.resize(static_cast<size_t>(c.num_experts));
    cpu::to_f32(b.dtype, b.data, bias_.data(), c.num_experts);
    if (c.mla.n_shared_experts > 0) {
      const int64_t S = I * c.mla.n_shared_experts;
      const std::string sp = p + "shared_experts.";
      shared_ = {bind.mat(sp + "gate_proj.weight", S, H), bind.mat(sp + "up_proj.weight", S, H), bind.mat(sp + "down_proj.weight", H, S)};
      has_shared_ = true;
    }
    experts_ = std::make_unique<RoutedExperts>(bind, c, layer, p, RoutedExperts::Home::host, pools, opt);
  }
  bool is_moe() const override { return true; }

  void forward(const float* x, int64_t n, float* out, Workspace&) override {
    const int64_t E = route_.experts, K = route_.k;
    logits_.resize(static_cast<size_t>(n * E));
    ids_.resize(static_cast<size_t>(n * K));
    w_.resize(static_cast<size_t>(n * K));
    cpu::gemm_exact(x, n, router_, logits_.data(), &pool_);
    for (int64_t t = 0; t < n; ++t) deepseek_route(logits_.data() + t * E, bias_.data(), route_, ids_.data() + t * K, w_.data() + t * K);
    if (has_shared_) numa::mlp_forward(x, n, shared_, out, &pool_, gemm_);
    else std::fill(out, out + n * hidden_, 0.0f);
    experts_->run_host(x, n, ids_.data(), w_.data(), K, out);
  }

 private:
  numa::ThreadPool& pool_;
  cpu::GemmOptions gemm_;
  int64_t hidden_;
  DeepseekRouting route_;
  cpu::Mat router_;
  std::vector<float> bias_;
  std::unique_ptr<RoutedExperts> experts_;
  numa::ExpertWeights shared_;
  bool has_shared_ = false;
  std::vector<float> logits_, w_;
  std::vector<int32_t> ids_;
};

}  // namespace

std::unique_ptr<FfnBlock> make_deepseek_moe(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix,
                                            numa::NodePools& pools, ExpertHomeOptions& opt, const cpu::GemmOptions& gemm) {
  return std::make_unique<DeepseekMoe>(bind, c, layer, prefix, pools, opt, gemm);
}

}  // namespace hmoe
