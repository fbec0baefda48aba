// hmoe plan MODEL: the placement hmoe would use, without loading weights
// onto a GPU - every layer's place, bytes on the GPU and in host memory, KV
// capacity, and the estimated decode speed from bandwidths. Works without a
// GPU: --gpu-memory describes one (default: a 24 GiB card, said so).
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "configs/error.h"
#include "engine/layers/cpu_layers.h"
#include "engine/layers/engram.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/gpu_expert_cache.h"
#include "engine/layers/gpu_experts.h"
#include "engine/layers/host_residence.h"
#include "engine/layers/weights.h"
#include "engine/loading/gguf_model.h"
#include "engine/loading/gguf_plan.h"
#include "engine/loading/model_config.h"
#include "engine/loading/quant_config.h"
#include "engine/models/model_graph.h"
#include "engine/layers/routing_trace.h"
#include "engine/placement/auto_fit.h"
#include "engine/placement/placement.h"
#include "engine/placement/prefill_cost.h"
#include "gpu/device.h"
#include "gpu/quant.h"
#include "io/gguf.h"
#include "numa/thread_pool.h"
#include "io/safetensors.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {

// Host memory read bandwidth (bytes/s): measure_host_read_bandwidth on a
// pool of every hardware thread (engine/placement/prefill_cost.h). The
// threads spawned per pass over 512 MiB that this was before read 72 GB/s
// on the device's Xeon against 143-146 GB/s streamed by 16 threads.
double measure_cpu_bandwidth() {
  numa::ThreadPool pool(0);
  return measure_host_read_bandwidth(&pool);
}

