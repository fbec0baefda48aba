// Gated DeltaNet kernels on the GPU (gpu/deltanet.h) on
// Qwen3-Next-80B-A3B's linear-attention layer (hidden 2048, 16 key heads,
// 32 value heads, head dims 128, conv kernel 4), random data, one sequence
// of T tokens (4096 and 32768) run in steps of S tokens (2048, the
// engine's default max_num_batched_tokens, and T in one step), each step
// continuing the state:
//  - the chunked delta rule, kernels v1 to v5 (setting gpu_deltanet_kernel;
//    v3 withdrawn and bench-only, v4 the default, v5 new: v4 in WY form):
//    time, FLOP/s of the chunked algorithm's useful products (per token and
//    value head, multiply-adds: C dk for k k^T and q k^T, (C - 1)/2 (dk + dv)
//    for the triangular solve, 3 dk dv for W S, q S and k^T u, (C + 1)/2 dv
//    for QK u; C = 64) and GB/s of the bytes it must move (conv rows in,
//    outputs out), each against the device's measured bf16 tensor
//    throughput (one cuBLAS 8192^3 product; also H100 SXM's nominal 989
//    TFLOP/s dense) and read bandwidth; % of roof = max(FLOP / tensor,
//    bytes / bandwidth) / time;
//  - the whole layer step as hybrid_gpu.cpp runs it under
//    gpu_hybrid_precise (the default: in_proj and out_proj on a bf16 hi + lo
//    input pair, hi's product then lo's added in place; kern "2S": the
//    previous way, one product over [hi; lo], 2S rows, into an fp32 buffer
//    and the halves added) and without it (bf16 input, S rows): in_proj,
//    conv + gates + conv window, delta rule, gated norm + out_proj (conv +
//    gates and the norm with the plain kernels, "plain", and the vectorised
//    ones, "vec1" / "vec2": gpu/deltanet_io.h), the layer without its delta
//    rule ("no rule", against the whole layer's roof: the ceiling with a
//    free delta rule), the whole layer per delta-rule kernel, and the layer
//    as it was ("layer prec 2S": 2S-row products, plain conv and norm).
//    Roof: the products' FLOPs (in precise mode the lo half's product counted
//    as work: it is what buys the 16 bits; the bf16 rows give the roof
//    without it) plus the delta rule's; bytes: weights once per step, the
//    input once, proj written once and each column read once, every other
//    intermediate (conv rows, gates, core, the norm's output) written and
//    read once, d written. Part rows count their own share the same way
//    (conv + gates: the columns it reads, what it writes);
//  - decode of B sequences x 1 token (1, 8, 64): the one-step recurrence;
//    GB/s of the states it reads and writes (3 x 32 x 128 x 128 x 4 bytes
//    per sequence) against the read bandwidth.
// Times are between events around the launches, averaged over --reps.
//
// Usage: bench_gpu_deltanet [--reps N] [--quick] [--kernels v1,v2,v3,v4,v5]
// (--quick: T = 4096 only; --kernels: the chunked kernels timed, all five by
// default). v3, v4 and v5 add phase rows: each launch timed alone (v4's walk
// three times: "v4 walk1" the 8-warp walk, "v4 walk2" the 16-warp one (the
// default), "v4 walk2 nocp" that one without its copies; v5: "v5 phase1" (v4's
// phase 1 and W, U), "v5 walk", "v5 outputs"); with v1 listed, at 4096
// tokens each kernel (and v4's other walk) is checked against v1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/deltanet.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gpu/quant.h"

using namespace hmoe;

namespace {

struct Timer {
  gpu::Stream& s;
  gpu::Event a, b;
  template <class F>
  double us(F f, int reps) {
    f();  // warm-up
    a.record(s);
    for (int i = 0; i < reps; ++i) f();
    b.record(s);
    b.synchronize();
    return static_cast<double>(b.elapsed_ms(a)) * 1e3 / reps;
  }
};

// A device buffer of `count` floats filled with a pattern in [-0.5, 0.5).
gpu::DeviceBuffer random_device(size_t count, uint32_t seed, gpu::Stream& s) {
  std::vector<float> h(count);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : h) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  }
  gpu::DeviceBuffer d(std::max<size_t>(count * 4, 16));
  gpu::copy_to_device(d.data(), h.data(), count * 4, s);
  s.synchronize();
  return d;
}

