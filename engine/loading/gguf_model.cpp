// GGUF as a model source. The hyper-parameters are turned into the same
// JSON fields a config.json would hold and validated by ModelConfig, so a
// GGUF model and its Hugging Face twin are checked by one piece of code.
#include "engine/loading/gguf_model.h"
#include "engine/loading/gguf_deepseek2.h"
#include "engine/loading/gguf_qwen3next.h"

#include "engine/layers/gpu_experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <cctype>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/stat.h>

#include "configs/error.h"
#include "engine/layers/cpu_layers.h"
#include "engine/loading/progress.h"
#include "gpu/quant.h"
#include "engine/text/chat/chat_template.h"
#include "io/gguf.h"
#include "numa/kernels.h"
#include "numa/quant_gguf.h"

namespace hmoe {

namespace {

constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBf16 = 30;

std::string type_name(uint32_t t) {
  const io::GgmlTypeInfo* ti = io::ggml_type_info(t);
  return ti ? std::string(ti->name) : "type id " + std::to_string(t);
}

const char* kSupported =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, "
    "IQ4_NL, IQ4_XS, MXFP4";

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Hugging Face names of one layer's tensors -> GGUF names (llama.cpp's
// tensor naming for qwen3moe).
const std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

bool parse_index(const std::string& s, size_t& pos, int64_t& out) {
  size_t start = pos;
  out = 0;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos])) && pos - start < 9) out = out * 10 + (s[pos++] - '0');
  return pos > start && pos < s.size() && s[pos] == '.';
}

enum class GgufArch { qwen3moe, deepseek2, qwen3next };

// The GGUF name of a Hugging Face tensor in the file's architecture.
bool tensor_for(GgufArch arch, const std::string& hf, std::string& g, int64_t& e) {
  switch (arch) {
    case GgufArch::deepseek2: return gguf_deepseek2_tensor_for(hf, g, e);
    case GgufArch::qwen3next: return gguf_qwen3next_tensor_for(hf, g, e);
    case GgufArch::qwen3moe: break;
  }
  return gguf_tensor_for(hf, g, e);
}

class GgufSource : public WeightSource {
 public:
  GgufSource(std::unique_ptr<io::GgufFile> f, const ModelConfig& c) : f_(std::move(f)), c_(c) {
    const std::string arch(f_->get("general.architecture").as_string("general.architecture"));
    arch_ = arch == "deepseek2" ? GgufArch::deepseek2 : arch == "qwen3next" ? GgufArch::qwen3next : GgufArch::qwen3moe;
    ds2_ = arch_ == GgufArch::deepseek2;
  }

  cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols) override {
    std::string g;
    int64_t e = -1;
    if (cpu::Mat m; split_kv_b(name, rows, cols, m)) return m;
    if (arch_ == GgufArch::qwen3next && gguf_qwen3next_stored(name) == Qwen3NextStored::split_qkvz) return qkvz(name, rows, cols);
    const io::GgufTensor& t = lookup(name, g, e);
    const auto& s = t.shape;
    const bool ok = e < 0 ? (s.size() == 2 && s[0] == static_cast<uint64_t>(cols) && s[1] == static_cast<uint64_t>(rows))
                          : (s.size() == 3 && s[0] == static_cast<uint64_t>(cols) && s[1] == static_cast<uint64_t>(rows) &&
                             static_cast<uint64_t>(e) < s[2]);
    if (!ok)
      fail(ErrorKind::bad_model, f_->path() + ": tensor '" + g + "' has shape " + shape_str(s) + " (ggml order), expected [" +
                                     std::to_string(cols) + ", " + std::to_string(rows) + (e < 0 ? "" : ", >" + std::to_string(e)) +
                                     "] from the metadata (for " + name + ")");
    cpu::Mat m = view(t, rows, cols);
    if (e >= 0) m.data = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(e) * static_cast<size_t>(rows) * m.row_bytes();
    return m;
  }

  cpu::Mat vec(const std::string& name, int64_t n) override {
    std::string g;
    int64_t e = -1;
    const io::GgufTensor& t = lookup(name, g, e);
    if (t.shape.size() != 1 || t.shape[0] != static_cast<uint64_t>(n))
      fail(ErrorKind::bad_model, f_->path() + ": tensor '" + g + "' has shape " + shape_str(t.shape) + ", expected [" + std::to_string(n) + "]");
    if (t.type != kGgmlF32 && t.type != kGgmlF16 && t.type != kGgmlBf16)
      fail(ErrorKind::unsupported, f_->path() + ": tensor '" + g + "' has type " + type_name(t.type) + "; vectors must be F32, F16 or BF16");
    const cpu::Mat m = view(t, 1, n);
    const Qwen3NextStored how = arch_ == GgufArch::qwen3next ? gguf_qwen3next_stored(name) : Qwen3NextStored::as_is;
    if (how != Qwen3NextStored::plus_one && how != Qwen3NextStored::neg_exp) return m;
    // qwen3next stores 1 + w and -exp(A_log): the layers take w and A_log (fp32, owned here).
    std::vector<float> v(static_cast<size_t>(n));
    cpu::to_f32(m.dtype, m.data, v.data(), n);
    for (float& x : v) x = how == Qwen3NextStored::plus_one ? x - 1.0f : std::log(-x);
    owned_.emplace_back(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data() + n));
    return cpu::Mat{DType::f32, owned_.back().data(), 1, n};
  }

  bool has(const std::string& name) const override {
    std::string g;
    int64_t e;
    if (!map(name, g, e)) return false;
    if (f_->find_tensor(g)) return true;
    const std::string kv_b = "attn_kv_b.weight";  // deepseek2 files may split it into attn_k_b / attn_v_b
    return ds2_ && g.size() > kv_b.size() && g.compare(g.size() - kv_b.size(), kv_b.size(), kv_b) == 0 &&
           f_->find_tensor(g.substr(0, g.size() - kv_b.size()) + "attn_k_b.weight");
  }

  void check_all_used(const std::string& where) const override {
    for (const auto& t : f_->tensors())
      if (!used_.count(std::string(t.name)) && !mtp_block(t.name))
        fail(ErrorKind::bad_model, f_->path() + ": unexpected tensor '" + std::string(t.name) + "' (not part of this architecture in " + where + ")");
  }

  uint64_t total_bytes() const override {
    uint64_t b = 0;
    for (const auto& t : f_->tensors()) b += t.bytes;
    return b;
  }

  bool file_backed(const void* p, size_t bytes) const override { return f_->maps(p, bytes); }

  void touch(const std::string& label, const std::string& mode) const override {
    Progress progress(label, total_bytes(), mode);
    volatile uint8_t sink = 0;
    for (const auto& t : f_->tensors()) {
      uint8_t acc = 0;
      for (uint64_t off = 0; off < t.bytes; off += 4096)
        if (!dropped(t.data + off)) acc ^= t.data[off];  // copied pages (copy residence) stay out of memory
      sink = sink ^ acc;
      progress.add(t.bytes);
    }
    progress.finish();
  }

 protected:
  void evict(const void* p, size_t bytes) override { f_->evict(p, bytes); }

 private:
  // deepseek2: kv_b_proj of a file that stores attn_k_b / attn_v_b, reassembled (owned here).
  bool split_kv_b(const std::string& name, int64_t rows, int64_t cols, cpu::Mat& m) {
    std::string g;
    int64_t e;
    const std::string suffix = ".self_attn.kv_b_proj.weight";
    if (!ds2_ || !tensor_for(GgufArch::deepseek2, name, g, e) || f_->find_tensor(g) || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      return false;
    const size_t dot = g.find('.', 4);
    const int64_t layer = std::stoll(g.substr(4, dot - 4));
    std::vector<uint8_t> buf;
    DType dt = DType::f32;
    std::vector<std::string> used;
    if (!gguf_deepseek2_kv_b(*f_, layer, rows, cols, buf, dt, used)) return false;
    for (auto& u : used) used_.insert(u);
    owned_.push_back(std::move(buf));
    m = cpu::Mat{dt, owned_.back().data(), rows, cols};
    return true;
  }

  // The GGUF name of a Hugging Face tensor. qwen3next: the MTP head (mtp.*,
  // run with speculative decoding) is block num_hidden_layers: its layer
  // under the usual names, fc and its norms as nextn.*.
  bool map(const std::string& hf, std::string& g, int64_t& e) const {
    if (arch_ == GgufArch::qwen3next && hf.compare(0, 4, "mtp.") == 0) {
      const std::string blk = "blk." + std::to_string(c_.num_hidden_layers) + ".", layer = "mtp.layers.0.";
      e = -1;
      if (hf == "mtp.fc.weight") return g = blk + "nextn.eh_proj.weight", true;
      if (hf == "mtp.pre_fc_norm_embedding.weight") return g = blk + "nextn.enorm.weight", true;
      if (hf == "mtp.pre_fc_norm_hidden.weight") return g = blk + "nextn.hnorm.weight", true;
      if (hf == "mtp.norm.weight") return g = blk + "nextn.shared_head_norm.weight", true;
      if (hf.compare(0, layer.size(), layer) != 0) return false;
      return tensor_for(arch_, "model.layers." + std::to_string(c_.num_hidden_layers) + "." + hf.substr(layer.size()), g, e);
    }
    return tensor_for(arch_, hf, g, e);
  }

  // qwen3next: a tensor of the MTP head (blocks from num_hidden_layers on), accepted unused when it does not run.
  bool mtp_block(std::string_view name) const {
    if (arch_ != GgufArch::qwen3next || name.compare(0, 4, "blk.") != 0) return false;
    int64_t b = 0;
    size_t i = 4;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i < 13) b = b * 10 + (name[i++] - '0');
    return i > 4 && i < name.size() && name[i] == '.' && b >= c_.num_hidden_layers;
  }

  // qwen3next: in_proj_qkvz [2K + 2V, H] regrouped per key head from
  // attn_qkv [2K + V, H] and attn_gate [V, H] (owned here): the rows' bytes
  // when both are stored in one type, else fp32.
  cpu::Mat qkvz(const std::string& name, int64_t rows, int64_t cols) {
    const HybridConfig& h = c_.hybrid;
    std::string g;
    int64_t e;
    const io::GgufTensor& tq = lookup(name, g, e);
    const std::string gate_name = g.substr(0, g.size() - std::string("attn_qkv.weight").size()) + "attn_gate.weight";
    const io::GgufTensor* tg = f_->find_tensor(gate_name);
    if (!tg) fail(ErrorKind::bad_model, f_->path() + ": tensor '" + gate_name + "' is missing (needed with '" + g + "' for " + name + ")");
    used_.insert(gate_name);
    const int64_t K = h.key_dim(), V = h.value_dim();
    if (rows != 2 * K + 2 * V) fail(ErrorKind::internal, name + ": asked for " + std::to_string(rows) + " rows");
    auto check = [&](const io::GgufTensor& t, int64_t r) {
      if (t.shape.size() != 2 || t.shape[0] != static_cast<uint64_t>(cols) || t.shape[1] != static_cast<uint64_t>(r))
        fail(ErrorKind::bad_model, f_->path() + ": tensor '" + std::string(t.name) + "' has shape " + shape_str(t.shape) + " (ggml order), expected [" +
                                       std::to_string(cols) + ", " + std::to_string(r) + "] from the metadata");
    };
    check(tq, 2 * K + V);
    check(*tg, V);
    const cpu::Mat mq = view(tq, 2 * K + V, cols), mg = view(*tg, V, cols);
    const bool same = tq.type == tg->type;
    const size_t rb = same ? mq.row_bytes() : static_cast<size_t>(cols) * 4;
    std::vector<uint8_t> buf(static_cast<size_t>(rows) * rb);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t src = 0;
      bool gate = false;
      gguf_qwen3next_qkvz_row(r, h.linear_num_key_heads, h.linear_key_head_dim, h.linear_num_value_heads, h.linear_value_head_dim, src, gate);
      const cpu::Mat& m = gate ? mg : mq;
      if (same) std::memcpy(buf.data() + static_cast<size_t>(r) * rb, m.row(src), rb);
      else cpu::row_to_f32(m, src, reinterpret_cast<float*>(buf.data() + static_cast<size_t>(r) * rb));
    }
    owned_.push_back(std::move(buf));
    if (!same) return cpu::Mat{DType::f32, owned_.back().data(), rows, cols};
    cpu::Mat m = mq;
    m.data = owned_.back().data();
    m.rows = rows;
    return m;
  }

  const io::GgufTensor& lookup(const std::string& name, std::string& g, int64_t& e) {
    if (!map(name, g, e)) fail(ErrorKind::bad_model, f_->path() + ": no GGUF tensor corresponds to '" + name + "'");
    const io::GgufTensor* t = f_->find_tensor(g);
    if (!t) fail(ErrorKind::bad_model, f_->path() + ": tensor '" + g + "' is missing (needed for " + name + ")");
    used_.insert(g);
    return *t;
  }

  cpu::Mat view(const io::GgufTensor& t, int64_t rows, int64_t cols) const {
    const std::string what = f_->path() + ": tensor '" + std::string(t.name) + "'";
    cpu::Mat m;
    if (t.type == kGgmlF32 || t.type == kGgmlF16 || t.type == kGgmlBf16) {
      m.dtype = t.type == kGgmlF32 ? DType::f32 : t.type == kGgmlF16 ? DType::f16 : DType::bf16;
      m.data = t.data;
      m.rows = rows;
      m.cols = cols;
    } else if (cpu::ggml_type_supported(t.type)) {
      m = cpu::ext_view(static_cast<cpu::ExtType>(t.type), t.data, rows, cols, what);
      cpu::check_mat(m, what);
    } else {
      fail(ErrorKind::unsupported, what + " has type " + type_name(t.type) + ", which hmoe does not compute on yet (supported: " + kSupported + ")");
    }
    return m;
  }

  std::unique_ptr<io::GgufFile> f_;
  ModelConfig c_;
  GgufArch arch_ = GgufArch::qwen3moe;
  bool ds2_ = false;
  std::set<std::string> used_;
  std::deque<std::vector<uint8_t>> owned_;  // reassembled tensors (split kv_b, qwen3next's qkvz and shifted vectors)
};

