// A small random qwen3moe GGUF (hidden 256, 4 experts of 256, 2 layers, vocab
// 256) with every matrix in one ggml block type, and its F32 twin holding the
// dequantized weights: the tests' model for each block type (CPU:
// tests/engine/test_gguf_files.cpp; GPU: tests/gpu/test_gpu_gguf.cpp).
#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "numa/kernels.h"
#include "numa/quant_gguf.h"
#include "tests/quant_tools/gguf_writer.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

namespace hmoe::qtools {

using cpu::ExtType;

constexpr int64_t kVocab = 256, kHidden = 256, kHeads = 4, kKv = 2, kHeadDim = 64, kExperts = 4, kTop = 2, kInter = 256, kLayers = 2;

struct Built {
  qtools::GgufWriter quant, twin;  // twin: F32 tensors holding the dequantized weights
};

// Random weights; every matrix stored as `type` (0 = F32) in `quant`.
inline Built build_model(uint32_t type) {
  Built b;
  for (auto* w : {&b.quant, &b.twin}) {
    w->kv_str("general.architecture", "qwen3moe");
    w->kv_u32("qwen3moe.block_count", kLayers);
    w->kv_u32("qwen3moe.context_length", 512);
    w->kv_u32("qwen3moe.embedding_length", kHidden);
    w->kv_u32("qwen3moe.attention.head_count", kHeads);
    w->kv_u32("qwen3moe.attention.head_count_kv", kKv);
    w->kv_u32("qwen3moe.attention.key_length", kHeadDim);
    w->kv_u32("qwen3moe.attention.value_length", kHeadDim);
    w->kv_f32("qwen3moe.rope.freq_base", 1000000.0f);
    w->kv_f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
    w->kv_u32("qwen3moe.expert_count", kExperts);
    w->kv_u32("qwen3moe.expert_used_count", kTop);
    w->kv_u32("qwen3moe.expert_feed_forward_length", kInter);
    w->kv_u32("tokenizer.ggml.eos_token_id", 1);
  }
  uint64_t seed = 1;
  auto f32_bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  auto add = [&](const std::string& name, std::vector<uint64_t> shape, bool matrix, float scale) {
    uint64_t n = 1;
    for (auto d : shape) n *= d;
    auto v = test::random_floats(n, seed++, scale);
    if (!matrix) {
      for (auto& x : v) x = 1.0f + 0.1f * x;
      b.quant.add({name, 0, shape, f32_bytes(v)});
      b.twin.add({name, 0, shape, f32_bytes(v)});
      return;
    }
    if (type == 0) {
      b.quant.add({name, 0, shape, f32_bytes(v)});
      b.twin.add({name, 0, shape, f32_bytes(v)});
      return;
    }
    const int64_t cols = static_cast<int64_t>(shape[0]), rows = static_cast<int64_t>(n / shape[0]);
    auto q = qtools::quant_rows(static_cast<ExtType>(type), v.data(), rows, cols);
    const cpu::Mat m = cpu::ext_view(static_cast<ExtType>(type), q.data(), rows, cols, name);
    std::vector<float> deq(n);
    for (int64_t r = 0; r < rows; ++r) cpu::row_to_f32(m, r, deq.data() + r * cols);
    b.quant.add({name, type, shape, std::move(q)});
    b.twin.add({name, 0, shape, f32_bytes(deq)});
  };
  add("token_embd.weight", {kHidden, kVocab}, true, 1.0f);
  add("output_norm.weight", {kHidden}, false, 1.0f);
  add("output.weight", {kHidden, kVocab}, true, 0.05f);
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {kHidden}, false, 1.0f);
    add(p + "ffn_norm.weight", {kHidden}, false, 1.0f);
    add(p + "attn_q.weight", {kHidden, kHeads * kHeadDim}, true, 0.05f);
    add(p + "attn_k.weight", {kHidden, kKv * kHeadDim}, true, 0.05f);
    add(p + "attn_v.weight", {kHidden, kKv * kHeadDim}, true, 0.05f);
    add(p + "attn_output.weight", {kHeads * kHeadDim, kHidden}, true, 0.05f);
    add(p + "attn_q_norm.weight", {kHeadDim}, false, 1.0f);
    add(p + "attn_k_norm.weight", {kHeadDim}, false, 1.0f);
    add(p + "ffn_gate_inp.weight", {kHidden, kExperts}, false, 0.0f);
    add(p + "ffn_gate_exps.weight", {kHidden, kInter, kExperts}, true, 0.05f);
    add(p + "ffn_up_exps.weight", {kHidden, kInter, kExperts}, true, 0.05f);
    add(p + "ffn_down_exps.weight", {kInter, kHidden, kExperts}, true, 0.05f);
  }
  // The router must not be the constant 1 +- 0.1 of a norm: random it is.
  for (auto* w : {&b.quant, &b.twin})
    for (auto& t : w->tensors())
      if (t.name.find("ffn_gate_inp") != std::string::npos) {
        auto v = test::random_floats(kHidden * kExperts, 99, 0.2f);
        t.bytes = f32_bytes(v);
      }
  return b;
}

}  // namespace hmoe::qtools
