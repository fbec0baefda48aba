// Private to gpu/deltanet*.cu: the v2 to v5 chunked delta rule's launchers
// (gpu/deltanet_chunked.cu, gpu/deltanet_v3.cu, gpu/deltanet_v4.cu, gpu/deltanet_v5.cu), called by deltanet_chunked (gpu/deltanet.h),
// which checks the shape and chooses the kernel.
#pragma once
#include <cstdint>

#include "gpu/deltanet.h"

namespace hmoe::gpu {

// v2_chunk: deltanet_v2_chunk's answer (> 0); slots: deltanet_v2_slots'.
void deltanet_chunked_v2(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v2_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s);
// The v2 kernels' shared-memory opt-in (before any graph capture).
void deltanet_v2_configure();
// v3 (gpu/deltanet_v3.cu), the same contract; v3_chunk: deltanet_v3_chunk's answer.
void deltanet_chunked_v3(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v3_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s);
void deltanet_v3_configure();
// v4 (gpu/deltanet_v4.cu), the same contract; v4_chunk: deltanet_v4_chunk's answer.
void deltanet_chunked_v4(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v4_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s);
void deltanet_v4_configure();
// v5 (gpu/deltanet_v5.cu), the same contract; v5_chunk: deltanet_v5_chunk's answer.
void deltanet_chunked_v5(const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                         const DeltaNetShape& sh, int64_t state_off, int64_t max_recurrent, int64_t v5_chunk, int64_t slots, void* scratch, float* out,
                         Stream& s);
void deltanet_v5_configure();

}  // namespace hmoe::gpu
