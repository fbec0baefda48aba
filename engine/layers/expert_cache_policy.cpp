// LRU slots and the split rule of split decode (see expert_cache_policy.h).
#include "engine/layers/expert_cache_policy.h"

#include <algorithm>
#include <cmath>

namespace hmoe {

ExpertSlotCache::ExpertSlotCache(int64_t slots)
    : owner_(static_cast<size_t>(std::max<int64_t>(slots, 0)), kEmpty),
      last_(owner_.size(), -1),
      step_(owner_.size(), -1) {}

int64_t ExpertSlotCache::find(int64_t layer, int64_t expert) const {
  const auto it = index_.find(key(layer, expert));
  return it == index_.end() ? -1 : it->second;
}

void ExpertSlotCache::touch(int64_t slot, int64_t tick) {
  last_[static_cast<size_t>(slot)] = ++seq_;
  step_[static_cast<size_t>(slot)] = tick;
}

int64_t ExpertSlotCache::admit(int64_t layer, int64_t expert, int64_t tick, bool* evicted) {
  if (evicted) *evicted = false;
  int64_t best = -1;
  for (size_t i = 0; i < owner_.size(); ++i) {
    if (step_[i] == tick) continue;  // in use by this layer step
    if (owner_[i] == kEmpty) {
      best = static_cast<int64_t>(i);
      break;
    }
    if (best < 0 || last_[i] < last_[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
  }
  if (best < 0) return -1;
  const auto b = static_cast<size_t>(best);
  if (owner_[b] != kEmpty) {
    index_.erase(owner_[b]);
    if (evicted) *evicted = true;
  }
  const uint64_t k = key(layer, expert);
  if (const auto it = index_.find(k); it != index_.end()) drop(it->second);  // never two slots for one expert
  owner_[b] = k;
  index_[k] = best;
  touch(best, tick);
  return best;
}

void ExpertSlotCache::drop(int64_t slot) {
  const auto b = static_cast<size_t>(slot);
  if (owner_[b] != kEmpty) index_.erase(owner_[b]);
  owner_[b] = kEmpty;
  last_[b] = -1;
  step_[b] = -1;
}

int64_t ExpertSlotCache::used() const { return static_cast<int64_t>(index_.size()); }

std::vector<int64_t> per_layer_slots(int64_t slots, int64_t layers) {
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(layers, 0)), 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = slots / layers + (static_cast<int64_t>(i) < slots % layers ? 1 : 0);
  return out;
}

int64_t split_stream_count(int64_t misses, uint64_t expert_bytes, int64_t free_slots, const SplitCost& c) {
  const int64_t cap = std::max<int64_t>(0, std::min(misses, free_slots));
  if (cap == 0) return 0;
  if (c.share >= 0) return std::min(cap, static_cast<int64_t>(std::llround(c.share * static_cast<double>(misses))));
  if (c.host_bandwidth <= 0 || c.pcie_bandwidth <= 0) return 0;
  const double b = static_cast<double>(expert_bytes);
  int64_t best = 0;
  double best_t = static_cast<double>(misses) * b / c.host_bandwidth;
  for (int64_t m = 1; m <= cap; ++m) {
    const double t = std::max(static_cast<double>(misses - m) * b / c.host_bandwidth, c.copy_latency_s + static_cast<double>(m) * b / c.pcie_bandwidth);
    if (t < best_t) {
      best_t = t;
      best = m;
    }
  }
  return best;
}

double split_pcie_share(const SplitCost& c) {
  if (c.share >= 0) return std::min(1.0, c.share);
  if (c.host_bandwidth <= 0 || c.pcie_bandwidth <= 0) return 0;
  return c.pcie_bandwidth / (c.pcie_bandwidth + c.host_bandwidth);
}

}  // namespace hmoe
