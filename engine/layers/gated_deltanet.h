// Gated DeltaNet, Qwen3-Next's linear attention, on the CPU, as
// transformers' Qwen3NextGatedDeltaNet computes it:
//   in_proj_qkvz(x) -> q, k (linear_num_key_heads x key dim), v, z (value
//   heads x value dim), grouped per key head as the checkpoint stores them;
//   in_proj_ba(x) -> b, a (one per value head)
//   [q k v] -> causal depthwise conv1d (kernel K, no bias) over the
//   sequence -> silu; q, k l2-normalised per head (eps 1e-6), q / sqrt(dk);
//   key heads repeated for the value heads sharing them
//   beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//   o = gated delta rule (engine/ops/delta_rule.h) per value head
//   o = RMSNorm(o) * w * silu(z) per head (eps rms_norm_eps); out_proj(o).
//
// State: per sequence, in the KV cache's seq_state at
// state_index * HybridConfig::state_bytes_per_layer(): the tokens consumed,
// the conv window (the last K - 1 inputs) and the delta-rule state
// [value heads][dk][dv], zero for a new sequence (KvCache::add_sequence).
// A step must continue each sequence where its state stands (position ==
// tokens consumed; throws Error(internal) before changing anything
// otherwise). A sequence's tokens run in pieces that end at absolute
// positions that are multiples of kDeltaNetChunk and at its state
// checkpoints (KvCache::add_state_checkpoint), so that a prompt gives the
// same bits however a step split it at such positions (prefix-cache hits
// resume from a snapshot); pieces of several tokens run the chunked kernel,
// single tokens the one-step recurrence; threaded over (sequence, value
// head). At each checkpoint the layer copies its part of the state
// (header, conv window, recurrent state) into the checkpoint's buffer.
#pragma once
#include <memory>
#include <string>

#include "engine/layers/cpu_layers.h"
#include "engine/layers/kinds.h"

namespace hmoe {

// gemm: the input treatment of its three products (cpu_layers.h).
std::unique_ptr<AttentionBlock> make_gated_deltanet(WeightBinder& bind, const ModelConfig& c, int64_t state_index, const std::string& prefix,
                                                    numa::ThreadPool& pool, const cpu::GemmOptions& gemm = {});

}  // namespace hmoe
