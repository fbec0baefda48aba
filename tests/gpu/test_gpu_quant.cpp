// Quantized GPU kernels (gpu/quant.h) against a plain scalar
// dequantize-then-multiply reference (cpu::row_to_f32 per row, double sums)
// on random data (never zeros) of real row lengths (2048, 7168) plus shapes
// that leave partial steps. The bound per output is tol * sum_k |w_k x_k|:
// fp32 summation order (and, for int4/Q4_K, the offset trick of
// gpu/quant.h) stays far below it; a wrong weight or scale does not.
// Skips with a message where no GPU is present.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "configs/error.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;
using test::bf16_of;
using test::bf16_round;

namespace {

// A CPU weight view plus the storage it points into.
struct HostQ {
  std::vector<uint8_t> bytes;
  cpu::QuantMat qm;
  cpu::Mat view;
};

enum class Fmt { q8_0, q4_k, gptq_g128_asym, int4_g32_sym, fp8, q4_0, q4_1, q5_0, q5_1, q5_k, q6_k, int8_channel, int8_g64_asym };
const Fmt kAll[] = {Fmt::q8_0,  Fmt::q4_k, Fmt::gptq_g128_asym, Fmt::int4_g32_sym, Fmt::fp8,          Fmt::q4_0,
                    Fmt::q4_1,  Fmt::q5_0, Fmt::q5_1,           Fmt::q5_k,         Fmt::q6_k,         Fmt::int8_channel, Fmt::int8_g64_asym};
bool ggml(Fmt f) { return f == Fmt::q8_0 || f == Fmt::q4_k || (f >= Fmt::q4_0 && f <= Fmt::q6_k); }
cpu::ExtType ggml_type(Fmt f) {
  switch (f) {
    case Fmt::q8_0: return cpu::ExtType::q8_0;
    case Fmt::q4_k: return cpu::ExtType::q4_k;
    case Fmt::q4_0: return cpu::ExtType::q4_0;
    case Fmt::q4_1: return cpu::ExtType::q4_1;
    case Fmt::q5_0: return cpu::ExtType::q5_0;
    case Fmt::q5_1: return cpu::ExtType::q5_1;
    case Fmt::q5_k: return cpu::ExtType::q5_k;
    default: return cpu::ExtType::q6_k;
  }
}
bool super_block(Fmt f) { return f == Fmt::q4_k || f == Fmt::q5_k || f == Fmt::q6_k; }  // cols % 256
const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::q8_0: return "Q8_0";
    case Fmt::q4_k: return "Q4_K";
    case Fmt::q4_0: return "Q4_0";
    case Fmt::q4_1: return "Q4_1";
    case Fmt::q5_0: return "Q5_0";
    case Fmt::q5_1: return "Q5_1";
    case Fmt::q5_k: return "Q5_K";
    case Fmt::q6_k: return "Q6_K";
    case Fmt::int8_channel: return "int8 per channel";
    case Fmt::int8_g64_asym: return "int8 g64 asym";
    case Fmt::gptq_g128_asym: return "GPTQ-int4 g128 asym";
    case Fmt::int4_g32_sym: return "int4 g32 sym";
    case Fmt::fp8: return "FP8 e4m3 g128";
  }
  return "?";
}

