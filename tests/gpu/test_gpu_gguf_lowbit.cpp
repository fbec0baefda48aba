// The low-bit GGUF types on the GPU as stored (Q2_K, Q3_K, IQ1_S, IQ1_M,
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS, IQ4_NL, MXFP4; gpu/quant.h,
// gpu/gguf_lowbit_units.h) against the CPU's decoding of the same bytes
// (cpu::lowbit_block_codes / lowbit_dequant_block, checked bit for bit
// against gguf-py in tests/numa/test_gguf_lowbit.cpp), on random blocks
// (tests/quant_tools/lowbit_blocks.h: every code, sign and sub-scale occurs;
// no zero weights by construction of the scales):
//  - without a GPU: the decoders the kernels run, compiled for the host,
//    give the CPU's codes, scales and offsets and the same fp32 weights bit
//    for bit; the type mapping and shape checks;
//  - with a GPU: gguf_dequant equals the CPU's weights rounded to bf16 bit
//    for bit; gguf_gemv, gguf_moe_experts and gguf_moe_gemm match plain
//    double sums of the CPU's weights within the kernels' rounding (int8
//    activations for the first two, bf16 for the third: the same bounds
//    tests/gpu/test_gpu_gguf_native.cpp uses for Q4_K..Q8_0, per output from
//    that type's |w|); and a small deepseek2 GGUF of each type (and a mixed
//    one) run with every layer on the GPU gives the CPU path's top-1 where
//    the CPU's margin exceeds 0.5 (and llama.cpp's own files of issue 28,
//    where present, as the CPU path and llama.cpp);
//  - without a GPU too: those deepseek2 files load on the CPU with clear
//    margins, and the plan counts their resident experts at stored bytes.
// GPU cases skip with a message where no GPU is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/loading/gguf_model.h"
#include "engine/loading/model.h"
#include "engine/placement/placement.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "gpu/gguf_lowbit_units.h"
#include "gpu/quant.h"
#include "io/gguf.h"
#include "io/tensor/gguf_iq_grids.h"
#include "io/tensor/quant_blocks_lowbit.h"
#include "tests/gpu/gguf_expert_check.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/model_run.h"
#include "tests/quant_tools/lowbit_blocks.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;
using cpu::ExtType;
using test::bf16_of;
using test::bf16_round;

namespace {

namespace gg = gpu::detail::gguf;

const cpu::ExtTypeInfo& info(ExtType t) { return *cpu::lowbit_type_info(static_cast<uint32_t>(t)); }
std::string name(ExtType t) { return info(t).name; }

// The host-compiled decoder of type t: unit q of the group at byte offset off of s.
void decode_unit(ExtType t, const uint8_t* s, int off, int q, gg::Run* r) {
  const gg::LowbitTables tb = gg::host_lowbit_tables();
  switch (static_cast<uint32_t>(t)) {
    case 10: return gg::Q2K::unit(s, off, q, r, tb);
    case 11: return gg::Q3K::unit(s, off, q, r, tb);
    case 16: return gg::IQ2XXS::unit(s, off, q, r, tb);
    case 17: return gg::IQ2XS::unit(s, off, q, r, tb);
    case 18: return gg::IQ3XXS::unit(s, off, q, r, tb);
    case 19: return gg::IQ1S::unit(s, off, q, r, tb);
    case 20: return gg::IQ4NL::unit(s, off, q, r, tb);
    case 21: return gg::IQ3S::unit(s, off, q, r, tb);
    case 22: return gg::IQ2S::unit(s, off, q, r, tb);
    case 23: return gg::IQ4XS::unit(s, off, q, r, tb);
    case 29: return gg::IQ1M::unit(s, off, q, r, tb);
    case 39: return gg::MXFP4::unit(s, off, q, r, tb);
    default: FAIL("no decoder for type " << static_cast<uint32_t>(t));
  }
}

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

using HostW = test::GgufHostW;  // deq: cpu::lowbit_dequant_block per block
using test::ref_dot;

HostW make(ExtType t, int64_t rows, int64_t cols, uint64_t seed, float rms = 0.05f) {
  HostW h;
  h.bytes = qtools::lowbit_random_rows(t, rows, cols, seed, rms);
  h.view = cpu::ext_view(t, h.bytes.data(), rows, cols, "test");
  const auto& ti = info(t);
  h.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / ti.block_elems; ++b)
      cpu::lowbit_dequant_block(t, h.view.row(r) + b * ti.block_bytes, h.deq.data() + r * cols + b * ti.block_elems);
  return h;
}

// ref = sum_k x_k w_k and the int8-activation bound, per output (as test_gpu_gguf_native.cpp).

}  // namespace

TEST_CASE("gpu gguf low-bit: the kernels' decoders (host build) give the CPU's codes, scales and weights bit for bit") {
  for (ExtType t : cpu::lowbit::kAll) {
    INFO(name(t));
    const auto& ti = info(t);
    const int per = 256 / ti.block_elems;  // blocks per 256 weights (IQ4_NL, MXFP4: 8, in groups of 2)
    const int64_t groups = 24;
    auto b = qtools::lowbit_random_rows(t, 1, 256 * groups, 40 + static_cast<uint64_t>(t), 0.05f);
    b.resize(b.size() + 16, 0);  // the decoders read aligned words up to 8 bytes past a block
    int64_t bad_code = 0, bad_scale = 0, bad_value = 0, zeros = 0;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int goff = static_cast<int>(gi * per * ti.block_bytes);  // groups at every offset mod 4, as rows are on the device
      const uint8_t* p = b.data() + goff;
      int8_t code[256];
      float s[16], o[16], want[256];
      for (int i = 0; i < per; ++i) {
        cpu::lowbit_block_codes(t, p + i * ti.block_bytes, code + i * ti.block_elems, s + i * ti.block_elems / 16, o + i * ti.block_elems / 16);
        cpu::lowbit_dequant_block(t, p + i * ti.block_bytes, want + i * ti.block_elems);
      }
      // The GPU's units of these 256 weights: 4 per super-block, or one per pair of 32-blocks.
      for (int u = 0; u < 4; ++u) {
        gg::Run r[4];
        if (ti.block_elems == 256) decode_unit(t, b.data(), goff, u, r);
        else decode_unit(t, b.data(), goff + 2 * u * ti.block_bytes, 0, r);
        const int base = ti.block_elems == 256 ? 0 : 64 * u;
        for (int k = 0; k < 4; ++k) {
          const int e0 = base + r[k].e;
          REQUIRE(e0 % 16 == 0);
          REQUIRE(e0 < 256);
          const int run = e0 / 16;
          if (fbits(r[k].a) != fbits(s[run]) || fbits(r[k].c) != fbits(-o[run])) {
            if (bad_scale++ < 3) FAIL_CHECK("group " << gi << " run " << run << ": a " << r[k].a << " c " << r[k].c << ", CPU scale " << s[run] << " offset " << o[run]);
          }
          for (int i = 0; i < 16; ++i) {
            const int8_t q = static_cast<int8_t>(r[k].w[i / 4] >> (8 * (i % 4)));
            if (q != code[e0 + i] && bad_code++ < 3) FAIL_CHECK("group " << gi << " weight " << e0 + i << ": code " << int{q} << ", CPU " << int{code[e0 + i]});
            const float v = gg::run_value(r[k].a, q, r[k].c);
            zeros += v == 0.0f;
            if (fbits(v) != fbits(want[e0 + i]) && bad_value++ < 3)
              FAIL_CHECK("group " << gi << " weight " << e0 + i << ": " << v << ", CPU " << want[e0 + i]);
          }
        }
      }
    }
    CHECK(bad_code == 0);
    CHECK(bad_scale == 0);
    CHECK(bad_value == 0);
    CHECK(zeros < 256 * groups / 4);  // random codes: mostly non-zero weights (MXFP4 and Q2_K have a zero code)
  }
}

TEST_CASE("gpu gguf low-bit: packed tables, byte helpers and the type mapping") {
  for (uint32_t n = 0; n < 16; ++n) {
    const uint32_t four = n * 0x01010101u;
    CHECK(gg::lut16(four, gg::kIq4W0, gg::kIq4W1, gg::kIq4W2, gg::kIq4W3) == (static_cast<uint8_t>(cpu::detail::kIq4nlValues[n]) * 0x01010101u));
    CHECK(gg::lut16(four, gg::kFp4W0, gg::kFp4W1, gg::kFp4W2, gg::kFp4W3) == (static_cast<uint8_t>(cpu::detail::mxfp4_value2(n)) * 0x01010101u));
  }
  CHECK(gg::lut16(0x0F080701u, gg::kIq4W0, gg::kIq4W1, gg::kIq4W2, gg::kIq4W3) == gg::pack_bytes(-104, -10, 1, 113));
  for (uint32_t i = 0; i < 128; ++i) CHECK(gg::sign_byte(i) == cpu::detail::iq_sign_byte(i));
  CHECK(gg::signed4(gg::pack_bytes(8, 25, 43, 0), 0x5u) == gg::pack_bytes(-8, 25, -43, 0));
  alignas(4) uint8_t bytes[32];
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<uint8_t>(1 + 7 * i);
  for (int off = 0; off < 8; ++off) {  // the aligned-word reads with funnel shifts give the bytes at off
    uint32_t w[4], want[4];
    std::memcpy(want, bytes + off, 16);
    CHECK(gg::lw(bytes, off) == want[0]);
    gg::l16(bytes, off, w);
    for (int i = 0; i < 4; ++i) CHECK(w[i] == want[i]);
  }
  CHECK(gg::byte_perm(0x44332211u, 0x88776655u, 0x7430u) == 0x88554411u);
  CHECK(gg::vadd4(gg::pack_bytes(16, 0, 8, 1), gg::pack_bytes(-9, -9, -7, 127)) == gg::pack_bytes(7, -9, 1, -128));

  for (ExtType t : cpu::lowbit::kAll) {
    INFO(name(t));
    const int64_t unit = info(t).block_elems == 32 ? 64 : 256;
    auto h = make(t, 3, 2 * unit, 5);
    REQUIRE(gpu::gguf_native_supported(h.view));
    const gpu::GgufType gt = gpu::gguf_type_of(h.view, "t");
    CHECK(gpu::gguf_type_lowbit(gt));
    CHECK(std::string(gpu::gguf_type_name(gt)) == name(t));
    gpu::GgufWeight w{gt, nullptr, 3, 2 * unit};
    CHECK(w.row_bytes() == h.view.row_bytes());
    alignas(16) static const uint8_t buf[32] = {};
    w.data = buf;
    CHECK_NOTHROW(gpu::check_gguf_weight(w, "t"));
    w.cols = unit + 32;  // a whole number of blocks for IQ4_NL/MXFP4, not of the kernels' groups
    CHECK_THROWS_AS(gpu::check_gguf_weight(w, "t"), Error);
    w.cols = 2 * unit;
    w.data = buf + 2;
    CHECK_THROWS_AS(gpu::check_gguf_weight(w, "t"), Error);
    if (unit == 64) CHECK_FALSE(gpu::gguf_native_supported(cpu::ext_view(t, h.bytes.data(), 1, 96, "t")));  // 3 blocks of 32
  }
  for (gpu::GgufType t : {gpu::GgufType::q4_k, gpu::GgufType::q5_k, gpu::GgufType::q6_k, gpu::GgufType::q8_0}) CHECK_FALSE(gpu::gguf_type_lowbit(t));
}

TEST_CASE("gpu gguf low-bit: gguf_dequant gives the CPU's weights rounded to bf16, bit for bit") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  struct Shape {
    int64_t rows, cols;
  };
  for (ExtType t : cpu::lowbit::kAll) {
    std::vector<Shape> shapes = {{21, 1024}, {7, 7168}};
    if (info(t).block_elems == 32) shapes.push_back({9, 2112});
    for (auto [rows, cols] : shapes) {
      auto h = make(t, rows, cols, 300 + static_cast<uint64_t>(t) + static_cast<uint64_t>(cols));
      gpu::GgufDeviceMat dw({h.view}, s, "test");
      const int64_t r0 = 3, rn = rows - 5;
      gpu::DeviceBuffer out(static_cast<size_t>(rn * cols) * 2);
      gpu::gguf_dequant(dw.weight(), r0, rn, out.as<uint16_t>(), s);
      auto got = test::to_host<uint16_t>(out, static_cast<size_t>(rn * cols), s);
      int64_t bad = 0, signed_zero = 0;
      for (int64_t i = 0; i < rn * cols; ++i) {
        const uint16_t want = f32_to_bf16(h.deq[static_cast<size_t>(r0 * cols + i)]), g = got[static_cast<size_t>(i)];
        if (g == want) continue;
        if (((g | want) & 0x7FFFu) == 0) {  // +0 against -0: equal values
          ++signed_zero;
          continue;
        }
        if (bad++ < 3)
          FAIL_CHECK(name(t) << " cols=" << cols << " element " << i << ": bf16 " << std::hex << g << ", CPU " << want << std::dec << " ("
                             << h.deq[static_cast<size_t>(r0 * cols + i)] << ")");
      }
      CHECK_MESSAGE(bad == 0, name(t) << " cols=" << cols << ": " << bad << " of " << rn * cols << " weights differ");
      if (signed_zero) MESSAGE(name(t) << " cols=" << cols << ": " << signed_zero << " zeros of the other sign");
    }
  }
}

TEST_CASE("gpu gguf low-bit: gguf_gemv matches the CPU weights' product within the int8 activation rounding") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  struct Shape {
    int64_t rows, cols;
  };
  for (ExtType t : cpu::lowbit::kAll) {
    std::vector<Shape> shapes = {{37, 2048}, {41, 768}, {5, 7168}};
    if (info(t).block_elems == 32) shapes.push_back({13, 2112});
    for (auto [rows, cols] : shapes) {
      auto h = make(t, rows, cols, 100 + static_cast<uint64_t>(cols) + static_cast<uint64_t>(t));
      gpu::GgufDeviceMat dw({h.view}, s, "test weight");
      CHECK(dw.weight().bytes() == static_cast<size_t>(rows) * h.view.row_bytes());
      for (int64_t n : {1, 3, 8, 11}) {
        auto x = bf16_round(test::random_floats(static_cast<size_t>(n * cols), 7 + static_cast<uint64_t>(n)));
        auto dx = test::to_device(bf16_of(x), s);
        const int64_t ldy = rows + 3;
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
        CHECK_MESSAGE(worst <= 1.0, name(t) << " rows=" << rows << " cols=" << cols << " n=" << n << ": worst error/bound " << worst << " at token "
                                            << bad_t << " row " << bad_r);
      }
    }
  }
}

TEST_CASE("gpu gguf low-bit: gguf_moe_experts (decode experts) matches a scalar SwiGLU expert reference") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t H = 1024, I = 512, E = 5, K = 3;
  struct Pair {
    ExtType gu, dn;
  };
  std::vector<Pair> pairs;
  for (ExtType t : cpu::lowbit::kAll) pairs.push_back({t, t});
  pairs.push_back({cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs});  // the dynamic quants' routed experts
  pairs.push_back({cpu::lowbit::q2_k, cpu::ExtType::q4_k});
  for (Pair f : pairs) {
    std::vector<HostW> gu, dn;
    auto mk = [&](ExtType t, int64_t rows, int64_t cols, uint64_t seed) {
      if (cpu::lowbit_type(static_cast<uint32_t>(t))) return make(t, rows, cols, seed);
      HostW h;  // Q4_K down (a Q2_K_M-like mix): the test quantizer and the CPU dequantizer of the older types
      const auto* ti = cpu::ext_type_info(static_cast<uint32_t>(t));
      const std::vector<float> w = test::random_floats(static_cast<size_t>(rows * cols), seed, 0.05f);
      h.bytes = qtools::quant_rows(t, w.data(), rows, cols);
      h.view = cpu::ext_view(t, h.bytes.data(), rows, cols, "test");
      h.deq.resize(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < cols / ti->block_elems; ++b)
          cpu::dequant_block(t, h.view.row(r) + b * ti->block_bytes, h.deq.data() + r * cols + b * ti->block_elems);
      return h;
    };
    for (int64_t e = 0; e < E; ++e) {
      gu.push_back(mk(f.gu, 2 * I, H, 500 + static_cast<uint64_t>(e) * 7 + static_cast<uint64_t>(f.gu)));
      dn.push_back(mk(f.dn, H, I, 900 + static_cast<uint64_t>(e) * 7 + static_cast<uint64_t>(f.dn)));
    }
    for (int64_t n : {1, 4}) {
      const double worst = test::gguf_moe_experts_worst(gu, dn, H, I, K, n, 4, s);
      CHECK_MESSAGE(worst <= 1.0, name(f.gu) << "/" << cpu::ext_type_info(static_cast<uint32_t>(f.dn))->name << " n=" << n << ": worst error/bound " << worst);
    }
  }
}

TEST_CASE("gpu gguf low-bit: gguf_moe_gemm (grouped tensor-core prefill product) matches the scalar reference") {
  if (!test::have_gpu()) return;
  test::check_gguf_moe_gemm(cpu::lowbit::kAll, [](ExtType t, int64_t rows, int64_t cols, uint64_t seed) { return make(t, rows, cols, seed); }, name, 700);
}

TEST_CASE("gpu gguf low-bit: gguf_moe_gemm (grouped tensor-core prefill product): ragged experts (0, 1, 63, 64, 65, 300, 7 rows), every kernel and tile") {
  if (!test::have_gpu()) return;
  test::check_gguf_moe_gemm_ragged(cpu::lowbit::kAll, [](ExtType t, int64_t rows, int64_t cols, uint64_t seed) { return make(t, rows, cols, seed); }, name, 1700);
}

namespace {

// Logits of a prompt (every position, one step) and then of `steps` decode
// steps fed the ids that follow in `ids` (teacher-forced), one row per position.
std::vector<std::vector<float>> run_rows(Model& m, const std::vector<int32_t>& ids, size_t prompt) {
  const int64_t V = m.config().vocab_size;
  KvCache kv(m.kv_layout(), static_cast<int64_t>(ids.size()) / 16 + 2, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, static_cast<int64_t>(ids.size()));
  Batch b;
  for (size_t i = 0; i < prompt; ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < prompt; ++i) rows.emplace_back(logits.begin() + static_cast<int64_t>(i) * V, logits.begin() + static_cast<int64_t>(i + 1) * V);
  for (size_t i = prompt; i < ids.size(); ++i) {
    b.clear();
    b.add(ids[i], seq, static_cast<int64_t>(i), true);
    m.forward(b, kv, logits);
    rows.emplace_back(logits.begin(), logits.begin() + V);
  }
  return rows;
}

}  // namespace

// The model test's data, on the CPU alone (runs without a GPU): each file
// loads, its logits are finite and most positions have a clear top-1.
TEST_CASE("gpu gguf low-bit: the deepseek2 test files load on the CPU with clear top-1 margins") {
  test::TempDir dir("gguf-lowbit-ds2-cpu");
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(static_cast<int32_t>((i * 131 + 7) % 512));
  for (ExtType t : cpu::lowbit::kAll) {
    INFO(name(t));
    const std::string path = dir.str() + "/m.gguf";
    test::write_file(path, qtools::deepseek2_lowbit_gguf(t, static_cast<ExtType>(0), 3 + static_cast<uint64_t>(t)).bytes());
    std::vector<std::string> args = {"--device", "cpu", "--progress", "none"};
    auto m = Model::load(path, Settings::load(args));
    CHECK(m->config().model_type == "deepseek_v3");
    const int64_t V = m->config().vocab_size;
    REQUIRE(V == 512);
    const auto lg = test::prompt_logits(*m, ids);
    int clear = 0, finite = 1;
    std::vector<int32_t> tops;
    for (size_t p = 0; p < ids.size(); ++p) {
      std::vector<int32_t> top;
      std::vector<float> tv;
      top_k(lg.data() + p * V, V, 2, top, tv);
      clear += tv[0] - tv[1] > 0.5f;
      if (std::find(tops.begin(), tops.end(), top[0]) == tops.end()) tops.push_back(top[0]);
      for (int64_t v = 0; v < V; ++v) finite &= std::isfinite(lg[p * V + v]) ? 1 : 0;
    }
    MESSAGE(name(t) << ": " << clear << " of " << ids.size() << " positions with a top-1 margin over 0.5; " << tops.size() << " distinct top-1 ids");
    CHECK(finite == 1);
    CHECK(clear * 2 >= static_cast<int>(ids.size()));
    CHECK(tops.size() >= 8);  // the top-1 follows the input: agreement on it is informative
  }
}

// hmoe plan / placement: resident low-bit experts count as the file's bytes
// (the GPU holds them as stored), not as bf16.
TEST_CASE("gpu gguf low-bit: the plan counts resident low-bit experts at their stored bytes") {
  test::TempDir dir("gguf-lowbit-plan");
  struct Case {
    ExtType type, down;
    double bytes_per_weight;
  };
  for (Case c : {Case{cpu::lowbit::iq2_xxs, static_cast<ExtType>(0), 66.0 / 256}, Case{cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs, (50.0 + 50.0 + 66.0) / 768},
                 Case{cpu::lowbit::mxfp4, static_cast<ExtType>(0), 17.0 / 32}}) {
    INFO(name(c.type));
    const std::string path = dir.str() + "/m.gguf";
    test::write_file(path, qtools::deepseek2_lowbit_gguf(c.type, c.down).bytes());
    const ModelConfig mc = gguf_model_config(*io::GgufFile::open(path));
    CHECK(mc.expert_bytes_per_weight == doctest::Approx(c.bytes_per_weight));
    CHECK(mc.gpu_expert_bytes_per_weight == doctest::Approx(c.bytes_per_weight));
    std::vector<std::string> args = {"--gpu-resident-moe-layers", "all"};
    const Settings st = Settings::load(args);
    GpuTarget gpu;
    gpu.total_bytes = 24ull << 30;
    const Plan p = make_plan(mc, st, gpu);
    CHECK(p.resident_moe_layers() == 2);
    const double expert_weights = 2.0 * 4 * 3 * 256 * 256;
    CHECK(static_cast<double>(p.gpu_expert_bytes) == doctest::Approx(expert_weights * c.bytes_per_weight).epsilon(0.01));
  }
}

TEST_CASE("gpu gguf low-bit: deepseek2 GGUF files of each type with every layer on the GPU give the CPU path's top-1") {
  if (!test::have_gpu()) return;
  test::TempDir dir("gpu-gguf-lowbit-ds2");
  struct File {
    std::string label;
    ExtType type, down;
  };
  std::vector<File> files;
  for (ExtType t : cpu::lowbit::kAll) files.push_back({name(t), t, static_cast<ExtType>(0)});
  files.push_back({"MIXED (IQ1_S experts, IQ2_XXS down)", cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs});
  // Prompt A: 100 tokens (prefill over 64 tokens: the grouped expert product, dequant + cuBLAS dense),
  // then 8 decode steps; prompt B: 40 tokens (the decode-sized kernels in one pass).
  std::vector<int32_t> a, bp;
  for (int i = 0; i < 108; ++i) a.push_back(static_cast<int32_t>((i * 131 + 7) % 512));
  for (int i = 0; i < 40; ++i) bp.push_back(static_cast<int32_t>((i * 71 + 300) % 512));
  for (const File& f : files) {
    INFO(f.label);
    const std::string path = dir.str() + "/m.gguf";
    test::write_file(path, qtools::deepseek2_lowbit_gguf(f.type, f.down, 3 + static_cast<uint64_t>(f.type)).bytes());
    auto load = [&](const std::string& device, bool quant_experts) {
      std::vector<std::string> args = {"--device", device, "--gpu-resident-moe-layers", "all", "--progress", "none", "--gpu-quantized-experts",
                                       quant_experts ? "1" : "0"};
      return Model::load(path, Settings::load(args));
    };
    auto mc = load("cpu", true), mg = load("cuda", true);
    REQUIRE(mg->gpu() != nullptr);
    const int64_t V = mc->config().vocab_size;
    int checked = 0, agreed = 0;
    std::vector<float> all_c, all_g;
    for (int pass = 0; pass < 2; ++pass) {
      const auto& ids = pass == 0 ? a : bp;
      const size_t prompt = pass == 0 ? 100 : ids.size();
      const auto rc = run_rows(*mc, ids, prompt), rg = run_rows(*mg, ids, prompt);
      REQUIRE(rc.size() == rg.size());
      for (size_t p = 0; p < rc.size(); ++p) {
        all_c.insert(all_c.end(), rc[p].begin(), rc[p].end());
        all_g.insert(all_g.end(), rg[p].begin(), rg[p].end());
        std::vector<int32_t> top;
        std::vector<float> tv;
        top_k(rc[p].data(), V, 2, top, tv);
        if (tv[0] - tv[1] <= 0.5f) continue;
        ++checked;
        const int32_t mine = argmax(rg[p].data(), V);
        agreed += mine == top[0];
        if (mine != top[0]) MESSAGE(f.label << ": pass " << pass << " position " << p << ": GPU top-1 " << mine << ", CPU " << top[0] << " (margin " << tv[0] - tv[1] << ")");
      }
    }
    const double rel = test::rel_error(all_g, all_c);
    MESSAGE(f.label << ": GPU weight bytes " << mg->gpu()->weight_bytes() << "; top-1 agreement with the CPU " << agreed << "/" << checked
                    << " where its margin > 0.5; rel. logit error " << rel);
    CHECK(checked >= 30);
    // Near-tied group routing (bf16 router scores and int8 activations on either side) may pick another
    // expert group at a position or two; a wrong code or scale would disagree almost everywhere.
    CHECK(agreed * 100 >= checked * 90);
    CHECK(rel < 0.15);
    if (f.down != static_cast<ExtType>(0)) {  // the experts held as stored take less than bf16 ones
      auto mb = load("cuda", false);
      CHECK(mg->gpu()->weight_bytes() < mb->gpu()->weight_bytes());
    }
  }
}

// llama.cpp's own deepseek2 files per low-bit type (tests/fixtures/README.md,
// llamacpp_deepseek2_reference.json; made with the reference by
// tests/fixtures/gen/llamacpp_deepseek2.sh, not checked in; a file whose
// SHA-256 is not the reference's fails, naming it): where they are,
// every layer on the GPU must give the CPU path's top-1 where the CPU's
// margin > 0.5, and llama.cpp's top-1 as often as the CPU path is required
// to (85% of the positions where llama.cpp's margin > 0.5; its routing
// near-ties, see tests/engine/test_gguf_llamacpp_ds2.cpp).
TEST_CASE("gpu gguf low-bit: llama.cpp's deepseek2 files per type on the GPU agree with the CPU path and llama.cpp") {
  if (!test::have_gpu()) return;
  const std::string ref_path = test::fixture_ref("llamacpp_deepseek2_reference.json");
  if (!std::filesystem::exists(ref_path)) {
    MESSAGE("SKIP: no " << ref_path);
    return;
  }
  const auto ref = nlohmann::json::parse(test::read_file(ref_path));
  const auto prompts = ref["prompts"].get<std::vector<std::vector<int32_t>>>();
  int files_run = 0;
  for (const auto& file : ref["files"]) {
    const std::string label = file["label"];
    const std::string path = test::fixture_ref("llamacpp-ds2/" + label + ".gguf");
    if (!std::filesystem::exists(path)) continue;
    INFO(label);
    if (file.contains("sha256") && test::file_sha256(path) != file["sha256"].get<std::string>()) {
      FAIL_CHECK(path << " is not the file llama.cpp's logits were computed on (tests/fixtures/gen/llamacpp_deepseek2.sh makes both)");
      continue;
    }
    auto load = [&](const std::string& device) {
      std::vector<std::string> args = {"--device", device, "--gpu-resident-moe-layers", "all", "--progress", "none"};
      return Model::load(path, Settings::load(args));
    };
    auto mc = load("cpu"), mg = load("cuda");
    REQUIRE(mg->gpu() != nullptr);
    const int64_t V = mc->config().vocab_size;
    int cpu_checked = 0, cpu_agreed = 0, ll_checked = 0, ll_agreed = 0;
    for (size_t c = 0; c < prompts.size(); ++c) {
      const auto lc = test::prompt_logits(*mc, prompts[c]), lg = test::prompt_logits(*mg, prompts[c]);
      for (size_t p = 0; p < prompts[c].size(); ++p) {
        const float* rc = lc.data() + p * V;
        const float* rg = lg.data() + p * V;
        std::vector<int32_t> top;
        std::vector<float> tv;
        top_k(rc, V, 2, top, tv);
        const int32_t mine = argmax(rg, V);
        if (tv[0] - tv[1] > 0.5f) ++cpu_checked, cpu_agreed += mine == top[0];
        const auto& pos = file["chats"][c]["positions"][p];
        const auto vals = pos["logits"].get<std::vector<double>>();
        if (vals[0] - vals[1] > 0.5) ++ll_checked, ll_agreed += mine == pos["ids"][0].get<int32_t>();
      }
    }
    MESSAGE(label << " on the GPU: top-1 as the CPU path " << cpu_agreed << "/" << cpu_checked << ", as llama.cpp " << ll_agreed << "/" << ll_checked);
    CHECK(cpu_checked > 10);
    CHECK(cpu_agreed * 100 >= cpu_checked * 90);
    CHECK(ll_agreed * 100 >= ll_checked * 85);
    ++files_run;
  }
  if (files_run == 0) MESSAGE("SKIP: no llama.cpp deepseek2 GGUF files under " << test::fixture_ref("llamacpp-ds2") << " (tests/fixtures/README.md)");
}
