// DeepSeek-V3 on the GPU (GpuRuntime), two parts.
// 1. Kernels of gpu/mla.h at DeepSeek-V3 decode shapes (128 heads, kv_lora
//    512 + rope 64, 256 experts) against the measured device copy
//    bandwidth: latent attention (GB/s of latent cache read), the absorbed
//    query / output per-head products (GB/s of weights), routing (us).
// 2. A DeepSeek-V3-shaped layer set (hidden 7168, 128 heads, q_lora 1536,
//    kv_lora 512, nope 128, rope 64, v 128, 256 experts of 2048, top-8, one
//    shared expert, first 3 layers dense, vocab 129280; random bf16 weights)
//    run through GpuRuntime (latent attention) with 0 and some MoE layers
//    resident: decode tok/s at batch 1, the time split, and the bandwidth
//    bound (GPU weight bytes per token / device bandwidth + cold expert bytes
//    / host DRAM bandwidth; the step waits for the CPU, so serial). To fit
//    host memory, every MoE layer's routed experts are views of ONE 22.5 GB
//    block (their own GPU copy when resident): the CPU still streams 8
//    experts (704 MB) per cold layer per token from DRAM, far beyond any cache.
//    Each placement runs with the attention projections' inputs split into
//    bf16 hi + lo pairs (gpu_mla_split_inputs, the default) and/or not.
//    With --stream-min-batch N, passes of >= N tokens (the prompt) stream the
//    non-resident layers' routed experts to the GPU (ExpertStream).
// Usage: bench_gpu_mla [--layers 61] [--resident 0,2,4] [--split 1,0]
//   [--steps 8] [--prompt 16] [--stream-min-batch 0] [--mla-attention latent]
//   [--skip-kernels] [--skip-model] [--cuda-graphs] (decode steps replay
//   their GPU segments as CUDA graphs). Never pass/fail on time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/synthetic_model.h"
#include "configs/error.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/device.h"
#include "gpu/mla.h"
#include "io/dtype.h"
#include "numa/node_pools.h"

using namespace hmoe;
using gpu::bf16_t;

