// Qwen3-Next-80B-A3B-shaped model on the GPU runtime (issue 25's speed rows):
// the published config's shapes (hidden 2048; Gated DeltaNet with 16 key /
// 32 value heads of 128, conv 4; every 4th layer gated full attention with
// 16 query / 2 KV heads of 256, 64 rotary dimensions, output gate; 512
// experts of 512, top-10, a shared expert of 512 with its sigmoid gate;
// vocab 151936) with --layers L decoder layers (default 8: 6
// linear-attention + 2 full-attention, the model's 3:1) and random bf16
// weights made on demand for every tensor the runtime asks for. The one
// reduction is the layer count: the real model's 48 layers hold 155 GB of
// bf16 experts, which fit neither an 80 GB GPU nor the 128 GB host; 8
// layers are 27 GB (16 would fit an H100 too, at twice the set-up time).
// Every 8 layers are the same 6 + 2 pattern, so the 48-layer model reads
// the lm_head once plus 6 times the 8 layers' bytes: its bound, printed
// beside each decode row, is that sum over the same bandwidths.
//
// Per placement (all-GPU: every MoE layer resident; experts on the CPU:
// none resident, routed experts on the host pool, and prompts of at least
// the automatic minimum batch stream them to the GPU, as Model::load sets
// it up) and precision mode (setting gpu_hybrid_precise 1 / 0), per context
// P (--contexts 4096,32768):
//  - prefill of one prompt of P tokens in steps of --chunk tokens (chunked
//    prefill, 4096): tok/s against the weight bytes once per step /
//    bandwidth (device read; host experts: PCIe when streamed, host DRAM
//    when the CPU runs them) and against the products' FLOPs / the bf16
//    tensor throughput one cuBLAS 8192^3 product reaches;
//  - then --steps decode steps of that sequence at context P (batch 1,
//    CUDA graphs): tok/s against the bytes a step reads (GPU weights,
//    GpuRuntime::decode_weight_bytes(1), + the full-attention layers' K/V
//    at context P + the DeltaNet states read and written) over the
//    device's measured read bandwidth, plus, experts on the CPU, the cold
//    expert bytes (10 of 512 per layer) over the host's read bandwidth;
//  - all-GPU at the last chunk of the longest prompt: the linear-attention
//    layers' time (part profile) and their share of the tensor throughput
//    (products, with the split's second half counted as work done, and the
//    chunked delta rule's 6 dk dv + 2 C (dk + dv) per token and value head)
//    and of the read bandwidth (weights + the chunk's activations and state).
// Never pass/fail on time. Usage: bench_gpu_qwen3next [--layers L]
// [--contexts 4096,32768] [--chunk 4096] [--steps 32] [--skip-cpu] [--skip-bf16]
// [--deltanet-kernel v1|v2|v3] (the chunked delta rule, setting gpu_deltanet_kernel)
// (--prefill is the old name of --contexts)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/synthetic_model.h"
#include "configs/error.h"
#include "configs/settings.h"
#include "engine/kv/kv_cache.h"
#include "engine/layers/expert_stream.h"
#include "engine/models/model_graph.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/quant.h"
#include "io/dtype.h"
#include "numa/node_pools.h"

using namespace hmoe;

