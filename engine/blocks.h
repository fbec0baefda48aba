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

// A checkpoint that is not plain safetensors weights (a GGUF file,
// engine/gguf_model.h; a quantized HF checkpoint, engine/quant_config.h):
// answers the binder by Hugging Face tensor name with views the kernels take
// (ggml blocks, int4/int8/fp8 views), checking shapes and types itself.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols) = 0;
  virtual cpu::Mat vec(const std::string& name, int64_t n) = 0;
  virtual bool has(const std::string& name) const = 0;
  // Throws bad_model naming the first tensor nobody took.
  virtual void check_all_used(const std::string& where) const = 0;
  virtual uint64_t total_bytes() const = 0;
  // Reads every weight once (page faults now rather than on the first request).
  virtual void touch(const std::string& label, const std::string& progress_mode) const = 0;
};

// Takes tensors from a store (or a WeightSource, which then answers mat, vec,
// has and check_all_used), checking shape and dtype, and remembers which
// were taken so that leftovers can be reported as unexpected.
class WeightBinder {
 public:
  explicit WeightBinder(const io::TensorStore& store) : store_(&store) {}
  // store may be null (GGUF); source may be null (plain safetensors).
  WeightBinder(const io::TensorStore* store, WeightSource* source) : store_(store), source_(source) {}
  cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols);
  cpu::Mat vec(const std::string& name, int64_t n);
  bool has(const std::string& name) const { return source_ ? source_->has(name) : store_->find(name) != nullptr; }
  // Any tensor of exactly this shape and dtype (integer tables, lookups).
  const io::TensorView& tensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype);
  // Throws bad_model naming the first tensor nobody took.
  void check_all_used(const std::string& dir) const;

 private:
  const io::TensorStore* store_ = nullptr;
  WeightSource* source_ = nullptr;
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
// Routed experts run on numa::ExpertEngine (placed across the pools' nodes).
std::unique_ptr<FfnBlock> make_moe_block(WeightBinder& bind, const ModelConfig& c, const std::string& prefix,
                                         numa::NodePools& pools, const numa::EngineOptions& opt);
std::unique_ptr<FfnBlock> make_dense_mlp(WeightBinder& bind, int64_t hidden, int64_t intermediate, const std::string& prefix,
                                         numa::ThreadPool& pool);

}  // namespace hmoe
