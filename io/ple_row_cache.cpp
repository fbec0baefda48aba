#include "io/ple_row_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "configs/error.h"

namespace hmoe::io {

namespace {
size_t index_size(size_t capacity) {
  size_t n = 16;
  while (n < 2 * capacity) n *= 2;
  return n;
}
}  // namespace

size_t PleRowCache::footprint(size_t bytes, size_t slot_bytes) {
  const size_t cap = slot_bytes > 0 ? bytes / slot_bytes : 0;
  if (cap == 0) return 0;
  return cap * (slot_bytes + sizeof(uint64_t) + 1 + sizeof(int32_t)) + index_size(cap) * (sizeof(uint64_t) + sizeof(int64_t));
}

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

PleRowCache::PleRowCache(size_t bytes, size_t slot_bytes) : slot_bytes_(slot_bytes) {
  capacity_ = slot_bytes > 0 ? static_cast<int64_t>(bytes / slot_bytes) : 0;
  if (capacity_ == 0) return;
  const size_t need = footprint(bytes, slot_bytes);
  const size_t phys = physical_memory_bytes();
  auto mib = [](size_t b) { return std::to_string(b >> 20) + " MiB"; };
  if (phys > 0 && need > phys / 2)
    fail(ErrorKind::out_of_memory, "PLE row cache of " + mib(bytes) + " (" + mib(need) + " with its index) is more than half of this machine's " +
                                       mib(phys) + " of memory; lower --ple-cache-mib / HMOE_PLE_CACHE_MIB");
  try {
    arena_.reset(new uint8_t[static_cast<size_t>(capacity_) * slot_bytes_]);  // not value-initialised: committed as written
    slot_key_.assign(static_cast<size_t>(capacity_), kEmpty);
    referenced_.assign(static_cast<size_t>(capacity_), 0);
    pins_.assign(static_cast<size_t>(capacity_), 0);
    const size_t n = index_size(static_cast<size_t>(capacity_));
    idx_key_.assign(n, kEmpty);
    idx_slot_.assign(n, -1);
    mask_ = n - 1;
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::out_of_memory, "PLE row cache of " + mib(bytes) + ": cannot allocate " + mib(need) + "; lower --ple-cache-mib / HMOE_PLE_CACHE_MIB");
  }
}

PleRowCache::~PleRowCache() = default;

size_t PleRowCache::home(uint64_t key) const {
  uint64_t h = key * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  return static_cast<size_t>(h) & mask_;
}

int64_t PleRowCache::lookup(uint64_t key) const {
  if (capacity_ == 0) return -1;
  for (size_t pos = home(key);; pos = (pos + 1) & mask_) {
    if (idx_key_[pos] == key) return static_cast<int64_t>(pos);
    if (idx_key_[pos] == kEmpty) return -1;
  }
}

int64_t PleRowCache::find(int table, int64_t row) {
  const int64_t pos = lookup(key_of(table, row));
  if (pos < 0) return -1;
  const int64_t slot = idx_slot_[static_cast<size_t>(pos)];
  referenced_[static_cast<size_t>(slot)] = 1;
  return slot;
}

// Linear probing's deletion: later entries of the probe run move back into
// the hole unless their home lies cyclically after it.
void PleRowCache::erase_at(size_t pos) {
  idx_key_[pos] = kEmpty;
  size_t hole = pos;
  for (size_t j = (pos + 1) & mask_; idx_key_[j] != kEmpty; j = (j + 1) & mask_) {
    const size_t h = home(idx_key_[j]);
    const bool stays = hole <= j ? (hole < h && h <= j) : (hole < h || h <= j);
    if (stays) continue;
    idx_key_[hole] = idx_key_[j];
    idx_slot_[hole] = idx_slot_[j];
    idx_key_[j] = kEmpty;
    hole = j;
  }
}

int64_t PleRowCache::insert(int table, int64_t row, const uint8_t* src, size_t bytes) {
  if (capacity_ == 0 || bytes > slot_bytes_) return -1;
  const uint64_t key = key_of(table, row);
  if (const int64_t pos = lookup(key); pos >= 0) return idx_slot_[static_cast<size_t>(pos)];
  int64_t slot = -1;
  if (used_ < capacity_) {
    slot = used_++;
  } else {
    // CLOCK: clear reference bits until an unpinned, unreferenced slot comes
    // round; give up after a bounded sweep (nearly everything pinned).
    const size_t cap = static_cast<size_t>(capacity_), limit = std::min<size_t>(2 * cap, 4096);
    for (size_t step = 0; step < limit; ++step) {
      const size_t s = hand_;
      hand_ = (hand_ + 1) % cap;
      if (pins_[s] > 0) continue;
      if (referenced_[s]) {
        referenced_[s] = 0;
        continue;
      }
      slot = static_cast<int64_t>(s);
      break;
    }
    if (slot < 0) return -1;
    erase_at(static_cast<size_t>(lookup(slot_key_[static_cast<size_t>(slot)])));
  }
  const size_t su = static_cast<size_t>(slot);
  std::memcpy(arena_.get() + su * slot_bytes_, src, bytes);
  slot_key_[su] = key;
  referenced_[su] = 0;  // a second look earns the bit: rows read once (a prompt's) go first
  size_t pos = home(key);
  while (idx_key_[pos] != kEmpty) pos = (pos + 1) & mask_;
  idx_key_[pos] = key;
  idx_slot_[pos] = slot;
  return slot;
}

}  // namespace hmoe::io
