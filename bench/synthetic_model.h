// Synthetic models for the GPU benchmarks: random bf16 weights made in host
// memory for a ModelConfig (Qwen3-MoE graph: attention with q/k norms,
// routed experts or a dense MLP per layer), handed out through a
// WeightLookup that GpuRuntime::from_lookup (and the CPU expert engine) can use directly.
//
// Contract: the weights live as long as the SyntheticModel; `get` returns
// views into them and throws Error(bad_model) for a name the model lacks.
// Values are uniform in (-0.05, 0.05), norm weights near 1, from a seed, so
// two builds with the same config and seed are identical. Memory is touched
// first by the pool's workers (parallel fill), never zeroed first.
//
// Layout of one MoE layer's routed experts (one allocation per layer, the
// layout of a GPU expert slot): [E][2I][H] (expert e's gate rows then its up
// rows), then [E][H][I] (down). expert_block(l) gives that allocation, so a
// benchmark can pin it or copy it as one piece.
//
// Used by bench_gpu (decode), bench_prefill (streamed experts) and others.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine/layers/weights.h"
#include "engine/loading/model_config.h"
#include "numa/thread_pool.h"

namespace hmoe::bench {

// Qwen3-30B-A3B shapes (hidden 2048, 32/4 heads of 128, 128 experts of 768,
// top-8, vocab 151936) with `layers` decoder layers (the real model has 48).
ModelConfig qwen3_30b_a3b_config(int64_t layers = 48);

class SyntheticModel {
 public:
  SyntheticModel(const SyntheticModel&) = delete;
  SyntheticModel& operator=(const SyntheticModel&) = delete;
  ~SyntheticModel();

  const ModelConfig& config() const { return c_; }
  // Tensor lookup in checkpoint names ("model.layers.3.mlp.experts.7.up_proj.weight").
  const WeightLookup& get() const { return get_; }
  uint64_t bytes() const { return bytes_; }  // bytes of weights made
  double build_seconds() const { return build_s_; }
  // Layer l's routed experts as one block in the slot layout (see above);
  // {nullptr, 0} for a dense layer.
  std::pair<const void*, uint64_t> expert_block(int64_t layer) const;

 private:
  friend std::unique_ptr<SyntheticModel> make_synthetic_model(const ModelConfig&, numa::ThreadPool&, uint64_t);
  explicit SyntheticModel(const ModelConfig& c);
  struct Block {
    void* p = nullptr;
    uint64_t bytes = 0;
  };
  ModelConfig c_;
  std::map<std::string, cpu::Mat> mats_;
  std::vector<Block> blocks_;                                  // block 0: non-expert weights
  std::vector<std::pair<const void*, uint64_t>> expert_blocks_;  // per layer
  WeightLookup get_;
  uint64_t bytes_ = 0;
  double build_s_ = 0;
};

// Makes every weight of `c` (arch qwen3_moe) with the pool's workers.
std::unique_ptr<SyntheticModel> make_synthetic_model(const ModelConfig& c, numa::ThreadPool& pool, uint64_t seed = 1);
// The Qwen3-30B-A3B shapes with `layers` layers (about 1.27 GB per layer plus 1.25 GB of embeddings and lm_head).
inline std::unique_ptr<SyntheticModel> make_qwen3_30b_a3b(int64_t layers, numa::ThreadPool& pool, uint64_t seed = 1) {
  return make_synthetic_model(qwen3_30b_a3b_config(layers), pool, seed);
}

// Fills p[0, n) with random bf16 values in (-scale, scale), in parallel.
void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale, numa::ThreadPool& pool);
// Host DRAM read bandwidth (bytes/s) of the pool's workers: best of 3 sums over 4 GiB.
double host_read_bandwidth(numa::ThreadPool& pool);
// Seconds on a steady clock.
double now_seconds();

}  // namespace hmoe::bench
