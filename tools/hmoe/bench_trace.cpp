// hmoe bench trace and bench cache-sim (see bench_trace.h).
#include "tools/hmoe/bench_trace.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "configs/error.h"
#include "engine/layers/routing_trace.h"
#include "engine/placement/expert_cache_sim.h"
#include "engine/placement/placement.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

int64_t need_int(std::vector<std::string>& args, const std::string& flag, int64_t lo, int64_t hi, const std::string& def = "") {
  std::string v = def;
  if (!take_option(args, flag, v) && def.empty()) fail(ErrorKind::invalid_argument, "bench trace: " + flag + " is required");
  const int64_t x = parse_int(flag, v);
  if (x < lo || x > hi)
    fail(ErrorKind::invalid_argument, flag + "=" + v + ": must be in " + std::to_string(lo) + ".." + std::to_string(hi));
  return x;
}

}  // namespace

int run_bench_trace(std::vector<std::string>& args) {
  std::string zipf_s, out;
  if (!take_option(args, "--zipf", zipf_s)) fail(ErrorKind::invalid_argument, "bench trace: --zipf S is required (0 = uniform routing, 1.0 = Zipf)");
  if (!take_option(args, "--out", out) || out.empty()) fail(ErrorKind::invalid_argument, "bench trace: --out FILE is required");
  const double s = parse_float("--zipf", zipf_s);
  if (!(s >= 0 && s <= 10)) fail(ErrorKind::invalid_argument, "--zipf=" + zipf_s + ": must be in 0..10");
  const int64_t E = need_int(args, "--experts", 1, 65535);
  const int64_t K = need_int(args, "--topk", 1, E);
  const int64_t L = need_int(args, "--layers", 1, 100000);
  const int64_t N = need_int(args, "--tokens", 1, int64_t{1} << 30);
  const int64_t B = need_int(args, "--batch", 1, 1 << 20, "1");
  const int64_t seed = need_int(args, "--seed", 0, INT64_MAX, "1");
  const int64_t H = need_int(args, "--hidden", 1, 1 << 20, "2048");
  const int64_t I = need_int(args, "--moe-intermediate", 1, 1 << 20, "768");
  reject_unknown_flags(args, "bench trace");
  if (!args.empty()) fail(ErrorKind::invalid_argument, "bench trace takes no positional arguments, got '" + args[0] + "'");
  const RoutingTrace t = zipf_routing_trace(s, E, K, L, N, B, static_cast<uint64_t>(seed), H, I);
  write_routing_trace(out, t);
  std::printf("wrote %s: %lld steps x %lld layers, %lld tokens (batch %lld), %lld experts, top-%lld, Zipf s=%.2f\n", out.c_str(),
              static_cast<long long>(t.steps()), static_cast<long long>(L), static_cast<long long>(N), static_cast<long long>(B),
              static_cast<long long>(E), static_cast<long long>(K), s);
  return 0;
}

