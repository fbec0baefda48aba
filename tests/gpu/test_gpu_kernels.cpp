// Every GPU kernel against the CPU reference (engine/ops, numa) on random
// data, with bf16 tolerances: inputs the GPU takes as bf16 are rounded to
// bf16 for the reference too, so the tolerance covers only bf16 outputs and
// fp32 summation order. Skips with a message where no GPU is present.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/ops/cpu_ops.h"
#include "numa/expert_engine.h"
#include "numa/kernels.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;
using test::bf16_of;
using test::bf16_round;

TEST_CASE("gpu kernels: a CPU-only build or a machine without a GPU says so") {
  if (gpu::device_count() > 0) return;
  MESSAGE("SKIP: no CUDA device (" << gpu::describe() << ")");
  CHECK_THROWS_AS(gpu::Stream(), Error);
  try {
    gpu::DeviceBuffer b(64);
    FAIL("allocation without a GPU did not throw");
  } catch (const Error& e) {
    CHECK((e.kind() == ErrorKind::unsupported || e.kind() == ErrorKind::device || e.kind() == ErrorKind::out_of_memory));
  }
}

TEST_CASE("gpu gemm (cuBLAS bf16 -> fp32) matches cpu::gemm_reference") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  gpu::Blas blas(s);
  for (auto [n, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 37, 64}, {5, 256, 512}, {33, 100, 2048}}) {
    auto x = bf16_round(test::random_floats(static_cast<size_t>(n * cols), 11 + n));
    auto w = bf16_of(test::random_floats(static_cast<size_t>(rows * cols), 12 + rows, 0.05f));
    std::vector<float> ref(static_cast<size_t>(n * rows));
    cpu::gemm_reference(x.data(), n, cpu::Mat{DType::bf16, w.data(), rows, cols}, ref.data());
    auto dx = test::to_device(bf16_of(x), s), dw = test::to_device(w, s);
    gpu::DeviceBuffer dy(static_cast<size_t>(n * rows) * 4);
    blas.gemm(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dy.as<float>(), rows);
    auto y = test::to_host<float>(dy, ref.size(), s);
    CHECK_MESSAGE(test::tol_ratio(y, ref, 1e-3, 1e-3) <= 1, "n=" << n << " rows=" << rows << " cols=" << cols);
  }
}

TEST_CASE("gpu gemm_add (y += x W^T) gives y0 + the product, and hi then lo of a split input the fp32 sum of the two products") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  gpu::Blas blas(s);
  for (auto [n, rows, cols, ldy] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 37, 64, 40}, {5, 256, 512, 256}, {33, 100, 2048, 130}}) {
    CAPTURE(n);
    CAPTURE(rows);
    const auto x = test::random_floats(static_cast<size_t>(n * cols), 61 + n, 2.0f);
    const auto w = bf16_of(test::random_floats(static_cast<size_t>(rows * cols), 62 + rows, 0.05f));
    const auto y0 = test::random_floats(static_cast<size_t>(n * ldy), 63, 4.0f);
    std::vector<float> prod(static_cast<size_t>(n * rows));
    cpu::gemm_reference(bf16_round(x).data(), n, cpu::Mat{DType::bf16, w.data(), rows, cols}, prod.data());
    std::vector<float> ref = y0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) ref[static_cast<size_t>(t * ldy + r)] += prod[static_cast<size_t>(t * rows + r)];
    auto dx = test::to_device(bf16_of(x), s), dw = test::to_device(w, s), dy = test::to_device(y0, s);
    blas.gemm_add(dx.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, dy.as<float>(), ldy);
    CHECK(test::tol_ratio(test::to_host<float>(dy, ref.size(), s), ref, 1e-3, 1e-3) <= 1);  // columns past rows untouched: y0's
    // A split input: gemm(hi) then gemm_add(lo) into one output equals the product over [hi; lo] with its halves added.
    auto dxf = test::to_device(x, s);
    gpu::DeviceBuffer hl(static_cast<size_t>(2 * n * cols * 2)), y2(static_cast<size_t>(2 * n * rows * 4)), sum(static_cast<size_t>(n * rows * 4));
    gpu::split_bf16(dxf.as<float>(), n * cols, hl.as<uint16_t>(), hl.as<uint16_t>() + n * cols, s);
    blas.gemm(hl.as<uint16_t>(), 2 * n, dw.as<uint16_t>(), rows, cols, y2.as<float>(), rows);
    gpu::add(y2.as<float>(), y2.as<float>() + n * rows, n * rows, y2.as<float>(), s);
    blas.gemm(hl.as<uint16_t>(), n, dw.as<uint16_t>(), rows, cols, sum.as<float>(), rows);
    blas.gemm_add(hl.as<uint16_t>() + n * cols, n, dw.as<uint16_t>(), rows, cols, sum.as<float>(), rows);
    const auto one = test::to_host<float>(y2, static_cast<size_t>(n * rows), s), two = test::to_host<float>(sum, static_cast<size_t>(n * rows), s);
    std::vector<float> exact(static_cast<size_t>(n * rows));
    cpu::gemm_reference(x.data(), n, cpu::Mat{DType::bf16, w.data(), rows, cols}, exact.data());
    // The same sum (cuBLAS may order its products differently per call), and x to about 16 bits (hi alone: ~1e-2 here).
    CHECK(test::tol_ratio(two, one, 1e-4, 1e-5) <= 1);
    CHECK(test::tol_ratio(two, exact, 2e-4, 1e-4) <= 1);
  }
}

