// Private to gpu/: the second tensor-core prefill kernel behind
// gpu::attention_tiles (gpu/kernels.h), chosen by set_attention_tiles_kernel
// 2 (rows_per_warp 16) or 3 (32: hd 64 and 128 where two query heads share a
// block; 16 otherwise). Same arguments and results (to rounding) as
// attention_tiles; hd 64, 128 or 256. Returns false, launching nothing, when the current device's shared
// memory per block (with the opt-in) is too small for it (hd 128 and 256 on
// sm_86/89): the caller then runs the first kernel. Asynchronous on `st`.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/kernels.h"

namespace hmoe::gpu::detail {

bool attention_tiles_v2(int rows_per_warp, const float* q, int64_t ldq, int64_t ntiles, const int32_t* tiles, int64_t heads, int64_t kv_heads,
                        int64_t hd, const bf16_t* kc, const bf16_t* vc, const int32_t* slot_lists, const int32_t* offsets, const int32_t* lens,
                        float scale, bf16_t* out, cudaStream_t st);

}  // namespace hmoe::gpu::detail