namespace {

ModelConfig deepseek_v3_config(int64_t layers) {
  ModelConfig c;
  c.arch = Arch::deepseek_v3;
  c.model_type = "deepseek_v3";
  c.vocab_size = 129280;
  c.hidden_size = 7168;
  c.intermediate_size = 18432;
  c.moe_intermediate_size = 2048;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 128;
  c.num_key_value_heads = 128;
  c.head_dim = 64;
  c.num_experts = 256;
  c.num_experts_per_tok = 8;
  c.norm_topk_prob = true;
  c.rope_theta = 10000;
  c.max_position_embeddings = 163840;
  c.mla.rope_scaling_type = "yarn";
  c.mla.yarn_factor = 40;
  c.mla.yarn_mscale = 1.0;
  c.mla.yarn_mscale_all_dim = 1.0;
  return c;  // MlaConfig defaults are DeepSeek-V3's
}

template <class F>
double time_gpu(gpu::Stream& s, int reps, F&& fn) {
  fn();
  s.synchronize();
  gpu::Event a, b;
  a.record(s);
  for (int i = 0; i < reps; ++i) fn();
  b.record(s);
  b.synchronize();
  return b.elapsed_ms(a) * 1e-3 / reps;
}

gpu::DeviceBuffer random_device(size_t elems, uint64_t seed, float scale, numa::ThreadPool& pool, gpu::Stream& s) {
  std::vector<bf16_t> h(elems);
  bench::fill_random_bf16(h.data(), h.size(), seed, scale, pool);
  gpu::DeviceBuffer d(elems * 2);
  gpu::copy_to_device(d.data(), h.data(), elems * 2, s);
  s.synchronize();
  return d;
}

double copy_bandwidth(gpu::Stream& s) {
  const size_t bytes = 2ull << 30;
  gpu::DeviceBuffer a(bytes), b(bytes);
  gpu::memset_device(a.data(), 1, bytes, s);
  return 2.0 * static_cast<double>(bytes) / time_gpu(s, 10, [&] { gpu::copy_on_device(b.data(), a.data(), bytes, s); });
}

void kernel_benchmarks(numa::ThreadPool& pool, double bw) {
  gpu::Stream s;
  const int64_t heads = 128, r = 512, rope = 64, lw = r + rope, nope = 128, vd = 128, qk = nope + rope;
  std::printf("\n## kernels (DeepSeek-V3 shapes, batch 1 decode unless said)\n");
  std::printf("| kernel | shape | us | GB/s | of copy bw |\n|---|---|---|---|---|\n");
  for (int64_t ctx : {1024, 4096, 16384}) {
    auto cache = random_device(static_cast<size_t>(ctx * lw), 3, 1.0f, pool, s);
    std::vector<int32_t> lists(static_cast<size_t>(ctx));
    for (int64_t i = 0; i < ctx; ++i) lists[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % ctx);  // scattered slots
    std::vector<int32_t> meta = {0, static_cast<int32_t>(ctx)};
    gpu::DeviceBuffer dl(lists.size() * 4), dm(8), dq(static_cast<size_t>(heads * qk) * 4), dql(static_cast<size_t>(heads * r) * 4),
        dout(static_cast<size_t>(heads * r) * 4);
    gpu::copy_to_device(dl.data(), lists.data(), lists.size() * 4, s);
    gpu::copy_to_device(dm.data(), meta.data(), 8, s);
    gpu::memset_device(dq.data(), 0, dq.bytes(), s);
    gpu::memset_device(dql.data(), 0, dql.bytes(), s);
    gpu::DeviceBuffer work(static_cast<size_t>(std::max<int64_t>(1, gpu::mla_attention_latent_workspace(1, heads, r, rope))) * 4);
    for (bool split : {true, false}) {
      const double t = time_gpu(s, 20, [&] {
        gpu::mla_attention_latent(dql.as<float>(), dq.as<float>() + nope, heads * qk, qk, 1, heads, r, rope, cache.as<bf16_t>(), dl.as<int32_t>(),
                                  dm.as<int32_t>(), dm.as<int32_t>() + 1, nullptr, 0.1f, dout.as<float>(), split ? work.as<float>() : nullptr, s);
      });
      const double bytes = static_cast<double>(ctx * lw * 2);
      std::printf("| mla_attention_latent%s | 128 heads, context %lld (%.1f MB of latent cache) | %.1f | %.0f | %.2f |\n", split ? "" : " (no split-K)",
                  static_cast<long long>(ctx), bytes / 1e6, t * 1e6, bytes / t / 1e9, bytes / t / bw);
    }
  }
  {
    auto uk = random_device(static_cast<size_t>(heads * r * nope), 5, 0.05f, pool, s);
    auto kvb = random_device(static_cast<size_t>(heads * (nope + vd) * r), 6, 0.05f, pool, s);
    gpu::DeviceBuffer dq(static_cast<size_t>(8 * heads * qk) * 4), dql(static_cast<size_t>(8 * heads * r) * 4), dat(static_cast<size_t>(8 * heads * vd) * 2);
    gpu::memset_device(dq.data(), 0, dq.bytes(), s);
    gpu::memset_device(dql.data(), 0, dql.bytes(), s);
    for (int64_t n : {1, 8}) {
      const double t1 = time_gpu(s, 20, [&] {
        gpu::head_matmul(dq.as<float>(), heads * qk, qk, n, heads, nope, r, uk.as<bf16_t>(), r * nope, dql.as<float>(), nullptr, heads * r, r, s);
      });
      const double t2 = time_gpu(s, 20, [&] {
        gpu::head_matmul(dql.as<float>(), heads * r, r, n, heads, r, vd, kvb.as<bf16_t>() + nope * r, (nope + vd) * r, nullptr, dat.as<bf16_t>(),
                         heads * vd, vd, s);
      });
      const double wb = static_cast<double>(heads * r * nope * 2);
      std::printf("| head_matmul (W_UK^T absorb) | %lld tokens, 128 x [512 x 128] | %.1f | %.0f | %.2f |\n", static_cast<long long>(n), t1 * 1e6,
                  wb / t1 / 1e9, wb / t1 / bw);
      std::printf("| head_matmul (W_UV output) | %lld tokens, 128 x [128 x 512] | %.1f | %.0f | %.2f |\n", static_cast<long long>(n), t2 * 1e6,
                  wb / t2 / 1e9, wb / t2 / bw);
    }
  }
  {
    const int64_t E = 256, n = 8;
    std::vector<float> lg(static_cast<size_t>(n * E)), bias(static_cast<size_t>(E));
    for (size_t i = 0; i < lg.size(); ++i) lg[i] = std::sin(static_cast<float>(i) * 0.37f);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.01f * std::cos(static_cast<float>(i));
    gpu::DeviceBuffer dl(lg.size() * 4), db(bias.size() * 4), di(static_cast<size_t>(n * 8) * 4), dw(static_cast<size_t>(n * 8) * 4);
    gpu::copy_to_device(dl.data(), lg.data(), lg.size() * 4, s);
    gpu::copy_to_device(db.data(), bias.data(), bias.size() * 4, s);
    const double t = time_gpu(s, 50, [&] {
      gpu::deepseek_topk(dl.as<float>(), db.as<float>(), n, E, 8, 8, 4, true, 2.5f, di.as<int32_t>(), dw.as<float>(), s);
    });
    std::printf("| deepseek_topk | 8 tokens, 256 experts, 8 groups / top-4 groups / top-8 | %.1f | - | - |\n", t * 1e6);
  }
}

// Random bf16 DeepSeek-V3 weights in host memory; all MoE layers share one routed-expert block.
struct SyntheticDeepseek {
  std::map<std::string, cpu::Mat> mats;
  std::vector<void*> blocks;
  uint64_t bytes = 0;
  ~SyntheticDeepseek() {
    for (void* p : blocks) std::free(p);
  }
  uint16_t* block(int64_t elems, uint64_t seed, numa::ThreadPool& pool) {
    const uint64_t b = (static_cast<uint64_t>(elems) * 2 + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, b);
    if (!p) fail(ErrorKind::out_of_memory, "synthetic DeepSeek-V3: cannot allocate " + std::to_string(b) + " bytes");
    blocks.push_back(p);
    bench::fill_random_bf16(static_cast<uint16_t*>(p), static_cast<size_t>(elems), seed, 0.05f, pool);
    bytes += static_cast<uint64_t>(elems) * 2;
    return static_cast<uint16_t*>(p);
  }
  void add(const std::string& name, int64_t rows, int64_t cols, uint64_t seed, numa::ThreadPool& pool, bool norm = false) {
    uint16_t* p = block(rows * cols, seed, pool);
    if (norm)
      for (int64_t i = 0; i < rows * cols; ++i) p[i] = f32_to_bf16(1.0f + bf16_to_f32(p[i]));
    mats[name] = cpu::Mat{DType::bf16, p, rows, cols};
  }
};

std::unique_ptr<SyntheticDeepseek> make_deepseek(const ModelConfig& c, numa::ThreadPool& pool) {
  auto m = std::make_unique<SyntheticDeepseek>();
  const MlaConfig& ml = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, E = c.num_experts, I = c.moe_intermediate_size, Id = c.intermediate_size;
  uint64_t seed = 1;
  m->add("model.embed_tokens.weight", c.vocab_size, H, seed++, pool);
  m->add("lm_head.weight", c.vocab_size, H, seed++, pool);
  m->add("model.norm.weight", 1, H, seed++, pool, true);
  uint16_t* ex = m->block(E * 3 * I * H, seed++, pool);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.", f = p + "mlp.";
    m->add(p + "input_layernorm.weight", 1, H, seed++, pool, true);
    m->add(p + "post_attention_layernorm.weight", 1, H, seed++, pool, true);
    m->add(a + "q_a_proj.weight", ml.q_lora_rank, H, seed++, pool);
    m->add(a + "q_a_layernorm.weight", 1, ml.q_lora_rank, seed++, pool, true);
    m->add(a + "q_b_proj.weight", nh * ml.qk_head_dim(), ml.q_lora_rank, seed++, pool);
    m->add(a + "kv_a_proj_with_mqa.weight", ml.kv_token_floats(), H, seed++, pool);
    m->add(a + "kv_a_layernorm.weight", 1, ml.kv_lora_rank, seed++, pool, true);
    m->add(a + "kv_b_proj.weight", nh * (ml.qk_nope_head_dim + ml.v_head_dim), ml.kv_lora_rank, seed++, pool);
    m->add(a + "o_proj.weight", H, nh * ml.v_head_dim, seed++, pool);
    if (!c.is_moe_layer(l)) {
      m->add(f + "gate_proj.weight", Id, H, seed++, pool);
      m->add(f + "up_proj.weight", Id, H, seed++, pool);
      m->add(f + "down_proj.weight", H, Id, seed++, pool);
      continue;
    }
    m->add(f + "gate.weight", E, H, seed++, pool);
    uint16_t* bias = m->block(E, seed++, pool);  // small: keeps every group in play
    m->mats[f + "gate.e_score_correction_bias"] = cpu::Mat{DType::bf16, bias, E, 1};
    const int64_t S = I * ml.n_shared_experts;
    m->add(f + "shared_experts.gate_proj.weight", S, H, seed++, pool);
    m->add(f + "shared_experts.up_proj.weight", S, H, seed++, pool);
    m->add(f + "shared_experts.down_proj.weight", H, S, seed++, pool);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = f + "experts." + std::to_string(e) + ".";
      m->mats[ep + "gate_proj.weight"] = cpu::Mat{DType::bf16, ex + e * 2 * I * H, I, H};
      m->mats[ep + "up_proj.weight"] = cpu::Mat{DType::bf16, ex + e * 2 * I * H + I * H, I, H};
      m->mats[ep + "down_proj.weight"] = cpu::Mat{DType::bf16, ex + E * 2 * I * H + e * H * I, H, I};
    }
  }
  return m;
}