TEST_CASE("gpu embedding and add_rms_norm match the CPU") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t V = 300, H = 320, n = 7;
  auto table = bf16_of(test::random_floats(static_cast<size_t>(V * H), 21));
  std::vector<int32_t> ids = {0, 299, 5, 5, 17, 123, 42};
  auto dt = test::to_device(table, s), di = test::to_device(ids, s);
  gpu::DeviceBuffer dx(static_cast<size_t>(n * H) * 4);
  gpu::embedding(dt.as<uint16_t>(), di.as<int32_t>(), n, H, dx.as<float>(), s);
  auto x = test::to_host<float>(dx, static_cast<size_t>(n * H), s);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < H; ++i) REQUIRE(x[static_cast<size_t>(t * H + i)] == bf16_to_f32(table[static_cast<size_t>(ids[t] * H + i)]));

  auto delta = test::random_floats(static_cast<size_t>(n * H), 22);
  auto w = bf16_of(test::random_floats(static_cast<size_t>(H), 23, 0.5f));
  auto dd = test::to_device(delta, s), dw = test::to_device(w, s);
  gpu::DeviceBuffer dy(static_cast<size_t>(n * H) * 2), dyf(static_cast<size_t>(n * H) * 4);
  gpu::add_rms_norm(dx.as<float>(), dd.as<float>(), nullptr, n, H, dw.as<uint16_t>(), 1e-6f, dy.as<uint16_t>(), dyf.as<float>(), s);
  std::vector<float> xr(x);
  for (size_t i = 0; i < xr.size(); ++i) xr[i] += delta[i];
  std::vector<float> ref(xr.size());
  ops::rms_norm(xr.data(), n, H, cpu::Mat{DType::bf16, w.data(), 1, H}, 1e-6, ref.data());
  CHECK(test::tol_ratio(test::to_host<float>(dx, xr.size(), s), xr, 1e-6, 1e-6) <= 1);
  CHECK(test::tol_ratio(test::to_host<float>(dyf, ref.size(), s), ref, 1e-5, 1e-4) <= 1);
  CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(dy, ref.size(), s)), ref, 1e-3, 8e-3) <= 1);

  // fp32 weights (Qwen3-Next's 1 + w): weights no bf16 holds, the fp32 output within fp32 rounding.
  {
    std::vector<float> wf = test::random_floats(static_cast<size_t>(H), 24, 0.1f);
    for (float& v : wf) v += 1.0f;
    auto dwf = test::to_device(wf, s);
    auto dx2 = test::to_device(xr, s);
    gpu::add_rms_norm(dx2.as<float>(), nullptr, nullptr, n, H, dwf.as<float>(), 1e-6f, dy.as<uint16_t>(), dyf.as<float>(), s);
    std::vector<float> ref2(xr.size());
    ops::rms_norm(xr.data(), n, H, cpu::Mat{DType::f32, wf.data(), 1, H}, 1e-6, ref2.data());
    CHECK(test::tol_ratio(test::to_host<float>(dyf, ref2.size(), s), ref2, 1e-5, 1e-5) <= 1);
    CHECK(test::tol_ratio(test::f32_of(test::to_host<uint16_t>(dy, ref2.size(), s)), ref2, 1e-3, 8e-3) <= 1);
  }

  // Gathered rows, no residual.
  std::vector<int32_t> rows = {6, 0, 3};
  auto dr = test::to_device(rows, s);
  gpu::add_rms_norm(dx.as<float>(), nullptr, dr.as<int32_t>(), 3, H, dw.as<uint16_t>(), 1e-6f, dy.as<uint16_t>(), dyf.as<float>(), s);
  auto g = test::to_host<float>(dyf, static_cast<size_t>(3 * H), s);
  for (int r = 0; r < 3; ++r)
    for (int64_t i = 0; i < H; i += 7)
      CHECK(std::fabs(g[static_cast<size_t>(r * H + i)] - ref[static_cast<size_t>(rows[static_cast<size_t>(r)] * H + i)]) <=
            1e-5 + 1e-4 * std::fabs(ref[static_cast<size_t>(rows[static_cast<size_t>(r)] * H + i)]));
}

