// CPU grouped-query attention over the paged KV cache (ops::attention,
// declared in engine/ops/cpu_ops.h).
//
// Why this shape: a decode step reads every cached key and value of the
// sequence once per layer, so decode time stays flat with context only if
// that read runs at memory speed on all threads. So:
//  - the cache is head-major (engine/kv/kv_storage.h, KvGeometry): one kv
//    head's keys and values are contiguous block after block, so a work item
//    streams its bytes instead of picking one head's slice out of every
//    token's row (a stride the hardware prefetchers do not follow);
//  - keys are stored transposed in tiles of 16 tokens, so a score is 16
//    tokens wide: one FMA per key dimension and query head, no horizontal
//    sums, and the softmax runs on 16 lanes;
//  - one work item is (token, kv head, chunk of positions): the GQA group's
//    query heads (up to 8 at once) share every K/V load, and long contexts
//    are split into chunks (at least kMinChunk positions, as many as the
//    threads need) that keep their own running max, sum and unnormalised
//    output; a second pass merges the chunks of each (token, head) by their
//    log-sum-exp (flash-decoding);
//  - the inner loop (cpu_attention_kernel.inc) reads the stored dtype
//    (fp32, bf16, q8_0) and widens it in registers; it is compiled for
//    AVX-512, AVX2 and plain C++, picked by cpu::best_isa().
// Results equal attention_reference (which decodes the stored values) up to
// float summation order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/ops/cpu_attention_kernel.h"
#include "engine/ops/cpu_ops.h"

