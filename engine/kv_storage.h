// KvStorage: where a KvCache's key/value bytes live. KvCache decides which
// block holds what (block tables, prefix sharing, LRU, the host tier); its
// storage moves the bytes when a block is copied, offloaded to a host slot or
// restored from one. Two storages:
// - CpuKvStorage (here): fp32 arrays in RAM for both tiers, read and written
//   by the CPU blocks through KvCache::k()/v(); copies are memcpy.
// - GpuKvStorage (engine/kv_storage_gpu.h): bf16 blocks on the GPU and a
//   pinned host pool; copies go on a copy stream and the next step waits.
//
// Contract: calls come from the thread that owns the KvCache, between steps,
// and take effect in call order: a later call, and the next step that reads
// or writes the cache, sees every earlier one. Indices are in range (the
// KvCache guarantees it).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace hmoe {

struct KvLayout;

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  virtual void copy_block(int64_t dst, int64_t src) = 0;       // first tier to first tier
  virtual void offload(int64_t block, int64_t host_slot) = 0;  // first tier to host tier
  virtual void restore(int64_t host_slot, int64_t block) = 0;  // host tier to first tier
  virtual int64_t bytes_per_block() const = 0;                 // bytes one block copy moves
};

// Both tiers as fp32 arrays [layer][block][token][width]. The memory comes
// from calloc, so pages never written (a GPU run, an unused host tier) cost
// no RAM.
class CpuKvStorage final : public KvStorage {
 public:
  CpuKvStorage(const KvLayout& l, int64_t num_blocks, int64_t block_size, int64_t host_blocks);
  void copy_block(int64_t dst, int64_t src) override;
  void offload(int64_t block, int64_t host_slot) override;
  void restore(int64_t host_slot, int64_t block) override;
  int64_t bytes_per_block() const override;

  float* k(int64_t layer, int64_t block, int64_t off) { return keys_.get() + ((layer * blocks_ + block) * bs_ + off) * kw_; }
  float* v(int64_t layer, int64_t block, int64_t off) { return values_.get() + ((layer * blocks_ + block) * bs_ + off) * vw_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  using Array = std::unique_ptr<float[], Free>;
  static Array zeros(int64_t floats);
  // Copies every layer's block `src` of (sbuf, sblocks) to block `dst` of (dbuf, dblocks).
  void copy(float* dbuf, int64_t dblocks, int64_t dst, const float* sbuf, int64_t sblocks, int64_t src, int64_t width);

  int64_t layers_, blocks_, bs_, kw_, vw_, host_blocks_;
  Array keys_, values_, host_keys_, host_values_;
};

}  // namespace hmoe
