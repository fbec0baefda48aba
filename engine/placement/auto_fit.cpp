// Automatic fit (see auto_fit.h).
#include "engine/placement/auto_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "configs/error.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/expert_stream_chunks.h"
#include "engine/layers/gpu_expert_cache.h"
#include "engine/placement/expert_cache_sim.h"

namespace hmoe {

std::string first_moe_layers(const ModelConfig& c, int64_t r) {
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_moe_layer(l)) moe.push_back(l);
  if (r <= 0) return "none";
  if (r >= static_cast<int64_t>(moe.size())) return "all";
  std::string out;
  for (int64_t i = 0; i < r;) {
    int64_t j = i;
    while (j + 1 < r && moe[static_cast<size_t>(j + 1)] == moe[static_cast<size_t>(j)] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(moe[static_cast<size_t>(i)]);
    if (j > i) {
      out += '-';
      out += std::to_string(moe[static_cast<size_t>(j)]);
    }
    i = j + 1;
  }
  return out;
}

FitChoice auto_fit(const ModelConfig& c, const Settings& s, const GpuTarget& gpu, const FitInputs& in) {
  FitChoice f;
  f.batch = std::max<int64_t>(in.batch, 1);
  f.context = in.context > 0 ? in.context : s.max_model_len > 0 ? s.max_model_len : c.max_position_embeddings;
  const int64_t B = f.batch, T = std::max<int64_t>(f.context, 1), bs = std::max<int64_t>(s.block_size, 1);
  const uint64_t E = static_cast<uint64_t>(std::max<int64_t>(c.num_experts, 1)), K = static_cast<uint64_t>(std::max<int64_t>(c.num_experts_per_tok, 1));
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_moe_layer(l)) moe.push_back(l);
  const int64_t M = static_cast<int64_t>(moe.size());
  if (in.trace && in.trace->header.layers != static_cast<uint32_t>(c.num_hidden_layers))
    fail(ErrorKind::invalid_argument, "routing trace has " + std::to_string(in.trace->header.layers) + " layers, the model " +
                                          std::to_string(c.num_hidden_layers) + ": record it from this model");
  if (in.trace && in.trace->header.experts != E)
    fail(ErrorKind::invalid_argument, "routing trace has " + std::to_string(in.trace->header.experts) + " experts per layer, the model " + std::to_string(E));
  const int64_t cache_setting = parse_gpu_expert_cache(s.gpu_expert_cache);  // -1: auto (what is left)
  const CachePolicy policy = parse_cache_policy(s.origin("gpu_expert_cache_policy"), s.gpu_expert_cache_policy);
  f.hit_model = in.trace ? std::string("routing trace (") + cache_policy_name(policy) + " policy per layer, simulated)" : "uniform routing (cached experts / host experts)";

  Settings base = s;
  base.max_model_len = T;
  uint64_t kv_blocks = static_cast<uint64_t>(kv_blocks_for(B, T, bs));
  // Plans for r = 0 (throws when nothing fits: the caller's error) and then each r.
  base.gpu_resident_moe_layers = "none";
  base.kv_cache_memory_bytes = 1;  // placeholder, replaced once the per-token KV size is known
  const Plan p0 = [&] {
    Settings t = base;
    t.kv_cache_memory_bytes = 0;
    t.max_model_len = T * B;  // make_plan's minimum KV is one context of tokens
    return make_plan(c, t, gpu);
  }();
  if (in.server_kv) kv_blocks = static_cast<uint64_t>(default_kv_blocks(s, T, static_cast<int64_t>(static_cast<uint64_t>(bs) * p0.kv_bytes_per_token)));
  const uint64_t kv_bytes = kv_blocks * static_cast<uint64_t>(bs) * p0.kv_bytes_per_token;
  base.kv_cache_memory_bytes = std::max<uint64_t>(kv_bytes, 1);
  f.budget = p0.gpu_budget;
  f.fixed_bytes = p0.gpu_fixed_bytes;
  f.workspace_bytes = p0.gpu_workspace_bytes;
  const double gpu_dtype = s.gpu_quantized_experts && c.gpu_expert_bytes_per_weight > 0 ? c.gpu_expert_bytes_per_weight : 2;
  f.expert_gpu_bytes = expert_layer_bytes(c, gpu_dtype) / E;
  f.expert_cpu_bytes = M > 0 ? p0.cpu_expert_bytes / (static_cast<uint64_t>(M) * E) : 0;
  const uint64_t card = s.gpu_memory > 0 ? s.gpu_memory : gpu.total_bytes;
  ExpertStreamOptions so;
  so.window = std::max(in.window, 1);
  so.quantized = s.gpu_quantized_experts;
  so.max_tokens = s.max_num_batched_tokens;
  // Quantized experts other than GGUF blocks take the cuBLAS path's bf16 chunks (make_expert_stream decides on the layers).
  so.dequant_chunks = so.quantized && c.gpu_expert_bytes_per_weight > 0 && c.gpu_expert_bytes_per_weight < 2 && c.expert_bytes_per_weight <= 0;
  so.split_act = !c.hybrid.full_attention.empty() && s.gpu_hybrid_precise && s.gpu_hybrid_precise_act;  // Qwen3-Next's hi + lo activation
  so.shared_scratch = true;  // the GPU runtime's streams share its big-pass scratch (GpuRuntime::enable_expert_streaming)
  const uint64_t step_room = expert_stream_step_room(c, so, card);  // the runtime's room (make_expert_stream)
  // Distinct experts a decode step of B tokens reads per layer.
  const double u = static_cast<double>(E) * (1.0 - std::pow(1.0 - static_cast<double>(K) / static_cast<double>(E), static_cast<double>(B)));
  const double kv_read = static_cast<double>(B) * static_cast<double>(T) * static_cast<double>(p0.kv_bytes_per_token);