TEST_CASE("gpu qk_norm_rope matches rms_norm + Rope for head dims 64, 128 and 256") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (int64_t hd : {64, 128, 256}) {
    const int64_t n = 5, heads = 3, ld = heads * hd + 16;
    auto x = test::random_floats(static_cast<size_t>(n * ld), 31 + hd);
    auto w = bf16_of(test::random_floats(static_cast<size_t>(hd), 32, 0.5f));
    std::vector<int32_t> pos = {0, 1, 17, 1000, 4095};
    ops::Rope rope(hd, 1e6);
    std::vector<float> ref(x);
    for (int64_t t = 0; t < n; ++t) {
      float* r = ref.data() + t * ld;
      ops::rms_norm(r, heads, hd, cpu::Mat{DType::bf16, w.data(), 1, hd}, 1e-6, r);
      rope.apply(r, heads, pos[static_cast<size_t>(t)]);
    }
    auto dx = test::to_device(x, s), dw = test::to_device(w, s), dp = test::to_device(pos, s), df = test::to_device(rope.inv_freq, s);
    gpu::qk_norm_rope(dx.as<float>(), n, ld, heads, hd, dw.as<uint16_t>(), 1e-6f, dp.as<int32_t>(), df.as<float>(), s);
    auto y = test::to_host<float>(dx, x.size(), s);
    CHECK_MESSAGE(test::tol_ratio(y, ref, 1e-4, 1e-4) <= 1, "hd=" << hd);
    for (int64_t t = 0; t < n; ++t)  // the padding after the heads is untouched
      for (int64_t i = heads * hd; i < ld; ++i) CHECK(y[static_cast<size_t>(t * ld + i)] == x[static_cast<size_t>(t * ld + i)]);
  }
}

TEST_CASE("gpu qkv_norm_rope_store equals qk_norm_rope on q and k heads plus kv_store") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (int64_t hd : {64, 128, 256}) {
    const int64_t n = 4, heads = 4, kvh = 2, ld = (heads + 2 * kvh) * hd + 8, width = kvh * hd, slots = 9;
    auto x = test::random_floats(static_cast<size_t>(n * ld), 51 + hd);
    auto wq = bf16_of(test::random_floats(static_cast<size_t>(hd), 52, 0.5f)), wk = bf16_of(test::random_floats(static_cast<size_t>(hd), 53, 0.5f));
    std::vector<int32_t> pos = {0, 3, 700, 4000}, slot = {7, 1, 4, 0};
    ops::Rope rope(hd, 1e6);
    auto dw = test::to_device(wq, s), dk = test::to_device(wk, s), dp = test::to_device(pos, s), df = test::to_device(rope.inv_freq, s),
         ds = test::to_device(slot, s);
    std::vector<uint16_t> zero(static_cast<size_t>(slots * width), 0x7FC0);  // bf16 NaN: slots not stored stay NaN in both
    auto a = test::to_device(x, s), b = test::to_device(x, s);
    auto kca = test::to_device(zero, s), vca = test::to_device(zero, s), kcb = test::to_device(zero, s), vcb = test::to_device(zero, s);
    gpu::qk_norm_rope(a.as<float>(), n, ld, heads, hd, dw.as<uint16_t>(), 1e-6f, dp.as<int32_t>(), df.as<float>(), s);
    gpu::qk_norm_rope(a.as<float>() + heads * hd, n, ld, kvh, hd, dk.as<uint16_t>(), 1e-6f, dp.as<int32_t>(), df.as<float>(), s);
    gpu::kv_store(a.as<float>() + heads * hd, a.as<float>() + (heads + kvh) * hd, ld, n, width, ds.as<int32_t>(), kca.as<uint16_t>(), vca.as<uint16_t>(), s);
    gpu::qkv_norm_rope_store(b.as<float>(), n, ld, heads, kvh, hd, dw.as<uint16_t>(), dk.as<uint16_t>(), 1e-6f, dp.as<int32_t>(), df.as<float>(),
                             ds.as<int32_t>(), kcb.as<uint16_t>(), vcb.as<uint16_t>(), s);
    CHECK(test::to_host<float>(a, x.size(), s) == test::to_host<float>(b, x.size(), s));
    CHECK(test::to_host<uint16_t>(kca, zero.size(), s) == test::to_host<uint16_t>(kcb, zero.size(), s));
    CHECK(test::to_host<uint16_t>(vca, zero.size(), s) == test::to_host<uint16_t>(vcb, zero.size(), s));
  }
}

