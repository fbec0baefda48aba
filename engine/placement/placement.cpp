// Placement parsing and planning. Byte counts are for bf16 weights on the
// GPU (the GPU path uploads every weight as bf16) and the checkpoint's dtype
// on the CPU; activation workspace is an estimate with a fixed floor.
#include "engine/placement/placement.h"

#include <algorithm>
#include <cstdio>

#include "configs/error.h"
#include "engine/layers/weights.h"
#include "gpu/device.h"

namespace hmoe {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

int64_t layer_number(const std::string& what, const std::string& value, const std::string& item, const std::string& part) {
  if (!all_digits(part) || part.size() > 9)
    fail(ErrorKind::invalid_argument, what + "='" + value + "': '" + item +
                                          "' is not a layer number, a range A-B, 'all', 'none' or 'auto' (example: 0-3,10,12-15)");
  return std::stoll(part);
}

}  // namespace

LayerSpec parse_layer_spec(const std::string& what, const std::string& value, int64_t num_layers) {
  LayerSpec spec;
  std::string v = trim(value);
  std::string lower = v;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "auto" || lower.empty()) return spec;
  if (lower == "all") {
    spec.mode = LayerSpec::Mode::all;
    return spec;
  }
  if (lower == "none") {
    spec.mode = LayerSpec::Mode::none;
    return spec;
  }
  spec.mode = LayerSpec::Mode::list;
  std::vector<std::string> owner(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
  size_t start = 0;
  while (start <= v.size()) {
    const size_t comma = v.find(',', start);
    const std::string item = trim(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? v.size() + 1 : comma + 1;
    if (item.empty()) fail(ErrorKind::invalid_argument, what + "='" + value + "': empty element (two commas, or a comma at an end)");
    int64_t a = 0, b = 0;
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      a = b = layer_number(what, value, item, item);
    } else {
      a = layer_number(what, value, item, trim(item.substr(0, dash)));
      b = layer_number(what, value, item, trim(item.substr(dash + 1)));
      if (b < a)
        fail(ErrorKind::invalid_argument, what + "='" + value + "': range " + item + " runs backwards (write " + std::to_string(b) + "-" +
                                              std::to_string(a) + ")");
    }
    if (b >= num_layers)
      fail(ErrorKind::invalid_argument, what + "='" + value + "': layer " + std::to_string(b) + " in '" + item + "' is beyond the model's " +
                                            std::to_string(num_layers) + " layers (0-" + std::to_string(num_layers - 1) + ")");
    for (int64_t l = a; l <= b; ++l) {
      std::string& o = owner[static_cast<size_t>(l)];
      if (!o.empty())
        fail(ErrorKind::invalid_argument, what + "='" + value + "': layer " + std::to_string(l) + " is listed twice ('" + o + "' and '" +
                                              item + "')");
      o = item;
    }
  }
  for (int64_t l = 0; l < num_layers; ++l)
    if (!owner[static_cast<size_t>(l)].empty()) spec.layers.push_back(l);
  return spec;
}

// DeepSeek-V3 (multi-head latent attention): one layer's attention weights
// on the GPU in bf16 - q_a + norm + q_b (or q_proj), kv_a + norm, kv_b, the
// per-head transposed W_UK the latent path keeps beside it, o_proj, the two
// layer norms (engine/layers/mla_attention_gpu.cpp).
uint64_t mla_attention_bytes(const ModelConfig& c, bool latent_path) {
  const MlaConfig& m = c.mla;
  const uint64_t H = static_cast<uint64_t>(c.hidden_size), nh = static_cast<uint64_t>(c.num_attention_heads);
  const uint64_t ql = static_cast<uint64_t>(m.q_lora_rank), qk = static_cast<uint64_t>(m.qk_head_dim()), r = static_cast<uint64_t>(m.kv_lora_rank);
  const uint64_t lw = static_cast<uint64_t>(m.kv_token_floats()), nope = static_cast<uint64_t>(m.qk_nope_head_dim), vd = static_cast<uint64_t>(m.v_head_dim);
  const uint64_t q = ql > 0 ? ql * H + ql + nh * qk * ql : nh * qk * H;
  return (q + lw * H + r + nh * (nope + vd) * r + (latent_path ? nh * r * nope : 0) + H * nh * vd + 2 * H) * 2;
}

