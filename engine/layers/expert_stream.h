// ExpertStream: the prefetch-window scheduler. For forward passes with many
// tokens, the host-memory MoE layers of a GPU step (engine/runtime/gpu_runtime.h) compute their experts on
// the GPU, the weights streamed from pinned host memory through a ring of
// device slots (each holds one layer's E experts: bf16 in the layout of
// gpu::moe_experts, or - quantized checkpoints, GGUF included - the GPU
// quantized format of gpu::quant_moe_experts, the stored blocks copied as
// they are where that format is the stored one;
// engine/layers/expert_stream_layout.h).
//
// Timeline (gpu/README.md has the picture): a copy stream runs ahead of the
// step's stream by `window` layers. Streamed layer j uses slot j % S
// (S = window + 1). Its copy waits for the compute of layer j - S (event
// "slot free"), then records "arrived"; the step stream waits for "arrived"
// right before the expert products of layer j, then records "slot free".
// Window fill: with Fill::all every expert of the next layers is copied (the
// router of layer j is only known once layer j-1 is done, and a big batch
// routes to nearly all experts anyway); Fill::routed copies, after the
// router, only the experts the batch chose (no prefetch; for small batches).
//
// Expert products: Compute::gemm groups the pairs by expert, reads the
// group sizes back to the host (one sync per layer) and runs one cuBLAS
// product per expert and matrix (tensor cores; for many tokens per expert;
// quantized slots are dequantized to bf16 a chunk of experts at a time
// first); Compute::kernel runs gpu::moe_experts / gpu::quant_moe_experts
// (no host sync; for few tokens).
//
// Host memory (engine/layers/host_residence.h): under the copy residence
// the host layers' experts are in node memory their RoutedExperts
// registered at load, read piece by piece (no pinning here); under map they
// are pinned where they are when the slot holds
// their stored bytes (bf16, or GGUF Q8_0/Q4_K blocks) and the driver allows
// it (no copy); otherwise (formats the GPU repacks, bf16 slots of other
// dtypes, file mappings the driver refuses) one pinned image per layer is
// made at load - announced on stderr with its size, as it doubles the
// experts' host memory.
//
// Chunks (ExpertStreamOptions::chunk_experts, chosen by make_expert_stream
// when window + 1 whole layers do not fit the GPU): the ring's slots hold C
// experts each and streamed layer j's chunk c (experts [cC, cC + C)) is
// unit u = j * chunks + c, in slot u % S; the same events per unit; each
// chunk runs the grouped GGUF product on its experts' share of the sorted
// pairs (route offsets from cC), and the weighted sum of the layer follows
// its last chunk. Fill is always all (every expert of the chunk).
//
// Contract: the host experts must outlive the stream. One pass at a time:
// begin(), then layer() for each streamed layer in ascending order (all of
// them), then end() after the step stream was synchronized. layer()
// enqueues on the step stream and may block the host until the router's
// results are on the host (Compute::gemm, Fill::routed).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "engine/loading/model_config.h"
#include "gpu/kernels.h"
#include "gpu/memory.h"
#include "numa/expert_engine.h"
#include "numa/node_pools.h"

