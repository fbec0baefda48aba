// Device pieces of the prefetch-window expert scheduler
// (engine/layers/expert_stream.h): host memory pinned in place, and the two
// kernels around the per-expert products of a streamed MoE layer (gather the
// routed token rows in expert order; weighted sum of the expert outputs back
// in token order). Same conventions as gpu/kernels.h: asynchronous on `s`,
// Error(device) with file:line on failure, Error(unsupported) without CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/memory.h"

namespace hmoe::gpu {

using bf16_t = uint16_t;

// Pins [p, p + bytes) in place (cudaHostRegister, portable) for the life of
// the object, so asynchronous copies from it overlap with compute. The range
// is widened to whole pages. try_pin returns an empty registration (ok() ==
// false) instead of throwing when the driver refuses (e.g. a file mapping it
// cannot pin); `why` receives the driver's message. A range someone pinned
// already counts as pinned (and is left registered at destruction).
// read_only_first: a read-only mapping (a checkpoint file's map, PROT_READ):
// cudaHostRegisterReadOnly is tried first where the device supports it (the
// driver then never asks for writable pages), plain registration after;
// otherwise (anonymous memory) plain first, read-only as the fallback.
class HostRegistration {
 public:
  HostRegistration() = default;
  ~HostRegistration();
  HostRegistration(HostRegistration&& o) noexcept;
  HostRegistration& operator=(HostRegistration&& o) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  static HostRegistration try_pin(const void* p, size_t bytes, std::string* why, bool read_only_first = false);
  bool ok() const { return base_ != nullptr; }
  size_t bytes() const { return bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = true;
};

// Copies bytes[i] from srcs[i] (pinned host memory, read in stream order)
// to dsts[i] (device) for i < count, in one cudaMemcpyBatchAsync where the
// driver takes it, else one cudaMemcpyAsync each. The copies of a batch may
// run in any order (no overlaps between them).
void copy_batch_to_device(void* const* dsts, const void* const* srcs, const size_t* bytes, size_t count, Stream& s);

// xs[i] = x[pair_list[i] / k] for i < pairs: token rows of `hidden` bf16
// values in expert order (pair_list from moe_route). hidden % 8 == 0.
void moe_gather_rows(const bf16_t* x, int64_t hidden, int64_t k, const int32_t* pair_list, int64_t pairs, bf16_t* xs, Stream& s);

// out[t] = sum_{j<k} weights[t*k+j] * ys[pos(t*k+j)] for t < n (overwritten),
// slots in order j = 0..k-1, where ys holds one fp32 row of `hidden` values
// per pair in expert order and pos inverts pair_list (pair_list[pos(p)] == p).
// inv: scratch of n*k int32.
void moe_combine_sorted(const float* ys, const int32_t* pair_list, const float* weights, int64_t n, int64_t k, int64_t hidden,
                        int32_t* inv, float* out, Stream& s);

}  // namespace hmoe::gpu
