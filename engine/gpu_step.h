// GpuStep: what Model (and the server, tests, benchmarks) need from a GPU
// decoder step, whatever the architecture: GpuStack (engine/blocks_gpu.h,
// Qwen3-MoE) and GpuMlaStack (engine/blocks_gpu_mla.h, DeepSeek-V3) implement it.
//
// Contract: forward() has the meaning of Model::forward (one call at a
// time); the KvCache lends its block tables, the keys/values live on the GPU.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"

namespace hmoe {

// Where decode time goes, summed over steps since the last reset.
struct GpuStepTimes {
  double total_s = 0;        // wall time of forward()
  double cpu_experts_s = 0;  // CPU expert work (wall)
  double transfer_s = 0;     // host<->device copies of the hybrid layers (GPU events)
  int64_t steps = 0;
  double gpu_s() const { return total_s - cpu_experts_s - transfer_s; }  // GPU work and launch overhead
};

class GpuStep {
 public:
  virtual ~GpuStep() = default;
  virtual void forward(const Batch& b, KvCache& kv, std::vector<float>& logits) = 0;
  // CUDA graph replay of steps without hybrid layers, where the step supports it.
  virtual void set_cuda_graphs(bool on) = 0;
  virtual const GpuStepTimes& times() const = 0;
  virtual void reset_times() = 0;
  virtual uint64_t weight_bytes() const = 0;  // bytes of weights on the GPU
};

}  // namespace hmoe
