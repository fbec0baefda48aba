// Routed experts on the CPU, placed across NUMA nodes.
//
// Placement: each expert's gate/up rows (the intermediate dimension) and its
// down rows (the hidden dimension) are split across the nodes, so every node
// streams its share of every expert and no weight is mirrored. On more than
// one node each slice is copied into memory bound to its node and first
// touched by that node's workers; on one node the engine keeps views of the
// caller's weights (no copy).
//
// Step: tokens routed to the same expert are computed together (one pass
// over that expert's weights per step, whatever the batch). Phase 1: every
// node computes its intermediate slice of silu(gate x) * up x for all
// active experts (SwiGLU fused per row block). Phase 2: every node computes
// its hidden slice of down(act) for all active experts and adds the
// routing-weighted sum into out, experts in ascending order, so results do
// not depend on thread timing or on the number of nodes.
//
// Exactness: activations stay fp32 by default. bf16_dot (HMOE_CPU_BF16_DOT)
// routes bf16 weights through vdpbf16ps, which rounds activations to bf16:
// faster for prefill, not for runs compared against fp32 references.
//
// int8_act (HMOE_CPU_INT8_ACT, default on): int8/int4 weights multiply
// activations quantized to int8 per group with VNNI integer dot products
// (numerics in numa/kernels.h); the gathered token rows and the SwiGLU
// output are quantized once per step. Used where cpu::int8_act_applies (else
// the fp32 path); bf16/f16/f32 weights are never affected.
//
// gguf_int8 (HMOE_CPU_GGUF_INT8, default on): ggml block weights (Q4_K,
// Q5_K, Q6_K, Q8_0, Q4_0, Q5_0) multiply activations quantized to 8 bits per
// weight block, as llama.cpp does (numa/quant_gguf_q8.h): the gathered token
// rows and the SwiGLU output are quantized once per step. Off: the exact
// fp32 dequantize path.
//
// lowbit_repack (HMOE_CPU_LOWBIT_REPACK, default on): with gguf_int8, IQ1_S
// and IQ1_M slices (AVX-512 CPUs) are repacked once here into the v5 layout
// (numa/quant_gguf_lowbit.h: base-3 trits, 58 / 66 bytes per 256 weights
// against 50 / 56), and IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S / IQ1_S /
// IQ1_M slices (AVX2 CPUs) into the AVX2 v3 level codes (102 / 106 / 106 /
// 134 / 134 / 70 / 82 bytes against 66 / 74 / 82 / 98 / 110 / 50 / 56), in
// memory of the node that computes them, and every step
// reads those instead of the file's blocks (pieces() still returns the
// file's blocks, for the GPU).
//
// amx_min_tokens (HMOE_CPU_AMX_MIN_TOKENS, default 0 = off; -1 here: the
// process-wide cpu::amx_min_tokens()): with gguf_int8 on a CPU with AMX-BF16
// (cpu::amx_mode()), experts that get at least this many tokens in a step run
// on AMX tiles (numa/quant_gguf_amx.h): their token rows and SwiGLU outputs
// are rounded to bf16 and packed per 16 tokens once per step, and each work
// item dequantizes a strip of up to 128 weight rows to bf16 once for all the
// expert's tokens. The other experts take the 8-bit path in the same step.
//
// onednn_min_tokens (HMOE_CPU_ONEDNN_MIN_TOKENS, 0 = off): with bf16
// weights, experts that get at least this many tokens in a step (prefill)
// run as oneDNN bf16 matmuls on oneDNN's threads (numa/onednn_matmul.h:
// weights used in place, no copy): up, then gate with silu(.) * up fused
// into its epilogue writing bf16, then down; activations are rounded to bf16
// as with bf16_dot. Their outputs join phase 2's sum after the other experts.
//
// Thread safety: the weights are read-only; forward() is one caller at a time
// (it uses the pools and per-engine scratch).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "numa/kernels.h"
#include "numa/node_pools.h"
#include "numa/onednn_matmul.h"
#include "numa/quant_gguf_amx.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/thread_pool.h"

namespace hmoe {
struct Settings;
}

namespace hmoe::numa {

struct ExpertWeights {
  cpu::Mat gate, up;  // [intermediate, hidden]
  cpu::Mat down;      // [hidden, intermediate]
};

struct EngineOptions {
  bool bf16_dot = false;      // see the file comment
  // Settings cpu_emulate_gpu_bf16 with cpu_bf16_dot (emulating the GPU's
  // resident bf16 experts): the activation between the bf16-dot gate/up and
  // down products is rounded to bf16 where the GPU rounds it: always when
  // !gpu_split_act, else only in passes the GPU runs as cuBLAS products
  // (n > 64 tokens and n * k >= 16 * experts; gpu_hybrid_precise keeps the
  // grouped kernels' activation as hi + lo). Off: fp32, as before.
  bool emulate_gpu_act = false;
  bool gpu_split_act = false;  // settings gpu_hybrid_precise and gpu_hybrid_precise_act
  bool int8_act = true;       // see the file comment
  bool gguf_int8 = true;      // see the file comment
  bool lowbit_repack = true;  // see the file comment
  int64_t onednn_min_tokens = 0;  // see the file comment
  int64_t amx_min_tokens = -1;    // see the file comment
  int copy_to_nodes = -1;     // -1: copy when more than one node; 0: views; 1: always copy
  bool print_memory = true;   // memory per node on stderr at load
  std::string name = "experts";

