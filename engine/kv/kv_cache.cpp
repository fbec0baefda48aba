#include "engine/kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "configs/error.h"

namespace hmoe {

namespace {
uint64_t mix(uint64_t h, uint64_t v) {
  // splitmix64 finalizer over h ^ v, chained.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

KvCache::KvCache(const KvLayout& layout, int64_t num_blocks, int64_t block_size, const KvCacheOptions& opt, std::unique_ptr<KvStorage> storage)
    : layout_(layout), num_blocks_(num_blocks), block_size_(block_size), k_floats_(layout.k_floats()), v_floats_(layout.v_floats()), opt_(opt) {
  if (block_size <= 0 || num_blocks <= 0) fail(ErrorKind::invalid_argument, "KV cache needs a positive block size and block count");
  if (k_floats_ < 0 || v_floats_ < 0) fail(ErrorKind::invalid_argument, "KV cache token widths must not be negative");
  if (opt_.host_blocks < 0) fail(ErrorKind::invalid_argument, "KV host pool block count must not be negative");
  if (opt_.state_snapshots < 0) fail(ErrorKind::invalid_argument, "KV state snapshot count must not be negative");
  // Per-sequence state is not in the blocks: a shared prefix restores it from a
  // snapshot where the layout can take them (linear attention), never otherwise (Engram).
  if (layout.seq_state_bytes > 0) {
    if (layout.state_align > 0 && opt_.prefix_caching && opt_.state_snapshots > 0) {
      snap_align_ = std::lcm(block_size, layout.state_align);
      opt_.host_blocks = 0;  // host blocks would come back without their snapshots
      snap_slot_block_.assign(static_cast<size_t>(opt_.state_snapshots), -1);
      snap_bytes_.resize(static_cast<size_t>(opt_.state_snapshots));
      snap_lru_pos_.assign(static_cast<size_t>(opt_.state_snapshots), snap_lru_.end());
      for (int64_t sl = opt_.state_snapshots - 1; sl >= 0; --sl) snap_free_.push_back(sl);
    } else {
      opt_.prefix_caching = false;
    }
  }
  if (!opt_.prefix_caching) opt_.host_blocks = 0;
  if (storage) {
    storage_ = std::move(storage);
  } else {
    auto cpu = std::make_unique<CpuKvStorage>(layout, num_blocks, block_size, opt_.host_blocks);
    cpu_ = cpu.get();
    storage_ = std::move(cpu);
  }
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  block_snap_.assign(static_cast<size_t>(num_blocks), -1);
  ids_.resize(static_cast<size_t>(num_blocks));
  lru_pos_.assign(static_cast<size_t>(num_blocks), lru_.end());
  if (opt_.host_blocks > 0) {
    host_.resize(static_cast<size_t>(opt_.host_blocks));
    for (int64_t b = opt_.host_blocks - 1; b >= 0; --b) host_free_.push_back(b);
  }
}

void KvCache::row_check() const {
  if (!cpu_ || cpu_->geometry().head_major || layout_.dtype != KvDtype::f32)
    fail(ErrorKind::internal, "KvCache::k()/v(): fp32 row-major CPU layouts only (use store()/load())");
}

void KvCache::set_storage(std::unique_ptr<KvStorage> storage) {
  if (!storage) fail(ErrorKind::internal, "KvCache::set_storage: null storage");
  if (!cached_.empty() || !host_lru_.empty() || stats_.offloaded_blocks > 0)
    fail(ErrorKind::internal, "KvCache::set_storage after blocks were cached: their contents would be lost");
  storage_ = std::move(storage);
  cpu_ = nullptr;
  // Only the CPU layers write state checkpoints.
  if (snap_align_ > 0) {
    opt_.prefix_caching = false;
    snap_align_ = 0;
  }
}

bool KvCache::BlockId::same(uint64_t p, const int32_t* t) const {
  return parent == p && !tokens.empty() && std::memcmp(tokens.data(), t, tokens.size() * sizeof(int32_t)) == 0;
}

uint64_t KvCache::block_hash(uint64_t parent, const int32_t* t) const {
  uint64_t h = mix(parent, opt_.salt);
  for (int64_t i = 0; i < block_size_; ++i) h = mix(h, static_cast<uint32_t>(t[i]));
  return h;
}

int64_t KvCache::find_cached(uint64_t parent, const int32_t* t, uint64_t h) const {
  auto [lo, hi] = cached_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (ids_[static_cast<size_t>(it->second)].same(parent, t)) return it->second;
  return -1;
}

uint8_t* KvCache::snapshot(int64_t slot) {
  auto& bytes = snap_bytes_[static_cast<size_t>(slot)];
  if (bytes.empty()) bytes.resize(static_cast<size_t>(layout_.seq_state_bytes));
  return bytes.data();
}

void KvCache::drop_snapshot(int64_t b) {
  if (block_snap_.empty()) return;
  const int64_t sl = block_snap_[static_cast<size_t>(b)];
  if (sl < 0) return;
  block_snap_[static_cast<size_t>(b)] = -1;
  snap_lru_.erase(snap_lru_pos_[static_cast<size_t>(sl)]);
  snap_lru_pos_[static_cast<size_t>(sl)] = snap_lru_.end();
  snap_slot_block_[static_cast<size_t>(sl)] = -1;
  snap_free_.push_back(sl);
  ++stats_.snapshots_dropped;
  stats_.snapshots_held = static_cast<int64_t>(snap_lru_.size());
}

int64_t KvCache::take_snapshot_slot() {
  if (snap_free_.empty() && !snap_lru_.empty()) drop_snapshot(snap_slot_block_[static_cast<size_t>(snap_lru_.front())]);
  if (snap_free_.empty()) return -1;
  const int64_t sl = snap_free_.back();
  snap_free_.pop_back();
  return sl;
}

bool KvCache::plan_state_snapshot(int seq, std::span<const int32_t> tokens, int64_t pos) {
  if (!opt_.prefix_caching || snap_align_ == 0 || pos <= 0 || pos % snap_align_ != 0 || pos > static_cast<int64_t>(tokens.size()))
    return false;
  int64_t b = -1;
  uint64_t parent = 0;
  for (int64_t i = 0; i < pos / block_size_; ++i) {
    const int32_t* tk = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, tk);
    b = find_cached(parent, tk, h);
    if (b < 0) break;
    parent = h;
  }
  if (b >= 0 && block_snap_[static_cast<size_t>(b)] >= 0) {  // already there: keep it longer
    const int64_t sl = block_snap_[static_cast<size_t>(b)];
    snap_lru_.splice(snap_lru_.end(), snap_lru_, snap_lru_pos_[static_cast<size_t>(sl)]);
    return false;
  }
  for (const PlannedSnapshot& p : planned_)
    if (p.seq == seq && p.pos == pos) return false;
  const int64_t sl = take_snapshot_slot();
  if (sl < 0) return false;
  snap_slot_block_[static_cast<size_t>(sl)] = -2;
  planned_.push_back({seq, pos, sl});
  add_state_checkpoint(seq, pos, snapshot(sl));
  return true;
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
  seq_hashes_.emplace_back();
  seq_state_.emplace_back(static_cast<size_t>(layout_.seq_state_bytes), 0);
  return static_cast<int>(live_.size() - 1);
}

void KvCache::free_sequence(int seq) {
  if (seq < 0 || static_cast<size_t>(seq) >= live_.size() || !live_[static_cast<size_t>(seq)]) return;
  for (const PlannedSnapshot& p : planned_)
    if (p.seq == seq) {
      snap_slot_block_[static_cast<size_t>(p.slot)] = -1;
      snap_free_.push_back(p.slot);
    }
  std::erase_if(planned_, [seq](const PlannedSnapshot& p) { return p.seq == seq; });
  std::erase_if(checkpoints_, [seq](const StateCheckpoint& c) { return c.seq == seq; });
  truncate(seq, 0);
  live_[static_cast<size_t>(seq)] = false;
  std::vector<uint8_t>().swap(seq_state_[static_cast<size_t>(seq)]);  // add_sequence allocates it again
  storage_->free_sequence(seq);
}

void KvCache::uncache(int64_t b) {
  BlockId& id = ids_[static_cast<size_t>(b)];
  if (id.tokens.empty()) return;
  drop_snapshot(b);
  auto [lo, hi] = cached_.equal_range(id.hash);
  for (auto it = lo; it != hi; ++it)
    if (it->second == b) {
      cached_.erase(it);
      break;
    }
  id.tokens.clear();
}

int64_t KvCache::take_block() {
  int64_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = lru_.front();
    lru_.pop_front();
    lru_pos_[static_cast<size_t>(b)] = lru_.end();
    ++stats_.evictions;
    if (opt_.host_blocks > 0) offload(b);
    uncache(b);
  }
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvCache::release_block(int64_t b) {
  if (--refs_[static_cast<size_t>(b)] > 0) return;
  if (!ids_[static_cast<size_t>(b)].tokens.empty()) lru_pos_[static_cast<size_t>(b)] = lru_.insert(lru_.end(), b);
  else free_.push_back(b);
}

void KvCache::reserve(int seq, int64_t len) {
  auto& t = tables_.at(static_cast<size_t>(seq));
  const int64_t need = (len + block_size_ - 1) / block_size_ - static_cast<int64_t>(t.size());
  if (need <= 0) return;
  if (need > free_blocks())
    fail(ErrorKind::out_of_memory, "KV cache full: need " + std::to_string(need) + " more blocks of " + std::to_string(block_size_) +
                                       " tokens, " + std::to_string(free_blocks()) + " free");
  for (int64_t i = 0; i < need; ++i) t.push_back(take_block());
}

int64_t KvCache::capacity(int seq) const {
  return static_cast<int64_t>(tables_.at(static_cast<size_t>(seq)).size()) * block_size_;
}

void KvCache::truncate(int seq, int64_t len) {
  auto& t = tables_.at(static_cast<size_t>(seq));
  const size_t keep = static_cast<size_t>((len + block_size_ - 1) / block_size_);
  while (t.size() > keep) {
    release_block(t.back());
    t.pop_back();
  }
  auto& hs = seq_hashes_.at(static_cast<size_t>(seq));
  const size_t full = static_cast<size_t>(len / block_size_);
  if (hs.size() > full) hs.resize(full);
  // A kept partial block will be written again: it must be private and uncached.
  if (len % block_size_ != 0 && !t.empty()) {
    const int64_t b = t.back();
    if (refs_[static_cast<size_t>(b)] > 1) {
      if (free_blocks() == 0) fail(ErrorKind::out_of_memory, "KV cache full: no block to copy a shared block into");
      const int64_t nb = take_block();
      storage_->copy_block(nb, b);
      release_block(b);
      t.back() = nb;
    } else {
      uncache(b);
    }
  }
}

int64_t KvCache::find_host(uint64_t parent, const int32_t* t, uint64_t h) const {
  auto [lo, hi] = host_map_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (host_[static_cast<size_t>(it->second)].id.same(parent, t)) return it->second;
  return -1;
}

void KvCache::offload(int64_t b) {
  const BlockId& id = ids_[static_cast<size_t>(b)];
  if (id.tokens.empty()) return;
  if (int64_t s = find_host(id.parent, id.tokens.data(), id.hash); s >= 0) {  // already there: refresh
    HostEntry& e = host_[static_cast<size_t>(s)];
    host_lru_.splice(host_lru_.end(), host_lru_, e.lru);
    return;
  }
  int64_t s;
  if (!host_free_.empty()) {
    s = host_free_.back();
    host_free_.pop_back();
  } else {
    auto it = host_lru_.begin();
    if (it != host_lru_.end() && *it == host_pinned_) ++it;
    if (it == host_lru_.end()) return;  // nothing droppable
    s = *it;
    host_lru_.erase(it);
    HostEntry& old = host_[static_cast<size_t>(s)];
    auto [lo, hi] = host_map_.equal_range(old.id.hash);
    for (auto m = lo; m != hi; ++m)
      if (m->second == s) {
        host_map_.erase(m);
        break;
      }
    old.id.tokens.clear();
    ++stats_.host_dropped;
  }
  storage_->offload(b, s);
  HostEntry& e = host_[static_cast<size_t>(s)];
  e.id = id;
  e.lru = host_lru_.insert(host_lru_.end(), s);
  host_map_.emplace(id.hash, s);
  ++stats_.offloaded_blocks;
  stats_.offloaded_bytes += storage_->bytes_per_block();
  stats_.host_used = static_cast<int64_t>(host_lru_.size());
}

int64_t KvCache::attach_prefix(int seq, std::span<const int32_t> tokens, int64_t max_tokens) {
  auto& t = tables_.at(static_cast<size_t>(seq));
  auto& hs = seq_hashes_.at(static_cast<size_t>(seq));
  if (!t.empty()) fail(ErrorKind::internal, "attach_prefix on a sequence that already has blocks");
  last_match_ = 0;
  if (!opt_.prefix_caching) return 0;
  ++stats_.queries;
  stats_.queried_tokens += static_cast<int64_t>(tokens.size());
  const int64_t nblocks = std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_tokens) / block_size_;
  if (snap_align_ > 0) return attach_with_snapshot(seq, tokens, nblocks);
  uint64_t parent = 0;
  int64_t got = 0;
  for (int64_t i = 0; i < nblocks; ++i) {
    const int32_t* tk = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, tk);
    int64_t b = -1;
    auto [lo, hi] = cached_.equal_range(h);
    for (auto it = lo; it != hi; ++it)
      if (ids_[static_cast<size_t>(it->second)].same(parent, tk)) {
        b = it->second;
        break;
      }
    if (b >= 0) {
      if (refs_[static_cast<size_t>(b)]++ == 0) {
        lru_.erase(lru_pos_[static_cast<size_t>(b)]);
        lru_pos_[static_cast<size_t>(b)] = lru_.end();
      }
      stats_.hit_tokens += block_size_;
    } else {
      if (opt_.host_blocks == 0) break;
      const int64_t s = find_host(parent, tk, h);
      if (s < 0 || free_blocks() == 0) break;
      host_pinned_ = s;
      b = take_block();  // may offload another block; never drops slot s
      host_pinned_ = -1;
      storage_->restore(s, b);
      HostEntry& e = host_[static_cast<size_t>(s)];
      host_lru_.splice(host_lru_.end(), host_lru_, e.lru);
      ids_[static_cast<size_t>(b)] = e.id;
      cached_.emplace(h, b);
      ++stats_.restored_blocks;
      stats_.restored_bytes += storage_->bytes_per_block();
      stats_.host_hit_tokens += block_size_;
    }
    t.push_back(b);
    hs.push_back(h);
    parent = h;
    got += block_size_;
  }
  if (got > 0) ++stats_.hits;
  last_match_ = got;
  return got;
}

