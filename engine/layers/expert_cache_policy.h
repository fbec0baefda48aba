// The host-side decisions of the GPU expert cache and split decode
// (engine/layers/gpu_expert_cache.h), kept free of CUDA so that they are
// tested on random traces without a GPU (tests/engine/test_expert_cache_policy.cpp).
//
// ExpertSlotCache: which (layer, expert) each device slot of one pool holds.
// Policy: LRU per layer. Every expert the GPU computes in a step must sit
// in a slot that step anyway (it was copied there to be computed), so
// admission is free and always happens; eviction takes the least recently
// used slot not used by the current layer step. Why LRU and not a
// frequency count: decode steps of one sequence route consecutive tokens to
// overlapping experts (llama.cpp's expert cache reports 67-81% hits on
// Qwen3-30B-A3B with LRU), LRU adapts at once when a new request changes
// the hot set, and it costs O(1) per touch; a frequency count would keep
// experts of an earlier request hot after the prompt changed. Why per
// layer: decode visits the layers in a cycle, so one LRU over all layers
// that is smaller than a token's working set (layers x top-k experts)
// evicts every expert before its layer comes round again and never hits
// (measured: 0 hits with 7 slots for 3 layers x 4 experts,
// tests/engine/test_expert_cache_policy.cpp); GpuExpertCache gives each
// layer its own ExpertSlotCache over an even share of the slots
// (per_layer_slots). With random weights routing is close to uniform and
// any policy hits about capacity / experts.
//
// split_stream_count: of the `misses` routed experts of one layer that are
// not cached, how many to copy to the GPU (the rest run on the CPU) so that
// the CPU's share and the copies finish together: minimises
// max(cpu_bytes / host read bandwidth, copy latency + copied bytes / PCIe
// bandwidth). Cached experts cost neither side (the GPU computes them from
// VRAM in a few microseconds).
//
// Thread safety: none (one step at a time).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace hmoe {

struct ExpertCacheCounters {
  int64_t hits = 0;       // routed experts of a host layer found in a slot
  int64_t misses = 0;     // not found (then copied, or left to the CPU)
  int64_t admitted = 0;   // copied into a slot
  int64_t evictions = 0;  // slots that held another expert when it was taken
  uint64_t bytes = 0;     // bytes copied host -> device
  int64_t gpu_pairs = 0, cpu_pairs = 0;  // routed (token, expert) pairs run on each side
  double hit_rate() const { return hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0; }
};

class ExpertSlotCache {
 public:
  explicit ExpertSlotCache(int64_t slots = 0);
  int64_t slots() const { return static_cast<int64_t>(owner_.size()); }
  // The slot holding (layer, expert), or -1.
  int64_t find(int64_t layer, int64_t expert) const;
  // Marks slot as used now (step `tick`); protected from eviction while tick is current.
  void touch(int64_t slot, int64_t tick);
  // A slot for (layer, expert) not used at `tick`: the least recently used
  // one (empty slots first); -1 when every slot is used at `tick`. Its
  // previous owner is forgotten (*evicted set when there was one).
  int64_t admit(int64_t layer, int64_t expert, int64_t tick, bool* evicted = nullptr);
  // Slots whose contents are gone (a failed copy): empty again.
  void drop(int64_t slot);
  int64_t used() const;  // slots holding an expert

 private:
  static uint64_t key(int64_t layer, int64_t expert) { return static_cast<uint64_t>(layer) << 32 | static_cast<uint32_t>(expert); }
  std::vector<uint64_t> owner_;  // key, or kEmpty
  std::vector<int64_t> last_;    // use sequence number of the last use (-1: never)
  std::vector<int64_t> step_;    // tick of the last use (protects the current layer step)
  int64_t seq_ = 0;
  std::unordered_map<uint64_t, int64_t> index_;  // key -> slot
  static constexpr uint64_t kEmpty = ~0ull;
};

// Slots of a pool split evenly over `layers` layers (the first ones get the
// remainder); each entry >= 0, the sum == slots.
std::vector<int64_t> per_layer_slots(int64_t slots, int64_t layers);

struct SplitCost {
  double host_bandwidth = 0;   // bytes/s the CPU expert engine reads (measured)
  double pcie_bandwidth = 0;   // bytes/s of pinned host -> device copies (measured)
  double copy_latency_s = 10e-6;  // fixed cost of starting a layer's copies
  double share = -1;           // >= 0: copy this fraction of the misses instead (setting gpu_split_decode)
};

// How many of `misses` uncached experts (each `expert_bytes`) to copy, at
// most `free_slots`. 0 when the bandwidths are unknown (<= 0).
int64_t split_stream_count(int64_t misses, uint64_t expert_bytes, int64_t free_slots, const SplitCost& c);
// The fraction of a layer's bytes the split sends over PCIe when nothing is
// cached: pcie / (pcie + host) (what `hmoe plan` prints).
double split_pcie_share(const SplitCost& c);

}  // namespace hmoe
