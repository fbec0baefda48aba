// Routed experts in the low-bit GGUF types (numa/quant_gguf_lowbit.h)
// through numa::ExpertEngine, the real decode path, on DeepSeek-V3 / Kimi-K2
// expert shapes (hidden 7168, moe_intermediate 2048, top-8), each type for
// gate/up/down alone and the dynamic-quant mix the IQ1_S/IQ2_XXS files use
// (gate/up IQ1_S or IQ2_XXS, down one step up):
//  - batch 1: weight GB/s (the stored bytes of the 8 experts a token
//    touches / step time) against a read bandwidth measured here with the
//    same threads (the probe of engine/placement/prefill_cost.h, 256 MiB,
//    taken before every format, the best one counting); the same over
//    process CPU time per thread (a shared machine's preemption left out);
//    experts are cycled over E so the working set is past the caches;
//  - batch 8 (a short prompt chunk) and 32: integer GOP/s (2 x 3 x H x I per
//    (token, expert) pair).
// --compare-v2: the int8 step again with the v4 kernels turned off (v2 for
// their types), in turns with v4 (three of each, the best counting): the
// before/after of quant_gguf_lowbit_codes.cpp on the same load. Where the
// engine repacks (cpu_lowbit_repack: IQ1_S / IQ1_M v5 on AVX-512; on AVX2
// CPUs AVX2 v3 of the grid IQ types, IQ1_S and IQ1_M), also an engine on the
// file's blocks (v4, or AVX2 v2) in the same turns; "bytes read / file" is the ratio of
// the bytes a step streams to the file's, and the CPU-time ratio is given
// over both (the file's bytes are what a user's model holds).
// "int8" is the default path (8-bit activations, VNNI), "exact" the fp32
// dequantize path (setting cpu_gguf_int8=0).
// Weights are random blocks with finite fp16 scales: the kernels' work does
// not depend on the values.
//
// --kernel: the int8 kernel alone on one thread (IQ2_XXS / IQ3_XXS also by
// their v2 kernel, which v3 replaced), rows resident in L2 (64 x
// hidden), batch 1 and 4, timed by the thread's CPU time (what a loaded
// machine's preemption does not inflate): the compute roof, as the GB/s of
// weights one core could consume.
//
// Usage: bench_gguf_lowbit [--threads T] [--quick] [--kernel] [--compare-v2] [--batch N] [--type NAME] [--experts E] [--shape deepseek|qwen] [--isa-avx2]
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "numa/expert_engine.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"

using namespace hmoe;
using cpu::ExtType;
using clk = std::chrono::steady_clock;