  for (int64_t r = 0; r <= M; ++r) {
    FitOption o;
    o.resident = r;
    o.kv_bytes = kv_bytes;
    o.kv_blocks = static_cast<int64_t>(kv_blocks);
    Settings t = base;
    t.gpu_resident_moe_layers = first_moe_layers(c, r);
    Plan p;
    try {
      p = make_plan(c, t, gpu);
    } catch (const Error& e) {
      o.why = e.what();
      f.options.push_back(o);
      continue;
    }
    o.fits = true;
    o.expert_bytes = p.gpu_expert_bytes;
    const uint64_t used = p.gpu_fixed_bytes + p.gpu_workspace_bytes + p.gpu_expert_bytes + kv_bytes;
    uint64_t left = p.gpu_budget > used ? p.gpu_budget - used : 0;
    if (in.stream_slots && r < M) {
      const uint64_t need = expert_stream_slot_bytes(c, so, M - r) + step_room;
      if (need <= left) {
        o.stream_slots = expert_stream_slots(so, M - r);
        o.slot_bytes = need;
        left -= need;
      } else if (left > step_room) {  // chunks of experts in a quarter of what is left; the expert cache keeps the rest
        // (with the cache off, all of it)
        const uint64_t room = cache_setting == 0 ? left - step_room : (left - step_room) / 4;
        const StreamChunkPlan cp = plan_stream_chunks(c.num_experts, f.expert_gpu_bytes, so.window, M - r, room, so.quantized);
        if (cp.fits() && !cp.whole_layers()) {
          o.stream_slots = cp.slots;
          o.stream_chunk = cp.experts_per_slot;
          o.slot_bytes = cp.bytes() + step_room;
          left -= o.slot_bytes;
        }
      }
    }
    const uint64_t host_experts = static_cast<uint64_t>(M - r) * E;
    if (cache_setting >= 0) left = std::min<uint64_t>(left, static_cast<uint64_t>(cache_setting));  // --gpu-expert-cache 0 or BYTES
    o.cache_experts = static_cast<int64_t>(std::min<uint64_t>(f.expert_gpu_bytes ? left / f.expert_gpu_bytes : 0, host_experts));
    o.cache_bytes = static_cast<uint64_t>(o.cache_experts) * f.expert_gpu_bytes;
    if (host_experts == 0) o.hit_rate = 0;
    else if (!in.trace) o.hit_rate = static_cast<double>(o.cache_experts) / static_cast<double>(host_experts);
    else {
      std::vector<bool> host(static_cast<size_t>(c.num_hidden_layers), false);
      for (int64_t i = r; i < M; ++i) host[static_cast<size_t>(moe[static_cast<size_t>(i)])] = true;
      o.hit_rate = simulate_expert_cache(*in.trace, o.cache_bytes, f.expert_gpu_bytes, policy, host).hit_rate();
    }
    const double host_loads = static_cast<double>(M - r) * u;
    const double gpu_bytes = static_cast<double>(p0.gpu_bytes_per_token) + static_cast<double>(r) * u * static_cast<double>(f.expert_gpu_bytes) +
                             host_loads * o.hit_rate * static_cast<double>(f.expert_gpu_bytes) + kv_read;
    const double cpu_bytes = host_loads * (1.0 - o.hit_rate) * static_cast<double>(f.expert_cpu_bytes);
    o.gpu_seconds = gpu_bytes / in.gpu_bandwidth;
    o.cpu_seconds = cpu_bytes / in.cpu_bandwidth;
    o.tok_s = static_cast<double>(B) / (o.gpu_seconds + o.cpu_seconds);
    f.options.push_back(o);
  }
  // Streamed prefill is kept where any option keeps it (a long prompt on the CPU experts is several times slower);
  // among those the decode bound decides.
  auto prefill_ok = [&](const FitOption& o) { return !in.stream_slots || o.resident == M || o.stream_slots > 0; };
  const bool any_prefill = std::any_of(f.options.begin(), f.options.end(), [&](const FitOption& o) { return o.fits && prefill_ok(o); });
  bool any = false;
  for (size_t i = 0; i < f.options.size(); ++i) {
    const FitOption& o = f.options[i];
    if (!o.fits || (any_prefill && !prefill_ok(o))) continue;
    if (!any || o.tok_s > f.options[f.best].tok_s * 1.005 || (o.tok_s >= f.options[f.best].tok_s * 0.995 && o.resident > f.options[f.best].resident))
      f.best = i;
    any = true;
  }
  if (!any) fail(ErrorKind::out_of_memory, f.options.front().why);
  return f;
}

