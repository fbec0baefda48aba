// Private to gpu/deltanet_v4.cu, gpu/deltanet_v4_walk.cu and gpu/deltanet_v5.cu:
// v4's record layout (written by its phase 1, read by either walk and by
// v5), the entry points of its 16-warp walk (gpu/deltanet_v4_walk.cu) and
// of its phase 1 (v5's first launch).
#pragma once
#include <cstdint>

#include "gpu/deltanet.h"

namespace hmoe::gpu::v4 {

// Floats of one (chunk slot, value head) record: Tb [C][C], QKm [C][C], exp(G) [C], exp(G_last - G) [C], exp(G_last), padding.
// Both matrices are lower triangular: only their 16 x 16 tiles on and below the diagonal are written and read
// (the walks' products stop at the diagonal tile).
__host__ __device__ constexpr int64_t rec_floats(int64_t C) { return 2 * C * C + 2 * C + 8; }

// The 16-warp walk's dynamic shared memory (C = 64, dk = 128: 214 KiB).
int64_t walk16_smem(int64_t C, int64_t dk);
// Its shared-memory opt-in, once per process (any thread).
void walk16_configure();
// Launches it for groups [g0, g0 + gn) on s: records at recs (phase 1's, slots numbered as v4's), outputs into out,
// the states at state_off of each group's buffer. C 16, 32 or 64; sh.dk, sh.dv multiples of 16. copies false (timing
// only, results wrong): every chunk reuses the first chunk's rows and record, nothing is copied after it.
void walk16_launch(int C, const float* conv_out, const DeltaNetGroups& gr, int64_t g0, int64_t gn, const DeltaNetShape& sh, int64_t state_off,
                   int64_t max_rec, float* out, const float* recs, bool copies, Stream& s);

// Phase 1's dynamic shared memory, its opt-in (once per process) and its launch on s: the record of every chunk slot
// of groups [g0, g0 + gn) and value head at recs + (slot * nv + value head) * rec_floats(C). C 16, 32 or 64.
int64_t prep_smem(int64_t C, int64_t dk);
void prep_configure();
void prep_launch(int C, const float* conv_out, const float* gate, const float* beta, const DeltaNetGroups& gr, int64_t g0, int64_t gn,
                 const DeltaNetShape& sh, int64_t max_rec, int64_t slots, float* recs, Stream& s);

}  // namespace hmoe::gpu::v4