// Random weights in the format; fp8 takes random bytes (every encoding,
// NaN codes included) and random positive block scales.
HostQ make_weights(Fmt f, int64_t rows, int64_t cols, uint64_t seed) {
  HostQ h;
  auto w = test::random_floats(static_cast<size_t>(rows * cols), seed, 0.05f);
  if (ggml(f)) {
    h.bytes = qtools::quant_rows(ggml_type(f), w.data(), rows, cols);
    h.view = cpu::ext_view(ggml_type(f), h.bytes.data(), rows, cols, "test");
    return h;
  }
  switch (f) {
    case Fmt::int8_channel: h.qm = cpu::quantize_int8(w.data(), rows, cols); h.view = h.qm.view; break;
    case Fmt::int8_g64_asym: {  // random codes, scales and zero points (HF int8 group view)
      std::mt19937_64 rng(seed);
      h.qm.data.resize(static_cast<size_t>(rows * cols));
      for (auto& b : h.qm.data) b = static_cast<uint8_t>(rng() & 0xFF);
      const int64_t G = cols / 64;
      h.qm.scales.resize(static_cast<size_t>(rows * G));
      h.qm.zeros.resize(h.qm.scales.size());
      std::uniform_real_distribution<float> ud(1e-4f, 2e-3f), uz(100.0f, 156.0f);
      for (auto& s : h.qm.scales) s = ud(rng);
      for (auto& z : h.qm.zeros) z = std::nearbyint(uz(rng));
      h.qm.view = cpu::Mat{DType::u8, h.qm.data.data(), rows, cols, cpu::Quant::ext, h.qm.scales.data(), h.qm.zeros.data(), 64};
      h.qm.view.ext = static_cast<uint32_t>(cpu::ExtType::int8_group);
      h.view = h.qm.view;
      break;
    }
    case Fmt::gptq_g128_asym: h.qm = cpu::quantize_int4(w.data(), rows, cols, 128, true); h.view = h.qm.view; break;
    case Fmt::int4_g32_sym: h.qm = cpu::quantize_int4(w.data(), rows, cols, 32, false); h.view = h.qm.view; break;
    case Fmt::fp8: {
      std::mt19937_64 rng(seed);
      h.qm.data.resize(static_cast<size_t>(rows * cols));
      for (auto& b : h.qm.data) b = static_cast<uint8_t>(rng() & 0xFF);
      const int64_t G = (cols + 127) / 128;
      h.qm.scales.resize(static_cast<size_t>(rows * G));
      std::uniform_real_distribution<float> ud(1e-4f, 2e-3f);
      for (auto& s : h.qm.scales) s = ud(rng);
      h.qm.view = cpu::Mat{DType::u8, h.qm.data.data(), rows, cols, cpu::Quant::ext, h.qm.scales.data(), nullptr, 128};
      h.qm.view.ext = static_cast<uint32_t>(cpu::ExtType::fp8_e4m3);
      h.view = h.qm.view;
      break;
    }
    default: break;  // the ggml types, above
  }
  return h;
}

// ref[t, r] = sum_k x[t, k] w[r, k] (double) and mag[t, r] = sum_k |x w|.
void reference(const cpu::Mat& w, const std::vector<float>& x, int64_t n, std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(static_cast<size_t>(n * w.rows), 0.0);
  mag.assign(ref.size(), 0.0);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    cpu::row_to_f32(w, r, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double p = static_cast<double>(x[static_cast<size_t>(t * w.cols + k)]) * row[static_cast<size_t>(k)];
        s += p;
        m += std::fabs(p);
      }
      ref[static_cast<size_t>(t * w.rows + r)] = s;
      mag[static_cast<size_t>(t * w.rows + r)] = m;
    }
  }
}

double tol_of(Fmt f) { return f == Fmt::q8_0 || f == Fmt::fp8 || f == Fmt::int8_channel || f == Fmt::q5_0 || f == Fmt::q6_k ? 2e-5 : 1e-4; }

}  // namespace

TEST_CASE("gpu quant: formats of CPU views, and shapes the kernels refuse") {
  auto q8 = make_weights(Fmt::q8_0, 4, 512, 1);
  CHECK(gpu::qformat_of(q8.view, "w") == gpu::QFormat::q8_0);
  auto i4 = make_weights(Fmt::gptq_g128_asym, 4, 256, 2);
  CHECK(gpu::qformat_of(i4.view, "w") == gpu::QFormat::int4_group);
  auto bf = bf16_of(test::random_floats(64, 3));
  CHECK_THROWS_AS(gpu::qformat_of(cpu::Mat{DType::bf16, bf.data(), 4, 16}, "w"), Error);
  gpu::QWeight w;
  w.format = gpu::QFormat::q4_k;
  w.data = reinterpret_cast<const void*>(uintptr_t{256});
  w.rows = 4;
  w.cols = 96;  // not a multiple of 256
  CHECK_THROWS_AS(gpu::check_qweight(w, "w"), Error);
  w.format = gpu::QFormat::int4_group;
  w.cols = 256;
  w.group = 48;
  CHECK_THROWS_AS(gpu::check_qweight(w, "w"), Error);
  w.format = gpu::QFormat::q8_0;
  w.cols = 48;  // not a multiple of 32
  CHECK_THROWS_AS(gpu::check_qweight(w, "w"), Error);
}

