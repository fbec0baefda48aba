// GGUF blocks as stored on the GPU (gpu/quant.h: gguf_gemv, gguf_dequant,
// gguf_moe_experts) against a plain scalar reference: cpu::dequant_block per
// block, products in double, on random weights quantized by the test
// quantizers and random activations. The kernels quantize activations per 32
// to int8 (as llama.cpp and the CPU integer path do), so the bound per
// output is that rounding's worst case, sum over 32-blocks b of
// amax_b / 254 * sum_{k in b} |w_k|, plus fp32 rounding; a wrong code, scale,
// min or row does not fit under it. Outputs are poisoned (NaN) first.
// Shapes: real row lengths (768, 2048, 4096), segmented rows (7168), Q8_0 rows
// that start on 2-byte boundaries (2112 columns), Q6_K ones (768).
// Skips with a message where no GPU is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "configs/error.h"
#include "configs/settings.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/quant.h"
#include "numa/quant_gguf.h"
#include "tests/gpu/gguf_expert_check.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;
using test::bf16_of;
using test::bf16_round;

namespace {

const cpu::ExtType kTypes[] = {cpu::ExtType::q4_k, cpu::ExtType::q5_k, cpu::ExtType::q6_k, cpu::ExtType::q8_0};

using HostW = test::GgufHostW;
using test::ref_dot;

HostW make(cpu::ExtType t, int64_t rows, int64_t cols, uint64_t seed) {
  HostW h;
  auto w = test::random_floats(static_cast<size_t>(rows * cols), seed, 0.05f);
  h.bytes = qtools::quant_rows(t, w.data(), rows, cols);
  h.view = cpu::ext_view(t, h.bytes.data(), rows, cols, "test");
  const cpu::ExtTypeInfo* info = cpu::ext_type_info(static_cast<uint32_t>(t));
  h.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / info->block_elems; ++b)
      cpu::dequant_block(t, h.view.row(r) + b * info->block_bytes, h.deq.data() + r * cols + b * info->block_elems);
  return h;
}


std::string name(cpu::ExtType t) { return cpu::ext_type_info(static_cast<uint32_t>(t))->name; }

// Both decode kernel sets (gpu::set_gguf_decode_kernel); the default is restored after each case.
const gpu::GgufDecodeKernel kKernels[] = {gpu::GgufDecodeKernel::direct, gpu::GgufDecodeKernel::staged};
const char* kname(gpu::GgufDecodeKernel k) { return k == gpu::GgufDecodeKernel::direct ? "direct" : "staged"; }
struct KernelScope {
  ~KernelScope() { gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::direct); }
};

}  // namespace

TEST_CASE("gpu gguf: types of CPU views and shapes the native kernels refuse") {
  auto h = make(cpu::ExtType::q6_k, 3, 512, 1);
  CHECK(gpu::gguf_native_supported(h.view));
  CHECK(gpu::gguf_type_of(h.view, "t") == gpu::GgufType::q6_k);
  auto q40 = make(cpu::ExtType::q4_0, 3, 512, 2);
  CHECK_FALSE(gpu::gguf_native_supported(q40.view));
  CHECK_THROWS_AS(gpu::gguf_type_of(q40.view, "t"), Error);
  auto q8 = make(cpu::ExtType::q8_0, 3, 96, 3);  // Q8_0 needs cols % 64
  CHECK_FALSE(gpu::gguf_native_supported(q8.view));
  gpu::GgufWeight w;
  w.type = gpu::GgufType::q4_k;
  w.rows = 4;
  w.cols = 300;
  alignas(16) static const uint8_t buf[32] = {};
  w.data = buf;
  CHECK_THROWS_AS(gpu::check_gguf_weight(w, "t"), Error);
  w.cols = 256;
  w.data = buf + 2;
  CHECK_THROWS_AS(gpu::check_gguf_weight(w, "t"), Error);
  CHECK(gpu::GgufWeight{gpu::GgufType::q6_k, nullptr, 1, 768}.row_bytes() == 630);
  CHECK(gpu::GgufWeight{gpu::GgufType::q8_0, nullptr, 1, 2112}.row_bytes() == 2244);
}

