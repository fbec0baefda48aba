// gpu::attention_tiles, every kernel (set_attention_tiles_kernel 1, 2, 3),
// against the scalar reference (ops::attention_reference, double sums) on
// random data: one step of several sequences with ragged lengths - a prompt
// from position 0 (causal masks from the first key tile), chunks after a
// prefix already in the cache (one ending in a 6-row query tile, one long
// enough for 17 key tiles), a decode token alone in its tile - with the
// cache's blocks of the sequences interleaved (scattered slot lists) and q
// read from a wider row (ldq > heads x hd, as the fused qkv buffer). Head
// dims 64, 128 and 256; GQA with an even group (kernels 2 and 3 pair two
// query heads a block; 3 gives a warp 32 rows at hd 64 and 128), an odd one
// and none (one head a block), and sharper softmax rows (q x 4).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/ops/cpu_ops.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

// set_attention_tiles_kernel(v) for a scope, then the kernel that was set before.
struct TilesKernel {
  int before = gpu::attention_tiles_kernel();
  explicit TilesKernel(int v) { gpu::set_attention_tiles_kernel(v); }
  ~TilesKernel() { gpu::set_attention_tiles_kernel(before); }
};

struct Chunk {
  int64_t ctx;    // tokens of the sequence in the cache
  int64_t first;  // first position of the step's rows (ctx - first rows)
};