int64_t KvCache::attach_with_snapshot(int seq, std::span<const int32_t> tokens, int64_t nblocks) {
  // The matched chain, then only its part up to the deepest snapshot.
  std::vector<int64_t> chain;
  std::vector<uint64_t> hashes;
  uint64_t parent = 0;
  for (int64_t i = 0; i < nblocks; ++i) {
    const int32_t* tk = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, tk);
    const int64_t b = find_cached(parent, tk, h);
    if (b < 0) break;
    chain.push_back(b);
    hashes.push_back(h);
    parent = h;
  }
  last_match_ = static_cast<int64_t>(chain.size()) * block_size_;
  int64_t keep = 0;  // blocks up to the deepest snapshot
  for (size_t i = chain.size(); i-- > 0;)
    if (block_snap_[static_cast<size_t>(chain[i])] >= 0) {
      keep = static_cast<int64_t>(i) + 1;
      break;
    }
  stats_.snapshot_short_tokens += last_match_ - keep * block_size_;
  if (keep == 0) return 0;
  auto& t = tables_.at(static_cast<size_t>(seq));
  auto& hs = seq_hashes_.at(static_cast<size_t>(seq));
  for (int64_t i = 0; i < keep; ++i) {
    const int64_t b = chain[static_cast<size_t>(i)];
    if (refs_[static_cast<size_t>(b)]++ == 0) {
      lru_.erase(lru_pos_[static_cast<size_t>(b)]);
      lru_pos_[static_cast<size_t>(b)] = lru_.end();
    }
    t.push_back(b);
    hs.push_back(hashes[static_cast<size_t>(i)]);
  }
  const int64_t sl = block_snap_[static_cast<size_t>(chain[static_cast<size_t>(keep - 1)])];
  std::memcpy(seq_state(seq), snapshot(sl), static_cast<size_t>(layout_.seq_state_bytes));
  snap_lru_.splice(snap_lru_.end(), snap_lru_, snap_lru_pos_[static_cast<size_t>(sl)]);
  const int64_t got = keep * block_size_;
  stats_.hit_tokens += got;
  ++stats_.hits;
  ++stats_.snapshots_restored;
  return got;
}

