// The building blocks a Model is composed of, and the binder that checks
// each weight as it is taken from the checkpoint. Private to engine/.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/model.h"
#include "numa/expert_engine.h"

namespace hmoe {

// Takes tensors from a store, checking shape and dtype, and remembers which
// were taken so that leftovers can be reported as unexpected.
class WeightBinder {
 public:
  explicit WeightBinder(const io::TensorStore& store) : store_(store) {}
  cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols);
  cpu::Mat vec(const std::string& name, int64_t n);
  bool has(const std::string& name) const { return store_.find(name) != nullptr; }
  // Throws bad_model naming the first tensor nobody took.
  void check_all_used(const std::string& dir) const;

 private:
  const io::TensorStore& store_;
  std::set<std::string> used_;
};

struct Workspace {
  std::vector<float> hidden, normed, block_out;
  std::vector<float> q, k, v, attn;
  std::vector<float> router;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_w;
  void resize(int64_t n, const ModelConfig& c);
};

std::unique_ptr<AttentionBlock> make_gqa_attention(WeightBinder& bind, const ModelConfig& c, int64_t layer,
                                                   const std::string& prefix, numa::ThreadPool& pool);
std::unique_ptr<FfnBlock> make_moe_block(WeightBinder& bind, const ModelConfig& c, const std::string& prefix,
                                         numa::ThreadPool& pool);
std::unique_ptr<FfnBlock> make_dense_mlp(WeightBinder& bind, int64_t hidden, int64_t intermediate, const std::string& prefix,
                                         numa::ThreadPool& pool);

}  // namespace hmoe