void check_tiles(int64_t hd, int64_t heads, int64_t kvh, float q_scale) {
  gpu::Stream s;
  const int64_t block = 16, kvw = kvh * hd;
  const std::vector<Chunk> chunks = {{200, 0}, {250, 100}, {1070, 1000}, {778, 777}, {129, 64}};
  int64_t total = 0;
  for (const auto& c : chunks) total += c.ctx;
  KvCache kv(KvLayout{1, kvh, hd}, total / block + 16, block);
  std::vector<int> seq;
  for (size_t i = 0; i < chunks.size(); ++i) seq.push_back(kv.add_sequence());
  // Blocks handed out in turns, so that every slot list jumps between distant blocks.
  for (int64_t p = block;; p += block) {
    bool more = false;
    for (size_t i = 0; i < chunks.size(); ++i) {
      kv.reserve(seq[i], std::min(p, chunks[i].ctx));
      more = more || p < chunks[i].ctx;
    }
    if (!more) break;
  }
  const int64_t slots = kv.num_blocks() * block;
  std::vector<float> kc(static_cast<size_t>(slots * kvw), 0.0f), vc(kc.size(), 0.0f);
  std::vector<int32_t> lists, list_at;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int64_t n = chunks[i].ctx;
    auto kr = test::bf16_round(test::random_floats(static_cast<size_t>(n * kvw), 700 + i + static_cast<uint64_t>(hd)));
    auto vr = test::bf16_round(test::random_floats(static_cast<size_t>(n * kvw), 800 + i + static_cast<uint64_t>(hd)));
    list_at.push_back(static_cast<int32_t>(lists.size()));
    for (int64_t p = 0; p < n; ++p) {
      kv.store(0, seq[i], p, kr.data() + p * kvw, vr.data() + p * kvw);
      const int64_t sl = kv.slot_index(seq[i], p);
      lists.push_back(static_cast<int32_t>(sl));
      std::copy(kr.begin() + p * kvw, kr.begin() + (p + 1) * kvw, kc.begin() + sl * kvw);
      std::copy(vr.begin() + p * kvw, vr.begin() + (p + 1) * kvw, vc.begin() + sl * kvw);
    }
  }
  std::vector<ops::TokenSlot> ts;
  std::vector<int32_t> offsets, lens;
  for (size_t i = 0; i < chunks.size(); ++i)
    for (int64_t p = chunks[i].first; p < chunks[i].ctx; ++p) {
      ts.push_back({seq[i], p});
      offsets.push_back(list_at[i]);
      lens.push_back(static_cast<int32_t>(p + 1));
    }
  const int64_t n = static_cast<int64_t>(ts.size()), qw = heads * hd, ldq = qw + 2 * kvw;
  const auto q = test::random_floats(static_cast<size_t>(n * qw), 900 + static_cast<uint64_t>(hd + heads), q_scale);
  std::vector<float> qwide(static_cast<size_t>(n * ldq), 1e30f);  // the k and v columns must never be read
  for (int64_t t = 0; t < n; ++t) std::copy(q.begin() + t * qw, q.begin() + (t + 1) * qw, qwide.begin() + t * ldq);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  // The reference of the query the kernels read: every kernel rounds q to bf16 for the tensor cores (an H100 run
  // against fp32 q: worst 1.7-2.5 of the tolerance at q x 1, 9.5-10.5 at q x 4, the same for kernels 1, 2 and 3).
  std::vector<float> ref(q.size());
  ops::attention_reference(test::bf16_round(q).data(), n, heads, kvh, hd, ts.data(), kv, 0, scale, ref.data());
  std::vector<float> first;  // kernel 1's output: 2 and 3 must agree with it to within bf16 rounding
  // The absolute tolerance: the tile kernels round the softmax weights P to bf16 for the P V product (relative
  // error <= 2^-9 each), so an output element may be off by up to 2^-9 max|v| on top of its own bf16 rounding;
  // 2^-8 max|v| leaves a factor 2 for the exponentials and the order of the sums. (An H100 run, 2026-12-07 19:33,
  // against 2e-3 absolute: worst 0.85-1.29 of it, identical for kernels 1, 2 and 3; the decode kernel, which keeps
  // P in fp32, stays at 0.1-0.34 of it on the same kind of data.)
  float vmax = 0.0f;
  for (float v : vc) vmax = std::max(vmax, std::fabs(v));
  const double abs_tol = std::max(2e-3, static_cast<double>(vmax) / 256.0);

  const auto tl = gpu::attention_tile_list(offsets.data(), n);
  auto dq = test::to_device(qwide, s), dk = test::to_device(test::bf16_of(kc), s), dv = test::to_device(test::bf16_of(vc), s);
  auto dl = test::to_device(lists, s), doff = test::to_device(offsets, s), dlen = test::to_device(lens, s), dt = test::to_device(tl, s);
  for (int v : {1, 2, 3}) {
    TilesKernel use(v);
    REQUIRE(gpu::attention_tiles_kernel() == v);
    gpu::DeviceBuffer dout(q.size() * 2);
    gpu::memset_device(dout.data(), 0xff, dout.bytes(), s);  // NaN where a row is left unwritten
    gpu::attention_tiles(dq.as<float>(), ldq, static_cast<int64_t>(tl.size() / 2), dt.as<int32_t>(), heads, kvh, hd, dk.as<uint16_t>(),
                         dv.as<uint16_t>(), dl.as<int32_t>(), doff.as<int32_t>(), dlen.as<int32_t>(), scale, dout.as<uint16_t>(), s);
    const auto got = test::f32_of(test::to_host<uint16_t>(dout, q.size(), s));
    const double r = test::tol_ratio(got, ref, abs_tol, 1e-2);
    if (v == 1) first = got;
    else CHECK_MESSAGE(test::tol_ratio(got, first, 2 * abs_tol, 1e-2) <= 1, "kernel " << v << " against kernel 1, hd " << hd);
    MESSAGE("attention_tiles kernel " << v << ", hd " << hd << ", " << heads << "/" << kvh << " heads, q x " << q_scale << ": " << n
                                      << " rows in " << tl.size() / 2 << " tiles; worst |diff| / (" << abs_tol << " + 1e-2 |ref|) = " << r);
    CHECK_MESSAGE(r <= 1, "kernel " << v << ", hd " << hd << ", heads " << heads << "/" << kvh);
  }
}

}  // namespace

TEST_CASE("gpu attention_tiles kernels 1, 2 and 3 match the scalar reference (ragged chunks after cached prefixes, hd 64/128/256, GQA)") {
  if (!test::have_gpu()) return;
  for (int64_t hd : {64, 128, 256}) {
    check_tiles(hd, 8, 2, 1.0f);  // groups of 4: kernels 2 and 3 take two heads a block
    check_tiles(hd, 6, 2, 1.0f);  // groups of 3: one head a block
  }
  check_tiles(128, 4, 4, 1.0f);  // no GQA
  check_tiles(128, 8, 2, 4.0f);
  check_tiles(256, 4, 1, 4.0f);
}

TEST_CASE("gpu attention_tiles kernel setting: 1, 2 or 3, anything else 1") {
  TilesKernel keep(1);
  gpu::set_attention_tiles_kernel(2);
  CHECK(gpu::attention_tiles_kernel() == 2);
  gpu::set_attention_tiles_kernel(3);
  CHECK(gpu::attention_tiles_kernel() == 3);
  gpu::set_attention_tiles_kernel(7);
  CHECK(gpu::attention_tiles_kernel() == 1);
}