namespace {

int64_t H = 7168, I = 2048;
constexpr int64_t K = 8;

// Random blocks of type t (fp16 scales finite; splitmix64 bytes).
std::vector<uint8_t> random_matrix(ExtType t, int64_t rows, int64_t cols, uint64_t seed) {
  const cpu::ExtTypeInfo* ti = cpu::ext_type_info(static_cast<uint32_t>(t));
  const int64_t nb = rows * cols / ti->block_elems;
  std::vector<uint8_t> b(static_cast<size_t>(nb * ti->block_bytes));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(b.data() + i, &z, 8);
  }
  const uint32_t id = static_cast<uint32_t>(t);
  const uint16_t h = f32_to_f16(0.01f);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t* p = b.data() + i * ti->block_bytes;
    if (id == 10) std::memcpy(p + 80, &h, 2), std::memcpy(p + 82, &h, 2);
    else if (id == 11) std::memcpy(p + 108, &h, 2);
    else if (id == 29) {
      for (int k = 0; k < 4; ++k) p[49 + 2 * k] = static_cast<uint8_t>((p[49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
    } else if (id == 39) p[0] = 120;
    else std::memcpy(p, &h, 2);
  }
  return b;
}

struct ExpertSet {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<numa::ExpertWeights> w;
  double expert_bytes = 0;
};

ExpertSet make_experts(ExtType tu, ExtType td, int64_t E) {
  ExpertSet s;
  s.bytes.reserve(static_cast<size_t>(3 * E));
  for (int64_t e = 0; e < E; ++e) {
    s.bytes.push_back(random_matrix(tu, I, H, static_cast<uint64_t>(3 * e)));
    const void* pg = s.bytes.back().data();
    s.bytes.push_back(random_matrix(tu, I, H, static_cast<uint64_t>(3 * e + 1)));
    const void* pu = s.bytes.back().data();
    s.bytes.push_back(random_matrix(td, H, I, static_cast<uint64_t>(3 * e + 2)));
    const void* pd = s.bytes.back().data();
    s.w.push_back({cpu::ext_view(tu, pg, I, H, "gate"), cpu::ext_view(tu, pu, I, H, "up"), cpu::ext_view(td, pd, H, I, "down")});
  }
  s.expert_bytes = static_cast<double>(s.w[0].gate.bytes() + s.w[0].up.bytes() + s.w[0].down.bytes());
  return s;
}

// Fastest forward of n tokens (each to K distinct experts; the routing moves every step).
double process_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Read bandwidth as engine/placement/prefill_cost.h measures it (sums of
// 256 MiB of u64 in 64K-word chunks over the pool, best of 3), over wall time
// and over process CPU time per thread (what the machine reads while we run:
// a loaded machine's preemption left out, its memory traffic not).
void read_probe(numa::ThreadPool& pool, double& wall_gbps, double& cpu_gbps) {
  static std::vector<uint64_t> buf;
  const size_t words = (256u << 20) / 8, chunk = 1u << 16;
  if (buf.empty()) {
    buf.resize(words);
    for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  }
  const int64_t chunks = static_cast<int64_t>(words / chunk);
  std::vector<uint64_t> sums(static_cast<size_t>(chunks));
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t ch = b; ch < e; ++ch) {
      uint64_t acc = 0;
      for (size_t i = static_cast<size_t>(ch) * chunk; i < static_cast<size_t>(ch + 1) * chunk; ++i) acc += buf[i];
      sums[static_cast<size_t>(ch)] = acc;
    }
  };
  wall_gbps = cpu_gbps = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const double c0 = process_seconds();
    const auto t0 = clk::now();
    pool.parallel_for(chunks, body);
    const double wall = std::chrono::duration<double>(clk::now() - t0).count(), cpu = (process_seconds() - c0) / pool.size();
    wall_gbps = std::max(wall_gbps, static_cast<double>(words * 8) / wall / 1e9);
    cpu_gbps = std::max(cpu_gbps, static_cast<double>(words * 8) / cpu / 1e9);
  }
  volatile uint64_t sink = 0;
  for (auto v : sums) sink = sink + v;
}

// Fastest step over wall time; *cpu_best: the smallest process CPU time per thread of a step.
double time_forward(numa::ExpertEngine& eng, int64_t n, int64_t E, double min_seconds, int threads = 1, double* cpu_best = nullptr) {
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * H)), out(static_cast<size_t>(n * H));
  for (auto& v : x) v = nd(g);
  std::vector<int32_t> ids(static_cast<size_t>(n * K));
  std::vector<float> wts(ids.size(), 1.0f / K);
  int64_t step = 0;
  auto route = [&] {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j) ids[static_cast<size_t>(t * K + j)] = static_cast<int32_t>((step * K + j + (t % 3) * K) % E);
    ++step;
  };
  route();
  eng.forward(x.data(), n, ids.data(), wts.data(), K, out.data());
  double total = 0, best = 1e30;
  int reps = 0;
  while (total < min_seconds || reps < 3) {
    route();
    const double c0 = process_seconds();
    const auto t0 = clk::now();
    eng.forward(x.data(), n, ids.data(), wts.data(), K, out.data());
    const double s = std::chrono::duration<double>(clk::now() - t0).count();
    const double c = (process_seconds() - c0) / threads;
    total += s;
    best = std::min(best, s);
    if (cpu_best) *cpu_best = reps == 0 ? c : std::min(*cpu_best, c);
    ++reps;
  }
  return best;
}