TEST_CASE("gpu gguf: the decode kernel setting takes dense, direct or staged and names a bad value") {
  Settings s = Settings::defaults();
  CHECK(s.gpu_gguf_decode_kernel == "direct");
  CHECK(GpuRuntimeOptions::from_settings(s).gguf_decode_kernel == gpu::GgufDecodeKernel::direct);
  s.gpu_gguf_decode_kernel = "dense";
  CHECK(GpuRuntimeOptions::from_settings(s).gguf_decode_kernel == gpu::GgufDecodeKernel::dense);
  s.gpu_gguf_decode_kernel = "STAGED";
  s.validate();  // choices are read in lower case
  CHECK(GpuRuntimeOptions::from_settings(s).gguf_decode_kernel == gpu::GgufDecodeKernel::staged);
  s.gpu_gguf_decode_kernel = "fast";
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("direct"), Error);
  CHECK_THROWS_AS(GpuRuntimeOptions::from_settings(s), Error);
  gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::staged);
  CHECK(gpu::gguf_decode_kernel() == gpu::GgufDecodeKernel::staged);
  gpu::set_gguf_decode_kernel(gpu::GgufDecodeKernel::direct);
  CHECK(gpu::gguf_decode_kernel() == gpu::GgufDecodeKernel::direct);
}

TEST_CASE("gpu gguf: the prefill kernel setting takes simple or pipelined (and its tiles), defaults to pipelined and names a bad value") {
  test::PrefillKernelScope restore;
  Settings s = Settings::defaults();
  CHECK(s.gpu_gguf_prefill_kernel == "pipelined");
  CHECK(GpuRuntimeOptions::from_settings(s).gguf_prefill_kernel == gpu::GgufPrefillKernel::pipelined);
  CHECK(gpu::gguf_prefill_kernel() == gpu::GgufPrefillKernel::pipelined);
  for (gpu::GgufPrefillKernel k : test::kPrefillKernels) {
    s.gpu_gguf_prefill_kernel = gpu::gguf_prefill_kernel_name(k);
    CHECK(GpuRuntimeOptions::from_settings(s).gguf_prefill_kernel == k);
    gpu::set_gguf_prefill_kernel(k);
    CHECK(gpu::gguf_prefill_kernel() == k);
  }
  s.gpu_gguf_prefill_kernel = "SIMPLE";
  s.validate();  // choices are read in lower case
  CHECK(GpuRuntimeOptions::from_settings(s).gguf_prefill_kernel == gpu::GgufPrefillKernel::simple);
  s.gpu_gguf_prefill_kernel = "fast";
  CHECK_THROWS_WITH_AS(s.validate(), doctest::Contains("pipelined"), Error);
  CHECK_THROWS_AS(GpuRuntimeOptions::from_settings(s), Error);
}

