// Engram module on the GPU (engine/layers/engram_gpu.h): its kernels against the
// device's measured copy bandwidth, at decode (1, 8 tokens) and prefill
// (2048 tokens) shapes of a hidden-2048 model with d_mem 1024 (3-grams, two
// n-gram orders of 512), kernel size 4, two modules: the key/value product
// (cuBLAS, TFLOP/s), engram_gate, engram_conv and engram_store (GB/s of the
// bytes each must move), and the pinned upload of the table rows on a copy
// stream (GB/s). Usage: bench_engram_gpu [--hidden H] [--dmem D].
// Never pass/fail on time.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/device.h"
#include "gpu/engram.h"
#include "gpu/kernels.h"

using namespace hmoe;

namespace {

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

// Fills a device buffer with small non-zero floats (a pattern; values do not matter for time).
void fill(gpu::DeviceBuffer& d, size_t floats, gpu::Stream& s) {
  std::vector<float> h(floats);
  for (size_t i = 0; i < floats; ++i) h[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
  gpu::copy_to_device(d.data(), h.data(), floats * 4, s);
  s.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t H = 2048, dm = 1024;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    const bool help = a == "--help" || a == "-h", known = a == "--hidden" || a == "--dmem";
    if (!known || i + 1 >= argc) {
      const std::string why = help ? "" : known ? " (" + a + " needs a value)" : " (unknown option " + a + ")";
      std::fprintf(help ? stdout : stderr, "usage: bench_engram_gpu [--hidden H] [--dmem D]%s\n", why.c_str());
      return help ? 0 : 2;
    }
    (a == "--hidden" ? H : dm) = std::atoll(argv[i + 1]);
  }
  if (gpu::device_count() == 0) {
    std::printf("SKIP: %s\n", gpu::describe().c_str());
    return 0;
  }
  const int64_t K = 4, modules = 2, window = 9, seqs = 64;
  std::printf("%s\nEngram GPU module: hidden %lld, d_mem %lld, kernel %lld, %lld modules\n", gpu::describe().c_str(), static_cast<long long>(H),
              static_cast<long long>(dm), static_cast<long long>(K), static_cast<long long>(modules));
  gpu::Stream s, cs;
  gpu::Blas blas(s);
  double copy_bw = 0;
  {
    const size_t bytes = 1ull << 30;
    gpu::DeviceBuffer a(bytes), b(bytes);
    gpu::memset_device(a.data(), 1, bytes, s);
    copy_bw = 2.0 * static_cast<double>(bytes) / time_gpu(s, 10, [&] { gpu::copy_on_device(b.data(), a.data(), bytes, s); });
    std::printf("device copy bandwidth (read+write): %.0f GB/s\n", copy_bw / 1e9);
  }
  std::printf("%6s %14s %14s %14s %14s %16s %12s\n", "tokens", "kv-proj us", "gate us", "conv us", "store us", "rows H2D us", "module us");
  for (int64_t n : {1, 8, 2048}) {
    gpu::DeviceBuffer w(static_cast<size_t>(2 * H * dm) * 2), e(static_cast<size_t>(n * dm) * 2), proj(static_cast<size_t>(n * 2 * H) * 4),
        x(static_cast<size_t>(n * H) * 4), d(static_cast<size_t>(n * H) * 4), v(static_cast<size_t>(n * H) * 4),
        vn(static_cast<size_t>(modules * n * H) * 4), vecs(static_cast<size_t>((5 + K) * H) * 4),
        hist(static_cast<size_t>(seqs * window * modules * H) * 4), meta(static_cast<size_t>(n * (K + 1)) * 4);
    gpu::memset_device(w.data(), 0x3c, w.bytes(), s);
    gpu::memset_device(e.data(), 0x3c, e.bytes(), s);
    fill(x, static_cast<size_t>(n * H), s);
    fill(d, static_cast<size_t>(n * H), s);
    fill(vecs, static_cast<size_t>((5 + K) * H), s);
    fill(hist, static_cast<size_t>(seqs * window * modules * H), s);
    // Conv sources: decode rows read history rows, prefill rows read earlier rows of the batch.
    std::vector<int32_t> mt(static_cast<size_t>(n * (K + 1)));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < K; ++j) {
        const int64_t back = (K - 1 - j) * 3;
        mt[static_cast<size_t>(i * K + j)] = back == 0 ? static_cast<int32_t>(i)
                                             : n > 8 ? static_cast<int32_t>(i >= back ? i - back : -1)
                                                     : static_cast<int32_t>(-2 - ((i % seqs) * window + (9 - back) % window));
      }
      mt[static_cast<size_t>(n * K + i)] = static_cast<int32_t>((i % seqs) * window + i / seqs % window);
    }
    if (n > seqs * window)
      for (int64_t i = seqs * window; i < n; ++i) mt[static_cast<size_t>(n * K + i)] = -1;  // distinct rows only
    gpu::copy_to_device(meta.data(), mt.data(), mt.size() * 4, s);
    gpu::PinnedBuffer rows_h(static_cast<size_t>(n * dm) * 2);
    std::memset(rows_h.as<uint8_t>(), 0x3c, rows_h.bytes());
    s.synchronize();
    const float* vp = vecs.as<float>();
    const int reps = n >= 2048 ? 20 : 200;
    auto kvproj = [&] { blas.gemm(e.as<uint16_t>(), n, w.as<uint16_t>(), 2 * H, dm, proj.as<float>(), 2 * H); };
    auto gate = [&] {
      gpu::engram_gate(x.as<float>(), d.as<float>(), proj.as<float>(), n, H, vp, vp + H, vp + 2 * H, vp + 3 * H, vp + 4 * H, 1e-6f, 1e-5f,
                       v.as<float>(), vn.as<float>(), s);
    };
    auto conv = [&] {
      gpu::engram_conv(v.as<float>(), vn.as<float>(), hist.as<float>(), modules * H, meta.as<int32_t>(), vp + 5 * H, n, H, K, x.as<float>(), s);
    };
    auto store = [&] { gpu::engram_store(vn.as<float>(), n, H, modules, meta.as<int32_t>() + n * K, hist.as<float>(), modules * H, s); };
    const double t_proj = time_gpu(s, reps, kvproj), t_gate = time_gpu(s, reps, gate), t_conv = time_gpu(s, reps, conv),
                 t_store = time_gpu(s, reps, store);
    const double t_up = time_gpu(cs, reps, [&] { gpu::copy_to_device(e.data(), rows_h.as<uint8_t>(), static_cast<size_t>(n * dm) * 2, cs); });
    const double t_mod = time_gpu(s, reps, [&] {
      kvproj();
      gate();
      conv();
    });
    std::printf("%6lld %14.2f %14.2f %14.2f %14.2f %16.2f %12.2f\n", static_cast<long long>(n), t_proj * 1e6, t_gate * 1e6, t_conv * 1e6,
                t_store * 1e6, t_up * 1e6, t_mod * 1e6);
    const double flops = 2.0 * static_cast<double>(n) * 2 * H * dm, wbytes = 2.0 * 2 * H * dm;
    const double gate_b = 4.0 * static_cast<double>(n * H) * 7, conv_b = 4.0 * static_cast<double>(n * H) * (3 + K),
                 store_b = 8.0 * static_cast<double>(modules * n * H), up_b = 2.0 * static_cast<double>(n * dm);
    std::printf("       kv-proj %.2f TFLOP/s, %.0f GB/s of weights; gate %.0f GB/s; conv %.0f GB/s; store %.0f GB/s (of %.0f copy); H2D %.1f GB/s\n",
                flops / t_proj / 1e12, wbytes / t_proj / 1e9, gate_b / t_gate / 1e9, conv_b / t_conv / 1e9, store_b / t_store / 1e9,
                copy_bw / 1e9, up_b / t_up / 1e9);
  }
  return 0;
}