uint64_t expert_layer_bytes(const ModelConfig& c, double bytes_per_weight) {
  return static_cast<uint64_t>(static_cast<double>(c.num_experts) * 3.0 * static_cast<double>(c.moe_intermediate_size) *
                               static_cast<double>(c.hidden_size) * bytes_per_weight);
}

std::vector<bool> Plan::resident() const {
  std::vector<bool> r;
  for (const auto& l : layers) r.push_back(l.resident);
  return r;
}
std::vector<int> Plan::devices() const {
  std::vector<int> d;
  for (const auto& l : layers) d.push_back(l.device);
  return d;
}

void check_layer_devices(const std::vector<int>& devices, int device_count) {
  const std::string have = device_count == 0   ? "this machine has no GPU"
                           : device_count == 1 ? "this machine has 1 GPU (GPU 0)"
                                               : "this machine has " + std::to_string(device_count) + " GPUs (0.." +
                                                     std::to_string(device_count - 1) + ")";
  for (size_t l = 0; l < devices.size(); ++l)
    if (devices[l] < 0 || devices[l] >= device_count)
      fail(ErrorKind::invalid_argument,
           "placement puts layer " + std::to_string(l) + " on GPU " + std::to_string(devices[l]) + ", but " + have);
  for (size_t l = 0; l < devices.size(); ++l)
    if (devices[l] != 0)
      fail(ErrorKind::unsupported, "placement puts layer " + std::to_string(l) + " on GPU " + std::to_string(devices[l]) +
                                       ": every layer runs on GPU 0 today; layers on other GPUs are pipeline parallel (issue 10)");
}

int64_t Plan::resident_moe_layers() const {
  return std::count_if(layers.begin(), layers.end(), [](const LayerPlacement& l) { return l.moe && l.resident; });
}
int64_t Plan::moe_layers() const {
  return std::count_if(layers.begin(), layers.end(), [](const LayerPlacement& l) { return l.moe; });
}
double Plan::decode_seconds(double gpu_bw, double cpu_bw) const {
  return static_cast<double>(gpu_bytes_per_token) / gpu_bw + static_cast<double>(cpu_bytes_per_token) / cpu_bw;
}