  static EngineOptions from_settings(const Settings& s);
};

class ExpertEngine {
 public:
  // Checks every expert's shapes and types (Error naming the expert), then
  // places the weights. experts must outlive the engine when it keeps views.
  ExpertEngine(const std::vector<ExpertWeights>& experts, NodePools& pools, const EngineOptions& opt = {});
  ~ExpertEngine();

  // out[t] += sum_j weights[t*k+j] * expert_{ids[t*k+j]}(x[t]) for t < n.
  // Throws Error(invalid_argument) for an id outside [0, experts()).
  void forward(const float* x, int64_t n, const int32_t* ids, const float* weights, int64_t k, float* out);

  int64_t experts() const { return experts_; }
  int64_t hidden() const { return hidden_; }
  int64_t intermediate() const { return inter_; }
  bool copied() const { return copied_; }
  // Weight bytes held per node (copied slices, or the viewed share).
  const std::vector<uint64_t>& bytes_per_node() const { return node_bytes_; }
  // Bytes one pass over expert e streams (all nodes together).
  uint64_t expert_bytes(int64_t e) const;
  std::string memory_report() const;
  // Bytes of the lowbit_repack copies, all nodes (0: none); a step reads
  // these instead of the file's blocks of those matrices.
  uint64_t packed_bytes() const { return packed_bytes_; }
  // Whether the int8-activation path serves gate/up or down.
  bool int8_act_used() const { return q_up_ || q_down_; }
  // Whether the 8-bit-activation GGUF path serves gate/up or down.
  bool gguf_int8_used() const { return g_up_ || g_down_; }
  // Steps so far in which at least one expert went through oneDNN.
  int64_t onednn_steps() const { return onednn_steps_; }
  // Steps so far in which at least one expert went through AMX tiles.
  int64_t amx_steps() const { return amx_steps_; }
  // Where node `node` starts its intermediate and hidden slices.
  int64_t inter_begin(int node) const { return inter_split_[static_cast<size_t>(node)]; }
  int64_t hidden_begin(int node) const { return hidden_split_[static_cast<size_t>(node)]; }
  // Expert e's rows as node `node` holds them: gate/up rows [inter_begin(node),
  // inter_begin(node + 1)), down rows [hidden_begin(node), hidden_begin(node + 1)),
  // views into the node's buffer when copied(), else into the caller's
  // weights. An expert's matrices are the nodes' pieces in node order.
  const ExpertWeights& piece(int node, int64_t e) const;
  // The pieces of every expert: [expert][node].
  std::vector<std::vector<ExpertWeights>> pieces() const;
  // The node buffers the copied pieces live in (anonymous memory, huge
  // pages advised, first touched by the node's workers): one per node, in
  // node order; empty when the engine views the caller's weights.
  struct Buffer {
    const uint8_t* data;
    size_t bytes;
  };
  std::vector<Buffer> buffers() const;

 private:
  using Slice = ExpertWeights;  // gate/up rows [inter_split_[j], inter_split_[j+1]), down rows [hidden_split_[j], hidden_split_[j+1])
  struct Scratch;

  NodePools& pools_;
  EngineOptions opt_;
  int64_t experts_ = 0, hidden_ = 0, inter_ = 0;
  bool copied_ = false;
  bool q_up_ = false, q_down_ = false;  // gate/up, down through the int8-activation path
  cpu::Mat q_up_like_, q_down_like_;    // the (shared) type the activations are quantized for
  bool g_up_ = false, g_down_ = false;  // gate/up, down through the GGUF 8-bit-activation path
  std::unique_ptr<OnednnBf16> onednn_;  // when onednn_min_tokens > 0 and every weight is bf16
  int64_t onednn_steps_ = 0;
  int64_t amx_steps_ = 0;
  std::vector<int64_t> inter_split_, hidden_split_;  // nodes + 1 boundaries
  std::vector<std::vector<Slice>> slices_;           // [node][expert]
  std::vector<NodeBuffer> buffers_;                  // one per node when copied
  struct Packed {
    cpu::LowbitPacked gate, up, down;
  };
  std::vector<std::vector<Packed>> packed_;  // [node][expert] lowbit_repack copies (empty: none)
  std::vector<NodeBuffer> packed_buffers_;   // one per node when packed_
  uint64_t packed_bytes_ = 0;
  std::vector<uint64_t> node_bytes_;
  std::vector<uint64_t> expert_bytes_;
  std::unique_ptr<Scratch> scratch_;
};

// Single-pool path without placement (tests, dense layers):
// moe_forward adds sum_k weight[t,k] * expert_{ids[t,k]}(x[t]) to out[t].
void moe_forward(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t k,
                 const std::vector<ExpertWeights>& experts, float* out, ThreadPool* pool);

// One SwiGLU MLP (dense layers, shared experts): out = down(silu(gate x) * up x), overwritten.
void mlp_forward(const float* x, int64_t n, const ExpertWeights& w, float* out, ThreadPool* pool, const cpu::GemmOptions& o = {});

}  // namespace hmoe::numa
