// The tiny fixture written as a quantized Hugging Face checkpoint (one of
// the tests' quantizers, tests/quant_tools/hf_quantizers.h) beside its
// dequantized twin in F32: the pair the quantized-checkpoint tests compare
// (CPU: tests/engine/test_quantized_models.cpp; GPU:
// tests/gpu/test_gpu_hf_quant.cpp).
#pragma once
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "tests/quant_tools/hf_quantizers.h"
#include "tests/test_util.h"

namespace hmoe::qtools {

using Quantizer = std::function<qtools::HfQuantized(const std::string& base, const float* w, int64_t out, int64_t in)>;

inline bool quantizable(const std::string& name) {
  return name.find("_proj.weight") != std::string::npos && name.find("norm") == std::string::npos;
}

inline std::vector<float> to_floats(const io::TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, t.data + i * 2, 2);
    v[i] = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  return v;
}

// Writes dir_q (quantized) and dir_f (the dequantized twin in F32).
inline void make_pair(const std::string& src, const std::string& dir_q, const std::string& dir_f, const nlohmann::json& qconfig, const Quantizer& quant,
               const std::function<void(std::vector<io::TensorToWrite>&)>& mutate = {}) {
  io::TensorStore store(src);
  std::vector<io::TensorToWrite> q, f;
  for (const auto& [name, t] : store.all()) {
    io::TensorToWrite plain{name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)};
    if (!quantizable(name)) {
      q.push_back(plain);
      f.push_back(std::move(plain));
      continue;
    }
    const auto w = to_floats(*t);
    const std::string base = name.substr(0, name.size() - 7);
    auto r = quant(base, w.data(), t->shape[0], t->shape[1]);
    if (r.tensors.empty()) {  // this layer stays unquantized (mixed precision)
      q.push_back(plain);
      f.push_back(std::move(plain));
      continue;
    }
    for (auto& x : r.tensors) q.push_back(std::move(x));
    f.push_back(qtools::tensor(name, DType::f32, t->shape, r.deq));
  }
  if (mutate) mutate(q);
  io::write_safetensors(dir_q + "/model.safetensors", q);
  io::write_safetensors(dir_f + "/model.safetensors", f);
  auto cfg = nlohmann::json::parse(test::read_file(src + "/config.json"));
  test::write_file(dir_f + "/config.json", cfg.dump());
  cfg["quantization_config"] = qconfig;
  test::write_file(dir_q + "/config.json", cfg.dump());
}

inline nlohmann::json gptq_cfg(int bits, int group, bool sym, bool desc_act) {
  return {{"quant_method", "gptq"}, {"bits", bits}, {"group_size", group}, {"sym", sym}, {"desc_act", desc_act}, {"checkpoint_format", "gptq"}};
}

}  // namespace hmoe::qtools