namespace {

ModelConfig next_config(int64_t layers) {
  const nlohmann::json j = {{"model_type", "qwen3_next"},
                            {"vocab_size", 151936},
                            {"hidden_size", 2048},
                            {"intermediate_size", 5120},
                            {"moe_intermediate_size", 512},
                            {"shared_expert_intermediate_size", 512},
                            {"num_hidden_layers", layers},
                            {"num_attention_heads", 16},
                            {"num_key_value_heads", 2},
                            {"head_dim", 256},
                            {"linear_conv_kernel_dim", 4},
                            {"linear_key_head_dim", 128},
                            {"linear_value_head_dim", 128},
                            {"linear_num_key_heads", 16},
                            {"linear_num_value_heads", 32},
                            {"full_attention_interval", 4},
                            {"num_experts", 512},
                            {"num_experts_per_tok", 10},
                            {"norm_topk_prob", true},
                            {"decoder_sparse_step", 1},
                            {"mlp_only_layers", nlohmann::json::array()},
                            {"hidden_act", "silu"},
                            {"rms_norm_eps", 1e-6},
                            {"rope_theta", 10000000},
                            {"partial_rotary_factor", 0.25},
                            {"max_position_embeddings", 262144},
                            {"tie_word_embeddings", false},
                            {"attention_bias", false}};
  return ModelConfig::from_json(j, "bench_gpu_qwen3next");
}

// Every tensor the runtime asks for, made on first request: uniform
// (-0.02, 0.02) bf16; norm weights near 0 (zero-centred: the model scales by
// 1 + w), the DeltaNet output norm near 1. No mtp.* (the head is not run).
class LazyWeights {
 public:
  explicit LazyWeights(numa::ThreadPool& pool) : pool_(pool) {}
  cpu::Mat get(const std::string& name, const std::vector<int64_t>& shape) {
    if (name.rfind("mtp.", 0) == 0) fail(ErrorKind::bad_model, "no " + name);
    if (shape.empty()) return cpu::Mat{DType::bf16, nullptr, 0, 0};  // WeightBinder::has
    auto it = mats_.find(name);
    if (it != mats_.end()) return it->second;
    int64_t n = 1, cols = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      n *= shape[i];
      if (i > 0) cols *= shape[i];
    }
    auto& buf = owned_.emplace_back(new uint16_t[static_cast<size_t>(n)]);
    bench::fill_random_bf16(buf.get(), static_cast<size_t>(n), ++seed_, 0.02f, pool_);
    if (name.find("linear_attn.norm.weight") != std::string::npos)
      for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = f32_to_bf16(1.0f + bf16_to_f32(buf[static_cast<size_t>(i)]));
    bytes_ += static_cast<uint64_t>(n) * 2;
    return mats_[name] = cpu::Mat{DType::bf16, buf.get(), shape.size() == 1 ? 1 : shape[0], shape.size() == 1 ? n : cols};
  }
  uint64_t bytes() const { return bytes_; }

 private:
  numa::ThreadPool& pool_;
  std::map<std::string, cpu::Mat> mats_;
  std::vector<std::unique_ptr<uint16_t[]>> owned_;
  uint64_t bytes_ = 0, seed_ = 0;
};

struct Limits {
  double read_bw = 0, tensor = 0, dram = 0, pcie = 0;
};

Limits measure_limits(numa::ThreadPool& pool) {
  Limits l;
  gpu::Stream s;
  gpu::Event a, b;
  auto time_us = [&](auto f, int reps) {
    f();
    a.record(s);
    for (int i = 0; i < reps; ++i) f();
    b.record(s);
    b.synchronize();
    return static_cast<double>(b.elapsed_ms(a)) * 1e3 / reps;
  };
  {
    const size_t bytes = size_t{2} << 30;
    gpu::DeviceBuffer x(bytes), sink(64);
    gpu::memset_device(x.data(), 1, bytes, s);
    l.read_bw = static_cast<double>(bytes) / time_us([&] { gpu::read_probe(x.data(), bytes, sink.as<uint32_t>(), s); }, 5) * 1e6;
  }
  {
    const int64_t m = 8192;
    gpu::DeviceBuffer x(static_cast<size_t>(m * m * 2)), w(static_cast<size_t>(m * m * 2)), y(static_cast<size_t>(m * m * 4));
    gpu::memset_device(x.data(), 0, x.bytes(), s);
    gpu::memset_device(w.data(), 0, w.bytes(), s);
    gpu::Blas blas(s);
    l.tensor = 2.0 * static_cast<double>(m * m * m) / time_us([&] { blas.gemm(x.as<uint16_t>(), m, w.as<uint16_t>(), m, m, y.as<float>(), m); }, 3) * 1e6;
  }
  l.dram = bench::host_read_bandwidth(pool);
  l.pcie = measure_pinned_h2d_bandwidth(256u << 20);
  std::printf("limits: device read %.0f GB/s, bf16 tensor %.0f TFLOP/s (cuBLAS 8192^3), host read %.1f GB/s (%d threads), pinned host->device %.1f GB/s\n",
              l.read_bw / 1e9, l.tensor / 1e12, l.dram / 1e9, pool.size(), l.pcie / 1e9);
  return l;
}