int run_bench_cache_sim(std::vector<std::string>& args) {
  std::string bytes_s, policy_s = "lru,lfu,freq_recency", bpw_s = "2", ebytes_s, layers_s, part_s = "per_layer";
  if (!take_option(args, "--bytes", bytes_s)) fail(ErrorKind::invalid_argument, "bench cache-sim: --bytes SIZE[,SIZE...] is required (e.g. 2GiB,8GiB)");
  take_option(args, "--policy", policy_s);
  const bool have_bpw = take_option(args, "--bytes-per-weight", bpw_s);
  const bool have_eb = take_option(args, "--expert-bytes", ebytes_s);
  take_option(args, "--layers", layers_s);
  take_option(args, "--partition", part_s);
  if (part_s != "per_layer" && part_s != "global")
    fail(ErrorKind::invalid_argument, "--partition='" + part_s + "': expected per_layer (the GPU expert cache's layout) or global");
  const bool per_layer = part_s == "per_layer";
  const bool json = take_flag(args, "--json");
  reject_unknown_flags(args, "bench cache-sim");
  if (args.size() != 1) fail(ErrorKind::invalid_argument, "bench cache-sim takes one TRACE file (from --routing-trace or bench trace)");
  if (have_bpw && have_eb) fail(ErrorKind::invalid_argument, "bench cache-sim: give --bytes-per-weight or --expert-bytes, not both");
  const RoutingTrace t = read_routing_trace(args[0]);
  const double bpw = parse_float("--bytes-per-weight", bpw_s);
  if (!(bpw > 0 && bpw <= 8)) fail(ErrorKind::invalid_argument, "--bytes-per-weight=" + bpw_s + ": must be in (0, 8]");
  const uint64_t eb = have_eb ? parse_bytes("--expert-bytes", ebytes_s) : t.header.expert_bytes(bpw);
  if (eb == 0) fail(ErrorKind::invalid_argument, "bench cache-sim: an expert of 0 bytes (the trace's header has no shape; pass --expert-bytes)");
  std::vector<bool> layers;
  if (!layers_s.empty()) {
    const LayerSpec spec = parse_layer_spec("--layers", layers_s, t.header.layers);
    layers.assign(t.header.layers, spec.mode == LayerSpec::Mode::all);
    for (int64_t l : spec.layers) layers[static_cast<size_t>(l)] = true;
    if (spec.mode == LayerSpec::Mode::none || spec.mode == LayerSpec::Mode::automatic)
      fail(ErrorKind::invalid_argument, "--layers='" + layers_s + "': name the layers the cache serves (e.g. 0-47 or all)");
  }
  std::vector<CachePolicy> policies;
  for (const auto& p : split(policy_s)) policies.push_back(parse_cache_policy("--policy", p));
  std::vector<uint64_t> sizes;
  for (const auto& b : split(bytes_s)) sizes.push_back(parse_bytes("--bytes", b));
  int64_t served = 0;
  for (uint32_t l = 0; l < t.header.layers; ++l) served += layers.empty() || layers[l];
  if (!json) {
    std::printf("trace %s: %u steps, %u layers (%lld served), %u experts, top-%u, expert %s; slots %s\n\n", args[0].c_str(), t.steps(), t.header.layers,
                static_cast<long long>(served), t.header.experts, t.header.topk, format_bytes(eb).c_str(),
                per_layer ? "shared evenly per layer (as the GPU expert cache)" : "one pool over all layers");
    std::printf("| cache | experts held | of all | policy | hit rate (expert loads) | hit rate (token-expert pairs) | ideal static top-C | copied/token | evictions |\n"
                "|---|---|---|---|---|---|---|---|---|\n");
  }
  for (uint64_t b : sizes) {
    const int64_t cap = static_cast<int64_t>(b / eb);
    const double ideal = static_top_hit_rate(t, cap, layers);
    for (CachePolicy p : policies) {
      const CacheSimResult r = simulate_expert_cache(t, b, eb, p, layers, per_layer);
      const double share = static_cast<double>(cap) / static_cast<double>(served * t.header.experts);
      if (json) {
        const nlohmann::json j = {{"trace", args[0]}, {"bytes", b}, {"expert_bytes", eb}, {"capacity", cap}, {"share", share},
                                  {"policy", cache_policy_name(p)}, {"partition", part_s}, {"hit_rate", r.hit_rate()}, {"pair_hit_rate", r.pair_hit_rate()},
                                  {"ideal_static", ideal}, {"admissions", r.admissions}, {"evictions", r.evictions}, {"loads", r.loads},
                                  {"copied_bytes_per_token", r.copied_bytes_per_token()}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("| %s | %lld | %.1f%% | %s | %.1f%% | %.1f%% | %.1f%% | %s | %lld |\n", format_bytes(b).c_str(), static_cast<long long>(cap),
                    100 * std::min(share, 1.0), cache_policy_name(p), 100 * r.hit_rate(), 100 * r.pair_hit_rate(), 100 * ideal,
                    format_bytes(static_cast<uint64_t>(r.copied_bytes_per_token())).c_str(), static_cast<long long>(r.evictions));
      }
    }
  }
  return 0;
}

}  // namespace hmoe::cli
