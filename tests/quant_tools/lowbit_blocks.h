// Random data of the low-bit GGUF types (Q2_K, Q3_K, IQ1-IQ4, MXFP4;
// io/tensor/quant_blocks_lowbit.h) for the GPU tests and benchmarks: random
// block bytes (so every code, sign, grid index and sub-scale occurs) with
// the block scale set so that the weights have about a chosen RMS, and a
// small deepseek2 GGUF whose every matrix is such blocks. No quantizer for
// these types is written here: the kernels are checked against the CPU's
// decoding of the same bytes (cpu::lowbit_dequant_block, itself checked bit
// for bit against gguf-py), so only the bytes' layout must be the format's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/tensor/lowbit_block_scale.h"
#include "io/tensor/quant_blocks_lowbit.h"
#include "tests/quant_tools/gguf_writer.h"

namespace hmoe::qtools {

// Sets block p's scale to d (cpu::lowbit_set_block_scale).
inline void lowbit_set_scale(cpu::ExtType t, uint8_t* p, float d) { cpu::lowbit_set_block_scale(t, p, d); }

// rows x cols weights of type t as ggml blocks (rows contiguous), random
// codes, block scales 0.5..1.5 (and a random sign on a quarter of the blocks
// of the types whose d is signed) times what gives an RMS of about `rms`.
inline std::vector<uint8_t> lowbit_random_rows(cpu::ExtType t, int64_t rows, int64_t cols, uint64_t seed, float rms) {
  const cpu::ExtTypeInfo* ti = cpu::lowbit_type_info(static_cast<uint32_t>(t));
  const int64_t nb = rows * (cols / ti->block_elems);
  std::vector<uint8_t> b(static_cast<size_t>(nb * ti->block_bytes));
  std::mt19937_64 g(seed);
  for (auto& v : b) v = static_cast<uint8_t>(g());
  std::vector<float> f(static_cast<size_t>(nb));
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  const bool fp4 = static_cast<uint32_t>(t) == 39;
  for (auto& x : f) x = u(g) * (!fp4 && g() % 4 == 0 ? -1.0f : 1.0f);
  // Scale 1 first, to measure the RMS of the codes times the sub-scales (on up to 4096 blocks).
  double sum = 0;
  std::vector<float> deq(static_cast<size_t>(ti->block_elems));
  const int64_t sample = std::min<int64_t>(nb, 4096);
  for (int64_t i = 0; i < sample; ++i) {
    uint8_t* p = b.data() + i * ti->block_bytes;
    lowbit_set_scale(t, p, 1.0f);
    cpu::lowbit_dequant_block(t, p, deq.data());
    for (float v : deq) sum += static_cast<double>(v) * v;
  }
  const double have = std::sqrt(sum / static_cast<double>(sample * ti->block_elems));
  const float k = static_cast<float>(rms / std::max(have, 1e-12));
  for (int64_t i = 0; i < nb; ++i) lowbit_set_scale(t, b.data() + i * ti->block_bytes, k * f[static_cast<size_t>(i)]);
  return b;
}

// A deepseek2 GGUF with the tiny-deepseekv3-256 shapes (hidden 256, q and kv
// LoRA ranks 256, 2 heads of nope 64 / rope 64 / v 128, intermediate and
// moe_intermediate 256, 1 dense + 2 MoE layers of 4 experts, top-2 of 2
// groups with 1 kept, 1 shared expert) and a vocabulary of 512: every
// matrix is random blocks of `type` (the routed experts' down matrices of
// `down_type` when non-zero, as the dynamic quants mix them), weights of RMS
// 0.04 (output 0.3); norms, router and score-correction bias F32;
// token_embd F32.
inline GgufWriter deepseek2_lowbit_gguf(cpu::ExtType type, cpu::ExtType down_type = static_cast<cpu::ExtType>(0), uint64_t seed = 1) {
  constexpr uint32_t H = 256, R = 256, heads = 2, nope = 64, rope = 64, vd = 128, I = 256, E = 4, V = 512, layers = 3;
  GgufWriter w;
  const std::string a = "deepseek2.";
  w.kv_str("general.architecture", "deepseek2");
  w.kv_u32(a + "block_count", layers);
  w.kv_u32(a + "context_length", 4096);
  w.kv_u32(a + "embedding_length", H);
  w.kv_u32(a + "feed_forward_length", I);
  w.kv_u32(a + "attention.head_count", heads);
  w.kv_u32(a + "attention.head_count_kv", 1);
  w.kv_f32(a + "rope.freq_base", 10000.0f);
  w.kv_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_u32(a + "expert_count", E);
  w.kv_u32(a + "expert_used_count", 2);
  w.kv_u32(a + "expert_group_count", 2);
  w.kv_u32(a + "expert_group_used_count", 1);
  w.kv_u32(a + "expert_gating_func", 2);
  w.kv_u32(a + "leading_dense_block_count", 1);
  w.kv_u32(a + "vocab_size", V);
  w.kv_u32(a + "attention.q_lora_rank", R);
  w.kv_u32(a + "attention.kv_lora_rank", R);
  w.kv_u32(a + "attention.key_length", R + rope);
  w.kv_u32(a + "attention.value_length", R);
  w.kv_u32(a + "attention.key_length_mla", nope + rope);
  w.kv_u32(a + "attention.value_length_mla", vd);
  w.kv_u32(a + "expert_feed_forward_length", I);
  w.kv_u32(a + "expert_shared_count", 1);
  w.kv_f32(a + "expert_weights_scale", 2.5f);
  w.kv_bool(a + "expert_weights_norm", true);
  w.kv_u32(a + "rope.dimension_count", rope);
  w.kv_u32("tokenizer.ggml.bos_token_id", 0);
  w.kv_u32("tokenizer.ggml.eos_token_id", 1);
  uint64_t s = seed * 1000;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto f32 = [&](const std::string& name, std::vector<uint64_t> shape, float base, float scale) {
    uint64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(n);
    for (auto& x : v) x = base + scale * nd(g);
    std::vector<uint8_t> bytes(n * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add({name, 0, std::move(shape), std::move(bytes)});
  };
  auto mat = [&](const std::string& name, std::vector<uint64_t> shape, cpu::ExtType t, float rms = 0.04f) {
    uint64_t rows = 1;
    for (size_t i = 1; i < shape.size(); ++i) rows *= shape[i];
    auto bytes = lowbit_random_rows(t, static_cast<int64_t>(rows), static_cast<int64_t>(shape[0]), ++s, rms);
    w.add({name, static_cast<uint32_t>(t), std::move(shape), std::move(bytes)});
  };
  const cpu::ExtType dn = static_cast<uint32_t>(down_type) ? down_type : type;
  f32("token_embd.weight", {H, V}, 0.0f, 1.0f);
  f32("output_norm.weight", {H}, 1.0f, 0.1f);
  mat("output.weight", {H, V}, type, 0.3f);  // logits of a few units: most top-1 margins over 0.5
  for (uint32_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    f32(p + "attn_norm.weight", {H}, 1.0f, 0.1f);
    f32(p + "ffn_norm.weight", {H}, 1.0f, 0.1f);
    mat(p + "attn_q_a.weight", {H, R}, type);
    f32(p + "attn_q_a_norm.weight", {R}, 1.0f, 0.1f);
    mat(p + "attn_q_b.weight", {R, heads * (nope + rope)}, type);
    mat(p + "attn_kv_a_mqa.weight", {H, R + rope}, type);
    f32(p + "attn_kv_a_norm.weight", {R}, 1.0f, 0.1f);
    mat(p + "attn_kv_b.weight", {R, heads * (nope + vd)}, type);
    mat(p + "attn_output.weight", {heads * vd, H}, type);
    if (l == 0) {
      mat(p + "ffn_gate.weight", {H, I}, type);
      mat(p + "ffn_up.weight", {H, I}, type);
      mat(p + "ffn_down.weight", {I, H}, type);
      continue;
    }
    f32(p + "ffn_gate_inp.weight", {H, E}, 0.0f, 0.04f);  // router logits of about 1: sigmoid scores far from saturation
    f32(p + "exp_probs_b.bias", {E}, 0.0f, 0.05f);
    mat(p + "ffn_gate_exps.weight", {H, I, E}, type);
    mat(p + "ffn_up_exps.weight", {H, I, E}, type);
    mat(p + "ffn_down_exps.weight", {I, H, E}, dn);
    mat(p + "ffn_gate_shexp.weight", {H, I}, type);
    mat(p + "ffn_up_shexp.weight", {H, I}, type);
    mat(p + "ffn_down_shexp.weight", {I, H}, type);
  }
  return w;
}

}  // namespace hmoe::qtools