// Products' FLOPs per token of the model (2 per multiply-add): every projection, the router, top-k + shared experts; lm_head not counted
// (one row per step), nor the full-attention core (run() adds it per prompt).
double flops_per_token(const ModelConfig& c, bool split, double& deltanet_layer) {
  const double H = static_cast<double>(c.hidden_size);
  const HybridConfig& h = c.hybrid;
  const double P = 2.0 * h.key_dim() + 2.0 * h.value_dim() + 2.0 * h.linear_num_value_heads, V = static_cast<double>(h.value_dim());
  const double x = split ? 2.0 : 1.0;  // the split's lo half is work the GPU does
  const double dn_products = x * 2.0 * H * (P + V);
  const double C = 64, dk = static_cast<double>(h.linear_key_head_dim), dv = static_cast<double>(h.linear_value_head_dim);
  const double rule = static_cast<double>(h.linear_num_value_heads) * (6 * dk * dv + 2 * C * (dk + dv));
  deltanet_layer = dn_products + rule;
  const double att = x * 2.0 * H * ((2.0 * c.num_attention_heads + 2.0 * c.num_key_value_heads) * c.head_dim + c.num_attention_heads * c.head_dim);
  const double moe = 2.0 * 3.0 * H * (c.num_experts_per_tok * c.moe_intermediate_size + h.shared_expert_intermediate_size) + 2.0 * H * (c.num_experts + 1);
  double f = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) f += (h.full_attention[static_cast<size_t>(l)] ? att : deltanet_layer) + moe;
  return f;
}

// Bytes of the lm_head (read once per step whatever the layer count): what the 48-layer bound does not multiply.
double head_bytes(const ModelConfig& c) { return 2.0 * static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size); }

