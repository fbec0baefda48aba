// Qwen3-Next (80B-A3B shapes by default) in llama.cpp's `qwen3next` layout,
// the one its converter (conversion/qwen.py) writes and hmoe's GGUF reader
// (engine/loading/gguf_qwen3next.h) takes, without the MTP block
// (nextn_predict_layers absent: llama.cpp and hmoe both then run the trunk).
//
// Values, chosen so that a forward pass over random weights stays finite
// and the recurrent state neither explodes nor is ignored:
//  - matrices uniform with standard deviation 0.02 (as the other archs);
//  - the zero-centred RMSNorms (attn_norm, post_attention_norm, q/k norms,
//    output_norm) are stored as 1 + w by the converter: stored 1, i.e. w = 0,
//    a unit scale; the DeltaNet output's gated norm (ssm_norm, stored as is)
//    is 1 too;
//  - ssm_a = -exp(A_log) with A_log uniform in [0, log 16): decay rates A in
//    [1, 16), inside the (0, 16) Qwen3-Next draws A from at initialisation
//    (the per-token decay exp(-A softplus(a + dt_bias)) then spans slow to
//    fast forgetting across heads);
//  - ssm_dt.bias (dt_bias) uniform in [0, 2), around its initial value 1;
//  - ssm_conv1d uniform in [-0.5, 0.5), the default initialisation bound
//    1/sqrt(kernel) of a depthwise conv of kernel 4 (at 0.02 the conv would
//    shrink the DeltaNet's values some 25-fold against the other paths);
//  - routers and the shared-expert gate F32 random (llama.cpp keeps them F32).
#include <cmath>
#include <string>
#include <vector>

#include "tools/slice_gguf/slice_gguf.h"

namespace hmoe::slice {

namespace {

void add_gated_deltanet(std::vector<Tensor>& t, const std::string& b, const Shape& s) {
  using F = Tensor::Fill;
  const uint64_t H = static_cast<uint64_t>(s.hidden), nk = static_cast<uint64_t>(s.linear_key_heads), nv = static_cast<uint64_t>(s.linear_value_heads),
                 d = static_cast<uint64_t>(s.linear_head_dim), K = static_cast<uint64_t>(s.conv_kernel);
  const uint64_t key_dim = nk * d, value_dim = nv * d, conv_dim = 2 * key_dim + value_dim;
  t.push_back({b + "attn_qkv.weight", kF16, {H, conv_dim}, F::random});  // [all q | all k | all v]
  t.push_back({b + "attn_gate.weight", kF16, {H, value_dim}, F::random});  // z
  t.push_back({b + "ssm_ba.weight", kF16, {H, 2 * nv}, F::random});
  t.push_back({b + "ssm_conv1d.weight", kF32, {K, conv_dim}, F::uniform, -0.5f, 0.5f});
  t.push_back({b + "ssm_dt.bias", kF32, {nv}, F::uniform, 0.0f, 2.0f});
  t.push_back({b + "ssm_a", kF32, {nv}, F::neg_exp, 0.0f, std::log(16.0f)});
  t.push_back({b + "ssm_norm.weight", kF32, {d}, F::ones});
  t.push_back({b + "ssm_out.weight", kF16, {value_dim, H}, F::random});
}

}  // namespace

std::vector<Tensor> qwen3next_tensors(const Shape& s) {
  using F = Tensor::Fill;
  const uint64_t H = static_cast<uint64_t>(s.hidden), V = static_cast<uint64_t>(s.vocab), S = static_cast<uint64_t>(s.shared_ffn);
  std::vector<Tensor> t;
  t.push_back({"token_embd.weight", kF16, {H, V}, F::random});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", kF32, {H}, F::ones});
    if ((l + 1) % s.full_interval == 0) add_qwen_attention(t, b, s, true);
    else add_gated_deltanet(t, b, s);
    t.push_back({b + "post_attention_norm.weight", kF32, {H}, F::ones});
    add_routed_experts(t, b, s);
    t.push_back({b + "ffn_gate_shexp.weight", kF16, {H, S}, F::random});
    t.push_back({b + "ffn_up_shexp.weight", kF16, {H, S}, F::random});
    t.push_back({b + "ffn_down_shexp.weight", kF16, {S, H}, F::random});
    t.push_back({b + "ffn_gate_inp_shexp.weight", kF32, {H, 1}, F::random});  // the shared expert's sigmoid gate ([1, H] as stored)
  }
  t.push_back({"output_norm.weight", kF32, {H}, F::ones});
  t.push_back({"output.weight", kF16, {H, V}, F::random});
  return t;
}

void add_qwen3next_keys(Meta& m, const Shape& s) {
  // Qwen3-Next-80B-A3B's context 262144, dense intermediate 5120 (no dense
  // layer uses it), rope theta 1e7.
  add_qwen_keys(m, "qwen3next", "Qwen3-Next-80B-A3B slice", s, 262144, 5120, 1e7f);
  const std::string a = "qwen3next.";
  m.u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(s.shared_ffn));
  m.u32(a + "ssm.conv_kernel", static_cast<uint32_t>(s.conv_kernel));
  m.u32(a + "ssm.state_size", static_cast<uint32_t>(s.linear_head_dim));
  m.u32(a + "ssm.group_count", static_cast<uint32_t>(s.linear_key_heads));
  m.u32(a + "ssm.time_step_rank", static_cast<uint32_t>(s.linear_value_heads));
  m.u32(a + "ssm.inner_size", static_cast<uint32_t>(s.linear_value_heads * s.linear_head_dim));
  m.u32(a + "full_attention_interval", static_cast<uint32_t>(s.full_interval));
  m.u32(a + "rope.dimension_count", static_cast<uint32_t>(s.head_dim / 4));  // partial rotary 0.25
}

}  // namespace hmoe::slice