uint64_t meta_u64(const io::GgufFile& f, const std::string& key) { return f.get(key).as_u64(key); }

}  // namespace

bool is_gguf_path(const std::string& path) {
  if (path.size() < 5) return false;
  std::string ext = path.substr(path.size() - 5);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  struct stat st {};
  return ext == ".gguf" && (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode));
}

bool gguf_tensor_for(const std::string& hf, std::string& g, int64_t& expert) { return gguf_tensor_for(hf, kLayerNames, g, expert); }

bool gguf_tensor_for(const std::string& hf, GgufLayerNames layer_names, std::string& g, int64_t& expert) {
  expert = -1;
  if (hf == "model.embed_tokens.weight") return g = "token_embd.weight", true;
  if (hf == "model.norm.weight") return g = "output_norm.weight", true;
  if (hf == "lm_head.weight") return g = "output.weight", true;
  const std::string pre = "model.layers.";
  if (hf.compare(0, pre.size(), pre) != 0) return false;
  size_t pos = pre.size();
  int64_t layer;
  if (!parse_index(hf, pos, layer)) return false;
  const std::string rest = hf.substr(pos + 1), blk = "blk." + std::to_string(layer) + ".";
  for (const auto& [h, n] : layer_names)
    if (rest == h) return g = blk + n, true;
  const std::string ex = "mlp.experts.";
  if (rest.compare(0, ex.size(), ex) != 0) return false;
  size_t p2 = ex.size();
  int64_t e;
  if (!parse_index(rest, p2, e)) return false;
  const std::string w = rest.substr(p2 + 1);
  const char* stacked = w == "gate_proj.weight" ? "ffn_gate_exps.weight" : w == "up_proj.weight" ? "ffn_up_exps.weight"
                        : w == "down_proj.weight" ? "ffn_down_exps.weight" : nullptr;
  if (!stacked) return false;
  expert = e;
  g = blk + stacked;
  return true;
}