namespace hmoe {

struct ExpertScratch;  // engine/layers/gpu_experts.h

struct ExpertStreamOptions {
  int64_t min_batch = 0;  // passes with at least this many tokens stream; 0: never
  int window = 1;         // layers in flight ahead of the computing one (slots = window + 1)
  enum class Fill { automatic, all, routed } fill = Fill::automatic;  // automatic: routed when a batch is expected to use < half the experts
  enum class Compute { automatic, gemm, kernel } compute = Compute::automatic;  // automatic: gemm from 8 pairs per expert on average
  enum class Source { automatic, in_place, copy } source = Source::automatic;   // how host experts are pinned
  bool serial = false;       // benchmark (b): each layer's copy starts when the step reaches it (no overlap)
  bool skip_copies = false;  // benchmark: no copies at all, slots zeroed (compute time only; results meaningless)
  bool quiet = false;        // no stderr lines
  // Source::automatic: register the host experts that their owner did not
  // register in place (residence map, or copy's node memory where its own
  // registration was refused); false (residence off): read them as pageable memory.
  bool pin_in_place = false;
  bool quantized = true;     // quantized experts stream in their GPU format (setting gpu_quantized_experts); false: bf16
  // > 0 and < the layer's experts: each slot holds this many experts of a
  // layer and a layer streams in chunks (engine/layers/expert_stream_chunks.h;
  // GGUF layers the grouped product takes, passes of > 64 tokens); 0: whole layers.
  int64_t chunk_experts = 0;
  // > 0: the bytes the automatic fit reserved for the slots and the step's
  // room (Plan::fit_stream_bytes); make_expert_stream sizes within them so
  // that the KV blocks allocated later keep their share. 0: free memory.
  uint64_t reserved_bytes = 0;
  // bf16 experts of the grouped kernels (passes below the gemm threshold)
  // keep their activation as a bf16 hi + lo pair (ExpertHomeOptions::split_act;
  // set by the GPU runtime for Qwen3-Next under gpu_hybrid_precise).
  bool split_act = false;
  // The most tokens one streamed pass takes (max_num_batched_tokens): sizes
  // the pass's own buffers in expert_stream_step_room. 0: unknown.
  int64_t max_tokens = 0;
  // The layers' experts go through the cuBLAS path, dequantized to bf16 a
  // chunk of experts at a time (quantized experts that are not GGUF blocks
  // the grouped product takes): the room holds those chunks too.
  bool dequant_chunks = false;
  // The passes' buffers (routed products, bf16 chunks) are the GPU stack's
  // big-pass scratch (ExpertScratch, engine/layers/gpu_experts.h: its
  // resident layers' passes over 64 tokens, on the same stream, never inside
  // a captured decode graph), which the plan's workspace already counts:
  // expert_stream_step_room leaves them out. make_expert_stream's `shared`
  // argument is that scratch.
  bool shared_scratch = false;
};

struct StreamLayerStats {
  int64_t layer = 0;
  uint64_t bytes = 0;     // copied
  double copy_s = 0;      // copy stream, first copy start to arrival
  double compute_s = 0;   // expert products on the step stream
  double stall_s = 0;     // step stream waiting for the copy
};

struct ExpertStreamStats {
  int64_t passes = 0;
  uint64_t bytes = 0;
  double copy_s = 0, compute_s = 0, stall_s = 0;
  double pinned_bandwidth = 0;  // measured pinned host->device bytes/s at start
  std::vector<StreamLayerStats> layers;  // per streamed layer, summed over passes
  double achieved_bandwidth() const { return copy_s > 0 ? static_cast<double>(bytes) / copy_s : 0; }
  // Fraction of copy time the step stream did not wait for.
  double hidden_fraction() const { return copy_s > 0 ? std::max(0.0, 1.0 - stall_s / copy_s) : 0; }
};

// Pinned host -> device bandwidth (bytes/s): `bytes` copied 3 times, best.
double measure_pinned_h2d_bandwidth(size_t bytes = 128u << 20);
// Device memory bandwidth (bytes/s, read + write of a device-to-device copy of `bytes`), best of 3.
double measure_device_copy_bandwidth(size_t bytes = 256u << 20);

// Options from --gpu-prefill-min-batch-size, --gpu-prefetch-window and
// --gpu-quantized-experts (bad values: Error naming the flag or variable).
// "auto" measures the CPU expert FLOP/s on `pools` (on `sample`, one expert
// of the model, when given: the kernels its format really takes; else a
// random bf16 expert), host read bandwidth and pinned PCIe bandwidth, and
// takes the break-even of engine/placement/prefill_cost.h with the experts' bytes per
// weight as stored and as streamed; a line on stderr says what it found
// unless `quiet`.
ExpertStreamOptions expert_stream_options(const ModelConfig& c, const Settings& s, numa::NodePools& pools, const numa::ExpertWeights* sample,
                                          bool quiet);

// Lines for `hmoe plan`: the minimum batch in effect (for auto the
// break-even, with the CPU expert FLOP/s measured here), the window and the
// device memory of the slots, and whether they fit the `gpu_left` bytes the
// plan leaves of a `gpu_total`-byte GPU (the rule of expert_stream_fits).
// pcie_bandwidth 0: measured when a GPU is present, else 25 GB/s assumed
// (each said so).
// sample: as for expert_stream_options (null: the bf16 probe). Also prints
// the model's per-layer CPU and streamed times at 128..4096 tokens.
std::string prefill_plan_report(const ModelConfig& c, const Settings& s, double cpu_bandwidth, double pcie_bandwidth, int64_t streamed_layers,
                                uint64_t gpu_left, uint64_t gpu_total, const numa::ExpertWeights* sample = nullptr);

// One slot: a layer's experts as streamed (E x 3 matrices of I x H at
// expert_stream_bytes_per_weight; the real slots, sized on the layers, are
// in ExpertStream::device_bytes()).
uint64_t expert_stream_slot_size(const ModelConfig& c, const ExpertStreamOptions& o);
// Slots an ExpertStream over `layers` streamed layers holds (window + 1, at most one per layer; serial: 1).
int64_t expert_stream_slots(const ExpertStreamOptions& o, int64_t layers);
// Device bytes of those slots.
uint64_t expert_stream_slot_bytes(const ModelConfig& c, const ExpertStreamOptions& o, int64_t layers);
// GPU memory a streamed pass needs besides its slots, out of total_bytes:
// the routing lists, unless o.shared_scratch the expert products'
// buffers for o.max_tokens tokens (o.max_tokens 0: 1 GiB), 512 MiB of
// bf16 chunks under o.dequant_chunks; and a margin of 128 MiB + 0.5% of
// the card for what the plan's workspace estimate misses. The allocator's
// and libraries' own headroom is outside the budget already
// (gpu-memory-utilization).
uint64_t expert_stream_step_room(const ModelConfig& c, const ExpertStreamOptions& o, uint64_t total_bytes);
// Whether those slots fit the current device's free memory with room left
// for the step (expert_stream_step_room); else *why says
// what is missing and what to change. The stacks leave streaming off (CPU
// experts for every pass) rather than fail to load.
bool expert_stream_fits(const ModelConfig& c, const ExpertStreamOptions& o, int64_t layers, std::string* why);
// The same rule for a GPU with free_bytes of total_bytes free.
bool expert_stream_fits_in(const ModelConfig& c, const ExpertStreamOptions& o, int64_t layers, uint64_t free_bytes, uint64_t total_bytes,
                           std::string* why);

class ExpertStream {
 public:
  struct Layer {
    int64_t layer;
    const std::vector<numa::ExpertWeights>* experts;
    const std::vector<std::vector<numa::ExpertWeights>>* pieces = nullptr;  // StreamLayerSource::pieces (copy residence)
    bool registered = false;                                                // StreamLayerSource::registered
  };
  // pool (null: the calling thread) builds the pinned images at construction.
  // shared: as make_expert_stream's.
  ExpertStream(const ModelConfig& c, std::vector<Layer> layers, const ExpertStreamOptions& opt, gpu::Stream& step, gpu::Blas& blas,
               numa::ThreadPool* pool = nullptr, ExpertScratch* shared = nullptr);
  ~ExpertStream();
  ExpertStream(const ExpertStream&) = delete;
  ExpertStream& operator=(const ExpertStream&) = delete;

