// RoutedExperts: one MoE layer's routed experts, in one of their homes,
// behind one interface for the CPU and the GPU step:
//  - gpu: resident on the GPU (GpuResidentExperts: bf16, or the checkpoint's
//    quantized format where the GPU kernels take it); the host pages of the
//    weights are released after the upload;
//  - host: in host memory, run by the NUMA expert engine (numa::ExpertEngine)
//    on the CPU - from the CPU step directly, from the GPU step through a
//    hand-off - or, for GPU passes of many tokens, streamed to the GPU
//    through the step's ExpertStream (engine/layers/expert_stream.h).
// The binding of the E x 3 matrices from the checkpoint lives here only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/layers/gpu_layer.h"
#include "engine/layers/host_residence.h"
#include "engine/layers/weights.h"
#include "engine/loading/model_config.h"
#include "numa/expert_engine.h"
#include "numa/node_pools.h"

namespace hmoe {

class GpuResidentExperts;
class RoutingTraceWriter;  // engine/layers/routing_trace.h
class ExpertDeferral;      // engine/layers/expert_deferral.h

// How the homes are made; print_memory is turned off after the first host
// layer (the first speaks for all).
struct ExpertHomeOptions {
  numa::EngineOptions engine;
  bool keep_quantized = true;  // setting gpu_quantized_experts
  // GPU homes, bf16 experts: passes of the grouped kernels (decode-sized;
  // not the cuBLAS passes of > 64 tokens) keep the activation between the
  // gate/up and down products as a bf16 hi + lo pair (Qwen3-Next under
  // gpu_hybrid_precise; gpu::moe_experts' act_lo).
  bool split_act = false;
  // Host homes: run_host records its routing here (null: no trace) and
  // defers experts through this (null: no deferral). Owned by the model /
  // runtime, which outlive the layers' use of them.
  RoutingTraceWriter* trace = nullptr;
  ExpertDeferral* deferral = nullptr;
  // Host homes of a GPU run (engine/layers/host_residence.h): copy makes the
  // expert engine copy experts that view a checkpoint file map into node
  // memory (whatever the node count), registers its node buffers with the
  // driver and drops the checkpoint's pages of them
  // (WeightBinder::drop_copied); experts in the loader's own buffers
  // (anonymous memory already) are registered where they are. map and off
  // leave the experts where the checkpoint has them. residence_stats (may
  // be null) sums what the copies and registrations took.
  HostResidence residence = HostResidence::off;
  HostResidenceStats* residence_stats = nullptr;
};

class RoutedExperts {
 public:
  enum class Home { gpu, host };
  // Binds `prefix`experts.{e}.{gate,up,down}_proj.weight for every expert of
  // layer `layer` (intermediate c.moe_intermediate_size). gpu: uploads on s.
  RoutedExperts(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix, Home home, numa::NodePools& pools,
                ExpertHomeOptions& opt, gpu::Stream* s = nullptr);
  ~RoutedExperts();
  RoutedExperts(const RoutedExperts&) = delete;
  RoutedExperts& operator=(const RoutedExperts&) = delete;

  Home home() const { return home_; }
  int64_t layer() const { return layer_; }
  // Host: out[t] += sum_j w[t*k+j] * expert_{ids[t*k+j]}(x[t]) (with
  // deferral: the kept experts now, plus the previous layer's deferred sum).
  // The routing goes to the routing trace (--routing-trace) unless `record` is false (split decode records a
  // step's whole routing with record_routing and hands the CPU only a subset of its pairs).
  void run_host(const float* x, int64_t n, const int32_t* ids, const float* w, int64_t k, float* out, bool record = true);
  // The routing trace only: n tokens' k expert ids (a no-op without a trace).
  void record_routing(int64_t n, const int32_t* ids, int64_t k);
  // GPU: resident experts, or (host home, ctx.step.stream_pass) streamed;
  // x: normed rows in bf16, out overwritten with the weighted sum.
  void enqueue(GpuCtx& ctx, const gpu::bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* w, float* out);
  // Scratch enqueue needs for the step.
  void reserve(GpuCtx& ctx, int64_t k) const;
  const std::vector<numa::ExpertWeights>& host_weights() const { return host_; }
  // Copy residence: the experts' bytes as the engine's node pieces
  // [expert][node] (null when not copied: the bytes are host_weights()'),
  // and whether the driver registered them (the pieces, or the loader's own
  // buffers in place).
  const std::vector<std::vector<numa::ExpertWeights>>* host_pieces() const { return pieces_.empty() ? nullptr : &pieces_; }
  bool host_registered() const { return !pins_.empty(); }
  uint64_t gpu_bytes() const;

 private:
  Home home_;
  int64_t layer_, experts_, hidden_, inter_;
  std::vector<numa::ExpertWeights> host_;  // host home
  std::unique_ptr<numa::ExpertEngine> engine_;
  std::vector<std::vector<numa::ExpertWeights>> pieces_;  // copy residence: engine_->pieces()
  std::vector<gpu::HostRegistration> pins_;               // copy residence: engine_'s node buffers (released before engine_)
  std::unique_ptr<GpuResidentExperts> gpu_;
  RoutingTraceWriter* trace_ = nullptr;
  ExpertDeferral* deferral_ = nullptr;
  bool split_act_ = false;  // ExpertHomeOptions::split_act, GPU home with bf16 experts (streamed passes: ExpertStreamOptions::split_act)
};

}  // namespace hmoe
