// ModelGraph: an architecture written once, as a composition of layer kinds
// (engine/layers/kinds.h) with the checkpoint names of their weights. The
// runtimes (engine/runtime/) instantiate it on the CPU or the GPU as the
// placement plan says and run it: embedding, then per block
// x += attention(norm(x)); x += ffn(norm(x)) (Engram modules before the
// blocks that have one), then the final norm and lm_head.
//
// Adding an architecture = one file here (a function below and its case in
// model_graph()) plus any new layer kind.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/layers/kinds.h"
#include "engine/loading/model_config.h"

namespace hmoe {

struct BlockDesc {
  int64_t layer = 0;
  std::string input_norm, post_norm;
  AttentionKind attention = AttentionKind::gqa;
  std::string attention_prefix;
  int64_t kv_layer = -1;     // the block's layer in the KV cache (-1: `layer`); hybrid models give K/V only to attention layers
  int64_t state_index = -1;  // gated_deltanet: which linear-attention state of the sequence's seq_state it owns
  FfnDesc ffn;
};

// A multi-token-prediction head (Qwen3-Next's mtp.*): for position p, from
// the main model's final (normed) hidden state h_p and the next token t:
// x = fc([norm_embedding(embed(t)), norm_hidden(h_p)]), then one decoder
// block (its own KV layer), then final_norm; logits through the model's
// lm_head. It drafts the token after t (speculative decoding).
struct MtpDesc {
  std::string fc, norm_embedding, norm_hidden, final_norm;
  BlockDesc block;  // kv_layer: set by the loader when speculative decoding is on
};

struct ModelGraph {
  std::string embed, final_norm, lm_head;  // lm_head == embed when tied
  std::vector<BlockDesc> blocks;
  bool engram = false;  // n-gram memory modules (engine/layers/engram.h) before some blocks
  KvLayout kv;          // without the Engram state (the modules add theirs)
  // RMSNorm weights stored zero-centred: the model scales by (1 + w)
  // (Qwen3-Next's input, post-attention, q/k and final norms).
  bool zero_centred_norms = false;
  // Checkpoint tensors under these prefixes are not run and not reported as
  // unexpected (Qwen3-Next's mtp.* head while speculative decoding is off).
  std::vector<std::string> unused_prefixes;
  std::optional<MtpDesc> mtp;  // the checkpoint's MTP head, if it has one
};

// has(name): whether the checkpoint holds a tensor (for optional weights).
using HasTensor = std::function<bool(const std::string&)>;

// The Hugging Face decoder layout the architectures share: model.embed_tokens,
// model.norm, lm_head (tied to the embedding when the config says so and the
// checkpoint has none); block l's norms and attention under model.layers.l.
ModelGraph hf_decoder_graph(const ModelConfig& c, const HasTensor& has);
BlockDesc hf_decoder_block(int64_t layer, AttentionKind attention);
// "model.layers.l.mlp."
std::string hf_mlp_prefix(int64_t layer);

ModelGraph qwen3_moe_graph(const ModelConfig& c, const HasTensor& has);    // qwen3_moe.cpp (and qwen3_moe_engram)
ModelGraph deepseek_v3_graph(const ModelConfig& c, const HasTensor& has);  // deepseek_v3.cpp
ModelGraph qwen3_next_graph(const ModelConfig& c, const HasTensor& has);   // qwen3_next.cpp

// The graph of c.arch; Error(unsupported) for an architecture without one.
ModelGraph model_graph(const ModelConfig& c, const HasTensor& has);

}  // namespace hmoe