TEST_CASE("gpu attention over the paged cache matches ops::attention (prefill and decode, GQA, hd 64/128)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (int64_t hd : {64, 128}) {
    const int64_t heads = 8, kvh = 2, layers = 1, block = 16;
    KvCache kv(KvLayout{layers, kvh, hd}, 120, block);
    // Two sequences: one prefill chunk of 150 tokens after 100 cached, one decode token at position 1300.
    const int sa = kv.add_sequence(), sb = kv.add_sequence();
    kv.reserve(sa, 250);
    kv.reserve(sb, 1301);
    const int64_t kvw = kvh * hd, slots = kv.num_blocks() * block;
    std::vector<float> kc(static_cast<size_t>(slots * kvw)), vc(kc.size());
    auto fill = [&](int seq, int64_t len, uint64_t seed) {
      auto kr = bf16_round(test::random_floats(static_cast<size_t>(len * kvw), seed));
      auto vr = bf16_round(test::random_floats(static_cast<size_t>(len * kvw), seed + 1));
      for (int64_t p = 0; p < len; ++p) {
        kv.store(0, seq, p, kr.data() + p * kvw, vr.data() + p * kvw);
        const int64_t sl = kv.slot_index(seq, p);
        std::copy(kr.begin() + p * kvw, kr.begin() + (p + 1) * kvw, kc.begin() + sl * kvw);
        std::copy(vr.begin() + p * kvw, vr.begin() + (p + 1) * kvw, vc.begin() + sl * kvw);
      }
    };
    fill(sa, 250, 41 + hd);
    fill(sb, 1301, 43 + hd);
    std::vector<ops::TokenSlot> ts;
    for (int64_t p = 100; p < 250; ++p) ts.push_back({sa, p});
    ts.push_back({sb, 1300});
    const int64_t n = static_cast<int64_t>(ts.size());
    auto q = test::random_floats(static_cast<size_t>(n * heads * hd), 45);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    std::vector<float> ref(q.size());
    ops::attention(q.data(), n, heads, kvh, hd, ts.data(), kv, 0, scale, ref.data(), nullptr);
    // Slot lists per sequence, offsets and lengths per token.
    std::vector<int32_t> lists, offsets, lens;
    for (int64_t p = 0; p < 250; ++p) lists.push_back(static_cast<int32_t>(kv.slot_index(sa, p)));
    for (int64_t p = 0; p < 1301; ++p) lists.push_back(static_cast<int32_t>(kv.slot_index(sb, p)));
    for (const auto& t : ts) {
      offsets.push_back(t.seq == sa ? 0 : 250);
      lens.push_back(static_cast<int32_t>(t.pos + 1));
    }
    auto dq = test::to_device(q, s), dk = test::to_device(bf16_of(kc), s), dv = test::to_device(bf16_of(vc), s);
    auto dl = test::to_device(lists, s), doff = test::to_device(offsets, s), dlen = test::to_device(lens, s);
    gpu::DeviceBuffer dout(q.size() * 2);
    CHECK(gpu::attention_splits(n, heads, 1301) == 1);
    gpu::attention(dq.as<float>(), heads * hd, n, heads, kvh, hd, dk.as<uint16_t>(), dv.as<uint16_t>(), dl.as<int32_t>(), doff.as<int32_t>(),
                   dlen.as<int32_t>(), 1301, scale, nullptr, dout.as<uint16_t>(), s);
    auto out = test::f32_of(test::to_host<uint16_t>(dout, q.size(), s));
    CHECK_MESSAGE(test::tol_ratio(out, ref, 2e-3, 1e-2) <= 1, "hd=" << hd);
    // The tensor-core tiles: 64-row query tiles of one sequence (here 64, 64, 22 rows of the chunk, then
    // the decode token alone), causal masks inside the tiles, keys in tiles of 64 slots.
    {
      const auto tiles = gpu::attention_tile_list(offsets.data(), n);
      REQUIRE(tiles == std::vector<int32_t>{0, 64, 64, 64, 128, 22, 150, 1});
      auto dt = test::to_device(tiles, s);
      const int before = gpu::attention_tiles_kernel();
      for (int v : {1, 2, 3}) {  // every kernel (gpu::set_attention_tiles_kernel), then the one set before
        gpu::set_attention_tiles_kernel(v);
        gpu::DeviceBuffer dout2(q.size() * 2);
        gpu::attention_tiles(dq.as<float>(), heads * hd, static_cast<int64_t>(tiles.size() / 2), dt.as<int32_t>(), heads, kvh, hd,
                             dk.as<uint16_t>(), dv.as<uint16_t>(), dl.as<int32_t>(), doff.as<int32_t>(), dlen.as<int32_t>(), scale,
                             dout2.as<uint16_t>(), s);
        auto out2 = test::f32_of(test::to_host<uint16_t>(dout2, q.size(), s));
        MESSAGE("attention_tiles kernel " << v << " hd=" << hd << ": worst |diff| / (2e-3 + 1e-2 |ref|) = " << test::tol_ratio(out2, ref, 2e-3, 1e-2));
        CHECK_MESSAGE(test::tol_ratio(out2, ref, 2e-3, 1e-2) <= 1, "tiles, kernel " << v << ", hd=" << hd);
      }
      gpu::set_attention_tiles_kernel(before);
    }
    // The decode token alone: long context, few blocks -> split-K.
    REQUIRE(gpu::attention_splits(1, heads, 1301) > 1);
    gpu::DeviceBuffer scratch(static_cast<size_t>(gpu::attention_scratch_floats(1, heads, hd, 1301)) * 4);
    gpu::attention(dq.as<float>() + (n - 1) * heads * hd, heads * hd, 1, heads, kvh, hd, dk.as<uint16_t>(), dv.as<uint16_t>(), dl.as<int32_t>(),
                   doff.as<int32_t>() + (n - 1), dlen.as<int32_t>() + (n - 1), 1301, scale, scratch.as<float>(), dout.as<uint16_t>(), s);
    auto one = test::f32_of(test::to_host<uint16_t>(dout, static_cast<size_t>(heads * hd), s));
    std::vector<float> ref_one(ref.end() - heads * hd, ref.end());
    CHECK_MESSAGE(test::tol_ratio(one, ref_one, 2e-3, 1e-2) <= 1, "split-K, hd=" << hd);
  }
  gpu::Stream s2;
  CHECK_THROWS_AS(gpu::attention(nullptr, 0, 1, 4, 3, 64, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1.0f, nullptr, nullptr, s2), Error);
  CHECK_THROWS_AS(gpu::attention(nullptr, 0, 1, 4, 2, 80, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1.0f, nullptr, nullptr, s2), Error);
  CHECK_THROWS_AS(gpu::attention(nullptr, 0, 1, 4, 2, 64, nullptr, nullptr, nullptr, nullptr, nullptr, 4096, 1.0f, nullptr, nullptr, s2), Error);
}