// The GPU layout (qrepack, on the host: no GPU needed) holds every weight of
// every format as the CPU reads it: exactly where the zero point is an
// integer, to fp32 rounding of zero = -min/scale otherwise (Q4_1, Q5_1, Q5_K).
TEST_CASE("gpu quant: repacked layouts read back every weight of every format") {
  for (Fmt f : kAll) {
    for (int64_t cols : {256, 2304}) {
      if (f == Fmt::int8_g64_asym && cols % 64) continue;
      const int64_t rows = 3;
      auto h = make_weights(f, rows, cols, 40 + static_cast<uint64_t>(f));
      gpu::QHostMat g = gpu::qrepack({h.view, h.view}, "test");
      CHECK(g.w.rows == 2 * rows);
      CHECK(g.w.stride() % 16 == 0);
      CHECK(static_cast<double>(g.w.bytes()) == doctest::Approx(gpu::qformat_bytes_per_weight(h.view) * static_cast<double>(2 * rows * cols)));
      std::vector<float> row(static_cast<size_t>(cols));
      double worst = 0;
      for (int64_t r = 0; r < 2 * rows; ++r) {
        cpu::row_to_f32(h.view, r % rows, row.data());
        for (int64_t k = 0; k < cols; ++k) {
          const double ref = row[static_cast<size_t>(k)], got = gpu::qhost_weight_at(g, r, k);
          worst = std::max(worst, std::fabs(got - ref) / (std::fabs(ref) + 1e-3));
        }
      }
      const bool exact = f != Fmt::q4_1 && f != Fmt::q5_1 && f != Fmt::q5_k && f != Fmt::q4_k && f != Fmt::int4_g32_sym && f != Fmt::gptq_g128_asym &&
                         f != Fmt::int8_g64_asym;
      INFO(fmt_name(f) << " cols " << cols << " -> " << gpu::qformat_name(g.w.format));
      if (exact) CHECK(worst == 0.0);
      else CHECK(worst < 1e-4);
    }
  }
  // A 96-column Q8_0 matrix (not a multiple of 256): rows padded to 16 bytes.
  auto q = make_weights(Fmt::q8_0, 2, 96, 9);
  gpu::QHostMat g = gpu::qrepack({q.view}, "test");
  CHECK(g.w.row_bytes() == 102);
  CHECK(g.w.stride() == 112);
  CHECK(gpu::qformat_supported(q.view));
  auto bf = bf16_of(test::random_floats(64, 3));
  CHECK_FALSE(gpu::qformat_supported(cpu::Mat{DType::bf16, bf.data(), 4, 16}));
}

