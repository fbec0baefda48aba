// A GGUF v3 writer from the published file layout (header, key/values,
// tensor infos, aligned data), for tests: it makes small qwen3moe files of
// any block type, and broken ones (every field can be overridden).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace hmoe::qtools {

struct GgufTensorOut {
  std::string name;
  uint32_t type = 0;
  std::vector<uint64_t> shape;  // ggml order: ne[0] first
  std::vector<uint8_t> bytes;
  int64_t offset_override = -1;  // write this offset instead of the real one
};

class GgufWriter {
 public:
  uint32_t version = 3;
  std::string magic = "GGUF";
  uint64_t alignment = 32;

  void kv_u32(const std::string& k, uint32_t v) { key(k, 4), put(v); ++n_kv_; }
  void kv_f32(const std::string& k, float v) { key(k, 6), put(v); ++n_kv_; }
  void kv_bool(const std::string& k, bool v) { key(k, 7), put(static_cast<uint8_t>(v)); ++n_kv_; }
  void kv_str(const std::string& k, const std::string& v) { key(k, 8), str(v); ++n_kv_; }
  void add(GgufTensorOut t) { tensors_.push_back(std::move(t)); }
  std::vector<GgufTensorOut>& tensors() { return tensors_; }

  std::string bytes() const {
    std::string out = magic.substr(0, 4);
    append(out, version);
    append(out, static_cast<uint64_t>(tensors_.size()));
    append(out, n_kv_);
    out += kv_;
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (const auto& t : tensors_) {
      offs.push_back(off);
      off += (t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      append(out, static_cast<uint64_t>(t.name.size()));
      out += t.name;
      append(out, static_cast<uint32_t>(t.shape.size()));
      for (auto d : t.shape) append(out, d);
      append(out, t.type);
      append(out, t.offset_override >= 0 ? static_cast<uint64_t>(t.offset_override) : offs[i]);
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.append(reinterpret_cast<const char*>(tensors_[i].bytes.data()), tensors_[i].bytes.size());
      out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    }
    return out;
  }

 private:
  template <class T> static void append(std::string& s, T v) { s.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  template <class T> void put(T v) { append(kv_, v); }
  void str(const std::string& v) { put(static_cast<uint64_t>(v.size())), kv_ += v; }
  void key(const std::string& k, uint32_t type) { str(k), put(type); }
  std::string kv_;
  uint64_t n_kv_ = 0;
  std::vector<GgufTensorOut> tensors_;
};

}  // namespace hmoe::qtools
