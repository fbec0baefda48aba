// The inner loop of the CPU attention (engine/ops/cpu_attention.cpp): one
// work item's query heads against a run of key tiles of one kv head, in
// the stored dtype, with an online softmax. One implementation
// (cpu_attention_kernel.inc) compiled three times: AVX-512
// (cpu_attention_avx512.cpp), AVX2 + FMA (cpu_attention_avx2.cpp) and plain
// C++ (cpu_attention_scalar.cpp); the caller picks by cpu::best_isa().
//
// Data (engine/kv/kv_storage.h, KvGeometry, head-major layout): a key tile is
// [hd][W] values (W = tile width, lanes = tokens) and, in q8_0, then
// [ceil(hd / 32)][W] fp32 scales at k_scale_offset; a token's values are a
// row of hd values (kv_row_bytes(dtype, hd) bytes, q8_0: int8 then one fp32
// scale per 32). Every tile starts at lane 0.
#pragma once
#include <cstdint>

#include "engine/kv/kv_storage.h"

namespace hmoe::ops::detail {

struct AttnTiles {
  KvDtype dtype = KvDtype::f32;
  int64_t hd = 0;              // head dimension
  int64_t G = 0;               // query heads sharing the kv head
  int64_t W = 16;              // key tile width (1..16)
  int64_t k_scale_offset = 0;  // q8_0: byte offset of a key tile's scales
  int64_t v_row_bytes = 0;
  int64_t ntiles = 0;          // tile i holds the item's positions [i W, i W + count[i])
  const uint8_t* const* ktile = nullptr;  // per tile
  const uint8_t* const* vrow = nullptr;   // per tile: the value row of its first token (the next rows follow)
  const int32_t* count = nullptr;         // per tile: tokens in it (lanes [0, count))
  const uint8_t* const* next_k = nullptr; // per tile: the key tile to prefetch while this one runs (or null)
  const uint8_t* const* next_v = nullptr; // per tile: the value rows to prefetch
  // Query rows (tokens of one sequence) sharing every tile load: row r
  // attends the item's positions [0, row_end[r]) (causal; <= 0: none).
  int64_t rows = 1;
  const int64_t* row_end = nullptr;
  const float* q = nullptr;  // rows x G x hd, already multiplied by the softmax scale
  // Results per row r at part + r * part_floats(G, hd), written from
  // scratch: per head the running max m[G], the sum of exp(score - m) l[G],
  // and the unnormalised output o[G][hd_pad(hd)] (m = -inf, l = 0, o = 0 for
  // a row that attends nothing here).
  float* part = nullptr;
};

// Rows of o are padded to a multiple of 16 floats.
inline int64_t hd_pad(int64_t hd) { return (hd + 15) / 16 * 16; }
inline int64_t part_floats(int64_t G, int64_t hd) { return G * (2 + hd_pad(hd)); }

void attend_tiles_avx512(const AttnTiles& a);
void attend_tiles_avx2(const AttnTiles& a);
void attend_tiles_scalar(const AttnTiles& a);

}  // namespace hmoe::ops::detail
