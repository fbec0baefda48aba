#include "engine/kv_cache.h"

#include "configs/error.h"

namespace hmoe {

KvCache::KvCache(const KvLayout& layout, int64_t num_blocks, int64_t block_size)
    : layout_(layout), num_blocks_(num_blocks), block_size_(block_size), k_floats_(layout.k_floats()), v_floats_(layout.v_floats()) {
  if (block_size <= 0 || num_blocks <= 0) fail(ErrorKind::invalid_argument, "KV cache needs a positive block size and block count");
  if (k_floats_ < 0 || v_floats_ < 0) fail(ErrorKind::invalid_argument, "KV cache token widths must not be negative");
  const size_t tokens = static_cast<size_t>(layout.layers * num_blocks * block_size);
  keys_.assign(tokens * static_cast<size_t>(k_floats_), 0.0f);
  values_.assign(tokens * static_cast<size_t>(v_floats_), 0.0f);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int KvCache::add_sequence() {
  for (size_t i = 0; i < live_.size(); ++i)
    if (!live_[i]) {
      live_[i] = true;
      if (layout_.seq_state_bytes) seq_state_[i].assign(static_cast<size_t>(layout_.seq_state_bytes), 0);
      return static_cast<int>(i);
    }
  live_.push_back(true);
  tables_.emplace_back();
  seq_state_.emplace_back(static_cast<size_t>(layout_.seq_state_bytes), 0);
  return static_cast<int>(live_.size() - 1);
}

void KvCache::free_sequence(int seq) {
  if (seq < 0 || static_cast<size_t>(seq) >= live_.size() || !live_[static_cast<size_t>(seq)]) return;
  truncate(seq, 0);
  live_[static_cast<size_t>(seq)] = false;
}

void KvCache::reserve(int seq, int64_t len) {
  auto& t = tables_.at(static_cast<size_t>(seq));
  const int64_t need = (len + block_size_ - 1) / block_size_ - static_cast<int64_t>(t.size());
  if (need <= 0) return;
  if (need > free_blocks())
    fail(ErrorKind::out_of_memory, "KV cache full: need " + std::to_string(need) + " more blocks of " + std::to_string(block_size_) +
                                       " tokens, " + std::to_string(free_blocks()) + " free");
  for (int64_t i = 0; i < need; ++i) {
    t.push_back(free_.back());
    free_.pop_back();
  }
}

int64_t KvCache::capacity(int seq) const {
  return static_cast<int64_t>(tables_.at(static_cast<size_t>(seq)).size()) * block_size_;
}

void KvCache::truncate(int seq, int64_t len) {
  auto& t = tables_.at(static_cast<size_t>(seq));
  const size_t keep = static_cast<size_t>((len + block_size_ - 1) / block_size_);
  while (t.size() > keep) {
    free_.push_back(t.back());
    t.pop_back();
  }
}

}  // namespace hmoe
