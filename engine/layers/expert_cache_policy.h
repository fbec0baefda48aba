// The host-side decisions of the GPU expert cache and split decode
// (engine/layers/gpu_expert_cache.h), kept free of CUDA so that they are
// tested on random traces without a GPU (tests/engine/test_expert_cache_policy.cpp).
//
// One policy, two users: the GPU expert cache (GpuExpertCache keeps one
// ExpertCacheSet per slot pool and asks it, per layer step, which routed
// experts run from a slot, which to copy now and which stay on the CPU) and
// the simulator (engine/placement/expert_cache_sim.h replays a routing
// trace through an ExpertCacheSet built the same way), so the hit rates and
// copied bytes `hmoe bench cache-sim` prints are the real cache's.
//
// ExpertSlotCache: which (layer, expert) each device slot of one pool (or
// one layer's share of it) holds, under a CachePolicy:
//  - freq_recency (the default, setting gpu_expert_cache_policy): evict the
//    least recently used slot, but admit a missed expert only when its
//    recent use count (every access counted, all counts halved every
//    max(8 x slots, 64) accesses) beats that victim's (TinyLFU-style
//    admission). Why: with top-k routing a token's misses are mostly
//    experts that will not come back soon; admitting each one copies an
//    expert over PCIe (9 MiB bf16 on Qwen3-30B-A3B) to gain nothing, and
//    pushes out a hot one. On the Qwen3-30B-A3B-shaped traces (uniform and
//    Zipf 0.8/1.2, bench/README.md "issue 27") it has the best or
//    near-best hit rate and copies 5-20x fewer bytes than lru/lfu.
//  - lru: admit every miss the split copies, evict the least recently used
//    (recency adapts at once when a new request changes the hot set; kept
//    selectable).
//  - lfu: admit every miss, evict the least used so far (ties: least recent).
// A slot used by the current layer step (its tick) is never the victim:
// what the GPU computes in a step must stay in its slot until the step's
// products ran. Why a share of slots per layer (ExpertCacheSet, per_layer):
// decode visits the layers in a cycle, so one LRU over all layers smaller
// than a token's working set (layers x top-k experts) evicts every expert
// before its layer comes round again and never hits (measured: 0 hits with
// 7 slots for 3 layers x 4 experts, tests/engine/test_expert_cache_policy.cpp).
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
#include <string>
#include <unordered_map>
#include <vector>

namespace hmoe {

enum class CachePolicy { lru, lfu, freq_recency };
// "lru", "lfu", "freq_recency" (or "freq-recency"); Error(invalid_argument)
// naming `what` and the value otherwise.
CachePolicy parse_cache_policy(const std::string& what, const std::string& v);
const char* cache_policy_name(CachePolicy p);

struct ExpertCacheCounters {
  int64_t hits = 0;       // routed experts of a host layer found in a slot
  int64_t misses = 0;     // not found (then copied, or left to the CPU)
  int64_t admitted = 0;   // copied into a slot and cached
  int64_t streamed = 0;   // copied into a transient slot for this step only (the policy refused to cache it)
  int64_t evictions = 0;  // slots that held another expert when it was taken
  uint64_t bytes = 0;     // bytes copied host -> device
  int64_t gpu_pairs = 0, cpu_pairs = 0;  // routed (token, expert) pairs run on each side
  double hit_rate() const { return hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0; }
};

class ExpertSlotCache {
 public:
  explicit ExpertSlotCache(int64_t slots = 0, CachePolicy p = CachePolicy::lru);
  int64_t slots() const { return static_cast<int64_t>(owner_.size()); }
  CachePolicy policy() const { return policy_; }
  // The slot holding (layer, expert), or -1. No side effect.
  int64_t find(int64_t layer, int64_t expert) const;
  // Marks slot as used now (step `tick`); protected from eviction while tick is current.
  void touch(int64_t slot, int64_t tick);
  // One use of (layer, expert): counted (the frequency lfu and
  // freq_recency rank by); its slot, touched, or -1 when not cached.
  int64_t access(int64_t layer, int64_t expert, int64_t tick);
  // A slot for (layer, expert) not used at `tick`, chosen by the policy
  // (empty slots first), or -1: every slot used at `tick`, or (freq_recency)
  // the expert's use count does not beat the victim's. The victim's owner
  // is forgotten (*evicted set when there was one).
  int64_t admit(int64_t layer, int64_t expert, int64_t tick, bool* evicted = nullptr);
  // Slots whose contents are gone (a failed copy): empty again.
  void drop(int64_t slot);
  int64_t used() const;  // slots holding an expert
  int64_t frequency(int64_t layer, int64_t expert) const;  // recent use count (decayed under freq_recency)

