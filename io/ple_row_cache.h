// PleRowCache: PLE table rows kept in memory after they were read from the
// table file, so that rows asked for again (frequent n-grams: in text, a few
// thousand bigrams make up much of every step) skip the disk. Row granular:
// a 128-byte row costs 128 bytes here, where the page cache (the mmap
// backend) holds the whole 4 KiB page around it.
//
// A fixed arena of slots of one size, CLOCK replacement, and an
// open-addressing index from (table, row) to slot. A pinned slot (a row that
// a prefetch still hands out) is never evicted; insert() gives up when every
// slot it looks at is pinned. Not thread-safe: PleTable calls it from the
// step thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace hmoe::io {

// Bytes of physical memory of this machine (sysconf); 0 when unknown. The
// PLE memory checks (row cache, tables kept in memory) measure against it.
uint64_t physical_memory_bytes();

class PleRowCache {
 public:
  // Room for bytes / slot_bytes rows (0: a cache that holds nothing). The
  // arena is reserved, not touched: memory is committed as rows arrive; the
  // index (about 45 bytes per row) is allocated at once. Throws
  // Error(out_of_memory) when arena and index together would take more than
  // half of the machine's physical memory, or cannot be allocated.
  PleRowCache(size_t bytes, size_t slot_bytes);
  // Bytes of memory a cache of `bytes` with `slot_bytes` rows takes when full (arena and index).
  static size_t footprint(size_t bytes, size_t slot_bytes);
  ~PleRowCache();
  PleRowCache(const PleRowCache&) = delete;
  PleRowCache& operator=(const PleRowCache&) = delete;

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return used_; }
  // The slot holding (table, row), marked recently used; -1 when absent.
  int64_t find(int table, int64_t row);
  const uint8_t* data(int64_t slot) const { return arena_.get() + static_cast<size_t>(slot) * slot_bytes_; }
  // Copies `bytes` (<= slot size) of (table, row) in, evicting an unpinned
  // row if need be; returns the slot, or -1 when no slot could be freed.
  // A row already present is left as it is (its slot is returned).
  int64_t insert(int table, int64_t row, const uint8_t* src, size_t bytes);
  void pin(int64_t slot) { ++pins_[static_cast<size_t>(slot)]; }
  void unpin(int64_t slot) { --pins_[static_cast<size_t>(slot)]; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key_of(int table, int64_t row) { return (static_cast<uint64_t>(table) << 48) | static_cast<uint64_t>(row); }
  size_t home(uint64_t key) const;
  int64_t lookup(uint64_t key) const;  // index position or -1
  void erase_at(size_t pos);

  int64_t capacity_ = 0, used_ = 0;
  size_t slot_bytes_ = 0, hand_ = 0;
  std::unique_ptr<uint8_t[]> arena_;
  std::vector<uint64_t> slot_key_;   // per slot: its key, kEmpty when free
  std::vector<uint8_t> referenced_;  // CLOCK bits
  std::vector<int32_t> pins_;
  // Index: power-of-two table of (key, slot), linear probing, at most half full.
  std::vector<uint64_t> idx_key_;
  std::vector<int64_t> idx_slot_;
  size_t mask_ = 0;
};

}  // namespace hmoe::io