TEST_CASE("gpu quant_gemv matches the scalar dequantize-then-multiply reference") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  struct Shape {
    int64_t rows, cols;
  };
  for (Fmt f : kAll) {
    std::vector<Shape> shapes = {{72, 2048}, {40, 7168}};
    if (ggml(f)) shapes.push_back({33, 2304});  // a partial step of 32 units (Q8_0)
    else shapes.push_back({33, 1152});           // a partial step (int4, int8, fp8)
    if (!super_block(f) && f != Fmt::int8_g64_asym && f != Fmt::gptq_g128_asym) shapes.push_back({9, 96});  // rows padded to 16 bytes
    for (auto [rows, cols] : shapes) {
      auto h = make_weights(f, rows, cols, 100 + static_cast<uint64_t>(cols) + static_cast<uint64_t>(f));
      gpu::QDeviceMat dw({h.view}, s, "test weight");
      CHECK(static_cast<double>(dw.weight().bytes()) == doctest::Approx(gpu::qformat_bytes_per_weight(h.view) * static_cast<double>(rows * cols)));
      for (int64_t n : {1, 2, 3, 8, 11}) {
        auto x = bf16_round(test::random_floats(static_cast<size_t>(n * cols), 7 + static_cast<uint64_t>(n)));
        std::vector<double> ref, mag;
        reference(h.view, x, n, ref, mag);
        auto dx = test::to_device(bf16_of(x), s);
        const int64_t ldy = rows + 3;
        gpu::DeviceBuffer dy(static_cast<size_t>(n * ldy) * 4);
        gpu::quant_gemv(dw.weight(), dx.as<uint16_t>(), n, dy.as<float>(), ldy, s);
        auto y = test::to_host<float>(dy, static_cast<size_t>(n * ldy), s);
        double worst = 0;
        int64_t bad_t = -1, bad_r = -1;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            const size_t i = static_cast<size_t>(t * rows + r);
            const double e = std::fabs(y[static_cast<size_t>(t * ldy + r)] - ref[i]) / (tol_of(f) * mag[i] + 1e-12);
            if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : e, bad_t = t, bad_r = r;
          }
        CHECK_MESSAGE(worst <= 1.0, std::string(fmt_name(f)) << " rows=" << rows << " cols=" << cols << " n=" << n << ": worst error/bound " << worst
                                                << " at token " << bad_t << " row " << bad_r);
      }
    }
  }
}

// quant_dequant (the big-pass path's bf16 copy) against the host reading of
// the same layout: equal up to one bf16 step, plus 1e-6 absolute where the
// offset formats cancel (the kernel computes a (128 + q) - b, as the product
// kernels do, so weights near zero carry fp32 rounding of 128 a).
TEST_CASE("gpu quant_dequant gives every weight of every format in bf16") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (Fmt f : kAll) {
    const int64_t rows = 37, cols = f == Fmt::int8_g64_asym ? 1152 : 2304;
    auto h = make_weights(f, rows, cols, 77 + static_cast<uint64_t>(f));
    gpu::QHostMat g = gpu::qrepack({h.view}, "test");
    gpu::QDeviceMat dw({h.view}, s, "test");
    gpu::DeviceBuffer out(static_cast<size_t>(30 * cols) * 2);
    gpu::quant_dequant(dw.weight(), 5, 30, out.as<uint16_t>(), s);  // rows 5..34
    auto got = test::to_host<uint16_t>(out, static_cast<size_t>(30 * cols), s);
    double worst = 0;
    for (int64_t r = 0; r < 30; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const double ref = gpu::qhost_weight_at(g, r + 5, k), v = bf16_to_f32(got[static_cast<size_t>(r * cols + k)]);
        worst = std::max(worst, std::fabs(v - ref) / (std::fabs(ref) * 0x1p-7 + 1e-6));
      }
    CHECK_MESSAGE(worst <= 1.0, std::string(fmt_name(f)) << ": worst |bf16 - ref| / (2^-7 |ref| + 1e-6) " << worst);
  }
}