void KvCache::commit(int seq, std::span<const int32_t> tokens, int64_t computed) {
  if (!opt_.prefix_caching) return;
  const auto& t = tables_.at(static_cast<size_t>(seq));
  auto& hs = seq_hashes_.at(static_cast<size_t>(seq));
  const int64_t full = std::min<int64_t>({computed, static_cast<int64_t>(tokens.size()), capacity(seq)}) / block_size_;
  for (int64_t i = static_cast<int64_t>(hs.size()); i < full; ++i) {
    const uint64_t parent = i ? hs[static_cast<size_t>(i - 1)] : 0;
    const int32_t* tk = tokens.data() + i * block_size_;
    const uint64_t h = block_hash(parent, tk);
    hs.push_back(h);
    const int64_t b = t[static_cast<size_t>(i)];
    if (!ids_[static_cast<size_t>(b)].tokens.empty()) continue;  // already cached (shared)
    bool dup = false;
    auto [lo, hi] = cached_.equal_range(h);
    for (auto it = lo; it != hi && !dup; ++it) dup = ids_[static_cast<size_t>(it->second)].same(parent, tk);
    if (dup) continue;  // another sequence computed the same block: this copy stays private
    BlockId& id = ids_[static_cast<size_t>(b)];
    id.hash = h;
    id.parent = parent;
    id.tokens.assign(tk, tk + block_size_);
    cached_.emplace(h, b);
  }
  // Snapshots the step wrote for seq: hung on the cached block ending at their position.
  for (const PlannedSnapshot& p : planned_) {
    if (p.seq != seq) continue;
    const int64_t i = p.pos / block_size_ - 1;
    int64_t b = -1;
    if (p.pos <= computed && i < static_cast<int64_t>(hs.size()))
      b = find_cached(i ? hs[static_cast<size_t>(i - 1)] : 0, tokens.data() + i * block_size_, hs[static_cast<size_t>(i)]);
    if (b >= 0 && block_snap_[static_cast<size_t>(b)] < 0) {
      block_snap_[static_cast<size_t>(b)] = p.slot;
      snap_slot_block_[static_cast<size_t>(p.slot)] = b;
      snap_lru_pos_[static_cast<size_t>(p.slot)] = snap_lru_.insert(snap_lru_.end(), p.slot);
      ++stats_.snapshots_taken;
    } else {
      snap_slot_block_[static_cast<size_t>(p.slot)] = -1;
      snap_free_.push_back(p.slot);
    }
  }
  std::erase_if(planned_, [seq](const PlannedSnapshot& p) { return p.seq == seq; });
  stats_.snapshots_held = static_cast<int64_t>(snap_lru_.size());
}

}  // namespace hmoe
