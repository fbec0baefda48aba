// Default sampling parameters a checkpoint ships in generation_config.json.
// As vLLM does (its --generation-config auto), requests that leave a field
// out get the checkpoint's value for the keys temperature, top_p, top_k,
// min_p and repetition_penalty; other keys (do_sample, max_new_tokens, ...)
// are not used. A key that is absent or null keeps hmoe's default.
//
// Contract: load_generation_defaults() reads nothing for "none" and for
// "auto" when the model is a GGUF file or its directory has no
// generation_config.json; any other value names a directory holding one or
// the file itself, and a missing file is Error(invalid_argument). A value of
// the wrong type or out of range is Error(bad_model) naming the file, the key
// and the value.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/text/sampler.h"

namespace hmoe {

struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  std::string source;  // the file they came from; empty when none was read

  bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
  // "temperature 0.6, top_p 0.95, top_k 20"
  std::string describe() const;
  // `p` with every field this file sets.
  SamplingParams apply(SamplingParams p) const;
};

// setting: the generation_config setting (auto | none | a directory or file).
GenerationDefaults load_generation_defaults(const std::string& setting, const std::string& model);

}  // namespace hmoe
