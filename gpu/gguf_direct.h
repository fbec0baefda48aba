// Private to gpu/*.cu: the "direct" decode kernels of GGUF Q4_K, Q5_K, Q6_K
// and Q8_0 blocks (gpu/gguf_gemv_direct.cu), behind gpu::gguf_gemv and
// gpu::gguf_moe_experts (gpu/quant.h) when gpu::gguf_decode_kernel() is
// GgufDecodeKernel::direct. Same contracts and numerics as those functions;
// the callers check shapes first. Each lane reads whole aligned 16-byte
// chunks that hold bytes of its own block group, never a chunk past the
// last one holding a byte of the matrix.
#pragma once

#include <cstdint>

#include "gpu/quant.h"

namespace hmoe::gpu::detail::gguf_direct {

struct Params {
  const uint8_t* data;
  const uint8_t* end;       // data + bytes(): prefetches stop at the last 16-byte boundary before it
  int64_t rb;               // row bytes
  int cols, rows;           // rows: of the matrix (dense) or of one expert
  int U, P, G, UPL, passes;  // units per row, lanes per row slot, row slots per warp, 32-unit steps per row, passes
  const uint16_t* x;        // dense, gate/up: bf16 [n, cols]
  const float* gu;          // down: [pairs, 2 * cols] gate/up products
  int n, k;
  float* y;
  int64_t ldy;
  const int32_t* ids;
  const float* weights;
};

// Whether the direct kernels take w at n tokens (types above, activations fit in shared memory).
bool gemv_supported(const GgufWeight& w, int64_t n);
bool moe_supported(const GgufWeight& gate_up, const GgufWeight& down, int64_t k);
void gemv(const GgufWeight& w, const bf16_t* x, int64_t n, float* y, int64_t ldy, Stream& s);
void moe_experts(const bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* weights, const GgufWeight& w_gate_up, const GgufWeight& w_down,
                 int64_t inter, float* gu, float* out, Stream& s);

}  // namespace hmoe::gpu::detail::gguf_direct
