// What the parts of slice_gguf share: the shape of the model a file takes,
// the key/value block as it is serialized, the tensor list (name, ggml type,
// ggml shape, how its values are drawn), and the pieces the Qwen-family
// architectures have in common. Single-threaded builders; nothing here
// touches the file (slice_gguf.cpp streams it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hmoe::slice {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8;  // ggml type ids
constexpr uint32_t kTypeU32 = 4, kTypeI32 = 5, kTypeF32 = 6, kTypeBool = 7, kTypeStr = 8, kTypeArray = 9;  // GGUF value types
constexpr uint64_t kAlign = 32;  // GGUF tensor data alignment
constexpr int64_t kQwenVocab = 151936, kDeepSeekVocab = 129280;

enum class Arch { qwen3moe, deepseek2, qwen3next };

// Model dimensions (defaults: Qwen3-30B-A3B; run() sets each architecture's).
struct Shape {
  Arch arch = Arch::qwen3moe;
  int64_t layers = 8, hidden = 2048, heads = 32, kv_heads = 4, head_dim = 128, experts = 128, expert_ffn = 768, top_k = 8;
  int64_t vocab = kQwenVocab;
  // deepseek2 only
  int64_t dense_layers = 1, ffn = 18432, q_lora = 1536, kv_lora = 512, rope = 64, v_dim = 128, groups = 8, group_top = 4;
  // qwen3next only: Gated DeltaNet layers (key and value heads share the
  // head dimension, as llama.cpp's qwen3next loader requires), every
  // full_interval-th layer full attention, one shared expert per layer.
  int64_t linear_key_heads = 16, linear_value_heads = 32, linear_head_dim = 128, conv_kernel = 4, full_interval = 4, shared_ffn = 512;
  uint32_t gu_type = kF16, dn_type = kF16;  // routed experts' ggml types
};

// Key/values, serialized as they are added.
class Meta {
 public:
  void u32(const std::string& k, uint32_t v) { key(k, kTypeU32), put(v); }
  void f32(const std::string& k, float v) { key(k, kTypeF32), put(v); }
  void boolean(const std::string& k, bool v) { key(k, kTypeBool), put(static_cast<uint8_t>(v)); }
  void str(const std::string& k, const std::string& v) { key(k, kTypeStr), text(v); }
  void strs(const std::string& k, const std::vector<std::string>& v) {
    key(k, kTypeArray), put(kTypeStr), put(static_cast<uint64_t>(v.size()));
    for (const auto& s : v) text(s);
  }
  void i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, kTypeArray), put(kTypeI32), put(static_cast<uint64_t>(v.size()));
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  const std::string& bytes() const { return bytes_; }
  uint64_t count() const { return count_; }

 private:
  template <class T> void put(T v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void text(const std::string& s) { put(static_cast<uint64_t>(s.size())), bytes_ += s; }
  void key(const std::string& k, uint32_t type) { text(k), put(type), ++count_; }
  std::string bytes_;
  uint64_t count_ = 0;
};

// One tensor of the file. Fill: random = uniform with standard deviation
// 0.02; ones; uniform = uniform in [lo, hi); neg_exp = -exp(u), u uniform
// in [lo, hi) (a stored -exp(A_log)).
struct Tensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;  // ggml order
  enum class Fill { random, ones, uniform, neg_exp } fill = Fill::random;
  float lo = 0.0f, hi = 0.0f;
  uint64_t elements() const {
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    return n;
  }
  // Units written at a time: elements (F16, F32) or blocks (low-bit types).
  bool lowbit() const { return type != kF32 && type != kF16 && type != kQ8_0; }
  uint64_t unit_elems() const;
  uint64_t unit_bytes() const;
  uint64_t units() const { return elements() / unit_elems(); }
  uint64_t bytes() const { return units() * unit_bytes(); }
};

// general.* and the keys qwen3moe and qwen3next share, under `a` ("qwen3next.").
void add_qwen_keys(Meta& m, const std::string& arch, const std::string& name, const Shape& s, uint32_t context, uint32_t ffn, float rope_theta);

// Block b's full attention: q (with output_gate, a gate row per query row
// of each head: [q | gate] per head), k, v, output, q/k norms (ones).
void add_qwen_attention(std::vector<Tensor>& t, const std::string& b, const Shape& s, bool output_gate);

// Block b's router (F32) and stacked routed experts (gu_type / dn_type).
void add_routed_experts(std::vector<Tensor>& t, const std::string& b, const Shape& s);

// Qwen3-Next (llama.cpp's qwen3next layout; slice_gguf_qwen3next.cpp).
std::vector<Tensor> qwen3next_tensors(const Shape& s);
void add_qwen3next_keys(Meta& m, const Shape& s);

}  // namespace hmoe::slice
