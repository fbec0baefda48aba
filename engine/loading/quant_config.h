// Quantized Hugging Face checkpoints: config.json's `quantization_config`
// (GPTQ, AWQ, compressed-tensors pack-quantized, FP8 with block scales) and
// the WeightSource that repacks each quantized Linear into the kernels'
// views (numa/quant_hf.h) as the model binds it.
//
// Mixed precision: a layer is quantized when its quantized tensors are
// present (`X.qweight`, `X.weight_packed`, or an F8_E4M3 `X.weight` with
// `X.weight_scale_inv`), else its plain `X.weight` is used. Bits and group
// are read per layer from the tensor shapes and checked against the config
// (GPTQ/AWQ: bits/group_size; compressed-tensors: the first config_group
// whose targets match the module, unless the module is in `ignore`).
//
// Errors (Error bad_model / unsupported, naming config.json or the tensor):
// unknown quant_method or format, asymmetric compressed-tensors, missing
// scales or zeros, shapes that disagree with the config or the model.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hmoe {

namespace io {
class TensorStore;
}
class WeightSource;

struct QuantScheme {
  int bits = 4;
  int group = 128;  // -1: per channel
  bool symmetric = true;
  std::vector<std::string> targets;  // compressed-tensors: "Linear" or "re:<regex>" or a module name
};

struct QuantConfig {
  enum class Method { gptq, awq, compressed_tensors, fp8 } method = Method::gptq;
  QuantScheme scheme;                 // gptq / awq
  bool desc_act = false;              // gptq
  bool gptq_v1 = true;                // checkpoint_format "gptq" stores zero - 1
  std::vector<QuantScheme> groups;    // compressed-tensors config_groups
  std::vector<std::string> ignore;    // names or "re:<regex>" (also GPTQ/AWQ modules_to_not_convert)
  int fp8_block_out = 128, fp8_block_in = 128;

  // Parses a quantization_config object; `where` names it in messages.
  static QuantConfig from_json(const nlohmann::json& qc, const std::string& where);
  // The scheme for a module (compressed-tensors), or nullptr when ignored / untargeted.
  const QuantScheme* scheme_for(const std::string& module) const;
};

// nullptr when dir/config.json has no quantization_config; else the source
// the WeightBinder takes weights from (it keeps a reference to `store`).
std::unique_ptr<WeightSource> open_hf_quant_source(const std::string& dir, const io::TensorStore& store);

}  // namespace hmoe