TEST_CASE("gpu quant_moe_experts matches a scalar SwiGLU expert reference") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t H = 2048, I = 768, E = 6, K = 2;
  for (Fmt f : {Fmt::q8_0, Fmt::q4_k, Fmt::gptq_g128_asym, Fmt::fp8, Fmt::q4_0, Fmt::q5_k, Fmt::q6_k, Fmt::int8_channel}) {
    std::vector<HostQ> gu, dn;
    std::vector<cpu::Mat> gu_views, dn_views;
    for (int64_t e = 0; e < E; ++e) {
      gu.push_back(make_weights(f, 2 * I, H, 500 + static_cast<uint64_t>(e) * 7 + static_cast<uint64_t>(f)));
      dn.push_back(make_weights(f, H, I, 900 + static_cast<uint64_t>(e) * 7 + static_cast<uint64_t>(f)));
    }
    for (auto& h : gu) gu_views.push_back(h.view);
    for (auto& h : dn) dn_views.push_back(h.view);
    gpu::QDeviceMat dgu(gu_views, s, "gate_up"), ddn(dn_views, s, "down");
    for (int64_t n : {1, 5, 12}) {
      auto x = bf16_round(test::random_floats(static_cast<size_t>(n * H), 31 + static_cast<uint64_t>(n)));
      std::vector<int32_t> ids(static_cast<size_t>(n * K));
      std::vector<float> rw(ids.size());
      for (int64_t t = 0; t < n; ++t) {
        ids[static_cast<size_t>(t * K)] = static_cast<int32_t>((t * 5 + 1) % E);
        ids[static_cast<size_t>(t * K + 1)] = static_cast<int32_t>((t * 5 + 3) % E);  // != the first (E = 6)
        rw[static_cast<size_t>(t * K)] = 0.6f + 0.01f * static_cast<float>(t);
        rw[static_cast<size_t>(t * K + 1)] = 0.4f - 0.01f * static_cast<float>(t);
      }
      // Reference: the GPU rounds silu(g) * u to bf16 before the down product; so does this.
      std::vector<double> out(static_cast<size_t>(n * H), 0.0), omag(out.size(), 0.0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = ids[static_cast<size_t>(t * K + j)];
          std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
          std::vector<double> g, gm;
          reference(gu[static_cast<size_t>(e)].view, xt, 1, g, gm);
          std::vector<float> hact(static_cast<size_t>(I));
          for (int64_t i = 0; i < I; ++i) {
            const double gv = g[static_cast<size_t>(i)], uv = g[static_cast<size_t>(I + i)];
            hact[static_cast<size_t>(i)] = bf16_to_f32(f32_to_bf16(static_cast<float>(gv / (1.0 + std::exp(-gv)) * uv)));
          }
          std::vector<double> d, dm;
          reference(dn[static_cast<size_t>(e)].view, hact, 1, d, dm);
          for (int64_t i = 0; i < H; ++i) {
            out[static_cast<size_t>(t * H + i)] += rw[static_cast<size_t>(t * K + j)] * d[static_cast<size_t>(i)];
            omag[static_cast<size_t>(t * H + i)] += rw[static_cast<size_t>(t * K + j)] * dm[static_cast<size_t>(i)];
          }
        }
      auto dx = test::to_device(bf16_of(x), s);
      auto di = test::to_device(ids, s), dwt = test::to_device(rw, s);
      gpu::DeviceBuffer off(static_cast<size_t>(E + 1) * 4), pl(ids.size() * 4), act(ids.size() * static_cast<size_t>(I) * 2),
          part(ids.size() * static_cast<size_t>(H) * 4), dout(out.size() * 4);
      gpu::moe_route(di.as<int32_t>(), n * K, E, off.as<int32_t>(), pl.as<int32_t>(), s);
      gpu::quant_moe_experts(dx.as<uint16_t>(), n, H, I, E, K, dwt.as<float>(), off.as<int32_t>(), pl.as<int32_t>(), dgu.weight(), ddn.weight(),
                             act.as<uint16_t>(), part.as<float>(), dout.as<float>(), s);
      auto y = test::to_host<float>(dout, out.size(), s);
      // bf16 rounding of the activation (one ulp, 2^-8, where g or u differ in the last fp32 bits) dominates.
      double worst = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double e = std::fabs(y[i] - out[i]) / (1e-2 * omag[i] + 1e-9);
        if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : e;
      }
      CHECK_MESSAGE(worst <= 1.0, std::string(fmt_name(f)) << " n=" << n << ": worst error/bound " << worst);
    }
  }
}