// Whether the AVX2 v2 / v3 kernels serve t here: every low-bit type on an AVX2 CPU (v2 on the file's blocks:
// quant_gguf_lowbit_avx2_grid.cpp, _avx2_nibble.cpp, _avx2_kquant.cpp, _avx2_iq1m.cpp; v3 repacked, _avx2_packed.cpp,
// _avx2_iq1m_packed.cpp; IQ1_S: v3 only), so --compare-v2 and --kernel add AVX2 v1 (the path before) beside them.
bool uses_avx2_grid(ExtType t) { return cpu::best_isa() == cpu::Isa::avx2 && cpu::lowbit_type(static_cast<uint32_t>(t)); }

// Whether the v4 kernels (numa/quant_gguf_lowbit_codes.cpp), or on AVX2 CPUs the AVX2 v2 kernel, serve one of these types.
bool uses_codes(ExtType a, ExtType b) {
  auto v4 = [](ExtType t) {
    return t == cpu::lowbit::iq1_s || t == cpu::lowbit::iq1_m || t == cpu::lowbit::iq2_xxs || t == cpu::lowbit::iq2_xs || t == cpu::lowbit::iq3_xxs ||
           t == cpu::lowbit::iq3_s || t == cpu::lowbit::iq2_s;
  };
  return (cpu::detail::lowbit_has_avx512_vbmi() && (v4(a) || v4(b))) || uses_avx2_grid(a) || uses_avx2_grid(b);
}

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The int8 kernel alone: rows x H of type t, resident in L2, n tokens; best of 5 runs of ~min_s CPU seconds.
// v2 = the VBMI kernel of every type, for the types v3 (grid planes) serves.
// v5 = IQ1_S / IQ1_M repacked into trits (GB/s: the file's bytes per second; the packed bytes are 58 / 50, 66 / 56 of them).
// a2v3 = AVX2 CPUs: the grid IQ types, IQ1_S and IQ1_M repacked (bytes per 256 weights in numa/quant_gguf_lowbit.h;
// IQ1_M 82 against the file's 56).
// v1 = the dispatcher with the v4 / AVX2 v2 kernels off (AVX2 CPUs: v1, the scalar decode).
void kernel_row(const std::string& name, ExtType t, double min_s, bool v2 = false, bool v5 = false, bool a2v3 = false, bool v1 = false) {
  const int64_t rows = 64;
  const auto bytes = random_matrix(t, rows, H, 5);
  const cpu::Mat w = cpu::ext_view(t, bytes.data(), rows, H, "w");
  std::vector<uint8_t> packed;
  double pack_ns = 0;  // v5 / a2v3: the repack at load, ns per group (best of 5)
  if (v5 || a2v3) {
    const size_t rbytes = v5 ? cpu::detail::lowbit_ternary_row_bytes(static_cast<uint32_t>(t), H) : cpu::detail::lowbit_avx2_row_bytes(static_cast<uint32_t>(t), H);
    packed.resize(static_cast<size_t>(rows) * rbytes + cpu::detail::kLowbitTernaryPad);
    pack_ns = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = thread_seconds();
      if (v5) cpu::detail::lowbit_ternary_pack(w, 0, rows, packed.data());
      else cpu::detail::lowbit_avx2_pack(w, 0, rows, packed.data());
      pack_ns = std::min(pack_ns, (thread_seconds() - t0) / static_cast<double>(rows * H / 256) * 1e9);
    }
  }
  std::printf("| %s |", name.c_str());
  for (int64_t n : {int64_t{1}, int64_t{4}}) {
    std::mt19937 g(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n * H)), y(static_cast<size_t>(n * rows));
    for (auto& v : x) v = nd(g);
    cpu::Q8Acts a;
    a.reset(n, w);
    for (int64_t j = 0; j < n; ++j) a.quantize(j, x.data() + j * H);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      int64_t calls = 0;
      const double t0 = thread_seconds();
      double el = 0;
      while (el < min_s / 5) {
        for (int i = 0; i < 16; ++i) {
          if (v5) cpu::detail::lowbit_rows_q8_ternary(a, 0, n, packed.data(), H, 0, rows, y.data(), rows);
          else if (a2v3) cpu::detail::lowbit_rows_q8_avx2_packed(a, 0, n, packed.data(), H, 0, rows, y.data(), rows);
          else if (v2) cpu::detail::lowbit_rows_q8_vbmi(a, 0, n, w, 0, rows, y.data(), rows);
          else if (v1) {
            const bool prev = cpu::detail::lowbit_set_codes_for_testing(false);
            cpu::gemm_rows_q8(a, 0, n, w, 0, rows, y.data(), rows);
            cpu::detail::lowbit_set_codes_for_testing(prev);
          } else cpu::gemm_rows_q8(a, 0, n, w, 0, rows, y.data(), rows);
        }
        calls += 16;
        el = thread_seconds() - t0;
      }
      best = std::min(best, el / static_cast<double>(calls));
    }
    const double groups = static_cast<double>(rows * H / 256);
    std::printf(" %.1f | %.2f |", best / groups * 1e9, static_cast<double>(w.bytes()) / best / 1e9);
  }
  if (v5 || a2v3) std::printf(" repack at load: %.0f ns per group (%.2f GB/s of the file's bytes) |", pack_ns, static_cast<double>(w.bytes()) / static_cast<double>(rows * H / 256) / pack_ns);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  bool quick = false, kernel = false, compare = false;
  std::vector<int64_t> batches{1, 8, 32};
  int64_t E = 24;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--kernel") kernel = true;
    else if (a == "--compare-v2") compare = true;
    else if (a == "--batch" && i + 1 < argc) batches = {std::stoll(argv[++i])};
    else if (a == "--type" && i + 1 < argc) only = argv[++i];
    else if (a == "--isa-avx2") cpu::set_isa_for_testing(cpu::Isa::avx2);  // the AVX2 kernels (and repacks) on an AVX-512 CPU
    else if (a == "--experts" && i + 1 < argc) E = std::stoll(argv[++i]);
    else if (a == "--shape" && i + 1 < argc) {
      const std::string s = argv[++i];
      if (s == "qwen") H = 2048, I = 768;
    } else {
      std::fprintf(stderr, "usage: bench_gguf_lowbit [--threads T] [--quick] [--kernel] [--compare-v2] [--batch N] [--type NAME] [--experts E] [--shape deepseek|qwen] [--isa-avx2]\n");
      return 2;
    }
  }
  if (kernel) {
    std::printf("# bench_gguf_lowbit --kernel: int8 kernel alone, 1 thread, 64 x %ld rows in L2, thread CPU time; ISA %s%s%s\n\n", H,
                cpu::isa_name(cpu::best_isa()), cpu::detail::lowbit_has_avx512_vnni() ? " +VNNI" : "",
                cpu::detail::lowbit_has_avx512_vbmi() ? " +VBMI" : "");
    std::printf("| type | batch 1 ns/group | batch 1 GB/s | batch 4 ns/group | batch 4 GB/s |\n|---|---|---|---|---|\n");
    for (ExtType t : cpu::lowbit::kAll) {
      const std::string name = cpu::ext_type_info(static_cast<uint32_t>(t))->name;
      if (only.empty() || only == name) kernel_row(name, t, quick ? 0.2 : 0.5);
      if ((only.empty() || only == name) && cpu::detail::lowbit_has_avx512_vbmi() &&
          (t == cpu::lowbit::iq2_xxs || t == cpu::lowbit::iq2_xs || t == cpu::lowbit::iq3_xxs || t == cpu::lowbit::iq3_s || t == cpu::lowbit::iq2_s ||
           t == cpu::lowbit::iq1_s || t == cpu::lowbit::iq1_m))
        kernel_row(name + " (v2, before grid codes)", t, quick ? 0.2 : 0.5, true);
      if ((only.empty() || only == name) && cpu::detail::lowbit_ternary_applies(static_cast<uint32_t>(t), H))
        kernel_row(name + " (v5, repacked into trits)", t, quick ? 0.2 : 0.5, false, true);
      const bool avx2 = cpu::best_isa() == cpu::Isa::avx2;
      if ((only.empty() || only == name) && avx2 && cpu::detail::lowbit_avx2_pack_applies(static_cast<uint32_t>(t), H))
        kernel_row(name + " (AVX2 v3, repacked)", t, quick ? 0.2 : 0.5, false, false, true);
      if ((only.empty() || only == name) && avx2 && uses_avx2_grid(t)) kernel_row(name + " (AVX2 v1, before)", t, quick ? 0.2 : 0.5, false, false, false, true);
    }
    if (only.empty() || only == "Q4_K") kernel_row("Q4_K", ExtType::q4_k, quick ? 0.2 : 0.5);
    std::printf("\n(ns per 256-weight group and row; GB/s: stored weight bytes per second one core consumes.)\n");
    return 0;
  }
  numa::PoolOptions po;
  po.threads = threads;
  po.quiet = true;
  numa::NodePools pools(po);
  numa::ThreadPool& pool = pools.pool(0);
  // The read bandwidth is probed again before every format and the rows are
  // printed at the end against the best probe: on a shared machine one probe
  // can land in a quiet or a busy moment, and the steps are best-of-N too.
  double bw = 0, bw_cpu = 0, bw_low = 1e30;
  const double min_s = quick ? 0.3 : 1.0;
  struct Fmt {
    std::string name;
    ExtType up, down;
  };
  std::vector<Fmt> fmts;
  for (ExtType t : cpu::lowbit::kAll) fmts.push_back({cpu::ext_type_info(static_cast<uint32_t>(t))->name, t, t});
  fmts.push_back({"IQ1_S / IQ2_XXS (UD-IQ1_S-like)", cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs});
  fmts.push_back({"IQ2_XXS / IQ3_XXS (UD-IQ2_XXS-like)", cpu::lowbit::iq2_xxs, cpu::lowbit::iq3_xxs});
  fmts.push_back({"Q4_K (baseline)", ExtType::q4_k, ExtType::q4_k});
  struct Row {
    std::string name;
    double bpw, mb;
    int64_t n;
    double se, sq, sq_cpu, bytes, ops;
    double v2 = NAN, v2_cpu = NAN;  // --compare-v2: the same step without the v4 kernels
    double v4_cpu = NAN;            // --compare-v2 where the engine repacks: the file's blocks (v4)
    double read = 1.0;              // bytes a step reads / the file's bytes
  };
  std::vector<Row> out;
  int probes = 0;
  for (const Fmt& f : fmts) {
    if (!only.empty() && only != f.name) continue;
    double b, bc;
    read_probe(pool, b, bc);
    bw = std::max(bw, b);
    bw_cpu = std::max(bw_cpu, bc);
    bw_low = std::min(bw_low, b);
    ++probes;
    ExpertSet set = make_experts(f.up, f.down, E);
    numa::EngineOptions on, off;
    on.print_memory = off.print_memory = false;
    off.gguf_int8 = false;
    numa::ExpertEngine eq(set.w, pools, on), ee(set.w, pools, off);
    numa::EngineOptions file = on;
    file.lowbit_repack = false;
    numa::ExpertEngine ef(set.w, pools, file);  // the file's blocks (v4/v2 for IQ1_S)
    double read_bytes = 0;                      // per expert: the packed copies, and the file's bytes of the rest
    for (const cpu::Mat* m : {&set.w[0].gate, &set.w[0].up, &set.w[0].down})
      if (!eq.packed_bytes() || !cpu::lowbit_repack_applies(*m)) read_bytes += static_cast<double>(m->bytes());
    read_bytes += static_cast<double>(eq.packed_bytes()) / static_cast<double>(E);
    const bool packed = eq.packed_bytes() > 0;
    const double bpw = 8.0 * set.expert_bytes / static_cast<double>(3 * H * I);
    const bool v4 = compare && uses_codes(f.up, f.down);
    for (int64_t n : batches) {
      const double se = (quick && n > 1) ? NAN : time_forward(ee, n, E, min_s * (n > 1 ? 0.5 : 1.0));
      double sq_cpu = 1e30, sq = 1e30, v2 = 1e30, v2_cpu = 1e30, v4_cpu = 1e30;
      // --compare-v2: v4 and v2 in turns, three times each (a shared machine's load moves between them)
      for (int rep = 0; rep < (v4 ? 3 : 1); ++rep) {
        double c = 0;
        sq = std::min(sq, time_forward(eq, n, E, v4 ? min_s / 2 : min_s, pool.size(), &c));
        sq_cpu = std::min(sq_cpu, c);
        if (!v4) continue;
        if (packed) {
          (void)time_forward(ef, n, E, min_s / 2, pool.size(), &c);
          v4_cpu = std::min(v4_cpu, c);
        }
        const bool prev = cpu::detail::lowbit_set_codes_for_testing(false);
        v2 = std::min(v2, time_forward(ef, n, E, min_s / 2, pool.size(), &c));
        v2_cpu = std::min(v2_cpu, c);
        cpu::detail::lowbit_set_codes_for_testing(prev);
      }
      const double touched = static_cast<double>(n == 1 ? K : std::min<int64_t>(E, 3 * K));  // distinct experts per step
      const double bytes = touched * set.expert_bytes;
      const double ops = 2.0 * 3.0 * static_cast<double>(H * I) * static_cast<double>(n * K);
      out.push_back({f.name, bpw, set.expert_bytes / 1e6, n, se, sq, sq_cpu, bytes, ops, v4 ? v2 : NAN, v4 ? v2_cpu : NAN, v4 && packed ? v4_cpu : NAN,
                     read_bytes / set.expert_bytes});
    }
  }
  std::printf("# bench_gguf_lowbit: %d threads, ISA %s%s%s, read bandwidth %.2f GB/s (best of %d probes of 256 MiB with the same threads, "
              "one before each format; lowest %.2f), over CPU time %.2f GB/s\n",
              pool.size(), cpu::isa_name(cpu::best_isa()), cpu::detail::lowbit_has_avx512_vnni() ? " +VNNI" : "",
              cpu::detail::lowbit_has_avx512_vbmi() ? " +VBMI" : "", bw, probes, bw_low, bw_cpu);
  std::printf("\n## routed experts (ExpertEngine, hidden %ld, intermediate %ld, top-%ld, %ld experts cycled)\n\n", H, I, K, E);
  std::printf("| format (gate,up / down) | bits/weight | MB/expert | batch | exact ms | int8 ms | int8 GB/s | int8 / read bw | int8 GOP/s "
              "| int8 CPU ms | CPU-time GB/s / read bw | bytes read / file | same over bytes read |%s\n",
              compare ? " v2 ms | v2 CPU ms | v2 CPU-time / read bw | file's blocks (v4) CPU-time / read bw |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", compare ? "---|---|---|---|" : "");
  for (const Row& r : out) {
    std::printf("| %s | %.3f | %.2f | %ld | %.2f | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f |", r.name.c_str(), r.bpw, r.mb, r.n, r.se * 1e3,
                r.sq * 1e3, r.bytes / r.sq / 1e9, r.bytes / r.sq / 1e9 / bw, r.ops / r.sq / 1e9, r.sq_cpu * 1e3,
                r.bytes / r.sq_cpu / 1e9 / bw_cpu);
    std::printf(" %.3f | %.2f |", r.read, r.read * r.bytes / r.sq_cpu / 1e9 / bw_cpu);
    if (compare)
      std::printf(" %.2f | %.2f | %.2f | %.2f |", r.v2 * 1e3, r.v2_cpu * 1e3, r.bytes / r.v2_cpu / 1e9 / bw_cpu, r.bytes / r.v4_cpu / 1e9 / bw_cpu);
    std::printf("\n");
  }
  std::printf("\n(GB/s at batch 1: stored bytes of the 8 experts a token touches / fastest step; GOP/s: 2 x 3 x H x I per (token,\n"
              " expert) pair; exact = the fp32 dequantize path. CPU ms: the smallest process CPU time per thread of a step (waits\n"
              " that spin count as busy); its GB/s against the probe's over CPU time.)\n");
  return 0;
}
