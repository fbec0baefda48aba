// The CUDA side of the layer kinds: what a GPU implementation of an
// attention or feed-forward layer gets from the step executor
// (engine/runtime/gpu_runtime.h) and what it must provide.
//
// A step runs the blocks' device work in segments between host hand-offs
// (routed experts in host memory, Engram modules), possibly as two
// micro-batches of rows, each segment possibly replayed as a CUDA graph.
// So a layer:
//  - sizes its scratch in reserve() (GpuScratch: named buffers shared by
//    all layers, grown before any work is enqueued, never during capture);
//  - enqueues only device work on ctx.s in enqueue() (no synchronisation,
//    no host reads) for the rows given, reading and writing the step's
//    activations at those rows; scratch used only inside the layer may
//    start at row 0 (micro-batches run one after the other on one stream);
//  - adds to key() every host value its launches depend on beyond the
//    step's shape (GpuStepInfo), so that graphs are captured again when one
//    changes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/kv/kv_storage_gpu.h"
#include "gpu/kernels.h"
#include "gpu/memory.h"
#include "numa/expert_engine.h"

namespace hmoe {

class ExpertStream;        // engine/layers/expert_stream.h
struct ExpertScratch;      // engine/layers/gpu_experts.h
class DeltaNetStep;        // engine/layers/hybrid_gpu.h

// The step's shape and metadata on the device (set by the executor).
struct GpuStepInfo {
  int64_t n = 0, mrows = 0;          // tokens, logit rows
  int64_t list_len = 0, max_len = 0; // KV slot lists of the step's sequences: total and longest
  int64_t ntiles = 0;                // prefill query tiles (gpu::attention_tile_list), 0: none
  int64_t multi_tokens = 0;          // tokens of sequences with more than one token in the step
  bool fused = true;                 // decode launches may be fused (setting gpu_decode_fusion)
  const int32_t *tok = nullptr, *pos = nullptr, *slot = nullptr, *off = nullptr, *len = nullptr, *multi = nullptr, *rows = nullptr,
                *lists = nullptr, *tiles = nullptr;
  std::vector<int64_t> mb_rows;     // rows of each micro-batch
  GpuKvStorage* kv = nullptr;
  bool stream_pass = false;  // host experts stream to the GPU this pass (no hand-offs)
  const DeltaNetStep* deltanet = nullptr;  // the sequences' linear-attention states (models that have them)
};

struct Rows {
  int64_t r0 = 0, rn = 0;
};

// Named device buffers the layers of a step share; grown, never shrunk.
class GpuScratch {
 public:
  void fit(const std::string& name, int64_t bytes) { bufs_[name].reserve(static_cast<size_t>(bytes < 16 ? 16 : bytes)); }
  template <class T>
  T* get(const std::string& name) const { return bufs_.at(name).as<T>(); }
  void key(std::vector<const void*>& k) const {
    for (const auto& [name, b] : bufs_) k.push_back(b.data());
  }

 private:
  std::map<std::string, gpu::DeviceBuffer> bufs_;
};

// The step's activations (device pointers at row 0): residual stream x,
// the pending block output d (added to x by the next norm), the normed
// input of a block's part as bf16 (hb) and fp32 (hf; where both are
// written, hb = bf16(hf): a split input's hi half), and the routing.
struct GpuActs {
  float *x = nullptr, *d = nullptr, *hf = nullptr;
  gpu::bf16_t* hb = nullptr;
  int32_t* ids = nullptr;
  float* wts = nullptr;
};

struct GpuCtx {
  gpu::Stream& s;
  gpu::Blas& blas;
  GpuScratch& scratch;
  ExpertScratch& expert_scratch;
  ExpertStream* stream;  // null: streaming off
  const GpuStepInfo& step;
  GpuActs a;
};

class GpuAttention {
 public:
  virtual ~GpuAttention() = default;
  virtual bool fp32_input() const { return false; }  // wants hf beside hb
  virtual void reserve(GpuCtx& ctx) = 0;
  virtual void key(const GpuStepInfo&, std::vector<int64_t>&) const {}
  // Normed input rows (hb, and hf when fp32_input) -> d rows (overwritten);
  // stores the rows' keys/values for layer `layer` of ctx.step.kv.
  virtual void enqueue(GpuCtx& ctx, const Rows& r) = 0;
  // Whether enqueue_with_norm() takes rows r: the block's input residual add
  // + RMSNorm (ctx.a.x += delta, delta null: none; normed into hb) fused
  // into the layer's first launch (decode), then as enqueue().
  virtual bool fuses_norm(const GpuCtx&, const Rows&) const { return false; }
  virtual void enqueue_with_norm(GpuCtx&, const Rows&, const gpu::bf16_t* /*norm_w*/, float /*eps*/, const float* /*delta*/) {}
  virtual uint64_t bytes() const = 0;
};

class GpuFfn {
 public:
  virtual ~GpuFfn() = default;
  // Whether the block's normed input is also wanted in fp32 (hf).
  virtual bool fp32_input() const { return false; }
  // Routed experts in host memory: this layer hands off to the CPU unless
  // the pass streams them.
  virtual bool host_experts() const { return false; }
  virtual const std::vector<numa::ExpertWeights>* host_expert_weights() const { return nullptr; }
  // Copy residence (engine/layers/host_residence.h): the host experts'
  // bytes as node pieces [expert][node] and whether they are registered
  // with the driver; null / false when the experts are the checkpoint's views.
  virtual const std::vector<std::vector<numa::ExpertWeights>>* host_expert_pieces() const { return nullptr; }
  virtual bool host_experts_registered() const { return false; }
  virtual int64_t topk() const { return 0; }
  virtual void reserve(GpuCtx& ctx) = 0;
  // Normed input rows -> d rows. With `handoff`, stops once the routing is
  // in ctx.a.ids / ctx.a.wts (the executor copies hf and the routing down,
  // runs run_host and copies the expert sums into d).
  virtual void enqueue(GpuCtx& ctx, const Rows& r, bool handoff) = 0;
  // Whether enqueue_with_norm() takes rows r: the block's post-attention
  // residual add + RMSNorm (ctx.a.x += ctx.a.d; normed into hb, and hf where
  // fp32_input()) fused into the layer's first launch (decode).
  virtual bool fuses_norm(const GpuCtx&, const Rows&) const { return false; }
  virtual void enqueue_with_norm(GpuCtx&, const Rows&, const gpu::bf16_t* /*norm_w*/, float /*eps*/, bool /*handoff*/) {}
  // During a hand-off: device work queued after the copies down, running
  // while the host computes (a shared expert).
  virtual void enqueue_during_handoff(GpuCtx&, const Rows&) {}
  // After it: device work once the expert sums are in d.
  virtual void enqueue_after_handoff(GpuCtx&, const Rows&) {}
  // Host: the routed experts for n rows; out [n, hidden] overwritten.
  virtual void run_host(const float*, int64_t, const int32_t*, const float*, float*) {}
  // The same for k pairs per token (split decode hands the CPU a subset:
  // engine/layers/gpu_expert_cache.h); out [n, hidden] overwritten. Not
  // written to the routing trace: split decode calls record_routing with
  // the step's whole routing first.
  virtual void run_host_pairs(const float*, int64_t, const int32_t*, const float*, int64_t, float*) {}
  // The routing trace (--routing-trace) of n tokens' k routed experts.
  virtual void record_routing(int64_t, const int32_t*, int64_t) {}
  virtual uint64_t bytes() const = 0;
  // Of bytes(): the routed experts resident on the GPU (0: none).
  virtual uint64_t routed_expert_bytes() const { return 0; }
};

}  // namespace hmoe