struct Groups {
  gpu::DeviceBuffer buf;
  gpu::DeltaNetGroups g;
};
// B sequences of T tokens each, states at `states` (one buffer per sequence, `bytes` apart).
Groups make_groups(int64_t B, int64_t T, const gpu::DeviceBuffer& states, int64_t bytes, gpu::Stream& s) {
  const int64_t n = B * T;
  std::vector<uint64_t> ptr(static_cast<size_t>(B));
  std::vector<int32_t> ints;
  for (int64_t i = 0; i < n; ++i) ints.push_back(static_cast<int32_t>(i));      // order
  for (int64_t i = 0; i < n; ++i) ints.push_back(static_cast<int32_t>(i / T));  // tok_group
  for (int64_t g = 0; g < B; ++g) ints.push_back(static_cast<int32_t>(g * T));  // start
  for (int64_t g = 0; g < B; ++g) ints.push_back(static_cast<int32_t>(T));      // count
  for (int64_t g = 0; g < B; ++g) ints.push_back(0);                            // fresh: continue the (random) state
  for (int64_t g = 0; g < B; ++g) ptr[static_cast<size_t>(g)] = reinterpret_cast<uint64_t>(states.as<uint8_t>() + g * bytes);
  Groups r;
  r.buf = gpu::DeviceBuffer(static_cast<size_t>(B) * 8 + ints.size() * 4);
  gpu::copy_to_device(r.buf.data(), ptr.data(), ptr.size() * 8, s);
  gpu::copy_to_device(r.buf.as<uint8_t>() + B * 8, ints.data(), ints.size() * 4, s);
  s.synchronize();
  const auto* i32 = reinterpret_cast<const int32_t*>(r.buf.as<uint8_t>() + B * 8);
  r.g.state = r.buf.as<uint64_t>();
  r.g.order = i32;
  r.g.tok_group = i32 + n;
  r.g.start = i32 + 2 * n;
  r.g.count = i32 + 2 * n + B;
  r.g.fresh = i32 + 2 * n + 2 * B;
  return r;
}

struct Setup {
  gpu::DeltaNetShape sh;
  int64_t H = 2048;
  double read_bw = 0, tensor = 0;  // GB/s, TFLOP/s (measured)
};

// One step of S tokens of one sequence: buffers, groups, weights.
struct Step {
  int64_t S;
  gpu::DeviceBuffer x, x2, xb, w_in, w_out, proj, y2, conv_w, dt, norm, a_neg, conv, gate, beta, core, o, d, states, v2;
  Groups g;
};

double core_flop(const gpu::DeltaNetShape& sh, double tokens) {
  const double C = 64, dk = static_cast<double>(sh.dk), dv = static_cast<double>(sh.dv);
  return 2.0 * tokens * static_cast<double>(sh.nv) * (C * dk + (C - 1) / 2 * (dk + dv) + 3 * dk * dv + (C + 1) / 2 * dv);
}