TEST_CASE("gpu gguf_gemv matches the scalar reference within the int8 activation rounding") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  KernelScope restore;
  struct Shape {
    int64_t rows, cols;
  };
  for (cpu::ExtType t : kTypes) {
    // 2048/768/4096: Qwen3-30B-A3B rows (one row per warp, rows sharing a warp,
    // two 32-unit steps); 7168: DeepSeek (four steps, the last one partial);
    // 256/512: 8 and 4 rows per warp; odd row counts end in partial passes.
    std::vector<Shape> shapes = {{37, 2048}, {41, 768}, {9, 4096}, {5, 7168}, {19, 256}, {23, 512}};
    if (t == cpu::ExtType::q8_0) shapes.push_back({13, 2112});  // rows on 4-byte boundaries, 33 units
    for (auto [rows, cols] : shapes) {
      auto h = make(t, rows, cols, 100 + static_cast<uint64_t>(cols) + static_cast<uint64_t>(t));
      gpu::GgufDeviceMat dw({h.view}, s, "test weight");
      CHECK(dw.weight().bytes() == static_cast<size_t>(rows) * h.view.row_bytes());
      for (int64_t n : {1, 2, 3, 5, 8, 11}) {
        auto x = bf16_round(test::random_floats(static_cast<size_t>(n * cols), 7 + static_cast<uint64_t>(n)));
        auto dx = test::to_device(bf16_of(x), s);
        const int64_t ldy = rows + 3;
        for (gpu::GgufDecodeKernel kern : kKernels) {
          gpu::set_gguf_decode_kernel(kern);
          std::vector<float> poison(static_cast<size_t>(n * ldy), std::nanf(""));
          auto dy = test::to_device(poison, s);
          gpu::gguf_gemv(dw.weight(), dx.as<uint16_t>(), n, dy.as<float>(), ldy, s);
          auto y = test::to_host<float>(dy, static_cast<size_t>(n * ldy), s);
          double worst = 0;
          int64_t bad_t = -1, bad_r = -1;
          for (int64_t tk = 0; tk < n; ++tk)
            for (int64_t r = 0; r < rows; ++r) {
              double ref, bound;
              ref_dot(h.deq.data() + r * cols, x.data() + tk * cols, cols, ref, bound);
              const double e = std::fabs(y[static_cast<size_t>(tk * ldy + r)] - ref) / bound;
              if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : e, bad_t = tk, bad_r = r;
            }
          CHECK_MESSAGE(worst <= 1.0, kname(kern) << " " << name(t) << " rows=" << rows << " cols=" << cols << " n=" << n << ": worst error/bound "
                                                  << worst << " at token " << bad_t << " row " << bad_r);
          // The gaps between the rows of a token are not written.
          bool gaps = true;
          for (int64_t tk = 0; tk < n; ++tk)
            for (int64_t r = rows; r < ldy; ++r) gaps = gaps && std::isnan(y[static_cast<size_t>(tk * ldy + r)]);
          CHECK_MESSAGE(gaps, kname(kern) << " " << name(t) << " cols=" << cols << " n=" << n << ": wrote past a token's rows");
        }
      }
    }
  }
}

// The two kernel sets compute the same int8 activation planes and the same
// run products; only the fp32 order of the sums over runs differs.
TEST_CASE("gpu gguf_gemv: direct and staged kernels agree to fp32 rounding") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  KernelScope restore;
  for (cpu::ExtType t : kTypes) {
    const int64_t rows = 300, cols = 2048;
    auto h = make(t, rows, cols, 77 + static_cast<uint64_t>(t));
    gpu::GgufDeviceMat dw({h.view}, s, "test weight");
    for (int64_t n : {1, 4, 8}) {
      auto x = bf16_round(test::random_floats(static_cast<size_t>(n * cols), 3 + static_cast<uint64_t>(n)));
      auto dx = test::to_device(bf16_of(x), s);
      std::vector<float> got[2];
      for (int i = 0; i < 2; ++i) {
        gpu::set_gguf_decode_kernel(kKernels[i]);
        gpu::DeviceBuffer dy(static_cast<size_t>(n * rows) * 4);
        gpu::gguf_gemv(dw.weight(), dx.as<uint16_t>(), n, dy.as<float>(), rows, s);
        got[i] = test::to_host<float>(dy, static_cast<size_t>(n * rows), s);
      }
      double worst = 0;
      for (int64_t tk = 0; tk < n; ++tk)
        for (int64_t r = 0; r < rows; ++r) {
          double mag = 0;
          for (int64_t k = 0; k < cols; ++k) mag += std::fabs(static_cast<double>(h.deq[static_cast<size_t>(r * cols + k)]) * x[static_cast<size_t>(tk * cols + k)]);
          const size_t i = static_cast<size_t>(tk * rows + r);
          worst = std::max(worst, std::fabs(static_cast<double>(got[0][i]) - got[1][i]) / (1e-4 * mag + 1e-12));
        }
      CHECK_MESSAGE(worst <= 1.0, name(t) << " n=" << n << ": |direct - staged| / (1e-4 sum |w x|) " << worst);
    }
  }
}

TEST_CASE("gpu gguf_dequant gives every weight in bf16") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (cpu::ExtType t : kTypes) {
    for (int64_t cols : {768, 2048, 7168}) {
      const int64_t rows = 23;
      auto h = make(t, rows, cols, 300 + static_cast<uint64_t>(t) + static_cast<uint64_t>(cols));
      gpu::GgufDeviceMat dw({h.view}, s, "test");
      gpu::DeviceBuffer out(static_cast<size_t>(17 * cols) * 2);
      gpu::gguf_dequant(dw.weight(), 5, 17, out.as<uint16_t>(), s);  // rows 5..21
      auto got = test::to_host<uint16_t>(out, static_cast<size_t>(17 * cols), s);
      double worst = 0;
      for (int64_t r = 0; r < 17; ++r)
        for (int64_t k = 0; k < cols; ++k) {
          const double ref = h.deq[static_cast<size_t>((r + 5) * cols + k)], v = bf16_to_f32(got[static_cast<size_t>(r * cols + k)]);
          const double e = std::fabs(v - ref) / (std::fabs(ref) * 0x1p-8 + 1e-6);
          if (!(e <= worst)) worst = std::isnan(e) ? 1e30 : e;
        }
      CHECK_MESSAGE(worst <= 1.0, name(t) << " cols=" << cols << ": worst |bf16 - ref| / (2^-8 |ref| + 1e-6) " << worst);
    }
  }
}

TEST_CASE("gpu gguf_moe_experts matches a scalar SwiGLU expert reference") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  KernelScope restore;
  const int64_t H = 2048, I = 768, E = 6, K = 3;
  struct Pair {
    cpu::ExtType gu, dn;
  };
  for (Pair f : {Pair{cpu::ExtType::q4_k, cpu::ExtType::q6_k}, Pair{cpu::ExtType::q8_0, cpu::ExtType::q8_0}, Pair{cpu::ExtType::q5_k, cpu::ExtType::q4_k},
                 Pair{cpu::ExtType::q6_k, cpu::ExtType::q5_k}}) {
    std::vector<HostW> gu, dn;
    for (int64_t e = 0; e < E; ++e) {
      gu.push_back(make(f.gu, 2 * I, H, 500 + static_cast<uint64_t>(e) * 7 + static_cast<uint64_t>(f.gu)));
      dn.push_back(make(f.dn, H, I, 900 + static_cast<uint64_t>(e) * 7 + static_cast<uint64_t>(f.dn)));
    }
    for (int64_t n : {1, 4}) {
      for (gpu::GgufDecodeKernel kern : kKernels) {
        gpu::set_gguf_decode_kernel(kern);
        const double worst = test::gguf_moe_experts_worst(gu, dn, H, I, K, n, 5, s);
        CHECK_MESSAGE(worst <= 1.0, kname(kern) << " " << name(f.gu) << "/" << name(f.dn) << " n=" << n << ": worst error/bound " << worst);
      }
    }
  }
}

TEST_CASE("gpu gguf_moe_gemm (grouped tensor-core product on the blocks) matches the scalar reference") {
  if (!test::have_gpu()) return;
  test::check_gguf_moe_gemm(kTypes, [](cpu::ExtType t, int64_t rows, int64_t cols, uint64_t seed) { return make(t, rows, cols, seed); }, name, 700);
}

TEST_CASE("gpu gguf_moe_gemm (grouped tensor-core product on the blocks): ragged experts (0, 1, 63, 64, 65, 300, 7 rows), every kernel and tile") {
  if (!test::have_gpu()) return;
  test::check_gguf_moe_gemm_ragged(kTypes, [](cpu::ExtType t, int64_t rows, int64_t cols, uint64_t seed) { return make(t, rows, cols, seed); }, name, 1700);
}
