// The expert cache policy, its slot sets and the split rule of split decode (see expert_cache_policy.h).
#include "engine/layers/expert_cache_policy.h"

#include <algorithm>
#include <cmath>

#include "configs/error.h"

namespace hmoe {

CachePolicy parse_cache_policy(const std::string& what, const std::string& v) {
  if (v == "lru") return CachePolicy::lru;
  if (v == "lfu") return CachePolicy::lfu;
  if (v == "freq_recency" || v == "freq-recency") return CachePolicy::freq_recency;
  fail(ErrorKind::invalid_argument, what + "='" + v + "': expected lru, lfu or freq_recency");
}

const char* cache_policy_name(CachePolicy p) {
  switch (p) {
    case CachePolicy::lru: return "lru";
    case CachePolicy::lfu: return "lfu";
    case CachePolicy::freq_recency: return "freq_recency";
  }
  return "?";
}

ExpertSlotCache::ExpertSlotCache(int64_t slots, CachePolicy p)
    : policy_(p),
      owner_(static_cast<size_t>(std::max<int64_t>(slots, 0)), kEmpty),
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

int64_t ExpertSlotCache::access(int64_t layer, int64_t expert, int64_t tick) {
  const uint64_t k = key(layer, expert);
  if (policy_ != CachePolicy::lru) {
    ++freq_[k];
    if (policy_ == CachePolicy::freq_recency && ++since_decay_ >= std::max<int64_t>(8 * slots(), 64)) {
      since_decay_ = 0;
      for (auto it = freq_.begin(); it != freq_.end();) {
        it->second /= 2;
        it = it->second == 0 && !index_.count(it->first) ? freq_.erase(it) : std::next(it);
      }
    }
  }
  const auto it = index_.find(k);
  if (it == index_.end()) return -1;
  touch(it->second, tick);
  return it->second;
}

int64_t ExpertSlotCache::frequency(int64_t layer, int64_t expert) const {
  const auto it = freq_.find(key(layer, expert));
  return it == freq_.end() ? 0 : it->second;
}

int64_t ExpertSlotCache::victim(int64_t tick) const {
  int64_t best = -1, best_f = 0;
  for (size_t i = 0; i < owner_.size(); ++i) {
    if (step_[i] == tick) continue;  // in use by this layer step
    if (owner_[i] == kEmpty) return static_cast<int64_t>(i);
    const auto b = static_cast<size_t>(best);
    if (policy_ == CachePolicy::lfu) {
      const auto it = freq_.find(owner_[i]);
      const int64_t f = it == freq_.end() ? 0 : it->second;
      if (best < 0 || f < best_f || (f == best_f && last_[i] < last_[b])) {
        best = static_cast<int64_t>(i);
        best_f = f;
      }
    } else if (best < 0 || last_[i] < last_[b]) {
      best = static_cast<int64_t>(i);
    }
  }
  return best;
}

int64_t ExpertSlotCache::admit(int64_t layer, int64_t expert, int64_t tick, bool* evicted) {
  if (evicted) *evicted = false;
  const int64_t best = victim(tick);
  if (best < 0) return -1;
  const auto b = static_cast<size_t>(best);
  const uint64_t k = key(layer, expert);
  if (owner_[b] != kEmpty && policy_ == CachePolicy::freq_recency) {
    const auto fk = freq_.find(k), fv = freq_.find(owner_[b]);
    if ((fk == freq_.end() ? 0 : fk->second) <= (fv == freq_.end() ? 0 : fv->second)) return -1;  // not admitted: stays on the CPU
  }
  if (owner_[b] != kEmpty) {
    index_.erase(owner_[b]);
    if (evicted) *evicted = true;
  }
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

int64_t transient_slots(CachePolicy p, int64_t total, int64_t topk) {
  return p == CachePolicy::lru ? 0 : std::max<int64_t>(0, std::min<int64_t>(2 * topk, total / 2));
}

ExpertCacheSet::ExpertCacheSet(const std::vector<int64_t>& layers, int64_t slots, CachePolicy p, bool per_layer, int64_t transient)
    : slots_(std::max<int64_t>(slots, 0)), transient_(std::max<int64_t>(transient, 0)) {
  if (layers.empty()) return;
  if (!per_layer) {
    parts_.push_back({0, ExpertSlotCache(slots_, p)});
    for (int64_t l : layers) part_of_[l] = 0;
    return;
  }
  const std::vector<int64_t> q = per_layer_slots(slots_, static_cast<int64_t>(layers.size()));
  int64_t base = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    parts_.push_back({base, ExpertSlotCache(q[i], p)});
    part_of_[layers[i]] = i;
    base += q[i];
  }
}

bool ExpertCacheSet::covers(int64_t layer) const { return part_of_.count(layer) && slots(layer) + transient_ > 0; }

int64_t ExpertCacheSet::slots(int64_t layer) const {
  const auto it = part_of_.find(layer);
  return it == part_of_.end() ? 0 : parts_[it->second].cache.slots();
}

int64_t ExpertCacheSet::used() const {
  int64_t u = 0;
  for (const Part& p : parts_) u += p.cache.used();
  return u;
}

void ExpertCacheSet::split(int64_t layer, const int32_t* ids, int64_t pairs, int64_t experts, uint64_t expert_bytes, const SplitCost& cost, LayerSplit& out,
                           ExpertCacheCounters& c) {
  const auto pit = part_of_.find(layer);
  if (pit == part_of_.end()) fail(ErrorKind::internal, "expert cache: layer " + std::to_string(layer) + " is not one it serves");
  Part& part = parts_[pit->second];
  const int64_t tick = ++tick_;
  count_.assign(static_cast<size_t>(std::max<int64_t>(experts, 0)), 0);
  out.experts.clear();
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= experts) fail(ErrorKind::internal, "expert cache: expert id " + std::to_string(e) + " out of range");
    if (count_[static_cast<size_t>(e)]++ == 0) out.experts.push_back(e);
  }
  const size_t D = out.experts.size();
  out.pairs.resize(D);
  out.slot.assign(D, -1);
  out.copied.clear();
  out.hits = out.misses = out.evictions = out.admitted = 0;
  std::vector<size_t> missed;
  for (size_t i = 0; i < D; ++i) {
    out.pairs[i] = count_[static_cast<size_t>(out.experts[i])];
    const int64_t s = part.cache.access(layer, out.experts[i], tick);
    if (s >= 0) {
      out.slot[i] = part.base + s;
      ++out.hits;
      c.gpu_pairs += out.pairs[i];
    } else {
      missed.push_back(i);
    }
  }
  out.misses = static_cast<int64_t>(missed.size());
  // Copy the misses with the most pairs first (they cost the CPU most compute).
  std::stable_sort(missed.begin(), missed.end(), [&](size_t a, size_t b) { return out.pairs[a] > out.pairs[b]; });
  const int64_t want = split_stream_count(out.misses, expert_bytes, part.cache.slots() - out.hits + transient_, cost);
  const int64_t want_cached = std::min<int64_t>(want, part.cache.slots() - out.hits);
  for (size_t i : missed) {
    if (out.admitted >= want_cached) break;
    bool evicted = false;
    const int64_t s = part.cache.admit(layer, out.experts[i], tick, &evicted);
    if (s < 0) continue;  // refused by the policy, or no slot free this step
    out.slot[i] = part.base + s;
    out.copied.push_back(i);
    ++out.admitted;
    out.evictions += evicted;
    c.gpu_pairs += out.pairs[i];
  }
  int64_t streamed = 0;  // refused misses the split still wants on the GPU: transient slots
  for (size_t i : missed) {
    if (static_cast<int64_t>(out.copied.size()) >= want || streamed >= transient_) break;
    if (out.slot[i] >= 0) continue;
    out.slot[i] = slots_ + streamed++;
    out.copied.push_back(i);
    c.gpu_pairs += out.pairs[i];
  }
  for (size_t i : missed)
    if (out.slot[i] < 0) c.cpu_pairs += out.pairs[i];
  c.hits += out.hits;
  c.misses += out.misses;
  c.admitted += out.admitted;
  c.streamed += streamed;
  c.evictions += out.evictions;
  c.bytes += static_cast<uint64_t>(out.copied.size()) * expert_bytes;
}

}  // namespace hmoe
