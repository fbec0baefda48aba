// One MoE layer's routed experts resident on the GPU, shared by the Qwen3-MoE
// and DeepSeek-V3 MoE layers (engine/layers/routed_experts.h).
//
// Contract:
//  - Plain checkpoints: bf16 [E][2I][H] (gate rows, then up rows, per expert)
//    and [E][H][I], run by gpu::moe_experts.
//  - Quantized checkpoints (GGUF blocks, GPTQ/AWQ/compressed-tensors, FP8)
//    whose every expert matrix has a GPU format (gpu/quant.h: Q8_0, Q4_K,
//    int4-group, int8-group, fp8; Q4_0/Q4_1/Q5_*/Q6_K are repacked losslessly)
//    stay quantized when `keep_quantized` (setting gpu_quantized_experts) and
//    run by gpu::quant_moe_experts: the GPU holds about the stored bytes
//    instead of 2 per weight. Otherwise they are dequantized to bf16.
//    GGUF Q4_K/Q5_K/Q6_K/Q8_0 and low-bit (Q2_K, Q3_K, IQ1-IQ4, MXFP4)
//    experts keep the file's blocks unchanged (the low-bit types have no
//    other GPU format) and run by gpu::gguf_moe_experts (decode-sized
//    passes), gpu::gguf_moe_gemm (grouped tensor cores, passes over 64
//    tokens) or gpu::gguf_dequant + cuBLAS (big passes).
//  - run() needs gpu::moe_route's offsets and pair list for `ids`; act and
//    partial are the scratch both kernels take ([n*K, I] bf16, [n*K, H] f32).
// Upload is synchronous on the given stream; errors are Error exceptions
// naming the layer (`what`).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu/kernels.h"
#include "gpu/memory.h"
#include "numa/expert_engine.h"

namespace hmoe {

// Bytes per weight the GPU holds for routed experts stored as `m` (2 for
// bf16 residency, else the GPU format's data + scales + zeros per weight).
double gpu_expert_bytes_per_weight(const cpu::Mat& m, bool keep_quantized);
// The same where the caller knows whether every expert matrix of the layer
// is a GGUF type the stored-block kernels take (gpu::gguf_native_supported):
// only then are they held as stored; one that is not puts the layer in the
// repacked formats.
double gpu_expert_bytes_per_weight(const cpu::Mat& m, bool keep_quantized, bool layer_native);

class WeightSource;
struct ModelConfig;
// Sets c.expert_bytes_per_weight (as stored, for the CPU experts) and
// c.gpu_expert_bytes_per_weight (resident, kept quantized) from the first
// MoE layer's expert 0 in `src` (a quantized Hugging Face checkpoint), so
// that placement and `hmoe plan` count what the experts really take. Leaves
// c alone when that expert is absent (the loader then names it).
void set_expert_bytes_from(ModelConfig& c, WeightSource& src);

// Routed experts as per-expert cuBLAS products, for big passes: the rows of
// each expert gathered (pair list order), gate/up product, SwiGLU, down
// product, then the weighted sum per token. offs: gpu::moe_route's offsets
// already copied to the host (E + 1); wgu/wdn as gpu::moe_experts takes
// them. Scratch grows to the pass. Worth it from about 16 * E routed pairs
// (tensor cores against the grouped SIMT kernel: 1.2 vs 14.5 ms per
// Qwen3-30B-A3B layer at 2048 tokens on an H200).
struct MoeGemmScratch {
  gpu::DeviceBuffer xs, gu, act, ys, inv;
};

// What a big pass of GpuResidentExperts::run needs besides the weights: one
// per GPU stack, shared by all its resident layers (a layer's pass ends
// before the next layer's starts, on one stream), so that it grows to one
// pass's size once rather than once per layer.
struct ExpertScratch {
  MoeGemmScratch gemm;
  gpu::DeviceBuffer deq_gu, deq_dn;  // quantized experts: a chunk of experts in bf16
  gpu::PinnedBuffer offs_h;          // the routing offsets on the host
  gpu::Event offs_ev;
};
// weight(e, down): expert e's bf16 [2I, H] gate/up (down false) or [H, I]
// down matrix on the device; asked in expert order, gate/up pass first, only
// for experts with rows.
using ExpertWeightFn = std::function<const uint16_t*(int64_t e, bool down)>;
void moe_experts_gemm(gpu::Blas& blas, const uint16_t* x, int64_t n, int64_t H, int64_t I, int64_t E, int64_t K, const int32_t* offs,
                      const int32_t* pair_list, const float* weights, const ExpertWeightFn& weight, MoeGemmScratch& sc, float* out, gpu::Stream& s);

class GpuResidentExperts {
 public:
  GpuResidentExperts(const std::vector<numa::ExpertWeights>& experts, bool keep_quantized, gpu::Stream& s, const std::string& what);
  ~GpuResidentExperts();
  GpuResidentExperts(const GpuResidentExperts&) = delete;
  GpuResidentExperts& operator=(const GpuResidentExperts&) = delete;

  uint64_t bytes() const;
  // "bf16" or the GPU format of the gate/up and down matrices ("Q8_0", "int4-group / Q8_0", ...).
  std::string format() const;
  bool quantized() const;
  // Whether run() for n tokens reads route_off / pair_list (gpu::moe_route);
  // GGUF experts of decode-sized passes go by ids alone.
  bool needs_routing(int64_t n, int64_t K) const;

  // out[t] = sum_j wts[t*K+j] * expert_{ids[t*K+j]}(x[t]) for t < n (overwritten).
  // Passes of n > 64 tokens with n * K >= 16 * E (never inside a captured
  // graph: the offsets come to the host) take moe_experts_gemm on `blas`;
  // quantized experts are then dequantized to bf16 a chunk of experts at a
  // time (at most 256 MiB of scratch per matrix kind).
  // act_lo (optional, laid out as act): bf16 experts of the grouped kernels
  // keep their activation as a hi + lo pair (gpu::moe_experts).
  void run(const uint16_t* x, int64_t n, int64_t K, const int32_t* ids, const float* wts, const int32_t* route_off, const int32_t* pair_list,
           uint16_t* act, float* partial, float* out, gpu::Blas& blas, ExpertScratch& scratch, gpu::Stream& s, uint16_t* act_lo = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe
