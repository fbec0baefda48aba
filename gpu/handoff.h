// The device side of the zero-copy hand-off (engine/runtime/
// zero_copy_handoff.h): kernels that move a decode step's hand-off data
// between device buffers and mapped pinned host memory (gpu::MappedBuffer)
// and signal the host through flags in that memory, so that a whole step
// can be enqueued (and captured as one CUDA graph) up front while the host
// runs the CPU experts in the middle of it.
//
// Flags are 32-bit words in mapped host memory. The GPU publishes with
// __threadfence_system() and a release store at system scope; it reads the
// host's flags with acquire loads at system scope and the host's data with
// uncached loads (ld.global.cv), so no stale line is ever used. Every kernel
// here is one block, launched plainly (never with programmatic launch), so
// the kernel after it starts only once it has finished.
//
// Timestamps (ts, may be null) are the GPU's %globaltimer in nanoseconds,
// written to mapped memory for the step's time breakdown.
#pragma once
#include <cstdint>

#include "gpu/memory.h"

namespace hmoe::gpu {

// Values of a hand-off's `done` flag (0: not yet).
constexpr uint32_t kHandoffRelease = 1;  // the host wrote the experts' output: add it
constexpr uint32_t kHandoffAbort = 2;    // the host failed: go on without it (the step is discarded)

// Copies hf [nh] fp32, ids [nk] int32 and w [nk] fp32 into the mapped
// buffers, then sets *ready = 1 (after a system fence). ts[0]: start, ts[1]:
// just before the flag.
void handoff_down(const float* hf, const int32_t* ids, const float* w, int64_t nh, int64_t nk, float* hf_m, int32_t* ids_m, float* w_m,
                  uint32_t* ready, uint64_t* ts, Stream& s);
// Spins until *done != 0 (the host's release), resets it to 0, and on
// kHandoffRelease copies out_m [nh] (mapped) into d (device); on
// kHandoffAbort leaves d alone. ts[0]: when it saw the flag, ts[1]: done.
// nh must be a multiple of 4 and both pointers 16-byte aligned.
void handoff_wait_add(uint32_t* done, const float* out_m, int64_t nh, float* d, uint64_t* ts, Stream& s);
// Sets *flag = 1 once everything before it on s has finished (ts[0]: then).
void handoff_signal(uint32_t* flag, uint64_t* ts, Stream& s);

}  // namespace hmoe::gpu
