// How streamed prefill's slots hold a layer's experts when the GPU budget
// is small (issue 27, "streamed prefill on a 24 GB card"): the prefetch
// window's ring of slots (engine/layers/expert_stream.h) holds whole layers
// when window + 1 of them fit the room; otherwise each slot holds a chunk of
// C experts of a layer and a layer streams through the ring in ceil(E / C)
// chunks, so the window works within any budget that holds a few experts
// per slot, instead of prefill falling back to the CPU experts.
//
// Why this shape: streaming is PCIe-bound (one copy per expert and pass
// whatever the slot size), so smaller slots cost overlap granularity, not
// bandwidth; chunks are balanced (C = ceil(E / chunks)) so that no chunk is
// a sliver, and at least kMinChunkExperts experts so that the grouped
// expert product still has whole experts' worth of rows per launch.
//
// Contract: pure functions, no device work.
#pragma once
#include <cstdint>
#include <string>

namespace hmoe {

struct StreamChunkPlan {
  int64_t slots = 0;              // ring slots (0: streaming cannot fit the room)
  int64_t experts_per_slot = 0;   // C (E: whole layers)
  int64_t chunks_per_layer = 0;   // ceil(E / C)
  uint64_t slot_bytes = 0;        // C x expert_bytes
  uint64_t bytes() const { return static_cast<uint64_t>(slots) * slot_bytes; }
  bool whole_layers() const { return chunks_per_layer == 1; }
  bool fits() const { return slots > 0; }
  std::string describe() const;   // "2 slots of 1 layer (1.20 GiB)" / "2 slots of 32 experts (4 chunks a layer, 160 MiB)"
};

inline constexpr int64_t kMinChunkExperts = 8;

// The ring for `layers` streamed layers of `experts` experts of
// `expert_bytes` each, with a prefetch `window` (slots = window + 1, at most
// one per layer for whole layers, at least 2 for chunks so that a copy
// overlaps a chunk's products), in at most `room` bytes. chunked_ok false
// (a layer format the chunked path does not run): whole layers or nothing.
StreamChunkPlan plan_stream_chunks(int64_t experts, uint64_t expert_bytes, int window, int64_t layers, uint64_t room, bool chunked_ok = true);

}  // namespace hmoe