void print_row(const Setup& su, const char* what, int64_t T, int64_t S, const char* kernel, double us, double flop, double bytes) {
  const double tf = flop / us / 1e6, gbs = bytes / us / 1e3;
  const double roof_us = std::max(flop / (su.tensor * 1e6), bytes / (su.read_bw * 1e3));
  std::printf("%-14s %6lld %6lld %-5s %10.1f %11.0f %8.1f %7.1f %7.1f %8.0f %7.1f %9.1f %7.1f\n", what, static_cast<long long>(T),
              static_cast<long long>(S), kernel, us, static_cast<double>(T) / us * 1e6, tf, 100.0 * tf / su.tensor, 100.0 * tf / 989.0, gbs,
              100.0 * gbs / su.read_bw, roof_us, 100.0 * roof_us / us);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  bool quick = false;
  std::vector<gpu::DeltaNetKernel> kernels = {gpu::DeltaNetKernel::v1, gpu::DeltaNetKernel::v2, gpu::DeltaNetKernel::v3, gpu::DeltaNetKernel::v4,
                                              gpu::DeltaNetKernel::v5};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--kernels" && i + 1 < argc) {
      const std::string k = argv[++i];
      kernels.clear();
      if (k.find("v1") != std::string::npos) kernels.push_back(gpu::DeltaNetKernel::v1);
      if (k.find("v2") != std::string::npos) kernels.push_back(gpu::DeltaNetKernel::v2);
      if (k.find("v3") != std::string::npos) kernels.push_back(gpu::DeltaNetKernel::v3);
      if (k.find("v4") != std::string::npos) kernels.push_back(gpu::DeltaNetKernel::v4);
      if (k.find("v5") != std::string::npos) kernels.push_back(gpu::DeltaNetKernel::v5);
      if (kernels.empty()) {
        std::fprintf(stderr, "bench_gpu_deltanet: --kernels takes a list of v1, v2, v3, v4, v5, got %s\n", k.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "bench_gpu_deltanet: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows reach the log even if a later launch fails
  if (gpu::device_count() == 0) {
    std::printf("bench_gpu_deltanet: no GPU (%s)\n", gpu::describe().c_str());
    return 0;
  }
  gpu::Stream s;
  Timer timer{s, {}, {}};
  std::printf("bench_gpu_deltanet: %s\n", gpu::describe().c_str());
  Setup su;
  {
    const size_t bytes = size_t{2} << 30;
    gpu::DeviceBuffer a(bytes), sink(64);
    gpu::memset_device(a.data(), 1, bytes, s);
    su.read_bw = static_cast<double>(bytes) / timer.us([&] { gpu::read_probe(a.data(), bytes, sink.as<uint32_t>(), s); }, 5) / 1e3;
    const int64_t m = 8192;
    gpu::DeviceBuffer x(static_cast<size_t>(m * m * 2)), w(static_cast<size_t>(m * m * 2)), y(static_cast<size_t>(m * m * 4));
    gpu::memset_device(x.data(), 0, x.bytes(), s);
    gpu::memset_device(w.data(), 0, w.bytes(), s);
    gpu::Blas blas(s);
    const double us = timer.us([&] { blas.gemm(x.as<uint16_t>(), m, w.as<uint16_t>(), m, m, y.as<float>(), m); }, 3);
    su.tensor = 2.0 * static_cast<double>(m * m * m) / us / 1e6;
    std::printf("device read bandwidth (2 GiB): %.0f GB/s; bf16 tensor throughput (cuBLAS 8192^3): %.0f TFLOP/s (H100 SXM nominal dense: 989)\n\n",
                su.read_bw, su.tensor);
  }
  gpu::DeltaNetShape& sh = su.sh;
  sh.nk = 16;
  sh.nv = 32;
  sh.dk = 128;
  sh.dv = 128;
  sh.conv_k = 4;
  gpu::deltanet_configure(sh);
  const int64_t H = su.H, P = sh.proj_cols(), cd = sh.conv_dim(), V = sh.value_dim(), layer_bytes = gpu::deltanet_layer_state_bytes(sh);
  const int64_t c2 = gpu::deltanet_v2_chunk(sh, 0), c3 = gpu::deltanet_v3_chunk(sh, 0), c4 = gpu::deltanet_v4_chunk(sh, 0), c5 = gpu::deltanet_v5_chunk(sh, 0);
  std::printf("v2 chunk: %lld tokens; v2 scratch for a 2048-token step: %.1f MiB; v3 chunk: %lld tokens, scratch %.1f MiB; v4 chunk: %lld tokens, scratch %.1f MiB;"
              " v5 chunk: %lld tokens, scratch %.1f MiB\n\n",
              static_cast<long long>(c2), static_cast<double>(gpu::deltanet_v2_scratch_bytes(sh, c2, gpu::deltanet_v2_slots(2048, 1, c2))) / 1048576.0,
              static_cast<long long>(c3), static_cast<double>(gpu::deltanet_v3_scratch_bytes(sh, c3, gpu::deltanet_v2_slots(2048, 1, c3))) / 1048576.0,
              static_cast<long long>(c4), static_cast<double>(gpu::deltanet_v4_scratch_bytes(sh, c4, gpu::deltanet_v2_slots(2048, 1, c4))) / 1048576.0,
              static_cast<long long>(c5), static_cast<double>(gpu::deltanet_v5_scratch_bytes(sh, c5, gpu::deltanet_v2_slots(2048, 1, c5))) / 1048576.0);
  auto kname = [](gpu::DeltaNetKernel k) {
    return k == gpu::DeltaNetKernel::v5   ? "v5"
           : k == gpu::DeltaNetKernel::v4 ? "v4"
           : k == gpu::DeltaNetKernel::v3 ? "v3"
           : k == gpu::DeltaNetKernel::v2 ? "v2"
                                          : "v1";
  };
  auto ioname = [](gpu::DeltaNetIo io) { return io == gpu::DeltaNetIo::plain ? "plain" : io == gpu::DeltaNetIo::vec1 ? "vec1" : "vec2"; };
  const bool with_v1 = std::find(kernels.begin(), kernels.end(), gpu::DeltaNetKernel::v1) != kernels.end();
  gpu::Blas blas(s);
  std::printf("%-14s %6s %6s %-5s %10s %11s %8s %7s %7s %8s %7s %9s %7s\n", "part", "T", "step", "kern", "us", "tokens/s", "TFLOP/s", "% meas",
              "% 989", "GB/s", "% read", "roof us", "% roof");
  std::vector<int64_t> prompts = {4096, 32768};
  if (quick) prompts = {4096};
  for (int64_t T : prompts) {
    for (int64_t S : {int64_t{2048}, T}) {
      Step st;
      st.S = S;
      st.x = random_device(static_cast<size_t>(S * H), 1, s);
      {  // bf16 weights from the pattern in [-0.5, 0.5)
        const auto wi = random_device(static_cast<size_t>(P * H), 2, s), wo = random_device(static_cast<size_t>(H * V), 3, s);
        st.w_in = gpu::DeviceBuffer(static_cast<size_t>(P * H * 2));
        st.w_out = gpu::DeviceBuffer(static_cast<size_t>(H * V * 2));
        gpu::split_bf16(wi.as<float>(), P * H, st.w_in.as<uint16_t>(), nullptr, s);
        gpu::split_bf16(wo.as<float>(), H * V, st.w_out.as<uint16_t>(), nullptr, s);
        s.synchronize();
      }
      st.x2 = gpu::DeviceBuffer(static_cast<size_t>(2 * S * std::max(H, V) * 2));
      st.xb = gpu::DeviceBuffer(static_cast<size_t>(S * H * 2));  // the bf16 input of a step without the split
      gpu::split_bf16(st.x.as<float>(), S * H, st.xb.as<uint16_t>(), nullptr, s);
      st.proj = gpu::DeviceBuffer(static_cast<size_t>(S * P * 4));
      st.y2 = gpu::DeviceBuffer(static_cast<size_t>(2 * S * std::max(P, H) * 4));
      st.conv_w = random_device(static_cast<size_t>(cd * sh.conv_k), 4, s);
      st.dt = random_device(static_cast<size_t>(sh.nv), 5, s);
      st.norm = random_device(static_cast<size_t>(sh.dv), 6, s);
      std::vector<float> an(static_cast<size_t>(sh.nv), -0.5f);
      st.a_neg = gpu::DeviceBuffer(an.size() * 4);
      gpu::copy_to_device(st.a_neg.data(), an.data(), an.size() * 4, s);
      st.conv = gpu::DeviceBuffer(static_cast<size_t>(S * cd * 4));
      st.gate = gpu::DeviceBuffer(static_cast<size_t>(S * sh.nv * 4));
      st.beta = gpu::DeviceBuffer(static_cast<size_t>(S * sh.nv * 4));
      st.core = gpu::DeviceBuffer(static_cast<size_t>(S * V * 4));
      st.o = gpu::DeviceBuffer(static_cast<size_t>(2 * S * V * 2));
      st.d = gpu::DeviceBuffer(static_cast<size_t>(S * H * 4));
      st.states = random_device(static_cast<size_t>(layer_bytes / 4), 7, s);
      int64_t scratch_bytes = 16;
      for (const auto k : kernels) scratch_bytes = std::max(scratch_bytes, gpu::deltanet_chunked_scratch_bytes(sh, k, 0, S, 1));
      st.v2 = gpu::DeviceBuffer(static_cast<size_t>(scratch_bytes));
      st.g = make_groups(1, S, st.states, layer_bytes, s);
      const int64_t steps = T / S;
      const double tf = static_cast<double>(T);
      // The projections of the layer step (fp32 x -> proj; core -> d) as hybrid_gpu.cpp runs them. Precise: the
      // product of hi (xb, the norm's bf16 output), then lo's added in place (Blas::gemm_add), as hybrid_gpu.cpp does
      // from S >= cols / 4 rows on; pass2s: the stacked way it keeps below that (decode), and the only one before,
      // one product over [hi; lo] (2S rows) into an fp32 buffer, the halves added.
      auto in_proj = [&](bool precise, bool pass2s = false) {
        if (precise && pass2s) {
          gpu::split_bf16(st.x.as<float>(), S * H, st.x2.as<uint16_t>(), st.x2.as<uint16_t>() + S * H, s);
          blas.gemm(st.x2.as<uint16_t>(), 2 * S, st.w_in.as<uint16_t>(), P, H, st.y2.as<float>(), P);
          gpu::add(st.y2.as<float>(), st.y2.as<float>() + S * P, S * P, st.proj.as<float>(), s);
          return;
        }
        blas.gemm(st.xb.as<uint16_t>(), S, st.w_in.as<uint16_t>(), P, H, st.proj.as<float>(), P);
        if (precise) {
          gpu::split_bf16(st.x.as<float>(), S * H, nullptr, st.x2.as<uint16_t>(), s);
          blas.gemm_add(st.x2.as<uint16_t>(), S, st.w_in.as<uint16_t>(), P, H, st.proj.as<float>(), P);
        }
      };
      auto prepare = [&] {
        gpu::deltanet_prepare(st.proj.as<float>(), P, st.g.g, 0, S, sh, st.conv_w.as<float>(), st.a_neg.as<float>(), st.dt.as<float>(), 0,
                              st.conv.as<float>(), st.gate.as<float>(), st.beta.as<float>(), s);
        gpu::deltanet_conv_window(st.proj.as<float>(), P, st.g.g, 0, 1, sh, 0, s);
      };
      auto core = [&](gpu::DeltaNetKernel k) {
        gpu::deltanet_chunked(st.conv.as<float>(), st.gate.as<float>(), st.beta.as<float>(), st.g.g, 0, 1, sh, 0, 1, 0, st.core.as<float>(), s, k, S,
                              st.v2.data());
      };
      auto out_proj = [&](bool precise, bool pass2s = false) {
        uint16_t* o = st.o.as<uint16_t>();
        if (precise) {
          gpu::deltanet_gated_norm(st.core.as<float>(), st.proj.as<float>(), P, st.g.g, 0, S, sh, st.norm.as<float>(), 1e-6f, o, s, o + S * V, 0);
          if (pass2s) {
            blas.gemm(o, 2 * S, st.w_out.as<uint16_t>(), H, V, st.y2.as<float>(), H);
            gpu::add(st.y2.as<float>(), st.y2.as<float>() + S * H, S * H, st.d.as<float>(), s);
            return;
          }
          blas.gemm(o, S, st.w_out.as<uint16_t>(), H, V, st.d.as<float>(), H);
          blas.gemm_add(o + S * V, S, st.w_out.as<uint16_t>(), H, V, st.d.as<float>(), H);
        } else {
          gpu::deltanet_gated_norm(st.core.as<float>(), st.proj.as<float>(), P, st.g.g, 0, S, sh, st.norm.as<float>(), 1e-6f, o, s);
          blas.gemm(o, S, st.w_out.as<uint16_t>(), H, V, st.d.as<float>(), H);
        }
      };
      auto steps_of = [&](auto f) {
        return [&, f] {
          for (int64_t k = 0; k < steps; ++k) f();
        };
      };
      in_proj(true);
      prepare();
      const int walk0 = gpu::deltanet_v4_walk();
      for (int pass = 0; pass < static_cast<int>(kernels.size()) + 1; ++pass) {  // v2, v3, v4 and v4's other walk against v1
        const bool other = pass == static_cast<int>(kernels.size());
        const auto kx = other ? gpu::DeltaNetKernel::v4 : kernels[static_cast<size_t>(pass)];
        if (other && std::find(kernels.begin(), kernels.end(), gpu::DeltaNetKernel::v4) == kernels.end()) continue;
        if (!(S == T && T == 4096 && with_v1 && kx != gpu::DeltaNetKernel::v1)) continue;
        gpu::set_deltanet_v4_walk(other ? 3 - walk0 : walk0);
        const size_t nst = static_cast<size_t>(layer_bytes / 4), nout = static_cast<size_t>(S * V);
        std::vector<float> st0(nst), o1(nout), o2(nout), s1(nst), s2(nst);
        gpu::copy_to_host(st0.data(), st.states.data(), nst * 4, s);
        core(gpu::DeltaNetKernel::v1);
        gpu::copy_to_host(o1.data(), st.core.data(), nout * 4, s);
        gpu::copy_to_host(s1.data(), st.states.data(), nst * 4, s);
        gpu::copy_to_device(st.states.data(), st0.data(), nst * 4, s);
        core(kx);
        gpu::copy_to_host(o2.data(), st.core.data(), nout * 4, s);
        gpu::copy_to_host(s2.data(), st.states.data(), nst * 4, s);
        gpu::copy_to_device(st.states.data(), st0.data(), nst * 4, s);
        s.synchronize();
        auto worst = [](const std::vector<float>& a, const std::vector<float>& b, size_t from) {
          double d = 0, m = 0;
          for (size_t i = from; i < a.size(); ++i) {  // a NaN difference counts as infinite (std::max would skip it)
            const double x = std::fabs(static_cast<double>(a[i]) - b[i]);
            if (!(x <= d)) d = std::isnan(x) ? HUGE_VAL : x;
            m = std::max(m, static_cast<double>(std::fabs(a[i])));
          }
          return std::pair<double, double>{d, m};
        };
        const auto od = worst(o1, o2, 0), sd = worst(s1, s2, static_cast<size_t>((sh.conv_k - 1) * cd));
        gpu::set_deltanet_v4_walk(walk0);
        std::printf("%s against v1, %lld tokens from the same state: outputs max |diff| %.3g (max |v1| %.3g), state max |diff| %.3g (max |v1| %.3g)%s\n",
                    other ? (walk0 == 1 ? "v4 (walk 2)" : "v4 (walk 1)") : kname(kx), static_cast<long long>(S), od.first, od.second, sd.first, sd.second,
                    od.first <= 1e-4 + 1e-3 * od.second && sd.first <= 1e-4 + 1e-3 * sd.second ? "" : "  <-- MISMATCH");
      }
      const double core_bytes = tf * static_cast<double>(cd + 2 * sh.nv + V) * 4;
      for (const auto k : kernels) print_row(su, "delta rule", T, S, kname(k), timer.us(steps_of([&] { core(k); }), reps), core_flop(sh, tf), core_bytes);
      if (std::find(kernels.begin(), kernels.end(), gpu::DeltaNetKernel::v3) != kernels.end()) {
        // v3's launches one at a time (the others skipped: values wrong, times right), then the state restored.
        const size_t nst = static_cast<size_t>(layer_bytes / 4);
        std::vector<float> st0(nst);
        gpu::copy_to_host(st0.data(), st.states.data(), nst * 4, s);
        const char* names[3] = {"v3 phase1", "v3 walk", "v3 outputs"};
        for (int ph = 0; ph < 3; ++ph) {
          gpu::set_deltanet_v3_phases(1 << ph);
          print_row(su, names[ph], T, S, "v3", timer.us(steps_of([&] { core(gpu::DeltaNetKernel::v3); }), reps), 0, 0);
        }
        gpu::set_deltanet_v3_phases(7);
        gpu::copy_to_device(st.states.data(), st0.data(), nst * 4, s);
        s.synchronize();
      }
      if (std::find(kernels.begin(), kernels.end(), gpu::DeltaNetKernel::v4) != kernels.end()) {
        // v4's two launches one at a time (as v3's), then the state restored.
        const size_t nst = static_cast<size_t>(layer_bytes / 4);
        std::vector<float> st0(nst);
        gpu::copy_to_host(st0.data(), st.states.data(), nst * 4, s);
        // "v4 walk1" the first walk (8 warps, k35a), "v4 walk2" the 16-warp one (k36a), "v4 walk2 nocp" that one
        // without its copies after the first chunk (its products, barriers and output stores alone).
        const int walk0 = gpu::deltanet_v4_walk();
        const char* names[4] = {"v4 phase1", "v4 walk1", "v4 walk2", "v4 walk2 nocp"};
        const int masks[4] = {1, 2, 2, 6}, walks[4] = {walk0, 1, 2, 2};
        for (int ph = 0; ph < 4; ++ph) {
          gpu::set_deltanet_v4_phases(masks[ph]);
          gpu::set_deltanet_v4_walk(walks[ph]);
          print_row(su, names[ph], T, S, "v4", timer.us(steps_of([&] { core(gpu::DeltaNetKernel::v4); }), reps), 0, 0);
        }
        gpu::set_deltanet_v4_phases(3);
        gpu::set_deltanet_v4_walk(walk0);
        gpu::copy_to_device(st.states.data(), st0.data(), nst * 4, s);
        s.synchronize();
      }
      if (std::find(kernels.begin(), kernels.end(), gpu::DeltaNetKernel::v5) != kernels.end()) {
        // v5's phases one at a time (as v3's): phase 1 (v4's phase 1, then W and U), the walk, the outputs.
        const size_t nst = static_cast<size_t>(layer_bytes / 4);
        std::vector<float> st0(nst);
        gpu::copy_to_host(st0.data(), st.states.data(), nst * 4, s);
        const char* names[3] = {"v5 phase1", "v5 walk", "v5 outputs"};
        for (int ph = 0; ph < 3; ++ph) {
          gpu::set_deltanet_v5_phases(1 << ph);
          print_row(su, names[ph], T, S, "v5", timer.us(steps_of([&] { core(gpu::DeltaNetKernel::v5); }), reps), 0, 0);
        }
        gpu::set_deltanet_v5_phases(7);
        gpu::copy_to_device(st.states.data(), st0.data(), nst * 4, s);
        s.synchronize();
      }
      for (const bool precise : {true, false}) {
        const double m = precise ? 2.0 : 1.0;
        const double proj_flop = 2.0 * tf * m * static_cast<double>(H * P + V * H);
        // Bytes the layer step must move: weights once per step; its input (x fp32 when precise: hi and lo come from it;
        // bf16 rows otherwise) read; proj written and each of its columns read once (conv + gates: q k v b a, the norm:
        // z); conv rows, gates and betas, core written and read; the norm's bf16 output (hi + lo when precise) written and
        // read; d written.
        const double w_bytes = static_cast<double>(steps) * static_cast<double>(P * H + H * V) * 2;
        const double in_bytes = static_cast<double>(H) * (precise ? 4 : 2);
        const double act_bytes = tf * (in_bytes + static_cast<double>(P) * 4 * 2 + static_cast<double>(cd + 2 * sh.nv) * 4 * 2 +
                                       static_cast<double>(V) * 4 * 2 + static_cast<double>(V) * 2 * 2 * m + static_cast<double>(H) * 4);
        const char* tag = precise ? "layer precise" : "layer bf16";
        const char* ip = precise ? "in_proj prec" : "in_proj bf16";
        const char* op = precise ? "norm+out prec" : "norm+out bf16";
        const double ip_flop = 2.0 * tf * m * static_cast<double>(H * P), op_flop = 2.0 * tf * m * static_cast<double>(V * H);
        const double ip_bytes = static_cast<double>(steps) * static_cast<double>(P * H) * 2 + tf * (in_bytes + static_cast<double>(P) * 4);
        const double op_bytes = static_cast<double>(steps) * static_cast<double>(H * V) * 2 + tf * static_cast<double>(V * 4 + V * 4 + H * 4);
        // The product of hi then lo's added in place ("" in kern); precise also the previous [hi; lo] product and add ("2S").
        print_row(su, ip, T, S, "", timer.us(steps_of([&] { in_proj(precise); }), reps), ip_flop, ip_bytes);
        if (precise) print_row(su, ip, T, S, "2S", timer.us(steps_of([&] { in_proj(true, true); }), reps), ip_flop, ip_bytes);
        // conv + gates + window (bytes: the columns it reads, conv rows, gates and betas written) and norm + out_proj with
        // the plain kernels and the vectorised ones (prepare's vec1 and vec2; the norm has one).
        const double cg_bytes = tf * static_cast<double>(cd + 2 * sh.nv) * 4 * 2;
        for (const auto io : {gpu::DeltaNetIo::plain, gpu::DeltaNetIo::vec1, gpu::DeltaNetIo::vec2}) {
          gpu::set_deltanet_io(io);
          print_row(su, "conv+gates", T, S, ioname(io), timer.us(steps_of(prepare), reps), 0, cg_bytes);
          if (io != gpu::DeltaNetIo::vec1)
            print_row(su, op, T, S, ioname(io), timer.us(steps_of([&] { out_proj(precise); }), reps), op_flop, op_bytes);
        }
        if (precise) print_row(su, op, T, S, "2S", timer.us(steps_of([&] { out_proj(true, true); }), reps), op_flop, op_bytes);
        gpu::set_deltanet_io(gpu::DeltaNetIo::automatic);
        // Everything but the delta rule, against the whole layer's roof: the ceiling with a free delta rule.
        const double rest_us = timer.us(steps_of([&] {
                                          in_proj(precise);
                                          prepare();
                                          out_proj(precise);
                                        }),
                                        reps);
        print_row(su, precise ? "prec no rule" : "bf16 no rule", T, S, "", rest_us, proj_flop + core_flop(sh, tf), w_bytes + act_bytes);
        for (const auto k : kernels) {
          gpu::set_deltanet_kernel(k);
          const char* kn = kname(k);
          const double us = timer.us(steps_of([&] {
                                       in_proj(precise);
                                       prepare();
                                       core(k);
                                       out_proj(precise);
                                     }),
                                     reps);
          print_row(su, tag, T, S, kn, us, proj_flop + core_flop(sh, tf), w_bytes + act_bytes);
        }
        if (precise) {  // the step as it was: [hi; lo] products and adds, the plain conv + gates and norm
          const gpu::DeltaNetKernel k = kernels.back();
          gpu::set_deltanet_kernel(k);
          gpu::set_deltanet_io(gpu::DeltaNetIo::plain);
          const double us = timer.us(steps_of([&] {
                                       in_proj(true, true);
                                       prepare();
                                       core(k);
                                       out_proj(true, true);
                                     }),
                                     reps);
          print_row(su, "layer prec 2S", T, S, kname(k), us, proj_flop + core_flop(sh, tf), w_bytes + act_bytes);
          gpu::set_deltanet_io(gpu::DeltaNetIo::automatic);
        }
        gpu::set_deltanet_kernel(gpu::DeltaNetKernel::v1);
      }
      std::printf("\n");
    }
  }
  for (int64_t B : {1, 8, 64}) {
    const auto proj = random_device(static_cast<size_t>(B * P), 6, s);
    const auto states = random_device(static_cast<size_t>(B * layer_bytes / 4), 7, s);
    const auto conv_w = random_device(static_cast<size_t>(cd * sh.conv_k), 1, s), dt = random_device(static_cast<size_t>(sh.nv), 2, s);
    std::vector<float> an(static_cast<size_t>(sh.nv), -0.5f);
    gpu::DeviceBuffer a_neg(an.size() * 4);
    gpu::copy_to_device(a_neg.data(), an.data(), an.size() * 4, s);
    gpu::DeviceBuffer conv(static_cast<size_t>(B * cd * 4)), gate(static_cast<size_t>(B * sh.nv * 4)), beta(static_cast<size_t>(B * sh.nv * 4)),
        core(static_cast<size_t>(B * V * 4));
    const Groups g = make_groups(B, 1, states, layer_bytes, s);
    gpu::deltanet_prepare(proj.as<float>(), P, g.g, 0, B, sh, conv_w.as<float>(), a_neg.as<float>(), dt.as<float>(), 0, conv.as<float>(),
                          gate.as<float>(), beta.as<float>(), s);
    const double us = timer.us([&] {
      gpu::deltanet_recurrent(conv.as<float>(), gate.as<float>(), beta.as<float>(), g.g, 0, B, sh, 0, 1, core.as<float>(), s);
    }, reps);
    const double bytes = static_cast<double>(B) * (3.0 * sh.nv * sh.dk * sh.dv * 4);
    std::printf("%-8s %7lld %-12s %10.1f us %12.0f tokens/s %9.0f GB/s %7.1f %% read\n", "decode", static_cast<long long>(B), "recurrence", us,
                static_cast<double>(B) / us * 1e6, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / su.read_bw);
  }
  std::printf("\nOne layer; Qwen3-Next-80B-A3B has 36 such layers. %% meas / %% 989: of the measured cuBLAS / nominal bf16 tensor throughput;"
              " %% read: of the measured read bandwidth; roof us = max(FLOP / measured tensor, bytes / read bandwidth).\n");
  return 0;
}