TEST_CASE("gpu silu_mul and add match the CPU") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  const int64_t n = 3, I = 200;
  auto gu = test::random_floats(static_cast<size_t>(n * 2 * I), 51, 2.0f);
  std::vector<float> ref(static_cast<size_t>(n * I));
  for (int64_t t = 0; t < n; ++t) ops::silu_mul(gu.data() + t * 2 * I, gu.data() + t * 2 * I + I, I, ref.data() + t * I);
  auto dgu = test::to_device(gu, s);
  gpu::DeviceBuffer dh(ref.size() * 2);
  gpu::silu_mul(dgu.as<float>(), n, I, dh.as<uint16_t>(), nullptr, s);
  const auto hi_only = test::to_host<uint16_t>(dh, ref.size(), s);
  CHECK(test::tol_ratio(test::f32_of(hi_only), ref, 1e-3, 8e-3) <= 1);
  // With the rounding remainder (split input): the same hi, and hi + lo to about 16 bits.
  gpu::DeviceBuffer dlo(ref.size() * 2);
  gpu::silu_mul(dgu.as<float>(), n, I, dh.as<uint16_t>(), dlo.as<uint16_t>(), s);
  CHECK(test::to_host<uint16_t>(dh, ref.size(), s) == hi_only);
  CHECK(test::tol_ratio(test::bf16_pair_sum(hi_only, test::to_host<uint16_t>(dlo, ref.size(), s)), ref, 1e-6, 3e-5) <= 1);
  auto a = test::random_floats(1000, 52), b = test::random_floats(1000, 53);
  auto da = test::to_device(a, s), db = test::to_device(b, s);
  gpu::add(da.as<float>(), db.as<float>(), 1000, da.as<float>(), s);
  auto c = test::to_host<float>(da, 1000, s);
  for (size_t i = 0; i < 1000; ++i) CHECK(c[i] == a[i] + b[i]);
}

TEST_CASE("gpu split_bf16: hi = bf16(x), lo = bf16(x - hi), bit for bit; hi alone when lo is null, lo alone when hi is null") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  auto x = test::random_floats(5003, 55, 3.0f);
  x[7] = 0.0f;
  x[8] = 1e-30f;
  x[9] = -65504.25f;
  auto dx = test::to_device(x, s);
  gpu::DeviceBuffer dhi(x.size() * 2), dlo(x.size() * 2);
  gpu::split_bf16(dx.as<float>(), static_cast<int64_t>(x.size()), dhi.as<uint16_t>(), dlo.as<uint16_t>(), s);
  const auto hi = test::to_host<uint16_t>(dhi, x.size(), s), lo = test::to_host<uint16_t>(dlo, x.size(), s);
  int64_t wrong = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    wrong += hi[i] != h || lo[i] != f32_to_bf16(x[i] - bf16_to_f32(h));
  }
  CHECK(wrong == 0);
  CHECK(test::tol_ratio(test::bf16_pair_sum(hi, lo), x, 1e-30, 2e-5) <= 1);
  gpu::memset_device(dhi.data(), 0, dhi.bytes(), s);
  gpu::split_bf16(dx.as<float>(), static_cast<int64_t>(x.size()), dhi.as<uint16_t>(), nullptr, s);
  CHECK(test::to_host<uint16_t>(dhi, x.size(), s) == hi);
  gpu::memset_device(dlo.data(), 0, dlo.bytes(), s);
  gpu::split_bf16(dx.as<float>(), static_cast<int64_t>(x.size()), nullptr, dlo.as<uint16_t>(), s);
  CHECK(test::to_host<uint16_t>(dlo, x.size(), s) == lo);
  // Four values a thread where x is 16-byte aligned (above), one where it is not: x from its second value.
  gpu::split_bf16(dx.as<float>() + 1, static_cast<int64_t>(x.size()) - 1, dhi.as<uint16_t>(), dlo.as<uint16_t>(), s);
  const auto hi1 = test::to_host<uint16_t>(dhi, x.size() - 1, s), lo1 = test::to_host<uint16_t>(dlo, x.size() - 1, s);
  CHECK(std::equal(hi1.begin(), hi1.end(), hi.begin() + 1));
  CHECK(std::equal(lo1.begin(), lo1.end(), lo.begin() + 1));
}

