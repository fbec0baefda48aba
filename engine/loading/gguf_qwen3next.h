// GGUF files of architecture `qwen3next` (Qwen3-Next) as the existing
// qwen3_next model (engine/models/qwen3_next.cpp): the metadata turned into
// the fields a Qwen3-Next config.json holds (then validated by ModelConfig
// like any checkpoint), and llama.cpp's tensor naming of that architecture
// mapped onto the Hugging Face names the layers bind. What llama.cpp's
// converter changes on the way, undone by the GGUF source
// (engine/loading/gguf_model.cpp) as it hands the tensors out:
//  - zero-centred RMSNorm weights are stored as 1 + w (input,
//    post-attention, q/k and final norms): handed out as f32 (stored - 1);
//  - A_log is stored as ssm_a = -exp(A_log): handed out as f32 log(-ssm_a);
//  - in_proj_qkvz (per key head [q k v z]) is split into attn_qkv
//    ([all q | all k | all v]) and attn_gate ([all z]): regrouped row by row
//    (the rows' bytes copied when both are stored in one type, else as f32);
//  - the MTP head is block num_hidden_layers (nextn_predict_layers > 0):
//    its layer under the usual block names, mtp.fc as nextn.eh_proj and
//    its norms as nextn.enorm / nextn.hnorm / nextn.shared_head_norm
//    (stored 1 + w); run with speculative decoding, else accepted unused.
//
// Errors: a qwen3next.* metadata key this reader does not know (it would
// change the model in a way nothing here reads), a missing required key,
// value heads not a multiple of key heads, or a layer-kind interval that does
// not divide into the blocks throws Error(bad_model) naming the file and the key.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace hmoe {

namespace io {
class GgufFile;
}

// The config.json fields (model_type qwen3_next) a qwen3next file describes.
nlohmann::json gguf_qwen3next_config_json(const io::GgufFile& f);

// GGUF name (and expert index, or -1) of a Hugging Face Qwen3-Next tensor;
// false for a name with no counterpart. in_proj_qkvz maps to attn_qkv (see
// gguf_qwen3next_qkvz_rows for its rows).
bool gguf_qwen3next_tensor_for(const std::string& hf_name, std::string& gguf_name, int64_t& expert);

// How a Hugging Face tensor's GGUF counterpart differs in value.
enum class Qwen3NextStored { as_is, plus_one, neg_exp, split_qkvz };
Qwen3NextStored gguf_qwen3next_stored(const std::string& hf_name);

// Row `row` of in_proj_qkvz ([2 key_dim + 2 value_dim, hidden], per key head
// q, k, v, z) in the GGUF pair: `gate` false: attn_qkv's row, true: attn_gate's.
void gguf_qwen3next_qkvz_row(int64_t row, int64_t key_heads, int64_t key_dim_per_head, int64_t value_heads, int64_t value_dim_per_head,
                             int64_t& src_row, bool& gate);

}  // namespace hmoe
