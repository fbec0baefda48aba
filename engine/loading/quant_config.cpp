// quantization_config parsing and the quantized-checkpoint WeightSource.
#include "engine/loading/quant_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "configs/error.h"
#include "engine/layers/cpu_layers.h"
#include "engine/loading/progress.h"
#include "io/safetensors.h"
#include "numa/quant_hf.h"

namespace hmoe {

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& msg) { fail(ErrorKind::bad_model, where + ": " + msg); }

int int_field(const nlohmann::json& j, const char* key, int def, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_number_integer()) bad(where, std::string("quantization_config.") + key + " must be an integer, got " + j[key].dump());
  return j[key].get<int>();
}
bool bool_field(const nlohmann::json& j, const char* key, bool def, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) bad(where, std::string("quantization_config.") + key + " must be true or false, got " + j[key].dump());
  return j[key].get<bool>();
}
std::vector<std::string> str_list(const nlohmann::json& j, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  if (!j[key].is_array()) bad(where, std::string("quantization_config.") + key + " must be a list of strings");
  for (const auto& e : j[key]) {
    if (!e.is_string()) bad(where, std::string("quantization_config.") + key + " must hold strings only, got " + e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

void check_bits_group(const QuantScheme& s, const std::string& where) {
  if (s.bits != 4 && s.bits != 8) fail(ErrorKind::unsupported, where + ": quantization bits " + std::to_string(s.bits) + " (supported: 4, 8)");
  if (s.group != -1 && (s.group <= 0 || s.group % 32 != 0))
    fail(ErrorKind::unsupported, where + ": group_size " + std::to_string(s.group) + " (supported: -1 or a multiple of 32)");
}

bool name_matches(const std::string& pattern, const std::string& module) {
  if (pattern.rfind("re:", 0) == 0) return std::regex_search(module, std::regex("^(?:" + pattern.substr(3) + ")"));
  return pattern == module || (module.size() > pattern.size() && module.compare(module.size() - pattern.size(), pattern.size(), pattern) == 0 &&
                               module[module.size() - pattern.size() - 1] == '.');
}

class HfQuantSource : public WeightSource {
 public:
  HfQuantSource(const io::TensorStore& store, QuantConfig qc, std::string where) : store_(store), qc_(std::move(qc)), where_(std::move(where)) {}

  cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols) override {
    const std::string suffix = ".weight";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string base = name.substr(0, name.size() - suffix.size());
      if (auto m = quantized(base, rows, cols)) return *m;
    }
    const io::TensorView& t = take(name, {rows, cols});
    plain_dtype(t, name);
    return cpu::Mat{t.dtype, t.data, rows, cols};
  }

  cpu::Mat vec(const std::string& name, int64_t n) override {
    const io::TensorView& t = take(name, {n});
    plain_dtype(t, name);
    return cpu::Mat{t.dtype, t.data, 1, n};
  }

  bool has(const std::string& name) const override {
    if (store_.find(name)) return true;
    const std::string suffix = ".weight";
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
    const std::string base = name.substr(0, name.size() - suffix.size());
    return store_.find(base + ".qweight") || store_.find(base + ".weight_packed");
  }

  void check_all_used(const std::string& dir) const override {
    for (const auto& [name, t] : store_.all())
      if (!used_.count(name)) fail(ErrorKind::bad_model, *t->file + ": unexpected tensor '" + name + "' (not part of this architecture in " + dir + ")");
  }

  uint64_t total_bytes() const override { return store_.total_bytes(); }
  bool file_backed(const void* p, size_t bytes) const override { return store_.maps(p, bytes); }

  void touch(const std::string& label, const std::string& mode) const override {
    Progress progress(label, store_.total_bytes(), mode);
    volatile uint8_t sink = 0;
    for (const auto& [name, t] : store_.all()) {
      uint8_t acc = 0;
      for (size_t off = 0; off < t->nbytes; off += 4096)
        if (!dropped(t->data + off)) acc ^= t->data[off];  // copied pages (copy residence) stay out of memory
      sink = sink ^ acc;
      progress.add(t->nbytes);
    }
    progress.finish();
  }

 private:
  const io::TensorView& take(const std::string& name, const std::vector<int64_t>& shape) {
    const io::TensorView& t = store_.get(name, shape);
    used_.insert(name);
    return t;
  }
  void plain_dtype(const io::TensorView& t, const std::string& name) const {
    if (t.dtype != DType::bf16 && t.dtype != DType::f16 && t.dtype != DType::f32)
      fail(ErrorKind::bad_model, *t.file + ": tensor '" + name + "' has dtype " + dtype_name(t.dtype) + "; supported: BF16, F16, F32 (or quantized per " +
                                     where_ + ")");
  }
  // A 2-D (or 1-D as one row) tensor, or an empty RawTensor when absent.
  cpu::RawTensor raw(const std::string& name, const char* label) {
    cpu::RawTensor r;
    r.name = label;
    const io::TensorView* t = store_.find(name);
    if (!t) return r;
    used_.insert(name);
    r.data = t->data;
    r.dtype = t->dtype;
    if (t->shape.size() == 1) r.rows = 1, r.cols = t->shape[0];
    else if (t->shape.size() == 2) r.rows = t->shape[0], r.cols = t->shape[1];
    else bad(*t->file, "tensor '" + name + "' has shape " + t->shape_str() + ", expected 2-D");
    return r;
  }
  const cpu::Mat& keep(cpu::QuantMat&& q) {
    owned_.push_back(std::make_unique<cpu::QuantMat>(std::move(q)));
    return owned_.back()->view;
  }

  const cpu::Mat* quantized(const std::string& base, int64_t rows, int64_t cols) {
    const std::string what = where_ + ": layer '" + base + "'";
    switch (qc_.method) {
      case QuantConfig::Method::gptq:
      case QuantConfig::Method::awq: {
        if (!store_.find(base + ".qweight")) return nullptr;
        const cpu::RawTensor qw = raw(base + ".qweight", "qweight"), qz = raw(base + ".qzeros", "qzeros"), sc = raw(base + ".scales", "scales");
        if (!sc.data) bad(what, "tensor '" + base + ".scales' is missing");
        if (!qz.data && (qc_.method == QuantConfig::Method::awq || !qc_.scheme.symmetric)) bad(what, "tensor '" + base + ".qzeros' is missing");
        // Mixed precision (GPTQ `dynamic`, per-layer recipes): the group is the
        // config's when the scales' rows agree with it, else read from them.
        int group = qc_.scheme.group;
        if (sc.rows == 1) group = -1;
        else if (group <= 0 || (cols + group - 1) / group != sc.rows) {
          if (cols % sc.rows != 0) bad(what, "scales have " + std::to_string(sc.rows) + " groups, which do not divide " + std::to_string(cols) + " input features");
          group = static_cast<int>(cols / sc.rows);
        }
        if (qc_.method == QuantConfig::Method::awq) return &keep(cpu::repack_awq(qw, qz, sc, cols, rows, group, what));
        cpu::GptqParams p;
        p.bits = qw.rows > 0 && (32 * qw.rows) % cols == 0 ? static_cast<int>(32 * qw.rows / cols) : 0;
        if (p.bits != 4 && p.bits != 8)
          bad(what, "qweight shape [" + std::to_string(qw.rows) + ", " + std::to_string(qw.cols) + "] does not give 4 or 8 bits for " +
                        std::to_string(cols) + " input features");
        p.group = group;
        p.zero_plus_one = qc_.gptq_v1;
        const cpu::RawTensor gi = raw(base + ".g_idx", "g_idx");
        if (gi.data && (gi.dtype != DType::i32 || gi.rows * gi.cols != cols)) bad(what, "g_idx must be I32 [" + std::to_string(cols) + "]");
        return &keep(cpu::repack_gptq(qw, qz, sc, gi.data ? static_cast<const int32_t*>(gi.data) : nullptr, cols, rows, p, what));
      }
      case QuantConfig::Method::compressed_tensors: {
        if (!store_.find(base + ".weight_packed")) return nullptr;
        const QuantScheme* s = qc_.scheme_for(base);
        if (!s) bad(what, "has packed weights but no config_group targets it (or it is ignored)");
        if (!s->symmetric || store_.find(base + ".weight_zero_point"))
          fail(ErrorKind::unsupported, what + ": asymmetric compressed-tensors weights (weight_zero_point) are not supported yet");
        const cpu::RawTensor pk = raw(base + ".weight_packed", "weight_packed"), sc = raw(base + ".weight_scale", "weight_scale");
        if (!sc.data) bad(what, "tensor '" + base + ".weight_scale' is missing");
        if (const io::TensorView* ws = store_.find(base + ".weight_shape")) {
          used_.insert(base + ".weight_shape");
          bool ok = ws->numel() == 2 && (ws->dtype == DType::i64 || ws->dtype == DType::i32);
          if (ok) {
            auto at = [&](int i) -> int64_t {
              if (ws->dtype == DType::i64) return reinterpret_cast<const int64_t*>(ws->data)[i];
              return reinterpret_cast<const int32_t*>(ws->data)[i];
            };
            ok = at(0) == rows && at(1) == cols;
          }
          if (!ok) bad(what, "weight_shape does not hold [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
        }
        return &keep(cpu::repack_ct_packed(pk, sc, cols, rows, s->bits, s->group, what));
      }
      case QuantConfig::Method::fp8: {
        const io::TensorView* w = store_.find(base + ".weight");
        if (!w || w->dtype != DType::f8_e4m3) return nullptr;
        take(base + ".weight", {rows, cols});
        const cpu::RawTensor si = raw(base + ".weight_scale_inv", "weight_scale_inv");
        if (!si.data) bad(what, "tensor '" + base + ".weight_scale_inv' is missing");
        return &keep(cpu::fp8_block_view(w->data, si, cols, rows, qc_.fp8_block_out, qc_.fp8_block_in, what));
      }
    }
    return nullptr;
  }

  const io::TensorStore& store_;
  QuantConfig qc_;
  std::string where_;
  std::vector<std::unique_ptr<cpu::QuantMat>> owned_;
  std::set<std::string> used_;
};

}  // namespace

QuantConfig QuantConfig::from_json(const nlohmann::json& qc, const std::string& where) {
  if (!qc.is_object()) bad(where, "quantization_config must be an object");
  QuantConfig c;
  const std::string method = qc.value("quant_method", std::string());
  if (method == "gptq" || method == "awq") {
    c.method = method == "gptq" ? Method::gptq : Method::awq;
    c.scheme.bits = int_field(qc, method == "awq" && qc.contains("w_bit") ? "w_bit" : "bits", 4, where);
    c.scheme.group = int_field(qc, method == "awq" && qc.contains("q_group_size") ? "q_group_size" : "group_size", 128, where);
    c.scheme.symmetric = bool_field(qc, "sym", method == "gptq", where);
    c.desc_act = bool_field(qc, "desc_act", false, where);
    c.gptq_v1 = qc.value("checkpoint_format", std::string("gptq")) != "gptq_v2";
    c.ignore = str_list(qc, "modules_to_not_convert", where);
    check_bits_group(c.scheme, where);
    if (method == "awq") {
      const std::string v = qc.value("version", std::string("gemm"));
      if (v != "gemm" && v != "GEMM") fail(ErrorKind::unsupported, where + ": AWQ version '" + v + "' (supported: gemm)");
      if (c.scheme.bits != 4) fail(ErrorKind::unsupported, where + ": AWQ " + std::to_string(c.scheme.bits) + "-bit (supported: 4)");
    }
  } else if (method == "compressed-tensors") {
    c.method = Method::compressed_tensors;
    const std::string fmt = qc.value("format", std::string());
    if (fmt != "pack-quantized") fail(ErrorKind::unsupported, where + ": compressed-tensors format '" + fmt + "' (supported: pack-quantized)");
    if (!qc.contains("config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty())
      bad(where, "compressed-tensors needs config_groups");
    for (const auto& [gname, g] : qc["config_groups"].items()) {
      const std::string gw = where + " config_groups." + gname;
      if (!g.is_object() || !g.contains("weights") || !g["weights"].is_object()) bad(gw, "needs a weights object");
      const auto& w = g["weights"];
      QuantScheme s;
      s.bits = int_field(w, "num_bits", 4, gw);
      if (w.value("type", std::string("int")) != "int") fail(ErrorKind::unsupported, gw + ": weights type '" + w.value("type", std::string()) + "' (supported: int)");
      const std::string strategy = w.value("strategy", std::string("group"));
      if (strategy == "group") s.group = int_field(w, "group_size", 128, gw);
      else if (strategy == "channel") s.group = -1;
      else fail(ErrorKind::unsupported, gw + ": strategy '" + strategy + "' (supported: group, channel)");
      s.symmetric = bool_field(w, "symmetric", true, gw);
      s.targets = str_list(g, "targets", gw);
      check_bits_group(s, gw);
      c.groups.push_back(std::move(s));
    }
    c.ignore = str_list(qc, "ignore", where);
  } else if (method == "fp8") {
    c.method = Method::fp8;
    const std::string fmt = qc.value("fmt", std::string("e4m3"));
    if (fmt != "e4m3") fail(ErrorKind::unsupported, where + ": FP8 format '" + fmt + "' (supported: e4m3)");
    if (!qc.contains("weight_block_size") || !qc["weight_block_size"].is_array() || qc["weight_block_size"].size() != 2 ||
        !qc["weight_block_size"][0].is_number_integer() || !qc["weight_block_size"][1].is_number_integer())
      fail(ErrorKind::unsupported, where + ": FP8 needs weight_block_size [out, in] (per-tensor FP8 is not supported yet)");
    c.fp8_block_out = qc["weight_block_size"][0].get<int>();
    c.fp8_block_in = qc["weight_block_size"][1].get<int>();
    if (c.fp8_block_out <= 0 || c.fp8_block_in <= 0 || c.fp8_block_in % 32 != 0)
      fail(ErrorKind::unsupported, where + ": FP8 weight_block_size [" + std::to_string(c.fp8_block_out) + ", " + std::to_string(c.fp8_block_in) + "]");
  } else {
    fail(ErrorKind::unsupported, where + ": quant_method '" + method + "' (supported: gptq, awq, compressed-tensors, fp8)");
  }
  return c;
}

const QuantScheme* QuantConfig::scheme_for(const std::string& module) const {
  for (const auto& pat : ignore)
    if (name_matches(pat, module)) return nullptr;
  if (method != Method::compressed_tensors) return &scheme;
  for (const auto& g : groups)
    for (const auto& t : g.targets)
      if (t == "Linear" || name_matches(t, module)) return &g;
  return nullptr;
}

std::unique_ptr<WeightSource> open_hf_quant_source(const std::string& dir, const io::TensorStore& store) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) return nullptr;
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("quantization_config") || j["quantization_config"].is_null()) return nullptr;
  QuantConfig qc = QuantConfig::from_json(j["quantization_config"], path);
  return std::make_unique<HfQuantSource>(store, std::move(qc), path);
}

}  // namespace hmoe