TEST_CASE("gpu router_topk matches ops::softmax_topk (ties: lower index)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (auto [E, K, norm] : {std::tuple<int64_t, int64_t, bool>{16, 4, true}, {128, 8, true}, {60, 4, false}, {256, 8, true}}) {
    const int64_t n = 9;
    auto lg = test::random_floats(static_cast<size_t>(n * E), 61 + E, 2.0f);
    lg[3] = lg[5];  // a tie in row 0
    std::vector<int32_t> rid(static_cast<size_t>(n * K));
    std::vector<float> rw(rid.size());
    for (int64_t t = 0; t < n; ++t) ops::softmax_topk(lg.data() + t * E, E, K, norm, rid.data() + t * K, rw.data() + t * K);
    auto dl = test::to_device(lg, s);
    gpu::DeviceBuffer di(rid.size() * 4), dw(rid.size() * 4);
    gpu::router_topk(dl.as<float>(), n, E, K, norm, di.as<int32_t>(), dw.as<float>(), s);
    auto ids = test::to_host<int32_t>(di, rid.size(), s);
    auto w = test::to_host<float>(dw, rid.size(), s);
    CHECK_MESSAGE(ids == rid, "E=" << E << " K=" << K);
    CHECK(test::tol_ratio(w, rw, 1e-6, 1e-4) <= 1);
  }
  gpu::Stream s2;
  CHECK_THROWS_AS(gpu::router_topk(nullptr, 1, 8, 9, true, nullptr, nullptr, s2), Error);
}

TEST_CASE("gpu grouped experts match numa::moe_forward (decode and prefill batches)") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  numa::ThreadPool pool(2);
  for (auto [n, H, I, E, K] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{1, 64, 32, 16, 4}, {8, 256, 96, 32, 8}, {40, 128, 64, 16, 4}}) {
    auto wgu = bf16_of(test::random_floats(static_cast<size_t>(E * 2 * I * H), 71 + n, 0.05f));
    auto wdn = bf16_of(test::random_floats(static_cast<size_t>(E * H * I), 72 + n, 0.05f));
    std::vector<numa::ExpertWeights> ex;
    for (int64_t e = 0; e < E; ++e)
      ex.push_back({cpu::Mat{DType::bf16, wgu.data() + e * 2 * I * H, I, H}, cpu::Mat{DType::bf16, wgu.data() + e * 2 * I * H + I * H, I, H},
                    cpu::Mat{DType::bf16, wdn.data() + e * H * I, H, I}});
    auto x = bf16_round(test::random_floats(static_cast<size_t>(n * H), 73 + n));
    // Distinct experts per token, many tokens sharing experts.
    std::vector<int32_t> ids(static_cast<size_t>(n * K));
    std::vector<float> w(ids.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j) {
        ids[static_cast<size_t>(t * K + j)] = static_cast<int32_t>((t * 3 + j * 5) % E);
        w[static_cast<size_t>(t * K + j)] = 0.1f + 0.05f * static_cast<float>(j);
      }
    std::vector<float> ref(static_cast<size_t>(n * H), 0.0f);
    numa::moe_forward(x.data(), n, H, ids.data(), w.data(), K, ex, ref.data(), &pool);
    auto dx = test::to_device(bf16_of(x), s), dgu = test::to_device(wgu, s), ddn = test::to_device(wdn, s);
    auto di = test::to_device(ids, s), dw = test::to_device(w, s);
    gpu::DeviceBuffer off(static_cast<size_t>(E + 1) * 4), pl(ids.size() * 4), act(ids.size() * static_cast<size_t>(I) * 2),
        part(ids.size() * static_cast<size_t>(H) * 4), out(ref.size() * 4);
    gpu::moe_route(di.as<int32_t>(), n * K, E, off.as<int32_t>(), pl.as<int32_t>(), s);
    auto offs = test::to_host<int32_t>(off, static_cast<size_t>(E + 1), s);
    CHECK(offs.back() == n * K);
    gpu::moe_experts(dx.as<uint16_t>(), n, H, I, E, K, di.as<int32_t>(), dw.as<float>(), off.as<int32_t>(), pl.as<int32_t>(), dgu.as<uint16_t>(),
                     ddn.as<uint16_t>(), act.as<uint16_t>(), part.as<float>(), out.as<float>(), s);
    auto y = test::to_host<float>(out, ref.size(), s);
    // The GPU rounds the SwiGLU activation to bf16 before the down product.
    double scale = 0;
    for (float v : ref) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    CHECK_MESSAGE(test::tol_ratio(y, ref, 1e-2 * scale, 1e-2) <= 1, "n=" << n << " H=" << H << " I=" << I << " E=" << E);
    // The activation as a hi + lo pair (gpu_hybrid_precise): within fp32-level noise of the fp32 reference, and closer than one bf16.
    gpu::DeviceBuffer act_lo(ids.size() * static_cast<size_t>(I) * 2);
    gpu::moe_experts(dx.as<uint16_t>(), n, H, I, E, K, di.as<int32_t>(), dw.as<float>(), off.as<int32_t>(), pl.as<int32_t>(), dgu.as<uint16_t>(),
                     ddn.as<uint16_t>(), act.as<uint16_t>(), part.as<float>(), out.as<float>(), s, act_lo.as<uint16_t>());
    auto y2 = test::to_host<float>(out, ref.size(), s);
    const double r1 = test::tol_ratio(y, ref, 1e-4 * scale, 1e-4), r2 = test::tol_ratio(y2, ref, 1e-4 * scale, 1e-4);
    MESSAGE("n=" << n << ": activation bf16 " << r1 << " / hi + lo " << r2 << " of the 1e-4 tolerance");
    CHECK(r2 <= 1);
    CHECK(r2 < r1);
  }
}

