// MODEL as a GGUF file: the architecture hyper-parameters from the file's
// metadata (`general.architecture` = qwen3moe today) into a ModelConfig, and
// a WeightSource that answers the model's Hugging Face tensor names with
// views of the file's tensors (blk.N.* mapped onto the blocks; the stacked
// expert tensors ffn_{gate,up,down}_exps [E, rows, cols] viewed per expert).
// Tensors stay in the memory map and are computed on in their stored type
// (F32/F16/BF16 directly, ggml blocks through numa/quant_gguf.h).
//
// Errors: a file the reader rejects (numa/io/gguf.h) or metadata that does
// not describe a supported model throws Error(bad_model/unsupported) naming
// the file and the key; a tensor of a type we do not compute on names the
// tensor and the type; shapes that disagree with the metadata name both.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "engine/loading/model_config.h"

namespace hmoe {

namespace io {
class GgufFile;
}
namespace chat {
class ChatTemplate;
}
class WeightSource;

// True when `path` names a file ending in ".gguf" (any case).
bool is_gguf_path(const std::string& path);

// The ModelConfig a GGUF file describes (throws as said above).
ModelConfig gguf_model_config(const io::GgufFile& file);

// Opens `path`, fills `config` from its metadata and returns the source the
// WeightBinder takes the weights from.
std::unique_ptr<WeightSource> open_gguf_source(const std::string& path, ModelConfig& config);

// The chat template a GGUF file carries (tokenizer.chat_template, with the
// BOS/EOS token texts of its vocabulary); Error(bad_model) when absent.
std::unique_ptr<chat::ChatTemplate> gguf_chat_template(const std::string& path);

// The GGUF tensor name (and expert index, or -1) that holds a Hugging Face
// tensor of the Qwen3-MoE layout; false for a name with no GGUF counterpart.
bool gguf_tensor_for(const std::string& hf_name, std::string& gguf_name, int64_t& expert);
// The same mapping for any architecture: the names shared by every MoE file
// (embedding, final norm, output, routed experts stacked as ffn_*_exps) plus
// the architecture's per-layer table of (Hugging Face suffix, GGUF suffix).
using GgufLayerNames = std::span<const std::pair<const char*, const char*>>;
bool gguf_tensor_for(const std::string& hf_name, GgufLayerNames layer_names, std::string& gguf_name, int64_t& expert);

}  // namespace hmoe