  const ExpertStreamOptions& options() const;
  bool wants(int64_t tokens) const;   // tokens >= min_batch > 0
  bool streams(int64_t layer) const;  // one of the layers given
  void begin(int64_t tokens);
  // Layer `layer`'s routed experts for n tokens: x [n, H] bf16 (normed),
  // ids/weights [n, k] from gpu::router_topk; out [n, H] fp32 overwritten.
  void layer(int64_t layer, const gpu::bf16_t* x, int64_t n, const int32_t* ids, const float* weights, float* out);
  void end();
  const ExpertStreamStats& stats() const;
  void reset_stats();
  uint64_t device_bytes() const;  // slots and scratch
  uint64_t pinned_copy_bytes() const;  // host bytes of pinned images (0 when pinned in place)
  bool host_registered() const;        // every layer read from node memory its owner registered (copy residence)
  bool host_pageable() const;          // read in place as pageable memory (residence off)
  bool quantized() const;              // slots hold a GPU quantized format (else bf16)
  int64_t chunk_experts() const;       // experts per slot (the layer's count: whole layers)
  const std::string& format() const;   // "bf16", "Q4_K", "Q4_K / int8-group, Q4_K", ...

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A step's stream over its host-memory MoE layers, or null when streaming
// is off: min_batch 0, no such layers, or slots that do not fit the GPU.
// When window + 1 whole layers do not fit (expert_stream_fits) the slots
// hold chunks of experts instead (plan_stream_chunks over the room the GPU
// or the --gpu-memory cap leaves after the step's room; GGUF layers the
// grouped product takes); when not even that fits, a notice on stderr unless o.quiet.
// shared: the stack's big-pass scratch the passes use when o.shared_scratch
// (it must outlive the stream); null: the stream's own.
std::unique_ptr<ExpertStream> make_expert_stream(const ModelConfig& c, std::vector<ExpertStream::Layer> layers, const ExpertStreamOptions& o,
                                                 gpu::Stream& step, gpu::Blas& blas, numa::ThreadPool* pool = nullptr, ExpertScratch* shared = nullptr);

}  // namespace hmoe
