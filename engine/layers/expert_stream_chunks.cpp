// Streamed prefill's slot plan: whole layers or chunks of experts (see expert_stream_chunks.h).
#include "engine/layers/expert_stream_chunks.h"

#include <algorithm>
#include <cstdio>

#include "engine/placement/placement.h"

namespace hmoe {

StreamChunkPlan plan_stream_chunks(int64_t experts, uint64_t expert_bytes, int window, int64_t layers, uint64_t room, bool chunked_ok) {
  StreamChunkPlan p;
  if (experts <= 0 || expert_bytes == 0 || layers <= 0 || window < 1) return p;
  const auto E = static_cast<uint64_t>(experts);
  const int64_t whole_slots = std::min<int64_t>(window + 1, layers);
  if (static_cast<uint64_t>(whole_slots) * E * expert_bytes <= room) {
    p.slots = whole_slots;
    p.experts_per_slot = experts;
    p.chunks_per_layer = 1;
    p.slot_bytes = E * expert_bytes;
    return p;
  }
  if (!chunked_ok || experts < 2) return p;
  const int64_t slots = std::max<int64_t>(window + 1, 2);
  const int64_t c = std::min<int64_t>(static_cast<int64_t>(room / (static_cast<uint64_t>(slots) * expert_bytes)), (experts + 1) / 2);
  if (c < std::min<int64_t>(kMinChunkExperts, experts)) return p;
  const int64_t n = (experts + c - 1) / c, balanced = (experts + n - 1) / n;  // the fewest chunks that fit, balanced (<= c)
  if (balanced < std::min<int64_t>(kMinChunkExperts, experts)) return p;
  p.chunks_per_layer = n;
  p.experts_per_slot = balanced;
  p.slots = slots;
  p.slot_bytes = static_cast<uint64_t>(p.experts_per_slot) * expert_bytes;
  return p;
}

std::string StreamChunkPlan::describe() const {
  char buf[160];
  if (!fits()) return "no slots (the room holds too few experts)";
  if (whole_layers())
    std::snprintf(buf, sizeof buf, "%lld slots of one layer (%s each)", static_cast<long long>(slots), format_bytes(slot_bytes).c_str());
  else
    std::snprintf(buf, sizeof buf, "%lld slots of %lld experts (%lld chunks a layer, %s each)", static_cast<long long>(slots),
                  static_cast<long long>(experts_per_slot), static_cast<long long>(chunks_per_layer), format_bytes(slot_bytes).c_str());
  return buf;
}

}  // namespace hmoe