void run(const ModelConfig& c, LazyWeights& lw, numa::NodePools& pools, const Limits& lim, bool all_gpu, bool precise, const std::vector<int>& contexts,
         int64_t chunk, int steps, gpu::DeltaNetKernel deltanet_kernel) {
  const int64_t L = c.num_hidden_layers, V = c.vocab_size;
  const HybridConfig& h = c.hybrid;
  GpuRuntimeOptions o;
  o.resident.assign(static_cast<size_t>(L), all_gpu);
  o.hybrid_precise = precise;
  o.cuda_graphs = true;
  o.deltanet_kernel = deltanet_kernel;
  WeightLookup get = [&lw](const std::string& n, const std::vector<int64_t>& s) { return lw.get(n, s); };
  const ModelGraph g = model_graph(c, [&](const std::string& n) { return n.rfind("mtp.", 0) != 0; });
  std::unique_ptr<GpuRuntime> rt;
  const double t0 = bench::now_seconds();
  try {
    rt = GpuRuntime::from_lookup(c, get, pools, o);
  } catch (const Error& e) {
    std::printf("| %s | precise %d | could not build: %s |\n", all_gpu ? "all-GPU" : "experts on CPU", precise, e.what());
    return;
  }
  // Experts on the CPU: long prompts stream them to the GPU from the automatic minimum batch on, as Model::load sets it up.
  int64_t stream_min = 0;
  if (!all_gpu) {
    ExpertStreamOptions so = expert_stream_options(c, Settings::defaults(), pools, rt->host_expert_sample(), false);  // says its choice on stderr
    so.quiet = true;
    rt->enable_expert_streaming(so);
    stream_min = rt->expert_stream() ? so.min_batch : 0;
  }
  KvLayout kl = g.kv;
  if (rt->seq_state_bytes() > 0) kl.seq_state_bytes = rt->seq_state_bytes();  // as Model::load sets up the GPU path:
  kl.state_align = 0;                                                           // states on the GPU, no state checkpoints
  const std::string where = std::string(all_gpu ? "all-GPU" : "experts on CPU") + (precise ? ", precise" : ", bf16 mode");
  std::printf("\n%s: GPU weights %.2f GB (built in %.1f s; %.1f GB of random bf16 made so far)%s\n", where.c_str(), static_cast<double>(rt->weight_bytes()) / 1e9,
              bench::now_seconds() - t0, static_cast<double>(lw.bytes()) / 1e9,
              all_gpu ? "" : (stream_min > 0 ? (", prompt steps of >= " + std::to_string(stream_min) + " tokens stream the experts").c_str()
                                             : ", expert streaming off (every routed expert on the CPU)"));
  const double expert_bytes = 3.0 * static_cast<double>(c.hidden_size * c.moe_intermediate_size) * 2;
  double dn_layer_flops = 0;
  const double fpt = flops_per_token(c, precise, dn_layer_flops);
  int64_t full_layers = 0;
  for (int64_t l = 0; l < L; ++l) full_layers += h.full_attention[static_cast<size_t>(l)] ? 1 : 0;
  const int64_t dn_layers = L - full_layers;
  // A decode step's DeltaNet state traffic: every linear-attention layer reads and writes its recurrent state (fp32) and conv window.
  const double state_bytes = static_cast<double>(dn_layers) * 2.0 * static_cast<double>(h.state_bytes_per_layer());
  // The 48-layer model repeats these L layers 48 / L times when L divides 48 into whole 3 + 1 patterns.
  const bool scales_to_48 = L <= 48 && 48 % L == 0 && L % 4 == 0 && full_layers * 4 == L;
  const double per48 = scales_to_48 ? 48.0 / static_cast<double>(L) : 0;
  for (int P : contexts) {
    const int64_t total = P + steps + 4;
    KvCache kv(kl, total / 16 + 2, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, total);
    std::vector<float> logits;
    const bool profile = all_gpu && P == contexts.back();
    double ttotal = 0;
    int64_t streamed_steps = 0;
    rt->reset_times();
    if (rt->expert_stream()) rt->expert_stream()->reset_stats();
    for (int64_t p0 = 0; p0 < P; p0 += chunk) {
      const int64_t n = std::min<int64_t>(chunk, P - p0);
      Batch b;
      for (int64_t i = 0; i < n; ++i) b.add(static_cast<int32_t>(((p0 + i) * 104729 + 7) % V), seq, p0 + i, p0 + i + 1 == P);
      if (profile && p0 + n >= P) rt->set_part_profile(true);
      const double t1 = bench::now_seconds();
      rt->forward(b, kv, logits);
      ttotal += bench::now_seconds() - t1;
      streamed_steps += stream_min > 0 && n >= stream_min ? 1 : 0;
    }
    const double prefill_cpu_s = rt->times().cpu_experts_s;
    // Bound of a chunk: the larger of its weight reads (every expert a chunk touches) and its products' FLOPs.
    const double touched = expected_experts_touched(c.num_experts, c.num_experts_per_tok, chunk);
    const double steps_n = std::ceil(static_cast<double>(P) / static_cast<double>(chunk));
    const double host_experts = static_cast<double>(L) * touched * expert_bytes;  // per chunk, when no layer is resident
    const double t_bytes = all_gpu ? steps_n * (rt->decode_weight_bytes(1) + static_cast<double>(L) * (touched - c.num_experts_per_tok) * expert_bytes) / lim.read_bw
                                   : steps_n * (rt->decode_weight_bytes(1) / lim.read_bw + host_experts / (streamed_steps > 0 ? lim.pcie : lim.dram));
    // FLOPs: the products per token, and the full-attention layers' causal QK^T and PV (4 nh hd per query-key pair, P^2 / 2 pairs).
    const double attn_core = static_cast<double>(full_layers) * 2.0 * c.num_attention_heads * c.head_dim * static_cast<double>(P) * P;
    const double t_flops = (static_cast<double>(P) * fpt + attn_core) / lim.tensor;
    std::printf("| %s | prefill %d in chunks of %lld%s | %.0f tok/s | %.1f ms | weight-bytes bound %.1f ms (%s), FLOP bound %.1f ms (%.1f GFLOP/token) | %.0f%% of the larger | CPU experts %.1f ms |\n",
                where.c_str(), P, static_cast<long long>(chunk), all_gpu ? "" : (streamed_steps > 0 ? ", experts streamed" : ", CPU experts"), P / ttotal,
                ttotal * 1e3, t_bytes * 1e3, all_gpu ? "device read" : (streamed_steps > 0 ? "experts over PCIe" : "experts from host DRAM"), t_flops * 1e3,
                fpt / 1e9, 100.0 * std::max(t_bytes, t_flops) / ttotal, prefill_cpu_s * 1e3);
    if (rt->expert_stream() && streamed_steps > 0) {
      const ExpertStreamStats& xs = rt->expert_stream()->stats();
      std::printf("|   | streamed: %.1f GB in %lld passes at %.1f GB/s (%.0f%% of the copies hidden) | | | | | |\n", static_cast<double>(xs.bytes) / 1e9,
                  static_cast<long long>(xs.passes), xs.achieved_bandwidth() / 1e9, 100.0 * xs.hidden_fraction());
    }
    if (profile) {
      const GpuPartTimes& pt = rt->part_times();
      double dn_ms = 0, att_ms = 0, ffn_ms = 0;
      for (int64_t l = 0; l < L; ++l) {
        (h.full_attention[static_cast<size_t>(l)] ? att_ms : dn_ms) += pt.attn_ms[static_cast<size_t>(l)];
        ffn_ms += pt.ffn_ms[static_cast<size_t>(l)];
      }
      const int64_t n = P - static_cast<int64_t>(steps_n - 1) * chunk;
      const double per = dn_ms / static_cast<double>(dn_layers) * 1e-3;
      const double fl = dn_layer_flops * static_cast<double>(n);
      // Bytes a linear-attention layer must move for the chunk: its weights, the fused input product's output (fp32, written and read),
      // conv output, core output, the bf16 hi/lo inputs, the state (read and written).
      const double P_cols = 2.0 * h.key_dim() + 2.0 * h.value_dim() + 2.0 * h.linear_num_value_heads;
      const double wb = 2.0 * c.hidden_size * (P_cols + h.value_dim());
      const double act = static_cast<double>(n) * (4.0 * P_cols * 2 + 4.0 * h.conv_dim() * 2 + 4.0 * h.value_dim() * 2 + 2.0 * c.hidden_size * 4);
      const double st = 2.0 * h.linear_num_value_heads * h.linear_key_head_dim * h.linear_value_head_dim * 4;
      std::printf("| %s | profile: last chunk of %lld tokens at context %d | linear-attention layer %.2f ms (%.1f TFLOP/s = %.0f%% of tensor; %.0f GB/s = %.0f%% of read) | "
                  "full-attention layers %.2f ms (%.2f ms each), MoE layers %.2f ms in all |\n",
                  where.c_str(), static_cast<long long>(n), P, per * 1e3, fl / per / 1e12, 100.0 * fl / per / lim.tensor, (wb + act + st) / per / 1e9,
                  100.0 * (wb + act + st) / per / lim.read_bw, att_ms, att_ms / static_cast<double>(std::max<int64_t>(full_layers, 1)), ffn_ms);
      rt->set_part_profile(false);
    }
    std::fflush(stdout);
    // Decode, batch 1, at context P.
    int64_t pos = P;
    auto step = [&] {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      Batch b;
      b.add(next, seq, pos++, true);
      rt->forward(b, kv, logits);
    };
    step();
    step();
    rt->reset_times();
    for (int i = 0; i < steps; ++i) step();
    const GpuStepTimes& t = rt->times();
    const double s = t.total_s / static_cast<double>(t.steps);
    const double ctx = static_cast<double>(P) + 2 + steps / 2.0;  // mean context of the timed steps
    const double gpu_bytes = rt->decode_weight_bytes(1);
    const double kv_bytes = static_cast<double>(full_layers) * ctx * static_cast<double>(c.num_key_value_heads * c.head_dim) * 2 * 2;
    const double cold = all_gpu ? 0.0 : static_cast<double>(L) * c.num_experts_per_tok * expert_bytes;
    const double bound = (gpu_bytes + kv_bytes + state_bytes) / lim.read_bw + cold / lim.dram;
    std::printf("| %s | decode batch 1 at context %d | %.1f tok/s | %.3f ms/step | bound %.3f ms (%.2f GB weights + %.3f GB K/V + %.3f GB states / %.0f GB/s + %.2f GB host "
                "experts / %.1f GB/s) | %.0f%% of bound | CPU experts %.3f ms |",
                where.c_str(), P, 1.0 / s, s * 1e3, bound * 1e3, gpu_bytes / 1e9, kv_bytes / 1e9, state_bytes / 1e9, lim.read_bw / 1e9, cold / 1e9,
                lim.dram / 1e9, 100.0 * bound / s, t.cpu_experts_s / static_cast<double>(t.steps) * 1e3);
    if (scales_to_48) {
      const double head = head_bytes(c) / lim.read_bw;
      std::printf(" 48 layers: bound %.2f ms (%.1f tok/s; %.1f GB read on the GPU per step) |", (head + per48 * (bound - head)) * 1e3, 1.0 / (head + per48 * (bound - head)),
                  (head_bytes(c) + per48 * (gpu_bytes - head_bytes(c))) / 1e9);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 8, chunk = 4096;
  int steps = 32;
  bool skip_cpu = false, skip_bf16 = false;
  gpu::DeltaNetKernel deltanet_kernel = gpu::DeltaNetKernel::v1;  // setting gpu_deltanet_kernel's default
  std::vector<int> contexts = {4096, 32768};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--chunk") && i + 1 < argc) chunk = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--skip-cpu")) skip_cpu = true;
    else if (!std::strcmp(argv[i], "--skip-bf16")) skip_bf16 = true;
    else if (!std::strcmp(argv[i], "--deltanet-kernel") && i + 1 < argc) {
      const std::string k = argv[++i];
      if (k != "v1" && k != "v2" && k != "v3") {
        std::fprintf(stderr, "bench_gpu_qwen3next: --deltanet-kernel takes v1, v2 or v3, got %s\n", k.c_str());
        return 2;
      }
      deltanet_kernel = k == "v3" ? gpu::DeltaNetKernel::v3 : k == "v2" ? gpu::DeltaNetKernel::v2 : gpu::DeltaNetKernel::v1;
    }
    else if ((!std::strcmp(argv[i], "--contexts") || !std::strcmp(argv[i], "--prefill")) && i + 1 < argc) {
      contexts.clear();
      for (const char* p = argv[++i]; *p;) {
        contexts.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "bench_gpu_qwen3next: unknown argument %s\n", argv[i]);
      return 1;
    }
  }
  std::printf("bench_gpu_qwen3next: %s\n", gpu::describe().c_str());
  if (gpu::device_count() == 0) {
    std::printf("SKIP: no CUDA device; nothing to measure\n");
    return 0;
  }
  const bool contexts_ok = !contexts.empty() && std::all_of(contexts.begin(), contexts.end(), [](int p) { return p > 0; });
  if (layers < 1 || chunk < 1 || steps < 1 || !contexts_ok) {
    std::fprintf(stderr, "bench_gpu_qwen3next: --layers, --chunk, --steps and --contexts must be positive\n");
    return 1;
  }
  try {
    numa::PoolOptions popt;
    numa::NodePools pools(popt);
    const Limits lim = measure_limits(pools.pool(0));
    const ModelConfig c = next_config(layers);
    std::printf("Qwen3-Next-80B-A3B shapes, %lld of its 48 layers (3 of every 4 Gated DeltaNet), 512 experts of 512, top-10; full attention 16 q / 2 kv "
                "heads of 256 (64 rotary), output gate\n",
                static_cast<long long>(layers));
    LazyWeights lw(pools.pool(0));
    for (bool precise : {true, false}) {
      if (!precise && skip_bf16) continue;
      run(c, lw, pools, lim, true, precise, precise ? contexts : std::vector<int>{contexts.front()}, chunk, steps, deltanet_kernel);
    }
    if (!skip_cpu) run(c, lw, pools, lim, false, true, contexts, chunk, steps, deltanet_kernel);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_gpu_qwen3next: %s\n", e.what());
    return 1;
  }
  return 0;
}
