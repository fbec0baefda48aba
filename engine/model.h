// Model: a decoder-only transformer composed from ModelConfig — embedding,
// a stack of (norm, attention block, norm, FFN block) layers, final norm and
// lm_head. Blocks are chosen per layer from the config (GQA attention with
// q/k norm; dense SwiGLU MLP or routed experts), so other architectures add
// blocks rather than new models.
//
// Contract: load() validates the checkpoint fully (every tensor present with
// the right shape and a supported dtype, nothing unexpected) before any
// compute. forward() runs one step for a flat batch of tokens from any
// number of sequences (prefill chunks and decode tokens mixed); it throws
// Error(invalid_argument) for token ids outside the vocabulary and leaves
// the cache unchanged in that case. One forward() at a time per Model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/ops/cpu_ops.h"
#include "io/safetensors.h"
#include "numa/node_pools.h"

namespace hmoe {

class WeightSource;  // engine/blocks.h

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<ops::TokenSlot> slots;  // same length as tokens
  std::vector<int64_t> logit_rows;    // rows (indices into tokens) that need logits
  void add(int32_t token, int seq, int64_t pos, bool want_logits) {
    tokens.push_back(token);
    slots.push_back({seq, pos});
    if (want_logits) logit_rows.push_back(static_cast<int64_t>(tokens.size()) - 1);
  }
  void clear() { tokens.clear(); slots.clear(); logit_rows.clear(); }
};

// Scratch buffers reused across steps (sized for the largest batch seen).
struct Workspace;
class GpuStep;  // engine/gpu_step.h
class EngramModules;  // engine/engram.h

class AttentionBlock {
 public:
  virtual ~AttentionBlock() = default;
  // x: normed hidden [n, hidden]; out: [n, hidden] (overwritten).
  virtual void forward(const float* x, int64_t n, const ops::TokenSlot* slots, KvCache& kv, float* out, Workspace& ws) = 0;
};

class FfnBlock {
 public:
  virtual ~FfnBlock() = default;
  // x: normed hidden [n, hidden]; out: [n, hidden] (overwritten).
  virtual void forward(const float* x, int64_t n, float* out, Workspace& ws) = 0;
  virtual bool is_moe() const = 0;
};

struct Layer {
  cpu::Mat input_norm, post_attention_norm;
  std::unique_ptr<AttentionBlock> attn;
  std::unique_ptr<FfnBlock> ffn;
};

class Model {
 public:
  // Opens and validates MODEL (a Hugging Face directory, quantized or not, or a .gguf file).
  static std::unique_ptr<Model> load(const std::string& dir, const Settings& settings);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  KvLayout kv_layout() const;
  numa::ThreadPool& pool() { return *pool_; }
  int64_t weight_bytes() const;

  // Runs one step. logits receives [batch.logit_rows.size(), vocab_size].
  void forward(const Batch& batch, KvCache& kv, std::vector<float>& logits);
  // The GPU path when --device chose it (times, placement), else nullptr.
  GpuStep* gpu() { return gpu_.get(); }
  // The n-gram memory modules of qwen3_moe_engram models (nullptr otherwise).
  EngramModules* engram() { return engram_.get(); }

 private:
  Model() = default;
  std::string dir_;
  ModelConfig config_;
  KvDtype kv_dtype_ = KvDtype::f32;  // CPU KV cache format (setting kv_cache_dtype)
  std::unique_ptr<io::TensorStore> store_;  // null for a GGUF file
  std::unique_ptr<WeightSource> source_;    // GGUF or quantized HF checkpoint; null for plain safetensors
  std::unique_ptr<numa::NodePools> pools_;  // one worker pool per NUMA node
  numa::ThreadPool* pool_ = nullptr;         // node 0's: attention, dense layers, lm_head
  std::unique_ptr<Workspace> ws_;
  cpu::Mat embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<GpuStep> gpu_;  // the GPU path (--device); null on the CPU path
  std::unique_ptr<EngramModules> engram_;
};

}  // namespace hmoe
