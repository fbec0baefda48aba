// Synthetic model weights (see synthetic_model.h).
#include "bench/synthetic_model.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "configs/error.h"
#include "io/dtype.h"

namespace hmoe::bench {

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

ModelConfig qwen3_30b_a3b_config(int64_t layers) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.arch = Arch::qwen3_moe;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.moe_intermediate_size = 768;
  c.intermediate_size = 6144;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.norm_topk_prob = true;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  return c;
}

void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale, numa::ThreadPool& pool) {
  pool.parallel_for(static_cast<int64_t>((n + 65535) / 65536), [&](int64_t b, int64_t e, int) {
    for (int64_t blk = b; blk < e; ++blk) {
      uint64_t s = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(blk) * 0xbf58476d1ce4e5b9ull + 1;
      const size_t i0 = static_cast<size_t>(blk) * 65536, i1 = std::min(n, i0 + 65536);
      for (size_t i = i0; i < i1; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const float u = static_cast<float>(static_cast<int32_t>(s >> 32)) * (1.0f / 2147483648.0f);
        p[i] = f32_to_bf16(u * scale);
      }
    }
  });
}

double host_read_bandwidth(numa::ThreadPool& pool) {
  const size_t words = (4ull << 30) / 8;
  std::vector<uint64_t> buf(words, 1);
  pool.parallel_for(static_cast<int64_t>(words / 4096), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) std::fill(buf.begin() + i * 4096, buf.begin() + (i + 1) * 4096, static_cast<uint64_t>(i));
  });
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<uint64_t> sums(static_cast<size_t>(pool.size()) * 8, 0);
    const double t0 = now_seconds();
    pool.parallel_for(
        static_cast<int64_t>(words / 4096),
        [&](int64_t b, int64_t e, int w) {
          uint64_t s = 0;
          for (int64_t i = b * 4096; i < e * 4096; ++i) s += buf[static_cast<size_t>(i)];
          sums[static_cast<size_t>(w) * 8] += s;
        },
        16);
    best = std::max(best, static_cast<double>(words * 8) / (now_seconds() - t0));
  }
  return best;
}

SyntheticModel::SyntheticModel(const ModelConfig& c) : c_(c) {
  get_ = [this](const std::string& name, const std::vector<int64_t>&) {
    auto it = mats_.find(name);
    if (it == mats_.end()) fail(ErrorKind::bad_model, "synthetic model has no tensor " + name);
    return it->second;
  };
}

SyntheticModel::~SyntheticModel() {
  for (Block& b : blocks_) std::free(b.p);
}

std::pair<const void*, uint64_t> SyntheticModel::expert_block(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(expert_blocks_.size())) return {nullptr, 0};
  return expert_blocks_[static_cast<size_t>(layer)];
}

std::unique_ptr<SyntheticModel> make_synthetic_model(const ModelConfig& c, numa::ThreadPool& pool, uint64_t seed) {
  if (c.arch != Arch::qwen3_moe) fail(ErrorKind::unsupported, "synthetic model: only the qwen3_moe graph");
  std::unique_ptr<SyntheticModel> m(new SyntheticModel(c));
  const double t0 = now_seconds();
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim, V = c.vocab_size;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, Id = c.intermediate_size, L = c.num_hidden_layers;
  // Page-aligned blocks, first touched by the fill.
  auto block = [&](int64_t elems) {
    const uint64_t bytes = (static_cast<uint64_t>(elems) * 2 + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, bytes);
    if (!p) fail(ErrorKind::out_of_memory, "synthetic model: cannot allocate " + std::to_string(bytes) + " bytes");
    m->blocks_.push_back({p, bytes});
    fill_random_bf16(static_cast<uint16_t*>(p), static_cast<size_t>(elems), seed * 1000 + m->blocks_.size(), 0.05f, pool);
    m->bytes_ += static_cast<uint64_t>(elems) * 2;
    return static_cast<uint16_t*>(p);
  };
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, uint16_t* p) {
    m->mats_[name] = cpu::Mat{DType::bf16, p, rows, cols};
    return p + rows * cols;
  };
  auto ones = [](uint16_t* q, int64_t n) {  // norm weights near 1 so activations keep their scale
    for (int64_t i = 0; i < n; ++i) q[i] = f32_to_bf16(1.0f + bf16_to_f32(q[i]));
  };
  // Everything that is not a routed expert in block 0.
  int64_t dense = 0;
  for (int64_t l = 0; l < L; ++l) dense += c.is_moe_layer(l) ? 0 : 3 * Id * H;
  const int64_t per_layer = (nh + 2 * kvh) * hd * H + H * nh * hd + 2 * hd + 2 * H + E * H;
  uint16_t* p = block((c.tie_word_embeddings ? 1 : 2) * V * H + H + L * per_layer + dense);
  p = add("model.embed_tokens.weight", V, H, p);
  if (!c.tie_word_embeddings) p = add("lm_head.weight", V, H, p);
  ones(p, H);
  p = add("model.norm.weight", 1, H, p);
  m->expert_blocks_.assign(static_cast<size_t>(L), {nullptr, 0});
  for (int64_t l = 0; l < L; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    p = add(pre + "self_attn.q_proj.weight", nh * hd, H, p);
    p = add(pre + "self_attn.k_proj.weight", kvh * hd, H, p);
    p = add(pre + "self_attn.v_proj.weight", kvh * hd, H, p);
    p = add(pre + "self_attn.o_proj.weight", H, nh * hd, p);
    ones(p, 2 * hd + 2 * H);
    p = add(pre + "self_attn.q_norm.weight", 1, hd, p);
    p = add(pre + "self_attn.k_norm.weight", 1, hd, p);
    p = add(pre + "input_layernorm.weight", 1, H, p);
    p = add(pre + "post_attention_layernorm.weight", 1, H, p);
    p = add(pre + "mlp.gate.weight", E, H, p);
    if (!c.is_moe_layer(l)) {
      p = add(pre + "mlp.gate_proj.weight", Id, H, p);
      p = add(pre + "mlp.up_proj.weight", Id, H, p);
      p = add(pre + "mlp.down_proj.weight", H, Id, p);
      continue;
    }
    uint16_t* ex = block(E * 3 * I * H);
    m->expert_blocks_[static_cast<size_t>(l)] = {ex, static_cast<uint64_t>(E * 3 * I * H) * 2};
    uint16_t* dn = ex + E * 2 * I * H;
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = pre + "mlp.experts." + std::to_string(e) + ".";
      add(ep + "gate_proj.weight", I, H, ex + e * 2 * I * H);
      add(ep + "up_proj.weight", I, H, ex + e * 2 * I * H + I * H);
      add(ep + "down_proj.weight", H, I, dn + e * H * I);
    }
  }
  m->build_s_ = now_seconds() - t0;
  return m;
}

}  // namespace hmoe::bench
