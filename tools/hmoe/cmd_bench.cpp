// hmoe bench experts: the routed-expert layer benchmark of numa/expert_bench.h
// as a subcommand, so anyone can rerun it on their machine. One run prints
// one JSON object (--json) or a line; --sweep prints the full tables (every
// shape, dtype and token count at all threads, then thread scaling at one
// token) in one call.
// hmoe bench MODEL: the model benchmark (prefill and decode tok/s, llama-bench
// style) of tools/hmoe/bench_model.h.
// hmoe bench disk FILE: the random-read probe of io/read_probe.h on a file
// of the disk that would hold a PLE table, against the reads/s `hmoe plan`
// says an Engram model needs.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "configs/error.h"
#include "io/read_probe.h"
#include "numa/expert_bench.h"
#include "numa/kernels.h"
#include "numa/onednn_matmul.h"
#include "tools/hmoe/bench_model.h"
#include "tools/hmoe/bench_trace.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void print_row(const numa::ExpertBenchResult& r, bool json) {
  if (json) {
    std::printf("%s\n", r.json().c_str());
  } else {
    std::printf("| %s | %s | %lld | %d | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %s |\n", r.shape.name.c_str(), r.cfg.dtype.c_str(),
                static_cast<long long>(r.cfg.tokens), r.threads, r.seconds_per_step * 1e3, r.weight_gbps, r.bandwidth_ratio, r.weight_gbps_cpu,
                r.bandwidth_ratio_cpu, r.gflops, r.note.c_str());
  }
  std::fflush(stdout);
}

