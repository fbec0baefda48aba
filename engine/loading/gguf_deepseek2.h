// GGUF files of architecture `deepseek2` (DeepSeek-V3/R1, Kimi-K2 and their
// "dynamic" low-bit quants) as the existing DeepSeek-V3 model
// (engine/models/deepseek_v3.cpp): the metadata turned into the fields a
// DeepSeek-V3 config.json holds (then validated by ModelConfig like any
// checkpoint), and llama.cpp's tensor naming of that architecture mapped
// onto the Hugging Face names the layers bind.
//
// Both ways converters store the latent up-projection are read: one
// `attn_kv_b` [heads * (nope + v), kv_lora] (older files), or llama.cpp's
// current split `attn_k_b` (per head W_UK transposed: [heads, kv_lora, nope])
// and `attn_v_b` ([heads, v, kv_lora]), reassembled here into kv_b's layout.
//
// Errors: metadata that does not describe a model we run (softmax or other
// gating, MLA key lengths that disagree, a KV head count that is neither 1
// nor the head count, a rope scaling other than yarn, no score-correction
// bias) throws Error(bad_model / unsupported) naming the file and the key.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/dtype.h"

namespace hmoe {

namespace io {
class GgufFile;
}

// The config.json fields (model_type deepseek_v3) a deepseek2 file describes.
nlohmann::json gguf_deepseek2_config_json(const io::GgufFile& f);

// GGUF name (and expert index, or -1) of a Hugging Face DeepSeek-V3 tensor;
// false for a name with no counterpart. kv_b_proj maps to attn_kv_b (see
// gguf_deepseek2_kv_b for files that split it).
bool gguf_deepseek2_tensor_for(const std::string& hf_name, std::string& gguf_name, int64_t& expert);

// Layer `layer`'s kv_b [rows = heads * (nope + v), cols = kv_lora] from the
// split attn_k_b / attn_v_b into `out` (row-major, `dtype`): copied exactly
// in F16 or BF16 when both halves are stored so, in fp32 when both are F32
// (or mixed 16-bit types); a block type (Q8_0, Q5_0, ...) in either half
// dequantized and held as F16 (rounded to nearest even: 2^-12 relative,
// below any block type's step; half of fp32's memory, 2 GB over
// DeepSeek-V3's 61 layers), or as fp32 where a value lies beyond F16's range.
// The latent attention keeps a 16-bit kv_b 16-bit (W_UK^T included).
// `used` gets the two tensor names. False when the file has no
// split pair for the layer; Error(bad_model) naming the tensor when their
// shapes disagree.
bool gguf_deepseek2_kv_b(const io::GgufFile& f, int64_t layer, int64_t rows, int64_t cols, std::vector<uint8_t>& out, DType& dtype,
                         std::vector<std::string>& used);

}  // namespace hmoe