std::string fit_table(const FitChoice& f) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "automatic fit: budget %s, decode batch %lld, context %lld tokens per sequence; hit rates from %s\n"
                "  weights %s + workspace %s always; one expert %s on the GPU, %s on the CPU\n\n",
                format_bytes(f.budget).c_str(), static_cast<long long>(f.batch), static_cast<long long>(f.context), f.hit_model.c_str(),
                format_bytes(f.fixed_bytes).c_str(), format_bytes(f.workspace_bytes).c_str(), format_bytes(f.expert_gpu_bytes).c_str(),
                format_bytes(f.expert_cpu_bytes).c_str());
  out += line;
  out += "| resident MoE layers | experts on GPU | KV (blocks) | stream slots | expert cache (experts) | hit rate | GPU ms | CPU ms | decode tok/s bound | |\n"
         "|---|---|---|---|---|---|---|---|---|---|\n";
  const size_t n = f.options.size();
  const size_t step = n > 16 ? (n + 11) / 12 : 1;
  bool elided = false;
  for (size_t i = 0; i < n; ++i) {
    const bool show = i % step == 0 || i + 1 == n || (i + 1 >= f.best && i <= f.best + 1);
    if (!show) {
      elided = true;
      continue;
    }
    const FitOption& o = f.options[i];
    if (!o.fits) {
      std::snprintf(line, sizeof line, "| %lld | - | - | - | - | - | - | - | - | does not fit |\n", static_cast<long long>(o.resident));
    } else {
      std::snprintf(line, sizeof line, "| %lld | %s | %s (%lld) | %s | %s (%lld) | %.1f%% | %.2f | %.2f | %.1f | %s |\n", static_cast<long long>(o.resident),
                    format_bytes(o.expert_bytes).c_str(), format_bytes(o.kv_bytes).c_str(), static_cast<long long>(o.kv_blocks),
                    o.stream_slots ? (std::to_string(o.stream_slots) + (o.stream_chunk ? " x " + std::to_string(o.stream_chunk) + " experts" : std::string()) +
                                      " (" + format_bytes(o.slot_bytes) + ")")
                                         .c_str()
                                   : "off",
                    format_bytes(o.cache_bytes).c_str(), static_cast<long long>(o.cache_experts), 100 * o.hit_rate, o.gpu_seconds * 1e3,
                    o.cpu_seconds * 1e3, o.tok_s, i == f.best ? "**chosen**" : "");
    }
    out += line;
  }
  if (elided) out += "(rows between those shown left out; every r was considered)\n";
  return out;
}

}  // namespace hmoe