int run_bench_disk(std::vector<std::string>& args) {
  std::string block_s = "512", secs_s = "3", group_s = "16";
  take_option(args, "--block", block_s);
  take_option(args, "--seconds", secs_s);
  take_option(args, "--group", group_s);
  const bool json = take_flag(args, "--json");
  reject_unknown_flags(args, "bench disk");
  if (args.size() != 1) fail(ErrorKind::invalid_argument, "bench disk takes one FILE (a PLE table file, or any large file on the disk to probe)");
  io::ReadProbeOptions o;
  const int64_t block = parse_int("--block", block_s);
  if (block < 512 || block > (1 << 20)) fail(ErrorKind::invalid_argument, "--block must be a power of two in 512..1048576, got " + block_s);
  o.block = static_cast<uint32_t>(block);
  o.seconds = parse_float("--seconds", secs_s);
  o.group = static_cast<int>(std::clamp<int64_t>(parse_int("--group", group_s), -1, 1 << 20));
  const io::ReadProbeResult r = io::probe_random_reads(args[0], o);
  if (json) {
    const nlohmann::json j = {{"file", args[0]}, {"bytes", r.file_bytes}, {"block", o.block}, {"direct", r.direct}, {"reader", r.reader},
                              {"iops", r.iops}, {"mb_per_s", r.mbps}, {"qd1_us", r.qd1_us}, {"group", o.group}, {"group_p50_us", r.group_p50_us},
                              {"group_p90_us", r.group_p90_us}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("%s: %.1f MiB, random %u-byte reads %s, %s\n", args[0].c_str(), static_cast<double>(r.file_bytes) / (1 << 20), o.block,
              r.direct ? "with O_DIRECT" : "through the page cache (no O_DIRECT on this filesystem: cached pages flatter the figures)", r.reader.c_str());
  std::printf("  queue depth %u over %u rings: %.0f reads/s, %.1f MB/s\n", o.queue_depth, o.rings, r.iops, r.mbps);
  std::printf("  one at a time: %.1f us per read\n", r.qd1_us);
  std::printf("  %d reads at once (one PLE module's rows for one token): %.0f us p50, %.0f us p90 until the last lands\n", o.group, r.group_p50_us,
              r.group_p90_us);
  std::printf("compare: `hmoe plan MODEL` prints the reads/s an Engram model's table file must serve; a module hides its reads when the layers\n"
              "in front of it take longer than the group time (else --ple-ram-modules keeps its table in memory)\n");
  return 0;
}

int run_bench(const Settings& s, std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "disk") {
    args.erase(args.begin());
    return run_bench_disk(args);
  }
  if (!args.empty() && (args[0] == "trace" || args[0] == "cache-sim")) {
    const bool trace = args[0] == "trace";
    args.erase(args.begin());
    return trace ? run_bench_trace(args) : run_bench_cache_sim(args);
  }
  if (args.empty()) fail(ErrorKind::invalid_argument, "bench: name a MODEL (directory or .gguf file), 'experts' or 'disk' (hmoe bench MODEL|experts|disk ...)");
  if (args[0] != "experts") return run_bench_model(s, args);
  args.erase(args.begin());
  std::string shape = "qwen3-30b-a3b", dtype = "bf16", tokens_s = "1", held_s = "0", secs_s = "1", stream_s = "256";
  std::string shapes_s = "qwen3-30b-a3b,deepseek-v3", dtypes_s = "bf16,int8,int4", tokens_list = "1,4,16,64,512", threads_list;
  take_option(args, "--shape", shape);
  // --dtype is also the settings flag (weight storage), consumed into s.weight_dtype before we see it.
  if (s.weight_dtype != "auto") dtype = s.weight_dtype;
  take_option(args, "--dtype", dtype);
  take_option(args, "--tokens", tokens_s);
  take_option(args, "--experts-held", held_s);
  take_option(args, "--seconds", secs_s);
  take_option(args, "--stream-mib", stream_s);
  take_option(args, "--shapes", shapes_s);
  take_option(args, "--dtypes", dtypes_s);
  take_option(args, "--tokens-list", tokens_list);
  take_option(args, "--threads-list", threads_list);
  const bool json = take_flag(args, "--json");
  const bool sweep = take_flag(args, "--sweep");
  reject_unknown_flags(args, "bench experts");
  if (!args.empty()) fail(ErrorKind::invalid_argument, "bench experts takes no positional arguments, got '" + args[0] + "'");
  const double secs = parse_float("--seconds", secs_s);
  const int64_t stream_mib = parse_int("--stream-mib", stream_s);
  if (secs <= 0 || secs > 60) fail(ErrorKind::invalid_argument, "--seconds must be in (0, 60]");
  if (stream_mib < 16 || stream_mib > 65536) fail(ErrorKind::invalid_argument, "--stream-mib must be in 16..65536");

  numa::PoolOptions po = numa::PoolOptions::from_settings(s);
  numa::ExpertBenchConfig base;
  base.experts_held = parse_int("--experts-held", held_s);
  base.min_seconds = secs;
  base.bf16_dot = s.cpu_bf16_dot;
  base.int8_act = s.cpu_int8_act;
  base.onednn_min_tokens = s.cpu_onednn_min_tokens;

  if (!sweep) {
    numa::NodePools pools(po);
    double stream_cpu = 0;
    const double stream = numa::stream_triad_gbps(pools, static_cast<size_t>(stream_mib) << 20, 5, &stream_cpu);
    numa::ExpertBenchConfig cfg = base;
    cfg.shape = shape;
    cfg.dtype = dtype;
    cfg.tokens = parse_int("--tokens", tokens_s);
    const auto r = numa::run_expert_bench(cfg, pools, stream, stream_cpu);
    if (!json)
      std::printf("| shape | dtype | tokens | threads | ms/step | weight GB/s | / STREAM | weight GB/s (CPU time) | / STREAM (CPU time) | GFLOP/s | note |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    print_row(r, json);
    return 0;
  }

  // Sweep: all threads first, then thread scaling at one token.
  std::vector<numa::ExpertBenchResult> big_rows;
  numa::NodePools all(po);
  double stream_cpu = 0;
  const double stream = numa::stream_triad_gbps(all, static_cast<size_t>(stream_mib) << 20, 5, &stream_cpu);
  const int max_threads = all.threads();
  const double dnnl_peak = numa::dnnl_sgemm_gflops(2048, 2048, 2048);
  const double dnnl_bf16_peak = numa::onednn_bf16_gflops(2048, 2048, 2048);
  std::fprintf(stderr, "hmoe bench: %s\n", all.topology().describe().c_str());
  std::string load = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[64] = {0};
    if (std::fgets(buf, sizeof(buf), f)) load = std::string(buf, strnlen(buf, sizeof(buf))).substr(0, 14);
    std::fclose(f);
  }
  std::printf("# hmoe bench experts --sweep: %s, isa %s%s, %d threads (%s), STREAM triad %.1f GB/s (%.1f GB/s over CPU time), oneDNN sgemm 2048^3 %.1f GFLOP/s, "
              "oneDNN bf16 matmul 2048^3 %.1f GFLOP/s, load average %s\n\n",
              all.topology().source.c_str(), cpu::isa_name(cpu::best_isa()), cpu::has_bf16_dot() ? " (+avx512_bf16)" : "", max_threads,
              all.describe().c_str(), stream, stream_cpu, dnnl_peak, dnnl_bf16_peak, load.c_str());
  if (!json)
    std::printf("| shape | dtype | tokens | threads | ms/step | weight GB/s | / STREAM | weight GB/s (CPU time) | / STREAM (CPU time) | GFLOP/s | note |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& sh : split_list(shapes_s))
    for (const auto& dt : split_list(dtypes_s))
      for (const auto& tk : split_list(tokens_list)) {
        numa::ExpertBenchConfig cfg = base;
        cfg.shape = sh;
        cfg.dtype = dt;
        cfg.tokens = parse_int("--tokens-list", tk);
        const auto r = numa::run_expert_bench(cfg, all, stream, stream_cpu);
        print_row(r, json);
        if (cfg.tokens >= 512) big_rows.push_back(r);
      }
  if (!json && !big_rows.empty()) {
    std::printf("\nLarge batches against oneDNN's own GEMM peaks on this machine (sgemm %.1f, bf16 matmul %.1f GFLOP/s, 2048^3):\n\n"
                "| shape | dtype | tokens | path | GFLOP/s | / oneDNN sgemm | / oneDNN bf16 matmul |\n|---|---|---|---|---|---|---|\n",
                dnnl_peak, dnnl_bf16_peak);
    for (const auto& r : big_rows)
      std::printf("| %s | %s | %lld | %s | %.1f | %.2f | %.2f |\n", r.shape.name.c_str(), r.cfg.dtype.c_str(), static_cast<long long>(r.cfg.tokens),
                  r.isa.c_str(), r.gflops, r.gflops / dnnl_peak, r.gflops / dnnl_bf16_peak);
  }
  std::vector<int> threads;
  if (!threads_list.empty()) {
    for (const auto& t : split_list(threads_list)) threads.push_back(static_cast<int>(parse_int("--threads-list", t)));
  } else {
    for (int t = 1; t < max_threads; t *= 2) threads.push_back(t);
    threads.push_back(max_threads);
  }
  if (!json) std::printf("\nThread scaling at 1 token (ratio against the all-thread STREAM triad):\n\n| shape | dtype | tokens | threads | ms/step | weight GB/s | / STREAM | weight GB/s (CPU time) | / STREAM (CPU time) | GFLOP/s | note |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int t : threads) {
    numa::PoolOptions pt = po;
    pt.threads = t;
    pt.quiet = true;
    numa::NodePools pools(pt);
    for (const auto& sh : split_list(shapes_s))
      for (const auto& dt : split_list(dtypes_s)) {
        numa::ExpertBenchConfig cfg = base;
        cfg.shape = sh;
        cfg.dtype = dt;
        cfg.tokens = 1;
        print_row(numa::run_expert_bench(cfg, pools, stream, stream_cpu), json);
      }
  }
  return 0;
}

}  // namespace

HMOE_COMMAND(bench_cmd, "bench",
             "bench MODEL [-p 512,4096] [-n 64] [-d 0] [--batch 1,8] [-r 3] [--json] [--decode-breakdown] | "
             "bench experts [--shape qwen3-30b-a3b|deepseek-v3] [--dtype bf16|int8|int4] [--tokens N] [--threads T] [--json] "
             "[--experts-held N] [--seconds S] [--stream-mib M] | bench experts --sweep [--shapes a,b] [--dtypes a,b] "
             "[--tokens-list 1,4,..] [--threads-list 1,2,..] [--json] | bench disk FILE [--block 512] [--seconds 3] [--group 16] [--json]",
             "model prefill/decode tok/s as serve runs it (llama-bench style); routed-expert layer and STREAM triad benchmark (weight GB/s against the machine's bandwidth); random-read probe of a disk for PLE tables; synthetic routing traces and the GPU expert cache simulator", run_bench);

}  // namespace hmoe::cli
