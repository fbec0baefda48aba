// DeepSeek-V3 / Kimi-K2 routed experts, as transformers' DeepseekV3MoE and
// DeepseekV3TopkRouter compute them (topk_method noaux_tc, sigmoid scores):
//   s = sigmoid(router(x))                    (fp32)
//   choice = s + e_score_correction_bias      (selection only)
//   group score = sum of the two largest choices in each of n_group groups;
//   keep the topk_group best groups, set the other experts' choice to 0.0
//   (0.0, not -inf: as transformers does), take the k largest choices;
//   weight = s[id] (unbiased), / (sum + 1e-20) when norm_topk_prob,
//   * routed_scaling_factor.
// The shared experts (one SwiGLU MLP of moe_intermediate_size *
// n_shared_experts) always run and are added to the routed sum.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/layers/cpu_layers.h"
#include "engine/layers/routed_experts.h"

namespace hmoe {

struct DeepseekRouting {
  int64_t experts = 0, k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
};

// Routes one token. logits, bias: [experts]. ids, weights: k entries each, in
// descending order of the biased choice (ties: lower expert id first).
// Throws Error(invalid_argument) for an inconsistent DeepseekRouting.
void deepseek_route(const float* logits, const float* bias, const DeepseekRouting& r, int32_t* ids, float* weights);

// Routed experts run on numa::ExpertEngine across the pools' nodes; the
// router and the shared experts on node 0's pool.
std::unique_ptr<FfnBlock> make_deepseek_moe(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix,
                                            numa::NodePools& pools, ExpertHomeOptions& opt, const cpu::GemmOptions& gemm = {});

}  // namespace hmoe