 private:
  static uint64_t key(int64_t layer, int64_t expert) { return static_cast<uint64_t>(layer) << 32 | static_cast<uint32_t>(expert); }
  int64_t victim(int64_t tick) const;
  CachePolicy policy_ = CachePolicy::lru;
  std::vector<uint64_t> owner_;  // key, or kEmpty
  std::vector<int64_t> last_;    // use sequence number of the last use (-1: never)
  std::vector<int64_t> step_;    // tick of the last use (protects the current layer step)
  int64_t seq_ = 0, since_decay_ = 0;
  std::unordered_map<uint64_t, int64_t> index_;  // key -> slot
  std::unordered_map<uint64_t, int64_t> freq_;   // key -> use count
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


// Of a pool of `total` slots, how many are transient (ExpertCacheSet): none
// under lru (it caches every copy), else up to two top-k sets, at most half.
int64_t transient_slots(CachePolicy p, int64_t total, int64_t topk);

// One layer step's decision (ExpertCacheSet::split).
struct LayerSplit {
  std::vector<int32_t> experts;  // the distinct routed experts, first seen first
  std::vector<int64_t> pairs;    // per distinct expert: its (token, expert) pairs
  std::vector<int64_t> slot;     // per distinct expert: the pool slot it runs from, -1: the CPU
  std::vector<size_t> copied;    // indices into experts copied host -> slot now: admitted (cached), then streamed (transient slots)
  int64_t hits = 0, misses = 0, evictions = 0, admitted = 0;
};

// The slots of one pool over the host layers it serves: per_layer (what
// GpuExpertCache does) gives each layer an even share (per_layer_slots, in
// the order given) with its own ExpertSlotCache; otherwise one cache over
// all (the simulator's "global" mode). Pool slot numbers are a layer's base
// plus its local slot. `transient` more slots [slots, slots + transient)
// take misses the split wants on the GPU this step but the policy refuses
// to cache (freq_recency): split decode keeps its PCIe share of the work
// while the cache keeps its hot experts. The simulator has none.
class ExpertCacheSet {
 public:
  ExpertCacheSet() = default;
  ExpertCacheSet(const std::vector<int64_t>& layers, int64_t slots, CachePolicy p, bool per_layer = true, int64_t transient = 0);
  bool covers(int64_t layer) const;       // a layer served with at least one slot
  int64_t slots(int64_t layer) const;     // its slots (the whole pool when shared)
  int64_t slots() const { return slots_; }
  int64_t used() const;
  // One layer step: `ids` [pairs] routed expert ids in [0, experts).
  // Looks each distinct expert up (hits run from their slot), then of the
  // misses, most pairs first, admits up to split_stream_count(...) of them
  // (cost.share 1: as many as the free slots take) as the policy allows,
  // then puts refused ones in transient slots up to that count: those are
  // copied now and run on the GPU, the rest on the CPU. Counts into c
  // (bytes: copies x expert_bytes; the pair counts too).
  // Error(internal) for an id out of range or a layer not served.
  void split(int64_t layer, const int32_t* ids, int64_t pairs, int64_t experts, uint64_t expert_bytes, const SplitCost& cost, LayerSplit& out,
             ExpertCacheCounters& c);

 private:
  struct Part {
    int64_t base = 0;
    ExpertSlotCache cache;
  };
  std::vector<Part> parts_;
  std::unordered_map<int64_t, size_t> part_of_;  // layer -> index into parts_
  int64_t slots_ = 0, tick_ = 0, transient_ = 0;
  std::vector<int64_t> count_;  // scratch: pairs per expert
};

}  // namespace hmoe
