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
//  - one work item is (up to kRowGroup consecutive tokens of one sequence,
//    kv head, chunk of positions): the GQA group's query heads (up to 8 at
//    once) and the item's rows (a prompt's tokens) share every K/V tile
//    load, and long contexts are split into chunks (at least kMinChunk
//    positions, as many as the threads need) that keep their own running
//    max, sum and unnormalised output per row; a second pass merges the
//    chunks of each (token, head) by their log-sum-exp (flash-decoding);
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
constexpr int64_t kRowGroup = 16;   // query rows of one sequence sharing each tile load

// Consecutive batch tokens [t0, t0 + rows) of one sequence (positions
// ascending); they read the same key/value tiles.
struct Group {
  int64_t t0, rows, len;  // len: positions the last row attends
};
struct Item {
  int64_t grp, g, j0, j1;  // group, kv head, positions [j0, j1)
  int64_t part;            // its first row's part (in part_floats units)
};

using detail::part_floats;
using Kernel = void (*)(const detail::AttnTiles&);

Kernel pick_kernel() {
  switch (cpu::best_isa()) {
    case cpu::Isa::avx512: return detail::attend_tiles_avx512;
    case cpu::Isa::avx2: return detail::attend_tiles_avx2;
    default: return detail::attend_tiles_scalar;
  }
}

// One item: positions [j0, j1) of a group's sequence against kv head g, for
// every row of the group.
void run_item(const Item& it, const Group& gr, const float* q, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots,
              KvCache& kv, int64_t layer, float scale, float* part, Kernel kernel) {
  const int64_t G = heads / kv_heads;
  const KvGeometry& geo = kv.geometry();
  const int64_t W = geo.tile;
  const int seq = slots[gr.t0].seq;
  thread_local std::vector<const uint8_t*> kt, vr, nk, nv;
  thread_local std::vector<int32_t> count;
  thread_local std::vector<int64_t> row_end;
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
  row_end.resize(static_cast<size_t>(gr.rows));
  qs.resize(static_cast<size_t>(gr.rows * G * hd));
  for (int64_t r = 0; r < gr.rows; ++r) {
    const int64_t t = gr.t0 + r;
    row_end[static_cast<size_t>(r)] = slots[t].pos + 1 - it.j0;
    const float* qg = q + (t * heads + it.g * G) * hd;
    for (int64_t i = 0; i < G * hd; ++i) qs[static_cast<size_t>(r * G * hd + i)] = qg[i] * scale;
  }
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
  a.rows = gr.rows;
  a.row_end = row_end.data();
  a.q = qs.data();
  a.part = part;
  kernel(a);
}

}  // namespace

void attention(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t hd, const TokenSlot* slots, KvCache& kv,
               int64_t layer, float scale, float* out, numa::ThreadPool* pool) {
  const int64_t G = heads / kv_heads;
  const int64_t hp = detail::hd_pad(hd);
  const int threads = pool ? pool->size() : 1;
  // Reused between calls; the workers see the caller's through references.
  thread_local std::vector<Group> tl_groups;
  thread_local std::vector<Item> tl_items;
  thread_local std::vector<int64_t> tl_first, tl_grp;
  thread_local std::vector<float> tl_parts;
  std::vector<Group>& groups = tl_groups;
  std::vector<Item>& items = tl_items;
  std::vector<int64_t>& first = tl_first;  // per (group, kv head): its first item
  std::vector<int64_t>& grp = tl_grp;      // per token: its group
  std::vector<float>& parts = tl_parts;
  groups.clear();
  grp.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    Group* last = groups.empty() ? nullptr : &groups.back();
    if (last && last->rows < kRowGroup && slots[t].seq == slots[last->t0].seq && slots[t].pos > slots[t - 1].pos) {
      ++last->rows;
      last->len = slots[t].pos + 1;
    } else {
      groups.push_back({t, 1, slots[t].pos + 1});
    }
    grp[static_cast<size_t>(t)] = static_cast<int64_t>(groups.size()) - 1;
  }
  // Chunks per (group, kv head): enough items for every thread (4 each),
  // never below kMinChunk positions; chunk starts are whole key tiles.
  const int64_t base = static_cast<int64_t>(groups.size()) * kv_heads;
  const int64_t want = std::max<int64_t>(1, (4 * threads + base - 1) / base);
  items.clear();
  first.assign(static_cast<size_t>(base) + 1, 0);
  int64_t nparts = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& gr = groups[gi];
    const int64_t splits = std::clamp<int64_t>(gr.len / kMinChunk, 1, want);
    const int64_t step = ((gr.len + splits - 1) / splits + 15) / 16 * 16;
    for (int64_t g = 0; g < kv_heads; ++g) {
      first[gi * static_cast<size_t>(kv_heads) + static_cast<size_t>(g)] = static_cast<int64_t>(items.size());
      for (int64_t j = 0; j < gr.len; j += step) {
        items.push_back({static_cast<int64_t>(gi), g, j, std::min(gr.len, j + step), nparts});
        nparts += gr.rows;
      }
    }
  }
  first[static_cast<size_t>(base)] = static_cast<int64_t>(items.size());
  const int64_t pf = part_floats(G, hd);
  if (parts.size() < static_cast<size_t>(nparts * pf)) parts.resize(static_cast<size_t>(nparts * pf));
  const Kernel kernel = pick_kernel();
  auto body = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const Item& it = items[static_cast<size_t>(i)];
      run_item(it, groups[static_cast<size_t>(it.grp)], q, heads, kv_heads, hd, slots, kv, layer, scale, parts.data() + it.part * pf, kernel);
    }
  };
  const int64_t ni = static_cast<int64_t>(items.size());
  if (pool && ni > 1) pool->parallel_for(ni, body, 1, 1);
  else body(0, ni, 0);
  // Merge each (token, kv head)'s chunks by their log-sum-exp (a chunk past
  // a row's position has m = -inf and weighs nothing).
  auto merge = [&](int64_t b, int64_t e, int) {
    for (int64_t tg = b; tg < e; ++tg) {
      const int64_t t = tg / kv_heads, g = tg % kv_heads;
      const int64_t gi = grp[static_cast<size_t>(t)], r = t - groups[static_cast<size_t>(gi)].t0;
      const int64_t i0 = first[static_cast<size_t>(gi * kv_heads + g)], i1 = first[static_cast<size_t>(gi * kv_heads + g) + 1];
      auto part_of = [&](int64_t i) { return parts.data() + (items[static_cast<size_t>(i)].part + r) * pf; };
      for (int64_t h = 0; h < G; ++h) {
        float M = -INFINITY;
        for (int64_t i = i0; i < i1; ++i) M = std::max(M, part_of(i)[h]);
        float* dst = out + (t * heads + g * G + h) * hd;
        std::fill(dst, dst + hd, 0.0f);
        double L = 0;
        for (int64_t i = i0; i < i1; ++i) {
          const float* p = part_of(i);
          if (p[h] == -INFINITY) continue;
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
  if (pool && n * kv_heads > 1 && n * heads * hd >= 4096) pool->parallel_for(n * kv_heads, merge);
  else merge(0, n * kv_heads, 0);
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