std::string format_bytes(uint64_t b) {
  char buf[64];
  const double x = static_cast<double>(b);
  if (x >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1024.0 * 1024 * 1024));
  else if (x >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", x / (1024.0 * 1024));
  else if (x >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", x / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

int64_t kv_blocks_for(int64_t sequences, int64_t context, int64_t block_size) {
  const int64_t bs = std::max<int64_t>(block_size, 1);
  return std::max<int64_t>(sequences, 1) * ((std::max<int64_t>(context, 1) + bs - 1) / bs + 1);
}

int64_t default_kv_blocks(const Settings& s, int64_t context, int64_t block_bytes) {
  const int64_t bb = std::max<int64_t>(block_bytes, 1), ctx_blocks = kv_blocks_for(1, context, s.block_size);
  if (s.kv_cache_memory_bytes > 0) {
    const int64_t blocks = static_cast<int64_t>(s.kv_cache_memory_bytes) / bb;
    if (blocks < 1) fail(ErrorKind::invalid_argument, "--kv-cache-memory-bytes is smaller than one KV block (" + std::to_string(bb) + " bytes)");
    return blocks;
  }
  return std::max(std::min<int64_t>(std::max<int64_t>(s.max_num_seqs, 1) * ctx_blocks, (int64_t{512} << 20) / bb), ctx_blocks);
}

int64_t server_kv_blocks(const Settings& s, int64_t context, int64_t block_bytes, int64_t reserved) {
  if (reserved > 0 && s.kv_cache_memory_bytes == 0) return std::max(reserved, kv_blocks_for(1, context, s.block_size));
  return default_kv_blocks(s, context, block_bytes);
}

uint64_t gpu_memory_budget(const Settings& s, const GpuTarget& gpu) {
  if (s.gpu_memory > 0 && !gpu.assumed && s.gpu_memory > gpu.total_bytes)
    fail(ErrorKind::invalid_argument, s.origin("gpu_memory") + "=" + format_bytes(s.gpu_memory) + " is more than " + gpu.name + " has (" +
                                          format_bytes(gpu.total_bytes) + ")");
  const uint64_t card = s.gpu_memory > 0 ? s.gpu_memory : gpu.total_bytes;
  return static_cast<uint64_t>(static_cast<double>(card) * s.gpu_memory_utilization);
}

std::string gpu_memory_budget_origin(const Settings& s, const GpuTarget& gpu) {
  char util[32];
  std::snprintf(util, sizeof util, "%.2f", s.gpu_memory_utilization);
  const std::string card = s.gpu_memory > 0 ? s.origin("gpu_memory") + " " + format_bytes(s.gpu_memory) : format_bytes(gpu.total_bytes) + " of " + gpu.name;
  return std::string(util) + " (" + s.origin("gpu_memory_utilization") + ") x " + card;
}

bool gpu_memory_capped(const Settings& s) { return s.gpu_memory > 0 || s.origin("gpu_memory_utilization") != "default"; }

Plan make_plan(const ModelConfig& c, const Settings& s, const GpuTarget& gpu) {
  const std::string what = s.origin("gpu_resident_moe_layers");
  const LayerSpec spec = parse_layer_spec(what, s.gpu_resident_moe_layers, c.num_hidden_layers);
  const uint64_t H = static_cast<uint64_t>(c.hidden_size), V = static_cast<uint64_t>(c.vocab_size);
  const uint64_t nh = static_cast<uint64_t>(c.num_attention_heads), kvh = static_cast<uint64_t>(c.num_key_value_heads),
                 hd = static_cast<uint64_t>(c.head_dim);
  const uint64_t K = static_cast<uint64_t>(c.num_experts_per_tok), E = static_cast<uint64_t>(std::max<int64_t>(c.num_experts, 1));
  const uint64_t I = static_cast<uint64_t>(c.moe_intermediate_size);
  // Host experts stay in the checkpoint's format (GGUF blocks, quantized), or
  // plain ones in --dtype when it says (engine/layers/weights.h).
  const std::optional<DType> wd = parse_weight_dtype(s.weight_dtype);
  const double cpu_dtype = c.expert_bytes_per_weight > 0 ? c.expert_bytes_per_weight
                           : wd                         ? static_cast<double>(dtype_size(*wd))
                           : c.torch_dtype == "float32" ? 4
                                                        : 2;
  // Resident experts: bf16, or (quantized checkpoints) their GPU format.
  const double gpu_dtype = s.gpu_quantized_experts && c.gpu_expert_bytes_per_weight > 0 ? c.gpu_expert_bytes_per_weight : 2;

  Plan p;
  p.spec = s.gpu_resident_moe_layers;
  p.gpu_budget = gpu_memory_budget(s, gpu);
  const uint64_t embed = V * H * 2, head = c.tie_word_embeddings ? 0 : V * H * 2;
  const bool mla = c.arch == Arch::deepseek_v3, hybrid = c.arch == Arch::qwen3_next;
  const uint64_t attn = mla ? mla_attention_bytes(c, s.mla_attention != "expanded") : ((nh + 2 * kvh) * hd * H + H * nh * hd + 2 * hd + 2 * H) * 2;
  // Qwen3-Next: gated attention (q_proj twice as wide) on the full-attention
  // layers, Gated DeltaNet on the others (engine/layers/hybrid_gpu.cpp).
  const HybridConfig& hy = c.hybrid;
  const uint64_t attn_full = ((2 * nh + 2 * kvh) * hd * H + H * nh * hd + 2 * H) * 2 + 4 * hd * 4;
  const uint64_t attn_linear = static_cast<uint64_t>((2 * hy.key_dim() + 2 * hy.value_dim() + 2 * hy.linear_num_value_heads) * c.hidden_size +
                                                     c.hidden_size * hy.value_dim()) * 2 +
                               static_cast<uint64_t>(hy.conv_dim() * hy.linear_conv_kernel_dim + 3 * hy.linear_num_value_heads +
                                                     hy.linear_value_head_dim) * 4 + 2 * H * 2;
  auto attn_of = [&](int64_t l) {
    if (!hybrid) return attn;
    return l < static_cast<int64_t>(hy.full_attention.size()) && hy.full_attention[static_cast<size_t>(l)] ? attn_full : attn_linear;
  };
  // DeepSeek MoE layers also keep the shared experts and the fp32 score-correction bias on the GPU;
  // Qwen3-Next's the shared expert and its gate.
  const uint64_t moe_extra = mla      ? 3 * I * static_cast<uint64_t>(c.mla.n_shared_experts) * H * 2 + E * 4
                             : hybrid ? (3 * static_cast<uint64_t>(hy.shared_expert_intermediate_size) + 1) * H * 2
                                      : 0;
  p.gpu_fixed_bytes = embed + head + H * 2;
  p.gpu_bytes_per_token = V * H * 2;  // lm_head
  const uint64_t per_expert = 3 * I * H;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerPlacement lp;
    lp.layer = l;
    lp.moe = c.is_moe_layer(l);
    p.gpu_fixed_bytes += attn_of(l);
    p.gpu_bytes_per_token += attn_of(l);
    if (lp.moe) {
      lp.expert_bytes = expert_layer_bytes(c, gpu_dtype);
      p.gpu_fixed_bytes += E * H * 2 + moe_extra;
      p.gpu_bytes_per_token += E * H * 2 + moe_extra;
    } else {
      lp.resident = true;
      const uint64_t mlp = 3 * static_cast<uint64_t>(c.intermediate_size) * H * 2;
      p.gpu_fixed_bytes += mlp;
      p.gpu_bytes_per_token += mlp;
    }
    p.layers.push_back(lp);
  }
  if (spec.mode == LayerSpec::Mode::list)
    for (int64_t l : spec.layers)
      if (!p.layers[static_cast<size_t>(l)].moe)
        fail(ErrorKind::invalid_argument, what + "='" + s.gpu_resident_moe_layers + "': layer " + std::to_string(l) +
                                              " has no routed experts (a dense MLP layer, always on the GPU)");

  const int64_t tokens = std::max<int64_t>(s.max_num_batched_tokens, 1);
  const int64_t ctx = s.max_model_len > 0 ? s.max_model_len : c.max_position_embeddings;
  // Per token: attention and norms' activations; per routed pair (K a token) the big passes' buffers (ExpertScratch:
  // gate/up fp32 8 I, activation 2 I, outputs 4 H, lists 8), which the expert stream shares; the dense MLP; the router.
  p.gpu_workspace_bytes = (256ull << 20) + static_cast<uint64_t>(tokens) * (4 * (nh + 2 * kvh) * hd + 2 * nh * hd + 24 * H + K * (8 + 4 * H + 10 * I) +
                                                                          12 * static_cast<uint64_t>(c.intermediate_size) + 8 * E) +
                          static_cast<uint64_t>(std::max<int64_t>(s.max_num_seqs, 1)) * V * 4;
  if (mla) {  // latent-path activations; the expanded path's K/V of one step (up to 1 GiB under expanded_prefill)
    const uint64_t ql = static_cast<uint64_t>(c.mla.q_lora_rank), lw = static_cast<uint64_t>(c.mla.kv_token_floats()),
                   r = static_cast<uint64_t>(c.mla.kv_lora_rank);
    p.gpu_workspace_bytes += static_cast<uint64_t>(tokens) * (6 * (ql + lw) + 4 * nh * static_cast<uint64_t>(c.mla.qk_head_dim()) + 8 * nh * r +
                                                              2 * nh * static_cast<uint64_t>(c.mla.v_head_dim));
    if (s.mla_attention == "expanded" || s.mla_attention == "expanded_prefill") p.gpu_workspace_bytes += 1ull << 30;
  }
  // Qwen3-Next: each running sequence's linear-attention states (fp32, GPU memory).
  if (hybrid) {
    int64_t linear = 0;
    for (bool full : hy.full_attention) linear += full ? 0 : 1;
    const uint64_t per_seq = static_cast<uint64_t>(linear) *
                             static_cast<uint64_t>((hy.linear_conv_kernel_dim - 1) * hy.conv_dim() +
                                                   hy.linear_num_value_heads * hy.linear_key_head_dim * hy.linear_value_head_dim) * 4;
    p.gpu_workspace_bytes += per_seq * static_cast<uint64_t>(std::max<int64_t>(s.max_num_seqs, 1));
  }
  // KV cache per token: K and V of every KV head in bf16, or (MLA) the latent and the rope key;
  // Qwen3-Next's full-attention layers only.
  int64_t kv_layers = c.num_hidden_layers;
  if (hybrid) kv_layers = static_cast<int64_t>(std::count(hy.full_attention.begin(), hy.full_attention.end(), true));
  p.kv_bytes_per_token = mla ? static_cast<uint64_t>(c.num_hidden_layers) * static_cast<uint64_t>(c.mla.kv_token_floats()) * 2
                             : static_cast<uint64_t>(kv_layers) * 2 * kvh * hd * 2;
  const uint64_t kv_min = s.kv_cache_memory_bytes > 0 ? s.kv_cache_memory_bytes : p.kv_bytes_per_token * static_cast<uint64_t>(ctx);
  const uint64_t base = p.gpu_fixed_bytes + p.gpu_workspace_bytes + kv_min;

  auto shortfall = [&](uint64_t need, const std::string& detail) {
    fail(ErrorKind::out_of_memory, "placement does not fit on " + gpu.name + ": needs " + format_bytes(need) + " but the budget is " +
                                       format_bytes(p.gpu_budget) + " (" + gpu_memory_budget_origin(s, gpu) + "); " +
                                       format_bytes(need - p.gpu_budget) + " missing. " + detail);
  };
  if (spec.mode == LayerSpec::Mode::automatic) {
    // All MoE layers cost the same bytes and, without routing statistics,
    // promise the same saving: fill in layer order.
    if (base > p.gpu_budget)
      shortfall(base, "Even with no resident MoE layers the attention, embeddings and a KV cache for " + std::to_string(ctx) +
                          " tokens do not fit; lower --max-model-len or --kv-cache-memory-bytes, or raise --gpu-memory-utilization.");
    uint64_t left = p.gpu_budget - base;
    for (auto& lp : p.layers)
      if (lp.moe && lp.expert_bytes <= left) {
        lp.resident = true;
        left -= lp.expert_bytes;
      }
  } else {
    for (auto& lp : p.layers)
      if (lp.moe)
        lp.resident = spec.mode == LayerSpec::Mode::all ||
                      (spec.mode == LayerSpec::Mode::list && std::binary_search(spec.layers.begin(), spec.layers.end(), lp.layer));
  }
  for (const auto& lp : p.layers) {
    if (!lp.moe) continue;
    const uint64_t active = K * per_expert;
    if (lp.resident) {
      p.gpu_expert_bytes += lp.expert_bytes;
      p.gpu_bytes_per_token += static_cast<uint64_t>(static_cast<double>(active) * gpu_dtype);
    } else {
      p.cpu_expert_bytes += static_cast<uint64_t>(static_cast<double>(E * per_expert) * cpu_dtype);
      p.cpu_bytes_per_token += static_cast<uint64_t>(static_cast<double>(active) * cpu_dtype);
    }
  }
  const uint64_t need = base + p.gpu_expert_bytes;
  if (need > p.gpu_budget) {
    const uint64_t missing = need - p.gpu_budget;
    const uint64_t per = expert_layer_bytes(c, gpu_dtype);
    const uint64_t fewer = per ? (missing + per - 1) / per : 0;
    shortfall(need, what + "='" + s.gpu_resident_moe_layers + "' puts " + std::to_string(p.resident_moe_layers()) + " MoE layers (" +
                        format_bytes(p.gpu_expert_bytes) + " of experts) on the GPU; make at least " + std::to_string(fewer) +
                        " fewer resident, or use 'auto'.");
  }
  p.kv_bytes = s.kv_cache_memory_bytes > 0 ? s.kv_cache_memory_bytes : p.gpu_budget - p.gpu_fixed_bytes - p.gpu_workspace_bytes - p.gpu_expert_bytes;
  p.kv_tier = "GPU 0";
  p.kv_tokens = static_cast<int64_t>(p.kv_bytes / std::max<uint64_t>(p.kv_bytes_per_token, 1));
  return p;
}

bool resolve_device(const Settings& s, std::string& why) {
  std::string d = s.device;
  for (auto& ch : d) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (d == "cpu") {
    why = "--device cpu: everything runs on the CPU";
    return false;
  }
  if (d == "cuda" || d == "gpu") {
    if (!gpu::built_with_cuda()) fail(ErrorKind::unsupported, s.origin("device") + "=" + s.device + ": hmoe was not built with CUDA");
    if (gpu::device_count() == 0) fail(ErrorKind::device, s.origin("device") + "=" + s.device + ": " + gpu::describe());
    why = "running on the GPU: " + gpu::describe();
    return true;
  }
  if (d == "auto") {
    if (gpu::device_count() > 0) {
      why = "running on the GPU: " + gpu::describe();
      return true;
    }
    why = gpu::describe();
    return false;
  }
  fail(ErrorKind::invalid_argument, s.origin("device") + "='" + s.device + "': expected cpu, cuda or auto");
}

}  // namespace hmoe