namespace hmoe::ops {

namespace {

constexpr int64_t kMinChunk = 128;  // positions: below this a split costs more than it gains

struct Item {
  int64_t t, g, j0, j1;
};

// Per item: m[G] (running max), l[G] (running sum), o[G][hd_pad] (unnormalised output).
inline int64_t part_floats(int64_t G, int64_t hd) { return G * (2 + detail::hd_pad(hd)); }

using Kernel = void (*)(const detail::AttnTiles&);

Kernel pick_kernel() {
  switch (cpu::best_isa()) {
    case cpu::Isa::avx512: return detail::attend_tiles_avx512;
    case cpu::Isa::avx2: return detail::attend_tiles_avx2;
    default: return detail::attend_tiles_scalar;
  }
}

// One item: positions [j0, j1) of token t's sequence against its kv head g.
void run_item(const Item& it, const float* q, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
              int64_t layer, float scale, float* part, Kernel kernel) {
  const int64_t G = heads / kv_heads;
  const KvGeometry& geo = kv.geometry();
  const int64_t W = geo.tile;
  const int seq = slots[it.t].seq;
  thread_local std::vector<const uint8_t*> kt, vr, nk, nv;
  thread_local std::vector<int32_t> count;
  thread_local std::vector<float> qs;
  const size_t nt = static_cast<size_t>((it.j1 - it.j0 + W - 1) / W);
  kt.resize(nt), vr.resize(nt), nk.resize(nt), nv.resize(nt), count.resize(nt);
  for (size_t i = 0; i < nt; ++i) {
    const int64_t j = it.j0 + static_cast<int64_t>(i) * W;  // j0 is a multiple of W: tiles start at lane 0
    kt[i] = kv.k_tile(layer, seq, j, it.g);
    vr[i] = kv.v_row(layer, seq, j, it.g);
    count[i] = static_cast<int32_t>(std::min(W, it.j1 - j));
  }
  // The tile after next is prefetched while one runs: with K/V coming from
  // memory this took 1-thread decode attention at 4096 from 2.5 to 2.0 ms
  // (fp32), 1.5 to 1.2 (bf16), 1.15 to 0.98 (q8_0) on the dev box; with
  // K/V hot in the L3 it costs 10-20% (the stalls move to the prefetches).
  for (size_t i = 0; i < nt; ++i) {
    nk[i] = i + 2 < nt ? kt[i + 2] : nullptr;
    nv[i] = i + 2 < nt ? vr[i + 2] : nullptr;
  }
  qs.resize(static_cast<size_t>(G * hd));
  const float* qg = q + (it.t * heads + it.g * G) * hd;
  for (int64_t i = 0; i < G * hd; ++i) qs[static_cast<size_t>(i)] = qg[i] * scale;
  detail::AttnTiles a;
  a.dtype = kv.dtype();
  a.hd = hd;
  a.G = G;
  a.W = W;
  a.k_scale_offset = geo.k_scale_offset;
  a.v_row_bytes = geo.v_row_bytes;
  a.ntiles = static_cast<int64_t>(nt);
  a.ktile = kt.data();
  a.vrow = vr.data();
  a.count = count.data();
  a.next_k = nk.data();
  a.next_v = nv.data();
  a.q = qs.data();
  a.m = part;
  a.l = part + G;
  a.o = part + 2 * G;
  kernel(a);
}

}  // namespace

void attention(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
               int64_t layer, float scale, float* out, numa::ThreadPool* pool) {
  const int64_t G = heads / kv_heads;
  const int64_t hp = detail::hd_pad(hd);
  const int threads = pool ? pool->size() : 1;
  // Chunks per (token, kv head): enough items for every thread (4 each),
  // never below kMinChunk positions; chunk starts are whole key tiles.
  const int64_t base = n * kv_heads;
  const int64_t want = std::max<int64_t>(1, (4 * threads + base - 1) / base);
  // Reused between calls; the workers see the caller's through references.
  thread_local std::vector<Item> tl_items;
  thread_local std::vector<int64_t> tl_first;
  thread_local std::vector<float> tl_parts;
  std::vector<Item>& items = tl_items;
  std::vector<int64_t>& first = tl_first;  // per (token, kv head): its first item
  std::vector<float>& parts = tl_parts;
  items.clear();
  first.assign(static_cast<size_t>(base) + 1, 0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t len = slots[t].pos + 1;
    const int64_t splits = std::clamp<int64_t>(len / kMinChunk, 1, want);
    const int64_t step = ((len + splits - 1) / splits + 15) / 16 * 16;
    for (int64_t g = 0; g < kv_heads; ++g) {
      first[static_cast<size_t>(t * kv_heads + g)] = static_cast<int64_t>(items.size());
      for (int64_t j = 0; j < len; j += step) items.push_back({t, g, j, std::min(len, j + step)});
    }
  }
  first[static_cast<size_t>(base)] = static_cast<int64_t>(items.size());
  const int64_t pf = part_floats(G, hd);
  if (parts.size() < items.size() * static_cast<size_t>(pf)) parts.resize(items.size() * static_cast<size_t>(pf));
  const Kernel kernel = pick_kernel();
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      run_item(items[static_cast<size_t>(i)], q, heads, kv_heads, hd, slots, kv, layer, scale, parts.data() + i * pf, kernel);
  };
  const int64_t ni = static_cast<int64_t>(items.size());
  if (pool && ni > 1) pool->parallel_for(ni, body, 1, 1);
  else body(0, ni, 0);
  // Merge each (token, kv head)'s chunks by their log-sum-exp.
  auto merge = [&](int64_t b, int64_t e, int) {
    for (int64_t tg = b; tg < e; ++tg) {
      const int64_t i0 = first[static_cast<size_t>(tg)], i1 = first[static_cast<size_t>(tg) + 1];
      const int64_t t = tg / kv_heads, g = tg % kv_heads;
      for (int64_t h = 0; h < G; ++h) {
        float M = -INFINITY;
        for (int64_t i = i0; i < i1; ++i) M = std::max(M, parts[static_cast<size_t>(i * pf + h)]);
        float* dst = out + (t * heads + g * G + h) * hd;
        std::fill(dst, dst + hd, 0.0f);
        double L = 0;
        for (int64_t i = i0; i < i1; ++i) {
          const float* p = parts.data() + i * pf;
          const float w = std::exp(p[h] - M);
          L += static_cast<double>(w) * p[G + h];
          const float* o = p + 2 * G + h * hp;
          for (int64_t k = 0; k < hd; ++k) dst[k] += w * o[k];
        }
        const float inv = static_cast<float>(1.0 / L);
        for (int64_t k = 0; k < hd; ++k) dst[k] *= inv;
      }
    }
  };
  if (pool && base > 1 && n * heads * hd >= 4096) pool->parallel_for(base, merge);
  else merge(0, base, 0);
}

void attention_reference(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
                         int64_t layer, float scale, float* out) {
  const int64_t group = heads / kv_heads;
  const int64_t kw = kv.layout().k_floats(), vw = kv.layout().v_floats();
  std::vector<double> scores;
  std::vector<float> kd, vd;  // the stored keys/values of every kv head, decoded to fp32
  for (int64_t t = 0; t < n; ++t) {
    const int seq = slots[t].seq;
    const int64_t len = slots[t].pos + 1;
    kd.resize(static_cast<size_t>(len * kw));
    vd.resize(static_cast<size_t>(len * vw));
    for (int64_t j = 0; j < len; ++j) kv.load(layer, seq, j, kd.data() + j * kw, vd.data() + j * vw);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / group;
      const float* qv = q + (t * heads + h) * hd;
      scores.assign(static_cast<size_t>(len), 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* kj = kd.data() + j * kw + g * hd;
        double s = 0;
        for (int64_t i = 0; i < hd; ++i) s += static_cast<double>(qv[i]) * kj[i];
        scores[static_cast<size_t>(j)] = s * scale;
        mx = std::max(mx, scores[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (auto& s : scores) sum += (s = std::exp(s - mx));
      float* o = out + (t * heads + h) * hd;
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < len; ++j) acc += scores[static_cast<size_t>(j)] * vd[static_cast<size_t>(j * vw + g * hd + i)];
        o[i] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace hmoe::ops