int run_plan(const Settings& s, std::vector<std::string>& args) {
  std::string gbw_s, cbw_s, ctx_s, batch_s = "1", trace_s;
  const bool have_mem = s.gpu_memory > 0;  // --gpu-memory is a setting (the cap a run honours too)
  const bool have_ctx = take_option(args, "--context", ctx_s);
  take_option(args, "--batch", batch_s);
  const bool have_trace = take_option(args, "--trace", trace_s);
  const bool have_gbw = take_option(args, "--gpu-bandwidth", gbw_s);
  const bool have_cbw = take_option(args, "--cpu-bandwidth", cbw_s);
  std::string pbw_s;
  const bool have_pbw = take_option(args, "--pcie-bandwidth", pbw_s);
  reject_unknown_flags(args, "plan");
  if (args.size() != 1) fail(ErrorKind::invalid_argument, "plan takes one MODEL (a directory or a .gguf file)");
  for (const auto& n : s.notices) std::fprintf(stderr, "%s\n", n.c_str());
  ModelConfig c = is_gguf_path(args[0]) ? gguf_model_config(*io::GgufFile::open(args[0])) : ModelConfig::from_dir(args[0]);
  if (!is_gguf_path(args[0])) {  // a quantized Hugging Face checkpoint: count its experts as stored
    io::TensorStore store(args[0]);
    if (auto src = open_hf_quant_source(args[0], store)) set_expert_bytes_from(c, *src);
  }

  GpuTarget gpu;
  std::string gpu_note;
  if (have_mem) {
    gpu.total_bytes = s.gpu_memory;
    gpu.name = "a GPU of " + format_bytes(gpu.total_bytes) + " (" + s.origin("gpu_memory") + ")";
    gpu.assumed = true;
  } else if (gpu::device_count() > 0) {
    const gpu::DeviceInfo d = gpu::device_info(0);
    gpu.total_bytes = d.total_bytes;
    gpu.name = d.name;
  } else {
    gpu.total_bytes = 24ull << 30;
    gpu.name = "a 24 GiB GPU";
    gpu.assumed = true;
    gpu_note = "no GPU found (" + gpu::describe() + "): planning for a 24 GiB card; pass --gpu-memory SIZE to describe yours";
  }
  // GPU memory and PCIe bandwidth: given, else measured on GPU 0 when there is one (as a run's automatic fit
  // does at load), else assumed for a 4090/3090-class card.
  const bool measure_gpu = gpu::device_count() > 0;
  std::string gbw_note = "--gpu-bandwidth";
  if (have_gbw) {
    gpu.bandwidth = static_cast<double>(parse_bytes("--gpu-bandwidth", gbw_s));
  } else if (measure_gpu) {
    try {
      gpu.bandwidth = measure_device_copy_bandwidth();
      gbw_note = "measured on GPU 0 (device-to-device copy)";
    } catch (const Error& e) {  // e.g. no room for the probe's 512 MiB on a busy card
      gpu.bandwidth = 1.0e12;
      gbw_note = std::string("assumed 1000 GB/s: the probe on GPU 0 failed (") + e.what() + "); pass --gpu-bandwidth";
    }
  } else {
    gpu.bandwidth = 1.0e12;
    gbw_note = "assumed 1000 GB/s (a 4090/3090-class card); pass --gpu-bandwidth";
  }
  const double cpu_bw = have_cbw ? static_cast<double>(parse_bytes("--cpu-bandwidth", cbw_s)) : measure_cpu_bandwidth();

  // Automatic fit: every resident-layer count with its KV, slots, expert cache and decode bound; `auto` takes the best.
  FitInputs fin;
  fin.gpu_bandwidth = gpu.bandwidth;
  fin.cpu_bandwidth = cpu_bw;
  fin.pcie_bandwidth = 25e9;  // PCIe 4.0 x16, unless given or measured
  if (have_pbw) {
    fin.pcie_bandwidth = static_cast<double>(parse_bytes("--pcie-bandwidth", pbw_s));
  } else if (measure_gpu) {
    try {
      fin.pcie_bandwidth = measure_pinned_h2d_bandwidth(64u << 20);
    } catch (const Error&) {
    }
  }
  if (have_ctx) {
    fin.context = parse_int("--context", ctx_s);
    if (fin.context < 1 || fin.context > (int64_t{1} << 24)) fail(ErrorKind::invalid_argument, "--context=" + ctx_s + ": must be in 1..16777216 tokens");
  }
  fin.batch = parse_int("--batch", batch_s);
  if (fin.batch < 1 || fin.batch > 4096) fail(ErrorKind::invalid_argument, "--batch=" + batch_s + ": must be in 1..4096 sequences");
  fin.stream_slots = parse_prefill_min_batch(s) != 0;
  fin.window = parse_prefetch_window(s);
  std::optional<RoutingTrace> trace;
  if (have_trace || !s.fit_routing_trace.empty()) {  // --trace, else the run's own --fit-routing-trace
    trace = read_routing_trace(have_trace ? trace_s : s.fit_routing_trace);
    fin.trace = &*trace;
  }
  const LayerSpec spec = parse_layer_spec(s.origin("gpu_resident_moe_layers"), s.gpu_resident_moe_layers, c.num_hidden_layers);
  std::optional<FitChoice> fit;
  Settings sp = s;
  if (spec.mode == LayerSpec::Mode::automatic) {
    fit = auto_fit(c, s, gpu, fin);
    sp.gpu_resident_moe_layers = first_moe_layers(c, fit->chosen().resident);
  }
  Plan p = make_plan(c, sp, gpu);
  p.spec = s.gpu_resident_moe_layers;
  if (!gpu_note.empty()) std::printf("note: %s\n", gpu_note.c_str());
  std::printf("model: %s (%s, %lld layers, %lld MoE)\n", args[0].c_str(), c.model_type.c_str(), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(p.moe_layers()));
  std::printf("GPU 0: %s, budget %s (gpu-memory-utilization %.2f)\n", gpu.name.c_str(), format_bytes(p.gpu_budget).c_str(),
              s.gpu_memory_utilization);
  std::printf("resident MoE layers: '%s' (%s) -> %lld of %lld\n\n", p.spec.c_str(), s.origin("gpu_resident_moe_layers").c_str(),
              static_cast<long long>(p.resident_moe_layers()), static_cast<long long>(p.moe_layers()));
  std::printf("layer  device  ffn    experts   bytes\n");
  for (const auto& l : p.layers)
    std::printf("%5lld  GPU %-3d %-5s  %-8s  %s\n", static_cast<long long>(l.layer), l.device, l.moe ? "moe" : "dense",
                !l.moe ? "-" : (l.resident ? ("GPU " + std::to_string(l.device)).c_str() : "CPU"), l.moe ? format_bytes(l.expert_bytes).c_str() : "-");
  std::printf("\nGPU 0: weights %s (attention, embeddings, routers, dense) + experts %s + workspace %s + KV %s = %s of %s\n",
              format_bytes(p.gpu_fixed_bytes).c_str(), format_bytes(p.gpu_expert_bytes).c_str(), format_bytes(p.gpu_workspace_bytes).c_str(),
              format_bytes(p.kv_bytes).c_str(),
              format_bytes(p.gpu_fixed_bytes + p.gpu_expert_bytes + p.gpu_workspace_bytes + p.kv_bytes).c_str(), format_bytes(p.gpu_budget).c_str());
  // Plain checkpoints hold their host experts in --dtype when it says (quantized ones as stored).
  const std::string host_dtype = c.expert_bytes_per_weight > 0 || s.weight_dtype == "auto" ? "" : " (" + s.weight_dtype + ": " + s.origin("weight_dtype") + ")";
  std::printf("host memory (NUMA nodes together; the expert engine splits each expert across nodes): experts %s%s%s\n",
              format_bytes(p.cpu_expert_bytes).c_str(), host_dtype.c_str(),
              c.expert_bytes_per_weight > 0
                  ? (" (as stored: " + std::to_string(c.expert_bytes_per_weight).substr(0, 6) + " bytes per weight; resident on the GPU " +
                     (s.gpu_quantized_experts && c.gpu_expert_bytes_per_weight > 0 ? std::to_string(c.gpu_expert_bytes_per_weight).substr(0, 6) + " bytes per weight)"
                                                                                   : std::string("bf16)")))
                        .c_str()
                  : "");
  std::printf("KV cache: %s per token, %lld tokens, on %s\n", format_bytes(p.kv_bytes_per_token).c_str(), static_cast<long long>(p.kv_tokens),
              p.kv_tier.c_str());
  const double t = p.decode_seconds(gpu.bandwidth, cpu_bw);
  std::printf("decode estimate (batch 1): GPU reads %s/token at %.0f GB/s (%s), CPU reads %s/token of cold experts at %.1f GB/s (%s)\n",
              format_bytes(p.gpu_bytes_per_token).c_str(), gpu.bandwidth / 1e9, gbw_note.c_str(), format_bytes(p.cpu_bytes_per_token).c_str(),
              cpu_bw / 1e9, have_cbw ? "--cpu-bandwidth" : "measured here");
  std::printf("  -> %.2f ms/token, about %.1f tokens/s (bandwidth bound; no overlap assumed)\n", t * 1e3, 1.0 / t);
  if (fit) {
    const FitOption& o = fit->chosen();
    std::printf("\n%s", fit_table(*fit).c_str());
    std::printf("auto: %lld resident MoE layers (%s), KV %lld blocks, streamed prefill %s, expert cache %s (%lld experts of host layers)\n",
                static_cast<long long>(o.resident), first_moe_layers(c, o.resident).c_str(), static_cast<long long>(o.kv_blocks),
                o.stream_slots ? (std::to_string(o.stream_slots) + " slots" + (o.stream_chunk ? " of " + std::to_string(o.stream_chunk) + " experts (chunks)" : std::string())).c_str()
                : o.resident + 1 == static_cast<int64_t>(fit->options.size())     ? "not needed (every MoE layer resident)"
                : parse_prefill_min_batch(s) == 0                                  ? "off (--gpu-prefill-min-batch-size 0)"
                                                                                   : "off (its slots do not fit)",
                format_bytes(o.cache_bytes).c_str(),
                static_cast<long long>(o.cache_experts));
  }
  if (p.resident_moe_layers() < p.moe_layers()) {
    // What the weights, resident experts and workspace leave on the GPU (the KV cache takes what the slots leave).
    const uint64_t used = p.gpu_fixed_bytes + p.gpu_expert_bytes + p.gpu_workspace_bytes;
    const uint64_t left = gpu.total_bytes > used ? gpu.total_bytes - used : 0;
    // GGUF: the CPU expert FLOP/s are measured on one of the file's experts (its format's kernels).
    ModelConfig gc;
    std::unique_ptr<WeightSource> gguf = is_gguf_path(args[0]) ? open_gguf_source(args[0], gc) : nullptr;
    std::optional<numa::ExpertWeights> sample;
    for (const LayerPlacement& l : p.layers)
      if (gguf && l.moe && !l.resident) {
        const std::string e = "model.layers." + std::to_string(l.layer) + ".mlp.experts.0.";
        const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
        sample = numa::ExpertWeights{gguf->mat(e + "gate_proj.weight", I, H), gguf->mat(e + "up_proj.weight", I, H), gguf->mat(e + "down_proj.weight", H, I)};
        break;
      }
    std::printf("%s", prefill_plan_report(c, s, cpu_bw, have_pbw ? static_cast<double>(parse_bytes("--pcie-bandwidth", pbw_s)) : 0,
                                          p.moe_layers() - p.resident_moe_layers(), left, gpu.total_bytes, sample ? &*sample : nullptr)
                          .c_str());
    // Split decode and the GPU expert cache (GGUF Q4_K/Q5_K/Q6_K/Q8_0 experts of host layers).
    const bool native = sample && gpu::gguf_native_supported(sample->gate) && gpu::gguf_native_supported(sample->up) &&
                        gpu::gguf_native_supported(sample->down);
    if (native) {
      double pcie = have_pbw ? static_cast<double>(parse_bytes("--pcie-bandwidth", pbw_s)) : 0;
      if (pcie <= 0) pcie = gpu::device_count() > 0 ? measure_pinned_h2d_bandwidth(64u << 20) : 25e9;
      const uint64_t eb = sample->gate.bytes() + sample->up.bytes() + sample->down.bytes();
      std::printf("%s", expert_cache_plan_report(c, s.gpu_expert_cache, s.gpu_split_decode, s.gpu_expert_cache_policy, cpu_bw, pcie, p.moe_layers() - p.resident_moe_layers(), eb).c_str());
    } else {
      std::printf("GPU expert cache and split decode: off (the host experts are not GGUF Q4_K/Q5_K/Q6_K/Q8_0 matrices of a shape the GPU's native kernels take)\n");
    }
  }
  {
    // Where the host experts live for the GPU's DMA (engine/layers/host_residence.h), chosen as a load on this host would.
    const bool host_layers = p.resident_moe_layers() < p.moe_layers();
    const bool reads = host_layers && (parse_prefill_min_batch(s) != 0 || parse_gpu_expert_cache(s.gpu_expert_cache) != 0);
    const auto kv_host = static_cast<uint64_t>(std::max(0.0, s.kv_offloading_size) * 1073741824.0);
    const int64_t avail = mem_available_bytes();
    const HostResidenceChoice rc = choose_host_residence(host_residence_of(s), reads, p.cpu_expert_bytes, kv_host, avail);
    std::printf("%s\n", rc.describe().c_str());
    if (rc.chosen == HostResidence::copy)
      std::printf("  at load: %s of host experts copied into node memory (the expert engine's node pieces, filled by each node's workers; about %.1f s at "
                  "the %.1f GB/s host read bandwidth above), then registered with the driver whole per layer and node; the checkpoint's pages of them "
                  "dropped (MADV_DONTNEED, and POSIX_FADV_DONTNEED for GGUF files)%s\n",
                  format_bytes(p.cpu_expert_bytes).c_str(), static_cast<double>(p.cpu_expert_bytes) / std::max(cpu_bw, 1.0), cpu_bw / 1e9,
                  gpu::device_count() > 0 ? "" : "; no GPU on this host: a run here is CPU-only and copies nothing");
  }
  if (c.arch == Arch::qwen3_moe_engram && !is_gguf_path(args[0])) std::printf("%s", ple_plan_report(c, io::TensorStore(args[0]), s, 1.0 / t).c_str());
  if (is_gguf_path(args[0])) {
    const auto f = io::GgufFile::open(args[0]);
    std::printf("%s%s", gguf_layer_bytes_report(*f).c_str(), gguf_fit_report(*f, p, gpu.total_bytes).c_str());
  }
  return 0;
}

}  // namespace
HMOE_COMMAND(plan_cmd, "plan", "plan MODEL [--gpu-memory 24GiB] [--context N] [--batch B] [--trace ROUTING_TRACE] [--gpu-bandwidth 1TB] [--cpu-bandwidth 50GB] [--pcie-bandwidth 25GB] [placement settings]",
             "print the GPU/CPU placement, memory and estimated decode speed without loading weights onto a GPU", run_plan);
}  // namespace hmoe::cli
