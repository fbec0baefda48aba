// GpuEngram: the Engram n-gram memory modules (engine/layers/engram.h) inside the
// GPU step (engine/runtime/gpu_runtime.h) of a qwen3_moe_engram model.
//
// The host side stays with EngramModules: hashing, the PLE table's row reads
// (begin_step starts every module's reads as soon as the step's tokens are
// known, so they overlap the layers before each module) and the ids each
// sequence records. Per module, apply() waits only for that module's rows,
// converts them to bf16 in a pinned buffer and copies them on a copy stream
// that the step's stream waits for (an event); the key/value products are
// gpu::Blas bf16 products with fp32 accumulation, the gate, the norms and
// the causal conv are gpu/engram.h kernels, in fp32, mirroring
// EngramModules::apply.
//
// State: the conv's window of past normalised values lives on the GPU, per
// sequence id: window() rows of [modules][hidden] fp32, written by
// end_step(); the host's recorded tags (KvCache seq_state, checked as on the
// CPU path) say which rows hold the position asked for. Like the GPU KV
// cache, these rows follow the sequence ids of the KvCache in use: one cache
// per model at a time.
//
// Contract: per step begin_step(), apply() for each module in layer order,
// end_step(); the stream is idle at begin_step() (the previous step synced).
// In a build without CUDA the constructor throws Error(unsupported).
#pragma once
#include <cstdint>
#include <memory>

#include "engine/layers/weights.h"
#include "engine/runtime/batch.h"
#include "engine/layers/engram.h"
#include "gpu/kernels.h"

namespace hmoe {

class GpuEngram {
 public:
  // Uploads every module's weights (key/value projections as bf16, the small
  // vectors as fp32); `host` (the model's EngramModules) must outlive this.
  GpuEngram(const ModelConfig& c, EngramModules& host, const WeightLookup& get, gpu::Stream& s);
  ~GpuEngram();
  GpuEngram(const GpuEngram&) = delete;
  GpuEngram& operator=(const GpuEngram&) = delete;

  uint64_t weight_bytes() const;
  // Module index inserted before `layer`, or -1.
  int module_before(int64_t layer) const;

  // Hashes the step's n-grams and starts the row reads, then uploads the
  // conv's sources and the history rows this step writes.
  void begin_step(const Batch& b, KvCache& kv, gpu::Stream& s);
  // Enqueues module m on s for batch rows [r0, r0 + rn) (x and d point at
  // row r0; rn hidden-wide rows): x += d (when not null, stored), then x +=
  // the module's output. The first call for m in a step blocks on the host
  // until m's rows are read and queues their upload. A micro-batch's rows
  // must hold every in-batch position their conv reads (one token per
  // sequence, or the whole batch).
  void apply(int m, float* x, const float* d, int64_t r0, int64_t rn, gpu::Blas& blas, gpu::Stream& s);
  // Enqueues the history update and records the step's ids on the host.
  void end_step(const Batch& b, KvCache& kv, gpu::Stream& s);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe
