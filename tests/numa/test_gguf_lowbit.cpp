// The low-bit ggml types (numa/quant_gguf_lowbit.h): dequantization bit for
// bit against gguf-py's reference dequantizer (tests/fixtures/
// gguf_lowbit_reference.json, made by tests/fixtures/gen/
// gguf_lowbit_reference.py), the AVX-512 decoder against the scalar codes,
// the exact and the int8 products of every ISA against plain double sums on
// random blocks, the AVX-512 int8 kernels v1, v2, v3 and v4 on row and
// token tails (every type, IQ2_S included) and the dispatcher with v4 on and
// off, the AVX2 kernels (v2 on the file's blocks for every type but IQ1_S,
// v3 repacked; IQ1_M's v3 at 1-5 and 8 tokens on odd row counts) on row and
// token tails, the threaded cpu::gemm, and the shape errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "configs/error.h"
#include "io/dtype.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "numa/quant_gguf_lowbit.h"
#include "numa/quant_gguf_q8.h"
#include "numa/thread_pool.h"
#include "tests/test_util.h"

using namespace hmoe;
using cpu::ExtType;

namespace {

std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return out;
}

const cpu::ExtTypeInfo& info(ExtType t) { return *cpu::lowbit_type_info(static_cast<uint32_t>(t)); }

// Random blocks with finite fp16 scales (as the generator of the reference makes them).
std::vector<uint8_t> random_blocks(ExtType t, int64_t nblocks, uint32_t seed) {
  const auto& ti = info(t);
  std::mt19937 g(seed);
  std::vector<uint8_t> b(static_cast<size_t>(nblocks * ti.block_bytes));
  for (auto& v : b) v = static_cast<uint8_t>(g());
  std::uniform_real_distribution<float> ex(-10.0f, 1.0f);
  auto half = [&] {
    const float m = std::exp2(ex(g)) * ((g() & 1) ? -1.0f : 1.0f);
    return f32_to_f16(m);
  };
  auto put = [&](uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); };
  const uint32_t id = static_cast<uint32_t>(t);
  for (int64_t i = 0; i < nblocks; ++i) {
    uint8_t* p = b.data() + i * ti.block_bytes;
    if (id == 10) put(p + 80, half()), put(p + 82, half());
    else if (id == 11) put(p + 108, half());
    else if (id == 29) {
      const uint16_t d = half();
      for (int k = 0; k < 4; ++k) {
        uint16_t s;
        std::memcpy(&s, p + 48 + 2 * k, 2);
        s = static_cast<uint16_t>((s & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12));
        std::memcpy(p + 48 + 2 * k, &s, 2);
      }
    } else if (id == 39) p[0] = static_cast<uint8_t>(100 + g() % 51);
    else put(p, half());
  }
  return b;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  for (size_t i = 0; i < n; i += 97) v[i] *= 8.0f;
  return v;
}

// x (n tokens of w.cols) quantized into a for w, and per (token j, row r) the
// sum over k of |w[r, k] a[j, k]|: the scale of a row product's rounding.
std::vector<double> quantize_with_absdot(const cpu::Mat& w, const std::vector<float>& x, int64_t n, cpu::Q8Acts& a) {
  const int64_t rows = w.rows, cols = w.cols;
  a.reset(n, w);
  for (int64_t j = 0; j < n; ++j) a.quantize(j, x.data() + j * cols);
  std::vector<double> absdot(static_cast<size_t>(n * rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    cpu::ext_row_to_f32(w, r, row.data());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < cols; ++k)
        absdot[static_cast<size_t>(j * rows + r)] += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * a.value(j, k));
  }
  return absdot;
}

std::vector<cpu::Isa> isas() {
  std::vector<cpu::Isa> v{cpu::Isa::scalar};
  if (cpu::best_isa() != cpu::Isa::scalar) v.push_back(cpu::Isa::avx2);
  if (cpu::best_isa() == cpu::Isa::avx512) v.push_back(cpu::Isa::avx512);
  return v;
}

struct IsaGuard {
  cpu::Isa prev;
  explicit IsaGuard(cpu::Isa i) : prev(cpu::set_isa_for_testing(i)) {}
  ~IsaGuard() { cpu::set_isa_for_testing(prev); }
};

}  // namespace

TEST_CASE("low-bit GGUF types: dequantization equals gguf-py's reference bit for bit") {
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("gguf_lowbit_reference.json")));
  REQUIRE(ref["types"].size() == 12);
  for (const auto& e : ref["types"]) {
    const std::string name = e["name"];
    INFO(name);
    const auto t = static_cast<ExtType>(e["ggml_type"].get<uint32_t>());
    REQUIRE(cpu::lowbit_type(static_cast<uint32_t>(t)));
    REQUIRE(cpu::ggml_type_supported(static_cast<uint32_t>(t)));
    CHECK(info(t).name == name);
    CHECK(info(t).block_elems == e["block_elems"].get<int>());
    CHECK(info(t).block_bytes == e["block_bytes"].get<int>());
    const auto blocks = unhex(e["block_hex"]);
    const auto vbytes = unhex(e["values_hex"]);
    const int64_t nb = e["blocks"], be = info(t).block_elems;
    std::vector<float> want(vbytes.size() / 4);
    std::memcpy(want.data(), vbytes.data(), vbytes.size());
    REQUIRE(static_cast<int64_t>(want.size()) == nb * be);
    // As one row of nb blocks through the Quant::ext hook.
    const cpu::Mat w = cpu::ext_view(t, blocks.data(), 1, nb * be, "ref");
    std::vector<float> got(want.size());
    cpu::ext_row_to_f32(w, 0, got.data());
    int64_t bad = 0;
    for (size_t k = 0; k < want.size(); ++k)
      if (!(got[k] == want[k])) {  // exact (the sign of a zero aside)
        if (bad++ < 5) FAIL_CHECK("value " << k << ": got " << got[k] << ", gguf-py " << want[k]);
      }
    CHECK(bad == 0);
    CHECK(cpu::ext_weight_at(w, 0, nb * be - 3) == want[want.size() - 3]);
  }
}

TEST_CASE("low-bit GGUF types: the AVX-512 decoder gives the scalar codes, scales and offsets") {
  if (!(cpu::best_isa() == cpu::Isa::avx512 && cpu::detail::lowbit_has_avx512_vnni())) {
    MESSAGE("no AVX-512 VNNI here: decoder not checked");
    return;
  }
  for (ExtType t : cpu::lowbit::kAll) {
    INFO(std::string(info(t).name));
    const int64_t per = 256 / info(t).block_elems;
    const auto b = random_blocks(t, per * 6, static_cast<uint32_t>(t) * 13u);
    for (int64_t gi = 0; gi < 6; ++gi) {
      const uint8_t* p = b.data() + gi * per * info(t).block_bytes;
      int8_t code[256];
      float s[16], o[16];
      for (int64_t i = 0; i < per; ++i) cpu::lowbit_block_codes(t, p + i * info(t).block_bytes, code + i * info(t).block_elems,
                                                                 s + i * info(t).block_elems / 16, o + i * info(t).block_elems / 16);
      uint8_t uc[256];
      float vs[16], vo[16];
      cpu::detail::lowbit_decode256_avx512(t, p, uc, vs, vo);
      int bad = 0;
      for (int k = 0; k < 256; ++k) {
        const int v = (uc[k] & 0x80) ? -(uc[k] & 0x7F) : uc[k];
        if (v != code[k] && bad++ < 3) FAIL_CHECK("group " << gi << " weight " << k << ": " << v << " vs " << int(code[k]));
      }
      for (int j = 0; j < 16; ++j) {
        CHECK(vs[j] == s[j]);
        CHECK(vo[j] == o[j]);
      }
    }
  }
}

TEST_CASE("low-bit GGUF types: exact and int8 products of every ISA against double sums") {
  for (ExtType t : cpu::lowbit::kAll) {
    INFO(std::string(info(t).name));
    const int64_t be = info(t).block_elems;
    for (int64_t cols : {int64_t{256}, int64_t{768}, be == 32 ? int64_t{96} : int64_t{512}}) {
      const int64_t rows = 13;
      const auto bytes = random_blocks(t, rows * cols / be, static_cast<uint32_t>(cols) + static_cast<uint32_t>(t));
      const cpu::Mat w = cpu::ext_view(t, bytes.data(), rows, cols, "w");
      const int64_t n = 5;
      const auto x = randn(static_cast<size_t>(n * cols), static_cast<uint32_t>(cols * 3));
      std::vector<float> row(static_cast<size_t>(cols));
      std::vector<double> exact(static_cast<size_t>(n * rows)), absdot(exact.size());
      for (int64_t r = 0; r < rows; ++r) {
        cpu::ext_row_to_f32(w, r, row.data());
        for (int64_t j = 0; j < n; ++j)
          for (int64_t k = 0; k < cols; ++k) {
            const double p = static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(j * cols + k)];
            exact[static_cast<size_t>(j * rows + r)] += p;
            absdot[static_cast<size_t>(j * rows + r)] += std::fabs(p);
          }
      }
      for (cpu::Isa isa : isas()) {
        IsaGuard guard(isa);
        INFO("isa " << cpu::isa_name(isa) << " cols " << cols);
        std::vector<float> y(exact.size(), NAN);
        cpu::gemm_rows(x.data(), cols, n, w, 0, rows, y.data(), rows);
        for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - exact[i]) <= 1e-5 * absdot[i] + 1e-6);
        if (isa == cpu::Isa::scalar || cols % 256 != 0) {
          if (isa != cpu::Isa::scalar) CHECK_FALSE(cpu::gguf_q8_applies(w));
          continue;
        }
        REQUIRE(cpu::gguf_q8_applies(w));
        cpu::Q8Acts a;
        a.reset(n + 1, w);
        for (int64_t j = 0; j < n + 1; ++j) a.quantize(j, x.data() + ((j + n - 1) % n) * cols);  // row 1.. = x rows 0..
        std::vector<float> ref(exact.size()), got(exact.size(), NAN);
        cpu::gemm_rows_q8_reference(a, 1, n, w, 2, rows, ref.data(), rows);
        cpu::gemm_rows_q8(a, 1, n, w, 2, rows, got.data(), rows);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t r = 2; r < rows; ++r) {
            const size_t i = static_cast<size_t>(j * rows + r);
            CHECK(std::fabs(got[i] - ref[i]) <= 2e-5 * absdot[i] + 1e-5);
            // activation rounding: |x - xq| <= d / 2 per element, d = max|x| / 127 per 256
            CHECK(std::fabs(got[i] - exact[i]) <= 0.05 * absdot[i] + 1e-4);
          }
      }
    }
  }
}

TEST_CASE("low-bit GGUF types: threaded cpu::gemm on both paths; bad shapes are errors") {
  numa::ThreadPool pool(2);
  for (ExtType t : {cpu::lowbit::iq2_xxs, cpu::lowbit::iq2_s, cpu::lowbit::q3_k, cpu::lowbit::mxfp4}) {
    INFO(std::string(info(t).name));
    const int64_t rows = 70, cols = 512, n = 3;
    const auto bytes = random_blocks(t, rows * cols / info(t).block_elems, 7);
    const cpu::Mat w = cpu::ext_view(t, bytes.data(), rows, cols, "w");
    const auto x = randn(static_cast<size_t>(n * cols), 9);
    std::vector<float> y1(static_cast<size_t>(n * rows)), y2(y1.size()), ye(y1.size());
    cpu::gemm_rows(x.data(), cols, n, w, 0, rows, ye.data(), rows);
    cpu::GemmOptions exact, int8;
    exact.gguf_int8 = false;
    int8.gguf_int8 = true;
    cpu::gemm(x.data(), n, w, y1.data(), &pool, exact);
    cpu::gemm(x.data(), n, w, y2.data(), &pool, int8);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      cpu::ext_row_to_f32(w, r, row.data());
      for (int64_t j = 0; j < n; ++j) {
        double absdot = 0;
        for (int64_t k = 0; k < cols; ++k) absdot += std::fabs(static_cast<double>(row[static_cast<size_t>(k)]) * x[static_cast<size_t>(j * cols + k)]);
        const size_t i = static_cast<size_t>(j * rows + r);
        CHECK(std::fabs(y1[i] - ye[i]) <= 1e-5 * absdot);
        CHECK(std::fabs(y2[i] - ye[i]) <= 0.05 * absdot);
      }
    }
  }
  std::vector<uint8_t> b(1000);
  CHECK_THROWS_AS(cpu::ext_view(cpu::lowbit::iq2_s, b.data(), 1, 300, "w"), Error);
  CHECK_THROWS_WITH(cpu::ext_view(cpu::lowbit::iq4_nl, b.data(), 1, 40, "blk.0.ffn_down"),
                    doctest::Contains("blk.0.ffn_down: 40 columns are not a multiple of the IQ4_NL block (32)"));
}

TEST_CASE("low-bit GGUF types: the AVX-512 int8 kernels v1, v2 (VBMI), v3 (grid planes) and v4 (grid codes) on row and token tails") {
  if (!(cpu::best_isa() == cpu::Isa::avx512 && cpu::detail::lowbit_has_avx512_vnni())) {
    MESSAGE("no AVX-512 VNNI here: not checked");
    return;
  }
  const bool vbmi = cpu::detail::lowbit_has_avx512_vbmi();
  if (!vbmi) MESSAGE("no AVX-512 VBMI here: v2 not checked");
  const bool planes = vbmi;
  const bool v4cpu = __builtin_cpu_supports("avx512bitalg") && __builtin_cpu_supports("gfni");
  if (vbmi && !v4cpu) MESSAGE("no AVX-512 BITALG or GFNI here: v4 not checked");
  for (ExtType t : cpu::lowbit::kAll) {
    INFO(std::string(info(t).name));
    const int64_t rows = 11, cols = 1024, be = info(t).block_elems;
    const auto bytes = random_blocks(t, rows * cols / be, static_cast<uint32_t>(t) * 7u + 1u);
    const cpu::Mat w = cpu::ext_view(t, bytes.data(), rows, cols, "w");
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}}) {
      INFO("tokens " << n);
      const auto x = randn(static_cast<size_t>(n * cols), static_cast<uint32_t>(n * 31 + 5));
      cpu::Q8Acts a;
      const std::vector<double> absdot = quantize_with_absdot(w, x, n, a);
      std::vector<float> ref(absdot.size()), v1(absdot.size(), NAN), v2(absdot.size(), NAN), v3(absdot.size(), NAN), v4(absdot.size(), NAN);
      cpu::gemm_rows_q8_reference(a, 0, n, w, 0, rows, ref.data(), rows);
      cpu::detail::lowbit_rows_q8_avx512(a, 0, n, w, 0, rows, v1.data(), rows);
      if (vbmi) cpu::detail::lowbit_rows_q8_vbmi(a, 0, n, w, 0, rows, v2.data(), rows);
      // v3 serves IQ3_XXS, and IQ2_XXS from 2 tokens; rows 0..4 and 4..11 (pairs with an odd tail, a start past 0)
      const bool v3on = planes && cpu::detail::lowbit_rows_q8_planes(a, 0, n, w, 0, 4, v3.data(), rows);
      if (v3on) CHECK(cpu::detail::lowbit_rows_q8_planes(a, 0, n, w, 4, rows, v3.data(), rows));
      if (planes) CHECK(v3on == ((t == cpu::lowbit::iq2_xxs && n >= 2) || t == cpu::lowbit::iq3_xxs));
      // v4 (grid codes): rows 0..3 and 3..11 (an odd pair tail and an odd start for IQ2_XXS's row pairs)
      const bool v4on = vbmi && cpu::detail::lowbit_rows_q8_codes(a, 0, n, w, 0, 3, v4.data(), rows);
      if (v4on) CHECK(cpu::detail::lowbit_rows_q8_codes(a, 0, n, w, 3, rows, v4.data(), rows));
      if (vbmi && v4cpu)
        CHECK(v4on == (t == cpu::lowbit::iq1_s || (t == cpu::lowbit::iq1_m && n >= 2) || t == cpu::lowbit::iq2_xxs || t == cpu::lowbit::iq2_xs ||
                      t == cpu::lowbit::iq2_s || t == cpu::lowbit::iq3_xxs || t == cpu::lowbit::iq3_s));
      // the dispatcher with v4 on and off (benchmarks turn it off to compare)
      std::vector<float> on(absdot.size(), NAN), off(absdot.size(), NAN);
      cpu::gemm_rows_q8(a, 0, n, w, 0, rows, on.data(), rows);
      const bool prev = cpu::detail::lowbit_set_codes_for_testing(false);
      cpu::gemm_rows_q8(a, 0, n, w, 0, rows, off.data(), rows);
      CHECK_FALSE(cpu::detail::lowbit_set_codes_for_testing(prev));
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double tol = 2e-5 * absdot[i] + 1e-5;
        if (!(std::fabs(v1[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("v1 " << i << ": " << v1[i] << " vs " << ref[i]);
        if (vbmi && !(std::fabs(v2[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("v2 " << i << ": " << v2[i] << " vs " << ref[i]);
        if (v3on && !(std::fabs(v3[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("v3 " << i << ": " << v3[i] << " vs " << ref[i]);
        if (v4on && !(std::fabs(v4[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("v4 " << i << ": " << v4[i] << " vs " << ref[i]);
        if (!(std::fabs(on[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("dispatch, v4 on " << i << ": " << on[i] << " vs " << ref[i]);
        if (!(std::fabs(off[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("dispatch, v4 off " << i << ": " << off[i] << " vs " << ref[i]);
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("low-bit GGUF types: IQ1_S and IQ1_M repacked into trits (v5) against the reference on row and token tails") {
  const int64_t cols = 1280;  // 5 groups: the kernel's group pairs and a single tail group
  if (!cpu::detail::lowbit_ternary_applies(static_cast<uint32_t>(cpu::lowbit::iq1_s), cols)) {
    MESSAGE("no AVX-512 VNNI + VBMI + GFNI here: v5 not checked");
    return;
  }
  CHECK_FALSE(cpu::detail::lowbit_ternary_applies(static_cast<uint32_t>(cpu::lowbit::iq2_xxs), cols));
  CHECK_FALSE(cpu::detail::lowbit_ternary_applies(static_cast<uint32_t>(cpu::lowbit::iq1_s), 300));
  for (ExtType t : {cpu::lowbit::iq1_s, cpu::lowbit::iq1_m}) {
    INFO(std::string(info(t).name));
    CHECK(cpu::detail::lowbit_ternary_applies(static_cast<uint32_t>(t), cols));
    const int64_t rows = 13, rb = static_cast<int64_t>(cpu::detail::lowbit_ternary_row_bytes(static_cast<uint32_t>(t), cols));
    CHECK(rb == 5 * (t == cpu::lowbit::iq1_s ? 58 : 66));
    const auto bytes = random_blocks(t, rows * cols / 256, 1234u + static_cast<uint32_t>(t));
    const cpu::Mat w = cpu::ext_view(t, bytes.data(), rows, cols, "w");
    // packed in two calls (rows 0..5, 5..13), the padding after the last row poisoned
    std::vector<uint8_t> packed(static_cast<size_t>(rows * rb) + cpu::detail::kLowbitTernaryPad, 0xA5);
    cpu::detail::lowbit_ternary_pack(w, 0, 5, packed.data());
    cpu::detail::lowbit_ternary_pack(w, 5, rows, packed.data() + 5 * rb);
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}}) {
      INFO("tokens " << n);
      const auto x = randn(static_cast<size_t>(n * cols), static_cast<uint32_t>(n * 17 + 3));
      cpu::Q8Acts a;
      const std::vector<double> absdot = quantize_with_absdot(w, x, n, a);
      std::vector<float> ref(absdot.size()), got(absdot.size(), NAN);
      cpu::gemm_rows_q8_reference(a, 0, n, w, 0, rows, ref.data(), rows);
      // rows 0..4 and 4..13: a start past 0
      cpu::detail::lowbit_rows_q8_ternary(a, 0, n, packed.data(), cols, 0, 4, got.data(), rows);
      cpu::detail::lowbit_rows_q8_ternary(a, 0, n, packed.data(), cols, 4, rows, got.data(), rows);
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        CHECK(absdot[i] > 0);
        if (!(std::fabs(got[i] - ref[i]) <= 2e-5 * absdot[i] + 1e-5) && bad++ < 3) FAIL_CHECK("v5 " << i << ": " << got[i] << " vs " << ref[i]);
      }
      CHECK(bad == 0);
    }
  }
}

// E random experts (gate and up of type tu, down of td; H x I) in an ExpertEngine with the low-bit repack on, against
// one on the file's blocks (cpu_lowbit_repack off): the repacked bytes are want (plus at most a line of padding per
// slice and node), the outputs equal up to the order of fp32 sums (the same integer sums) at each token count.
void check_repacked_engine(ExtType tu, ExtType td, int64_t E, numa::NodePools& pools, uint64_t want, std::initializer_list<int64_t> tokens) {
  const int64_t H = 512, I = 768, K = 2;
  INFO(info(tu).name << " / " << info(td).name);
  std::vector<std::vector<uint8_t>> store;
  std::vector<numa::ExpertWeights> ex;
  for (int64_t e = 0; e < E; ++e) {
    store.push_back(random_blocks(tu, I * H / 256, static_cast<uint32_t>(10 * e + 1)));
    store.push_back(random_blocks(tu, I * H / 256, static_cast<uint32_t>(10 * e + 2)));
    store.push_back(random_blocks(td, H * I / 256, static_cast<uint32_t>(10 * e + 3)));
  }
  for (int64_t e = 0; e < E; ++e)
    ex.push_back({cpu::ext_view(tu, store[static_cast<size_t>(3 * e)].data(), I, H, "gate"),
                  cpu::ext_view(tu, store[static_cast<size_t>(3 * e + 1)].data(), I, H, "up"),
                  cpu::ext_view(td, store[static_cast<size_t>(3 * e + 2)].data(), H, I, "down")});
  numa::EngineOptions on, off;
  on.print_memory = off.print_memory = false;
  off.lowbit_repack = false;
  numa::ExpertEngine ep(ex, pools, on), ef(ex, pools, off);
  CHECK(ep.packed_bytes() >= want);
  CHECK(ep.packed_bytes() <= want + static_cast<uint64_t>(E * 3 * pools.nodes()) * 128);
  CHECK(ef.packed_bytes() == 0);
  for (int64_t n : tokens) {
    const auto x = randn(static_cast<size_t>(n * H), static_cast<uint32_t>(n + 40));
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    std::vector<float> wts(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 3 + i / 2) % E), wts[i] = 0.3f + 0.1f * static_cast<float>(i % 3);
    std::vector<float> a(static_cast<size_t>(n * H), 0.0f), b = a;
    ep.forward(x.data(), n, ids.data(), wts.data(), K, a.data());
    ef.forward(x.data(), n, ids.data(), wts.data(), K, b.data());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i)
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i]))), scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    INFO("tokens " << n << " max diff " << diff << " of max " << scale);
    CHECK(scale > 0);
    CHECK(diff <= 1e-4 * scale);  // the same integer sums; fp32 sums in another order
  }
}

numa::NodePools two_threads(const char* topology = "") {
  numa::PoolOptions po;
  po.topology = topology;
  po.threads = 2;
  po.quiet = true;
  return numa::NodePools(po);
}

TEST_CASE("low-bit GGUF types: ExpertEngine with IQ1_S / IQ1_M repacked (cpu_lowbit_repack) equals the file's blocks, on 1 and 2 nodes") {
  const int64_t E = 4, H = 512, I = 768;
  if (!cpu::detail::lowbit_ternary_applies(static_cast<uint32_t>(cpu::lowbit::iq1_s), H)) {
    MESSAGE("no AVX-512 VNNI + VBMI + GFNI here: the repack is not used");
    return;
  }
  // IQ1_S everywhere, IQ1_M gate/up with IQ1_S down, and IQ1_S gate/up with IQ2_XXS down (down stays the file's blocks)
  for (auto [tu, td] : {std::pair{cpu::lowbit::iq1_s, cpu::lowbit::iq1_s}, std::pair{cpu::lowbit::iq1_m, cpu::lowbit::iq1_s},
                        std::pair{cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs}}) {
    for (const char* topo : {"", "numa:2 core:1 pu:1"}) {
      INFO("topology '" << topo << "'");
      numa::NodePools pools = two_threads(topo);
      const uint64_t gb = tu == cpu::lowbit::iq1_s ? 58 : 66;
      const uint64_t want = static_cast<uint64_t>(E) * (2 * gb * I * H / 256 + (td == cpu::lowbit::iq1_s ? 58 * H * I / 256 : 0));
      check_repacked_engine(tu, td, E, pools, want, {1, 3});
    }
  }
}

TEST_CASE("low-bit GGUF types: the AVX2 kernels v2 (file's blocks: grid, codebook, K types, IQ1_M) and v3 (repacked) against the reference on row and token tails") {
  const int64_t cols = 1024, rows = 11;
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("bmi2")) {
    MESSAGE("no AVX2 + FMA + BMI2 here: not checked");
    return;
  }
  CHECK_FALSE(cpu::detail::lowbit_avx2_pack_applies(static_cast<uint32_t>(cpu::lowbit::q2_k), cols));
  CHECK_FALSE(cpu::detail::lowbit_avx2_pack_applies(static_cast<uint32_t>(cpu::lowbit::iq2_xxs), 300));
  for (ExtType t : cpu::lowbit::kAll) {
    INFO(std::string(info(t).name));
    const bool grid = t == cpu::lowbit::iq2_xxs || t == cpu::lowbit::iq2_xs || t == cpu::lowbit::iq2_s || t == cpu::lowbit::iq3_xxs || t == cpu::lowbit::iq3_s;
    const bool packs = grid || t == cpu::lowbit::iq1_s || t == cpu::lowbit::iq1_m;
    const bool nibble = t == cpu::lowbit::iq4_nl || t == cpu::lowbit::iq4_xs || t == cpu::lowbit::mxfp4;
    const bool kq = t == cpu::lowbit::q2_k || t == cpu::lowbit::q3_k;
    CHECK(cpu::detail::lowbit_avx2_pack_applies(static_cast<uint32_t>(t), cols) == packs);
    const auto bytes = random_blocks(t, rows * cols / info(t).block_elems, static_cast<uint32_t>(t) * 11u + 3u);
    const cpu::Mat w = cpu::ext_view(t, bytes.data(), rows, cols, "w");
    std::vector<uint8_t> packed;
    int64_t rb = 0;
    if (packs) {
      rb = static_cast<int64_t>(cpu::detail::lowbit_avx2_row_bytes(static_cast<uint32_t>(t), cols));
      CHECK(rb == 4 * (t == cpu::lowbit::iq2_xxs ? 102 : t == cpu::lowbit::iq2_xs || t == cpu::lowbit::iq2_s ? 106 : t == cpu::lowbit::iq1_s ? 70 : t == cpu::lowbit::iq1_m ? 82 : 134));
      // packed in two calls (rows 0..5, 5..11), the padding after the last row poisoned
      packed.assign(static_cast<size_t>(rows * rb) + cpu::detail::kLowbitTernaryPad, 0xA5);
      cpu::detail::lowbit_avx2_pack(w, 0, 5, packed.data());
      cpu::detail::lowbit_avx2_pack(w, 5, rows, packed.data() + 5 * rb);
    }
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{9}}) {
      INFO("tokens " << n);
      const auto x = randn(static_cast<size_t>(n * cols), static_cast<uint32_t>(n * 13 + 7));
      cpu::Q8Acts a;
      const std::vector<double> absdot = quantize_with_absdot(w, x, n, a);
      std::vector<float> ref(absdot.size()), v2(absdot.size(), NAN), v3(absdot.size(), NAN), v2n(absdot.size(), NAN);
      cpu::gemm_rows_q8_reference(a, 0, n, w, 0, rows, ref.data(), rows);
      // rows 0..3 and 3..11: a start past 0 (v2: the grid IQ types but IQ1_S)
      const bool v2on = cpu::detail::lowbit_rows_q8_avx2_grid(a, 0, n, w, 0, 3, v2.data(), rows);
      CHECK(v2on == grid);
      if (v2on) CHECK(cpu::detail::lowbit_rows_q8_avx2_grid(a, 0, n, w, 3, rows, v2.data(), rows));
      // the codebook types' v2: rows 0..5 and 5..11, and tokens 1.. of a second call from t0 = 1
      // (and Q2_K / Q3_K's, IQ1_M's)
      const auto v2more = nibble ? cpu::detail::lowbit_rows_q8_avx2_nibble
                          : t == cpu::lowbit::iq1_m ? cpu::detail::lowbit_rows_q8_avx2_iq1m
                                                    : cpu::detail::lowbit_rows_q8_avx2_kquant;
      const bool nibon = v2more(a, 0, n, w, 0, 5, v2n.data(), rows);
      CHECK(nibon == (nibble || kq || t == cpu::lowbit::iq1_m));
      if (nibon) {
        CHECK(v2more(a, 0, n, w, 5, rows, v2n.data(), rows));
        std::vector<float> tail(absdot.size(), NAN);
        if (n > 1) CHECK(v2more(a, 1, n - 1, w, 0, rows, tail.data() + rows, rows));
        for (size_t i = static_cast<size_t>(rows); i < tail.size(); ++i) CHECK(tail[i] == v2n[i]);
      }
      std::vector<float> disp(absdot.size(), NAN);
      cpu::lowbit_gemm_rows_q8(a, 0, n, w, 0, rows, disp.data(), rows);
      if (packs) {
        cpu::detail::lowbit_rows_q8_avx2_packed(a, 0, n, packed.data(), cols, 0, 4, v3.data(), rows);
        cpu::detail::lowbit_rows_q8_avx2_packed(a, 0, n, packed.data(), cols, 4, rows, v3.data(), rows);
      }
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        CHECK(absdot[i] > 0);
        const double tol = 2e-5 * absdot[i] + 1e-5;
        if (v2on && !(std::fabs(v2[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("AVX2 v2 " << i << ": " << v2[i] << " vs " << ref[i]);
        if (packs && !(std::fabs(v3[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("AVX2 v3 " << i << ": " << v3[i] << " vs " << ref[i]);
        if (nibon && !(std::fabs(v2n[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("AVX2 v2 codebook / K / IQ1_M " << i << ": " << v2n[i] << " vs " << ref[i]);
        if (!(std::fabs(disp[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("dispatch " << i << ": " << disp[i] << " vs " << ref[i]);
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("low-bit GGUF types: IQ1_M's AVX2 v3 (repacked) against the reference at 1-8 tokens, odd row counts and row starts") {
  const int64_t cols = 2048;
  const uint32_t id = static_cast<uint32_t>(cpu::lowbit::iq1_m);
  if (!cpu::detail::lowbit_avx2_pack_applies(id, cols)) {
    MESSAGE("no AVX2 + FMA + BMI2 + F16C here: not checked");
    return;
  }
  CHECK_FALSE(cpu::detail::lowbit_avx2_pack_applies(id, 1000));
  const int64_t rb = static_cast<int64_t>(cpu::detail::lowbit_avx2_row_bytes(id, cols));
  CHECK(rb == 8 * 82);
  for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{13}}) {
    INFO("rows " << rows);
    const auto bytes = random_blocks(cpu::lowbit::iq1_m, rows * cols / 256, static_cast<uint32_t>(rows) * 7u + 1u);
    const cpu::Mat w = cpu::ext_view(cpu::lowbit::iq1_m, bytes.data(), rows, cols, "w");
    // packed in two calls (none for rows [0, 0) at one row), nothing after the last row
    std::vector<uint8_t> packed(static_cast<size_t>(rows * rb), 0xA5);
    const int64_t split = rows / 2;
    cpu::detail::lowbit_avx2_pack(w, 0, split, packed.data());
    cpu::detail::lowbit_avx2_pack(w, split, rows, packed.data() + split * rb);
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}}) {
      INFO("tokens " << n);
      // the ends of the int8 range in every group
      auto x = randn(static_cast<size_t>(n * cols), static_cast<uint32_t>(n * 31 + rows));
      for (size_t i = 0; i < x.size(); i += 61) x[i] = (i / 61) % 2 ? 40.0f : -40.0f;
      cpu::Q8Acts a;
      const std::vector<double> absdot = quantize_with_absdot(w, x, n, a);
      std::vector<float> ref(absdot.size()), v3(absdot.size(), NAN), tail(absdot.size(), NAN);
      cpu::gemm_rows_q8_reference(a, 0, n, w, 0, rows, ref.data(), rows);
      // rows [0, split) and [split, rows); tokens 1.. again from t0 = 1
      cpu::detail::lowbit_rows_q8_avx2_packed(a, 0, n, packed.data(), cols, 0, split, v3.data(), rows);
      cpu::detail::lowbit_rows_q8_avx2_packed(a, 0, n, packed.data(), cols, split, rows, v3.data(), rows);
      if (n > 1) cpu::detail::lowbit_rows_q8_avx2_packed(a, 1, n - 1, packed.data(), cols, 0, rows, tail.data() + rows, rows);
      int bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double tol = 2e-5 * absdot[i] + 1e-5;
        if (!(std::fabs(v3[i] - ref[i]) <= tol) && bad++ < 3) FAIL_CHECK("IQ1_M AVX2 v3 " << i << ": " << v3[i] << " vs " << ref[i]);
        if (n > 1 && i >= static_cast<size_t>(rows) && !(tail[i] == v3[i]) && bad++ < 3) FAIL_CHECK("from t0 = 1, " << i << ": " << tail[i] << " vs " << v3[i]);
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("low-bit GGUF types: IQ2_XS / IQ2_S on an AVX-512 CPU repacked into the AVX2 layout (AMD's default) equal the file's blocks") {
  const int64_t E = 3, H = 512, I = 768;
  if (cpu::best_isa() != cpu::Isa::avx512 || !cpu::detail::lowbit_avx2_pack_applies(static_cast<uint32_t>(cpu::lowbit::iq2_xs), H)) {
    MESSAGE("not an AVX-512 CPU with AVX2 + BMI2: the layout choice does not arise");
    return;
  }
  const int was = cpu::detail::lowbit_set_avx2_layout_for_testing(1);
  numa::NodePools pools = two_threads();
  check_repacked_engine(cpu::lowbit::iq2_xs, cpu::lowbit::iq2_s, E, pools, static_cast<uint64_t>(E) * 3 * 106 * I * H / 256, {1, 3, 8});
  cpu::detail::lowbit_set_avx2_layout_for_testing(0);  // off: nothing of these types is repacked on AVX-512
  check_repacked_engine(cpu::lowbit::iq2_xs, cpu::lowbit::iq2_s, E, pools, 0, {1});
  cpu::detail::lowbit_set_avx2_layout_for_testing(was);
}

TEST_CASE("low-bit GGUF types: ExpertEngine with the grid IQ types repacked for AVX2 (cpu_lowbit_repack) equals the file's blocks") {
  const int64_t E = 3, H = 512, I = 768;
  if (cpu::best_isa() != cpu::Isa::avx2 || !cpu::detail::lowbit_avx2_pack_applies(static_cast<uint32_t>(cpu::lowbit::iq2_xxs), H)) {
    MESSAGE("not an AVX2 CPU: the AVX2 repack is not used");
    return;
  }
  numa::NodePools pools = two_threads();
  // IQ2_XXS everywhere, IQ2_XS gate/up with IQ2_S down, IQ2_XXS gate/up with IQ3_XXS down, IQ3_S gate/up with Q2_K down (the file's
  // blocks), IQ1_S gate/up with IQ2_XXS down (UD-IQ1_S-like), IQ1_M everywhere, IQ1_M gate/up with IQ1_S down
  for (auto [tu, td] : {std::pair{cpu::lowbit::iq2_xxs, cpu::lowbit::iq2_xxs}, std::pair{cpu::lowbit::iq2_xs, cpu::lowbit::iq2_s},
                        std::pair{cpu::lowbit::iq2_xxs, cpu::lowbit::iq3_xxs}, std::pair{cpu::lowbit::iq3_s, cpu::lowbit::q2_k},
                        std::pair{cpu::lowbit::iq1_s, cpu::lowbit::iq2_xxs}, std::pair{cpu::lowbit::iq1_m, cpu::lowbit::iq1_m},
                        std::pair{cpu::lowbit::iq1_m, cpu::lowbit::iq1_s}}) {
    auto gb = [](ExtType t) -> uint64_t {
      return t == cpu::lowbit::iq2_xxs ? 102 : t == cpu::lowbit::iq2_xs || t == cpu::lowbit::iq2_s ? 106 : t == cpu::lowbit::q2_k ? 0
             : t == cpu::lowbit::iq1_s ? 70 : t == cpu::lowbit::iq1_m ? 82 : 134;
    };
    check_repacked_engine(tu, td, E, pools, static_cast<uint64_t>(E) * (2 * gb(tu) * I * H / 256 + gb(td) * H * I / 256), {1, 3});
  }
}
