// GpuKvStorage: a KvCache's keys and values on the GPU (bf16), with the
// host tier in pinned memory (engine/kv/kv_storage.h has the interface).
//
// Layout: keys(l) / values(l) point at layer l's [num_blocks * block_size]
// [k_width or v_width] bf16 plane, indexed by KvCache::slot_index(); the
// pinned host pool has the same layout with host_blocks blocks per layer.
//
// Copies: copy_block/offload/restore only queue the copy. begin_step(s),
// called by the GPU step before it enqueues work on its stream s, issues
// everything queued on the storage's own copy stream (one 2-D copy per plane
// and run of consecutive blocks, all layers at once) after the previous
// step's work, and makes s wait for them on the device. So a restored block
// is complete before the step reads it, an offloaded block is read before
// the step overwrites it, and the host thread never blocks on a copy.
// end_step() (after the step's stream was synchronized) adds the copies'
// device time to copy_seconds().
//
// Per-sequence device state (Gated DeltaNet's conv windows and recurrent
// states, engine/layers/hybrid_gpu.h): seq_state(seq, bytes) is a device
// buffer for a running sequence, taken on its first use from the buffers
// freed sequences gave back (KvCache::free_sequence), else allocated; its
// contents are whatever the last owner left (the layers treat a sequence
// with no tokens consumed as starting from zero). Freed buffers are kept
// for reuse and released with the storage.
//
// Contract: as KvStorage; one step at a time; the storage must outlive any
// work enqueued with its pointers. Throws Error(unsupported) in a build
// without CUDA and Error(out_of_memory) when the GPU or pinned memory is short.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kv/kv_storage.h"
#include "gpu/memory.h"

namespace hmoe {

class GpuKvStorage final : public KvStorage {
 public:
  // Widths in bf16 values per token and layer (k_width > 0; v_width may be 0).
  GpuKvStorage(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t k_width, int64_t v_width, int64_t host_blocks);
  ~GpuKvStorage() override;

  void copy_block(int64_t dst, int64_t src) override;
  void free_sequence(int seq) override;
  void offload(int64_t block, int64_t host_slot) override;
  void restore(int64_t host_slot, int64_t block) override;
  int64_t bytes_per_block() const override { return layers_ * bs_ * (kw_ + vw_) * 2; }

  void begin_step(gpu::Stream& s);
  void end_step();
  // Issues what is queued and waits (host) until every copy is done. The
  // caller must have synchronized the steps' stream before (no step runs).
  void synchronize();

  uint16_t* keys(int64_t layer) const { return kc_.as<uint16_t>() + layer * blocks_ * bs_ * kw_; }
  uint16_t* values(int64_t layer) const { return vw_ ? vc_.as<uint16_t>() + layer * blocks_ * bs_ * vw_ : nullptr; }
  const void* keys_base() const { return kc_.data(); }  // stable for the storage's life (graph keys)
  const void* values_base() const { return vc_.data(); }
  int64_t num_blocks() const { return blocks_; }
  int64_t block_size() const { return bs_; }
  int64_t k_width() const { return kw_; }
  int64_t v_width() const { return vw_; }
  int64_t host_blocks() const { return host_blocks_; }
  // The device state of `seq` (`bytes` long; one size per storage, Error(internal) otherwise).
  void* seq_state(int seq, int64_t bytes);
  int64_t seq_states_live() const;                                     // sequences holding one now
  int64_t seq_states_allocated() const { return states_allocated_; }  // buffers allocated so far
  double copy_seconds() const { return copy_s_; }
  int64_t copy_calls() const { return copy_calls_; }  // 2-D copies issued (for the benchmark)

 private:
  enum class Kind { device, offload, restore };
  struct Op {
    Kind kind;
    int64_t src, dst, count;
  };
  void queue(Kind k, int64_t src, int64_t dst);
  void issue();  // pending ops onto the copy stream

  int64_t layers_, blocks_, bs_, kw_, vw_, host_blocks_;
  gpu::DeviceBuffer kc_, vc_;
  gpu::PinnedBuffer hk_, hv_;
  gpu::Stream copy_;
  gpu::Event step_done_, copy_start_, copy_end_;
  bool timing_ = false;    // copy_start_/copy_end_ bracket copies not yet timed
  bool unwaited_ = false;  // issued copies the next step must wait for
  std::vector<Op> ops_;
  std::vector<gpu::DeviceBuffer> states_;      // per sequence id (empty: none)
  std::vector<gpu::DeviceBuffer> free_states_;
  int64_t state_bytes_ = 0, states_allocated_ = 0;
  double copy_s_ = 0;
  int64_t copy_calls_ = 0;
};

class KvCache;

// The GpuKvStorage of `kv`, bound on first use: a cache still on its CPU
// storage (nothing committed yet) gets a GPU one for its num_blocks and
// host_blocks. Throws Error(internal) when kv's storage has other widths.
GpuKvStorage& gpu_kv_storage(KvCache& kv, int64_t k_width, int64_t v_width);

}  // namespace hmoe
