// Private to gpu/gguf_moe_gemm.cu and gpu/gguf_moe_gemm_pipelined.cu: the
// arguments of the grouped GGUF expert product (gpu::gguf_moe_gemm), the
// tile locator both kernels share, the bf16 tensor-core instruction, and the
// pipelined kernel's launcher.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/gguf_units.cuh"
#include "gpu/quant.h"

namespace hmoe::gpu::detail::moe_gemm {

struct GemmParams {
  const uint16_t* a;       // bf16 activations, rows of cols
  const int32_t* rowmap;   // sorted row i reads activation row rowmap[i] / k_div (null: row i)
  int k_div;
  const int32_t* offsets;  // [experts + 1] device offsets of each expert's sorted rows
  int experts;
  const uint8_t* w;        // the experts' blocks as stored, 16-byte aligned
  int64_t rb;              // bytes per weight row
  int cols, rows_per_expert;
  float* c;                // [pairs, rows_per_expert]
  gguf::LowbitTables tabs;  // the IQ codebooks (low-bit types)
};

// Tile `tile` of the enumeration "every expert's rows in tiles of bm, experts
// in order": its expert e, first sorted row m0 and the end of the expert's
// rows. False past the last tile (the grid covers an upper bound).
__device__ __forceinline__ bool locate_tile(const int32_t* offsets, int experts, int tile, int bm, int& e, int& m0, int& mend) {
  int acc = 0;
  for (int i = 0; i < experts; ++i) {
    const int b = __ldg(offsets + i), en = __ldg(offsets + i + 1), t = (en - b + bm - 1) / bm;
    if (tile < acc + t) {
      e = i;
      m0 = b + (tile - acc) * bm;
      mend = en;
      return true;
    }
    acc += t;
  }
  return false;
}

// d += a (16 x 16, row-major) * b (16 x 8, column-major); bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Upper bound of the tiles of bm rows over all experts (grid rows).
inline int64_t tile_bound(int64_t pairs, int64_t experts, int bm) { return (pairs + bm - 1) / bm + (experts < pairs ? experts : pairs); }

// The pipelined kernel (gpu/gguf_moe_gemm_pipelined.cu) with tiles of bm
// (64 or 128) sorted rows; p as for the simple kernel, pairs > 0, the grid's
// size checked by the caller. False, launching nothing, where the current
// device cannot give a block the kernel's shared memory (142-170 KB: sm_80
// and sm_90 can, sm_86 and sm_89 cannot).
bool launch_pipelined(GgufType t, const GemmParams& p, int bm, int64_t pairs, cudaStream_t st);

}  // namespace hmoe::gpu::detail::moe_gemm
