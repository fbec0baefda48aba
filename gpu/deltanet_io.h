// Private to gpu/deltanet*.cu: the vectorised conv + gates and gated norm
// (gpu/deltanet_io.cu) behind deltanet_prepare and deltanet_gated_norm
// (gpu/deltanet.h), which check the shape and fall back to the plain
// kernels (gpu/deltanet.cu) where these answer false.
#pragma once
#include <cstdint>

#include "gpu/deltanet.h"

namespace hmoe::gpu {

// deltanet_prepare's contract. version 1: the tiled kernel (a warp per 32
// tokens x 128 channels, every tap's row loaded per token); 2: the sliding
// one (a warp per tile of tokens x 128 channels, tiles as long as fill the
// device once or set_deltanet_io's vec2_tile; each token's row loaded once,
// the taps kept in registers, token indices loaded up front). false (nothing
// launched) where the shape or alignment does not allow them: conv_k 4, dk
// dividing 128 and a multiple of 4, dv and ld multiples of 4, state_off a
// multiple of 16 and proj, conv_w, conv_out 16-byte aligned (the state
// buffers are device allocations: 256-byte aligned).
bool deltanet_prepare_vec(int version, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok, const DeltaNetShape& sh,
                          const float* conv_w, const float* a_neg, const float* dt_bias, int64_t state_off, float* conv_out, float* gate, float* beta,
                          Stream& s);
// deltanet_gated_norm's contract; false where dv is not a multiple of 4 up
// to 512, ld or the value block not a multiple of 4, or core, proj, w not
// 16-byte (y, y_lo not 8-byte) aligned.
bool deltanet_gated_norm_vec(const float* core, const float* proj, int64_t ld, const DeltaNetGroups& gr, int64_t tok0, int64_t ntok,
                             const DeltaNetShape& sh, const float* w, float eps, uint16_t* y, Stream& s, uint16_t* y_lo, int64_t row0);

}  // namespace hmoe::gpu