ModelConfig gguf_model_config(const io::GgufFile& f) {
  const std::string arch(f.get("general.architecture").as_string("general.architecture"));
  if (arch != "qwen3moe" && arch != "deepseek2" && arch != "qwen3next")
    fail(ErrorKind::unsupported,
         f.path() + ": general.architecture '" + arch + "' is not supported for GGUF yet (supported: qwen3moe, deepseek2, qwen3next)");
  const std::string a = arch + ".";
  auto u = [&](const char* k) { return meta_u64(f, a + k); };
  auto num = [&](const char* k) { return f.get(a + k).as_f64(a + k); };
  nlohmann::json j = arch == "deepseek2" ? gguf_deepseek2_config_json(f) : arch == "qwen3next" ? gguf_qwen3next_config_json(f) : nlohmann::json::object();
  if (arch == "qwen3moe") {
    j["model_type"] = "qwen3_moe";
    const io::GgufTensor* emb = f.find_tensor("token_embd.weight");
    if (!emb || emb->shape.size() != 2) fail(ErrorKind::bad_model, f.path() + ": tensor 'token_embd.weight' is missing or not 2-D");
    j["vocab_size"] = emb->shape[1];
    j["hidden_size"] = u("embedding_length");
    j["num_hidden_layers"] = u("block_count");
    j["num_attention_heads"] = u("attention.head_count");
    j["num_key_value_heads"] = u("attention.head_count_kv");
    if (f.find(a + "attention.key_length")) {
      j["head_dim"] = u("attention.key_length");
      if (f.find(a + "attention.value_length") && u("attention.value_length") != u("attention.key_length"))
        fail(ErrorKind::unsupported, f.path() + ": " + a + "attention.value_length differs from key_length");
    }
    j["num_experts"] = u("expert_count");
    j["num_experts_per_tok"] = u("expert_used_count");
    j["moe_intermediate_size"] = u("expert_feed_forward_length");
    if (f.find(a + "feed_forward_length")) j["intermediate_size"] = u("feed_forward_length");
    // llama.cpp's qwen3moe graph always renormalises the top-k weights.
    j["norm_topk_prob"] = f.find(a + "expert_weights_norm") ? f.get(a + "expert_weights_norm").as_u64(a + "expert_weights_norm") != 0 : true;
    j["rms_norm_eps"] = num("attention.layer_norm_rms_epsilon");
    if (f.find(a + "rope.freq_base")) j["rope_theta"] = num("rope.freq_base");
    if (f.find(a + "context_length")) j["max_position_embeddings"] = u("context_length");
    j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
    if (const io::GgufValue* v = f.find("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = v->as_u64("tokenizer.ggml.eos_token_id");
    if (const io::GgufValue* v = f.find("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = v->as_u64("tokenizer.ggml.bos_token_id");
  }
  ModelConfig c = ModelConfig::from_json(j, f.path() + " (GGUF metadata)");
  // The routed experts as stored (blk.N.ffn_{gate,up,down}_exps), and as the GPU would hold them resident.
  uint64_t exp_bytes = 0, exp_weights = 0;
  double gpu_bytes = 0;
  auto view_of = [](const io::GgufTensor& t) {
    cpu::Mat m;  // format and row length are all the GPU size needs
    m.cols = t.shape.empty() ? 0 : static_cast<int64_t>(t.shape[0]);
    m.rows = 1;
    if (cpu::ggml_type_supported(t.type)) {
      m.quant = cpu::Quant::ext;
      m.ext = t.type;
    }
    return m;
  };
  bool native = true;  // every expert matrix held as stored (gpu/quant.h GGUF kernels)
  for (const io::GgufTensor& t : f.tensors())
    if (t.name.find("_exps.") != std::string_view::npos) native = native && gpu::gguf_native_supported(view_of(t));
  for (const io::GgufTensor& t : f.tensors())
    if (t.name.find("_exps.") != std::string_view::npos) {
      exp_bytes += t.bytes;
      exp_weights += t.elements();
      gpu_bytes += static_cast<double>(t.elements()) * gpu_expert_bytes_per_weight(view_of(t), true, native);
    }
  if (exp_weights > 0) {
    c.expert_bytes_per_weight = static_cast<double>(exp_bytes) / static_cast<double>(exp_weights);
    c.gpu_expert_bytes_per_weight = gpu_bytes / static_cast<double>(exp_weights);
  }
  return c;
}

std::unique_ptr<chat::ChatTemplate> gguf_chat_template(const std::string& path) {
  auto f = io::GgufFile::open(path);
  const io::GgufValue* t = f->find("tokenizer.chat_template");
  if (!t) fail(ErrorKind::bad_model, path + ": no tokenizer.chat_template in the GGUF metadata");
  auto token = [&](const char* key) -> std::string {
    const io::GgufValue* id = f->find(key);
    const io::GgufValue* toks = f->find("tokenizer.ggml.tokens");
    if (!id || !toks) return "";
    const auto& list = toks->as_strings("tokenizer.ggml.tokens");
    const uint64_t i = id->as_u64(key);
    return i < list.size() ? std::string(list[i]) : "";
  };
  return std::make_unique<chat::ChatTemplate>(std::string(t->as_string("tokenizer.chat_template")), token("tokenizer.ggml.bos_token_id"),
                                              token("tokenizer.ggml.eos_token_id"));
}

std::unique_ptr<WeightSource> open_gguf_source(const std::string& path, ModelConfig& config) {
  auto f = io::GgufFile::open(path);
  config = gguf_model_config(*f);
  return std::make_unique<GgufSource>(std::move(f), config);
}

}  // namespace hmoe