void model_benchmark(numa::NodePools& pools, int64_t layers, int steps, int64_t prompt, const std::vector<int>& residents, const std::vector<int>& splits, bool graphs,
                     int64_t stream_min, MlaMode mode, double gpu_bw) {
  const ModelConfig c = deepseek_v3_config(layers);
  const MlaConfig& ml = c.mla;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, E = c.num_experts, I = c.moe_intermediate_size, K = c.num_experts_per_tok;
  const int64_t V = c.vocab_size, moe_layers = layers - std::min<int64_t>(layers, ml.first_k_dense_replace);
  const double dram = bench::host_read_bandwidth(pools.pool(0));
  const double t0 = bench::now_seconds();
  auto w = make_deepseek(c, pools.pool(0));
  std::printf("\n## DeepSeek-V3-shaped model: %lld of 61 layers (%lld MoE), weights made in %.1f s (%.1f GB in host memory; routed experts: one "
              "22.5 GB block shared by all MoE layers)\n",
              static_cast<long long>(layers), static_cast<long long>(moe_layers), bench::now_seconds() - t0, static_cast<double>(w->bytes) / 1e9);
  std::printf("host DRAM read bandwidth %.1f GB/s, device copy bandwidth %.0f GB/s\n", dram / 1e9, gpu_bw / 1e9);
  const double kv_token = static_cast<double>(layers * ml.kv_token_floats() * 2);
  std::printf("KV cache: %.0f bytes per token (%lld layers x (512 + 64) x 2 bytes); full K/V of 128 heads x (192 + 128) in bf16 would be %.0f\n",
              kv_token, static_cast<long long>(layers), static_cast<double>(layers * nh * (ml.qk_head_dim() + ml.v_head_dim) * 2));
  WeightLookup get = [&](const std::string& name, const std::vector<int64_t>&) {
    auto it = w->mats.find(name);
    if (it == w->mats.end()) fail(ErrorKind::bad_model, "synthetic model has no tensor " + name);
    return it->second;
  };
  const double expert = static_cast<double>(3 * I * H * 2);
  const double attn = static_cast<double>(ml.q_lora_rank * H + nh * ml.qk_head_dim() * ml.q_lora_rank + ml.kv_token_floats() * H +
                                          nh * (ml.qk_nope_head_dim + ml.v_head_dim) * ml.kv_lora_rank + H * nh * ml.v_head_dim) * 2;
  std::printf("\n| resident MoE layers | split inputs | batch | tok/s | ms/token | GPU ms | CPU experts ms | transfers ms | GPU GB/token | CPU GB/token | bound ms | of bound |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int res : residents)
    for (int split : splits) {
    std::vector<bool> resident(static_cast<size_t>(layers), false);
    int nres = 0;
    for (int64_t l = 0; l < layers && nres < res; ++l)
      if (c.is_moe_layer(l)) {
        resident[static_cast<size_t>(l)] = true;
        ++nres;
      }
    numa::EngineOptions eopt;
    eopt.copy_to_nodes = 0;
    eopt.print_memory = false;
    std::unique_ptr<GpuRuntime> stack;
    const double b0 = bench::now_seconds();
    try {
      GpuRuntimeOptions o;
      o.resident = resident;
      o.experts.engine = eopt;
      o.mla_mode = mode;
      o.split_inputs = split != 0;
      o.cuda_graphs = graphs;
      stack = GpuRuntime::from_lookup(c, get, pools, o);
    } catch (const Error& e) {
      std::printf("| %d | - | could not build: %s |\n", res, e.what());
      continue;
    }
    if (stream_min > 0) {
      ExpertStreamOptions o;
      o.min_batch = stream_min;
      stack->enable_expert_streaming(o);
    }
    const double build_s = bench::now_seconds() - b0;
    const int64_t total = prompt + steps + 4;
    KvCache kv(KvLayout{layers, 1, ml.kv_token_floats(), ml.kv_token_floats(), 0}, (total + 15) / 16 + 1, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, total);
    Batch b;
    for (int64_t i = 0; i < prompt; ++i) b.add(static_cast<int32_t>((i * 104729 + 7) % V), seq, i, i + 1 == prompt);
    std::vector<float> logits;
    const double p0 = bench::now_seconds();
    stack->forward(b, kv, logits);
    const double prefill_s = bench::now_seconds() - p0;
    auto decode = [&](int64_t pos) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
      b.clear();
      b.add(next, seq, pos, true);
      stack->forward(b, kv, logits);
    };
    decode(prompt);  // warm-up
    stack->reset_times();
    for (int i = 0; i < steps; ++i) decode(prompt + 1 + i);
    const GpuStepTimes& t = stack->times();
    const double step = t.total_s / static_cast<double>(t.steps);
    // Bytes per decode token at batch 1: every non-expert weight the step reads (latent path: W_UK^T and kv_b's V half
    // = kv_b's size), the 8 active experts of resident layers on the GPU, those of the other MoE layers on the CPU.
    const double dense = static_cast<double>(3 * c.intermediate_size * H * 2);
    const double shared = static_cast<double>(3 * I * ml.n_shared_experts * H * 2), router = static_cast<double>(E * H * 2);
    const double gpu_bytes = static_cast<double>(V * H * 2) + static_cast<double>(layers) * attn + static_cast<double>(layers - moe_layers) * dense +
                             static_cast<double>(moe_layers) * (shared + router) + static_cast<double>(nres) * static_cast<double>(K) * expert +
                             static_cast<double>(prompt + steps) * kv_token;
    const double cpu_bytes = static_cast<double>(moe_layers - nres) * static_cast<double>(K) * expert;
    const double bound = gpu_bytes / gpu_bw + cpu_bytes / dram;
    std::printf("| %d of %lld | %d | 1 | %.2f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.2f |\n", nres, static_cast<long long>(moe_layers), split, 1.0 / step,
                step * 1e3, t.gpu_s() / t.steps * 1e3, t.cpu_experts_s / t.steps * 1e3, t.transfer_s / t.steps * 1e3, gpu_bytes / 1e9, cpu_bytes / 1e9,
                bound * 1e3, bound / step);
    std::printf("  (stack built in %.1f s, %.1f GB of weights on the GPU; prefill of %lld tokens %.2f s = %.0f tok/s%s)\n", build_s,
                static_cast<double>(stack->weight_bytes()) / 1e9, static_cast<long long>(prompt), prefill_s, static_cast<double>(prompt) / prefill_s,
                stack->expert_stream() ? ", non-resident experts streamed to the GPU" : ", non-resident experts on the CPU");
    if (const ExpertStream* xs = stack->expert_stream(); xs && xs->stats().passes > 0) {
      const ExpertStreamStats& st = xs->stats();
      std::printf("  (streamed: %.1f GB over %lld pass(es), copy %.0f ms, expert products %.0f ms, stall %.0f ms, %.1f GB/s of %.1f pinned)\n",
                  static_cast<double>(st.bytes) / 1e9, static_cast<long long>(st.passes), st.copy_s * 1e3, st.compute_s * 1e3, st.stall_s * 1e3,
                  st.achieved_bandwidth() / 1e9, st.pinned_bandwidth / 1e9);
    }
    std::fflush(stdout);
  }
  std::printf("\nbound = GPU bytes per token / device copy bandwidth + cold expert bytes per token / host DRAM bandwidth (serial: the step waits\n"
              "for the CPU experts); 'of bound' = bound / measured. Attention per mla_attention above\n"
              "(latent: absorbed; expanded_prefill: expanded for prompts, latent for decode).\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool skip_kernels = false, skip_model = false, graphs = false;
  int steps = 8;
  int64_t layers = 61, prompt = 16, stream_min = 0;
  MlaMode mode = MlaMode::latent;
  std::string mode_name = "latent";
  std::vector<int> residents = {0, 2, 4}, splits = {1, 0};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--skip-kernels")) skip_kernels = true;
    else if (!std::strcmp(argv[i], "--skip-model")) skip_model = true;
    else if (!std::strcmp(argv[i], "--cuda-graphs")) graphs = true;
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--stream-min-batch") && i + 1 < argc) stream_min = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--mla-attention") && i + 1 < argc) mode = parse_mla_mode(mode_name = argv[++i]);
    else if ((!std::strcmp(argv[i], "--resident") || !std::strcmp(argv[i], "--split")) && i + 1 < argc) {
      std::vector<int>& list = !std::strcmp(argv[i], "--resident") ? residents : splits;
      list.clear();
      for (const char* p = argv[++i]; *p;) {
        list.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    }
  }
  std::printf("%s\n", gpu::describe().c_str());
  if (gpu::device_count() == 0) {
    std::printf("SKIP: no CUDA device; nothing to measure\n");
    return 0;
  }
  try {
    numa::PoolOptions popt;
    numa::NodePools pools(popt);
    gpu::Stream s;
    const double bw = copy_bandwidth(s);
    if (!skip_kernels) kernel_benchmarks(pools.pool(0), bw);
    if (!skip_model) {
      std::printf("\nmla_attention=%s\n", mode_name.c_str());
      model_benchmark(pools, layers, steps, prompt, residents, splits, graphs, stream_min, mode, bw);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpu_mla: %s\n", e.what());
    return 1;
  }
  return 0;
}