// Qwen3-Next's full-attention shape (16 query heads over 2 KV heads of 256)
// against the plain scalar reference (ops::attention_reference, double sums)
// on random data: decode tokens of contexts 1 to 4100, together (split-K over
// 17 slices) and each alone (1, 3, 6 and 17 slices), then a batch of two
// prompt chunks (one from position 0: causal masks inside the query tiles and
// the 32-key tiles; one at context ~1200) and a decode token, per token and in
// tensor-core tiles. hd 160 (a partial 256-thread block) through the per-token kernel.
TEST_CASE("gpu attention at head_dim 256 (GQA 16/2) matches the scalar reference: decode with and without split-K, prefill tiles") {
  if (!test::have_gpu()) return;
  gpu::Stream s;
  for (int64_t hd : {256, 160}) {
    const int64_t heads = 16, kvh = 2, block = 16, kvw = kvh * hd;
    const std::vector<int64_t> ctx = {1, 37, 300, 513, 1300, 4100};
    int64_t total = 0;
    for (int64_t c : ctx) total += c;
    KvCache kv(KvLayout{1, kvh, hd}, total / block + 16, block);
    std::vector<int> seq;
    for (size_t i = 0; i < ctx.size(); ++i) {
      seq.push_back(kv.add_sequence());
      kv.reserve(seq.back(), ctx[i]);
    }
    const int64_t slots = kv.num_blocks() * block;
    std::vector<float> kc(static_cast<size_t>(slots * kvw)), vc(kc.size());
    std::vector<int32_t> lists, list_at;  // every sequence's slot list, one after another
    for (size_t i = 0; i < ctx.size(); ++i) {
      auto kr = bf16_round(test::random_floats(static_cast<size_t>(ctx[i] * kvw), 300 + i + static_cast<uint64_t>(hd)));
      auto vr = bf16_round(test::random_floats(static_cast<size_t>(ctx[i] * kvw), 400 + i + static_cast<uint64_t>(hd)));
      list_at.push_back(static_cast<int32_t>(lists.size()));
      for (int64_t p = 0; p < ctx[i]; ++p) {
        kv.store(0, seq[i], p, kr.data() + p * kvw, vr.data() + p * kvw);
        const int64_t sl = kv.slot_index(seq[i], p);
        lists.push_back(static_cast<int32_t>(sl));
        std::copy(kr.begin() + p * kvw, kr.begin() + (p + 1) * kvw, kc.begin() + sl * kvw);
        std::copy(vr.begin() + p * kvw, vr.begin() + (p + 1) * kvw, vc.begin() + sl * kvw);
      }
    }
    auto dk = test::to_device(bf16_of(kc), s), dv = test::to_device(bf16_of(vc), s), dl = test::to_device(lists, s);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    // One batch of (sequence index, position) tokens through gpu::attention (and the tiles) against the reference.
    auto run = [&](const std::vector<std::pair<size_t, int64_t>>& toks, const std::string& what, bool tiles) {
      std::vector<ops::TokenSlot> ts;
      std::vector<int32_t> offsets, lens;
      int64_t max_len = 0;
      for (auto [i, p] : toks) {
        ts.push_back({seq[i], p});
        offsets.push_back(list_at[i]);
        lens.push_back(static_cast<int32_t>(p + 1));
        max_len = std::max<int64_t>(max_len, p + 1);
      }
      const int64_t n = static_cast<int64_t>(ts.size());
      auto q = test::random_floats(static_cast<size_t>(n * heads * hd), 500 + static_cast<uint64_t>(n + hd));
      std::vector<float> ref(q.size());
      ops::attention_reference(q.data(), n, heads, kvh, hd, ts.data(), kv, 0, scale, ref.data());
      auto dq = test::to_device(q, s), doff = test::to_device(offsets, s), dlen = test::to_device(lens, s);
      const int64_t splits = gpu::attention_splits(n, heads, max_len);
      gpu::DeviceBuffer dout(q.size() * 2), scratch(static_cast<size_t>(std::max<int64_t>(gpu::attention_scratch_floats(n, heads, hd, max_len), 4)) * 4);
      gpu::attention(dq.as<float>(), heads * hd, n, heads, kvh, hd, dk.as<uint16_t>(), dv.as<uint16_t>(), dl.as<int32_t>(), doff.as<int32_t>(),
                     dlen.as<int32_t>(), max_len, scale, scratch.as<float>(), dout.as<uint16_t>(), s);
      const double r = test::tol_ratio(test::f32_of(test::to_host<uint16_t>(dout, q.size(), s)), ref, 2e-3, 1e-2);
      MESSAGE("hd " << hd << " " << what << ": " << n << " tokens, max context " << max_len << ", " << splits
                    << " split(s); worst |diff| / (2e-3 + 1e-2 |ref|) = " << r);
      CHECK_MESSAGE(r <= 1, "hd " << hd << " " << what);
      if (!tiles) return splits;
      const auto tl = gpu::attention_tile_list(offsets.data(), n);
      auto dt = test::to_device(tl, s);
      if (!gpu::attention_tiles_takes(hd)) {
        CHECK_THROWS_AS(gpu::attention_tiles(dq.as<float>(), heads * hd, static_cast<int64_t>(tl.size() / 2), dt.as<int32_t>(), heads, kvh, hd,
                                             dk.as<uint16_t>(), dv.as<uint16_t>(), dl.as<int32_t>(), doff.as<int32_t>(), dlen.as<int32_t>(), scale,
                                             dout.as<uint16_t>(), s),
                        Error);
        return splits;
      }
      // the tiles round q to bf16 for the tensor cores: their reference is of that q
      std::vector<float> ref16(q.size());
      ops::attention_reference(bf16_round(q).data(), n, heads, kvh, hd, ts.data(), kv, 0, scale, ref16.data());
      const int before = gpu::attention_tiles_kernel();
      for (int v : {1, 2, 3}) {  // every kernel (gpu::set_attention_tiles_kernel), then the one set before
        gpu::set_attention_tiles_kernel(v);
        gpu::DeviceBuffer dout2(q.size() * 2);
        gpu::attention_tiles(dq.as<float>(), heads * hd, static_cast<int64_t>(tl.size() / 2), dt.as<int32_t>(), heads, kvh, hd, dk.as<uint16_t>(),
                             dv.as<uint16_t>(), dl.as<int32_t>(), doff.as<int32_t>(), dlen.as<int32_t>(), scale, dout2.as<uint16_t>(), s);
        const double r2 = test::tol_ratio(test::f32_of(test::to_host<uint16_t>(dout2, q.size(), s)), ref16, 2e-3, 1e-2);
        MESSAGE("hd " << hd << " " << what << " in " << tl.size() / 2 << " query tiles, kernel " << v
                      << ": worst |diff| / (2e-3 + 1e-2 |ref|) = " << r2);
        CHECK_MESSAGE(r2 <= 1, "tiles, kernel " << v << ", hd " << hd << " " << what);
      }
      gpu::set_attention_tiles_kernel(before);
      return splits;
    };
    std::vector<std::pair<size_t, int64_t>> decode;
    for (size_t i = 0; i < ctx.size(); ++i) decode.push_back({i, ctx[i] - 1});
    CHECK(run(decode, "decode of 6 sequences", false) == 17);
    const int64_t want[] = {1, 1, 1, 3, 6, 17};
    for (size_t i = 0; i < ctx.size(); ++i) CHECK(run({decode[i]}, "decode alone at context " + std::to_string(ctx[i]), false) == want[i]);
    std::vector<std::pair<size_t, int64_t>> prefill;
    for (int64_t p = 0; p < 200; ++p) prefill.push_back({2, p});
    for (int64_t p = 1170; p < 1300; ++p) prefill.push_back({4, p});
    prefill.push_back({5, 4099});
    CHECK(run(prefill, "two prompt chunks and a decode token", true) == 1);
  }
  gpu::Stream s2;
  CHECK_THROWS_AS(gpu::attention(nullptr, 0, 1, 16, 2, 288, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1.0f, nullptr, nullptr, s2), Error);
  CHECK_THROWS_AS(gpu::attention(nullptr, 0, 1, 16, 2, 240, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1.0f, nullptr, nullptr, s2), Error);
}
