// KvCache: paged key/value storage for every layer. Memory is a pool of
// fixed-size blocks (block_size tokens each); a sequence owns a block table.
// Attention reads K/V through the table, so sequences grow without copies.
//
// Prefix caching (KvCacheOptions::prefix_caching): every FULL block a
// sequence computed is identified by a hash chained over the previous
// block's hash, the block's token ids and a salt (model and numerics
// settings); commit() registers it. A later sequence whose tokens start with
// the same blocks shares them (reference counts) through attach_prefix()
// instead of recomputing them. Blocks nobody references stay cached on an LRU
// list and are taken (oldest first) only when the free list is empty. Shared
// blocks are full and never written again (writes happen past a sequence's
// computed length; truncate() copies a shared block before it would become
// partial). Lookups compare the stored token ids, so a hash collision cannot
// hand out a wrong block.
//
// Second tier (KvCacheOptions::host_blocks > 0): a cached block evicted from
// the first tier is copied to a host pool kept in LRU order (its oldest
// blocks are dropped when full); attach_prefix() copies host-resident blocks
// back instead of having them recomputed.
//
// Storage (engine/kv/kv_storage.h): the bytes live in a KvStorage that the
// cache calls to copy, offload and restore blocks. By default that is
// CpuKvStorage (arrays for both tiers in the layout's KvDtype: fp32, bf16
// or q8_0; head-major with transposed key tiles for GQA layouts; written
// through store(), read back through load(), by the attention through
// k_tile()/v_row(), and for the latent cache as fp32 rows through k()); the GPU
// path binds a GpuKvStorage (bf16 blocks on the GPU, pinned host pool), and
// then k()/v() must not be used.
//
// Per-sequence state (seq_state_bytes: Engram windows, linear-attention
// states) cannot be rebuilt from shared blocks. A layout whose state can be
// checkpointed (state_align > 0: Gated DeltaNet's conv windows and recurrent
// states) keeps prefix caching through state snapshots: a sequence's whole
// seq_state as it stood after `pos` tokens, pos a multiple of
// snapshot_align() = lcm(block_size, state_align). The scheduler plans one
// (plan_state_snapshot) for a position its next step passes; the layers
// write it there (state checkpoints, below); commit() hangs it on the cached
// block that ends at pos. attach_prefix() then shares blocks only up to the
// deepest block of the match that has a snapshot and copies that snapshot
// into the new sequence's seq_state. Snapshots live in a pool of
// KvCacheOptions::state_snapshots slots of seq_state_bytes each (the oldest
// is reused when full) and die with their block (eviction, truncation). The
// host tier is off for such layouts (its blocks would come back without
// their snapshots). Other layouts with state (Engram) have prefix caching
// off (prefix_caching() tells).
//
// State checkpoints (add_state_checkpoint): a request, for the next
// forward, that every layer keeping per-sequence state copies its part of
// `seq`'s state as it stands after `pos` tokens (pos inside the step's
// tokens of seq, or its end) into dst (seq_state_bytes, same layout as
// seq_state). Prefix snapshots and speculative decoding's rollback points use
// them. clear_state_checkpoints() drops them after the step.
//
// Contract: not thread-safe for allocation (the step thread owns it);
// store(), load(), k() and v() may run concurrently for distinct
// (seq, pos). reserve() throws Error(out_of_memory) when the pool is empty,
// leaving the sequence unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv/kv_storage.h"

namespace hmoe {

struct KvLayout {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // K and V share it (MLA layouts come with their own)
  // Floats per token and layer in the K and V planes; -1: kv_heads*head_dim.
  // Multi-head latent attention keeps the compressed latent and the rope key
  // in K (kv_lora_rank + qk_rope_head_dim) and has no V plane (0).
  int64_t k_token_floats = -1;
  int64_t v_token_floats = -1;
  int64_t seq_state_bytes = 0;  // per-sequence state kept beside the KV (Engram windows), zeroed by add_sequence
  KvDtype dtype = KvDtype::f32;  // element format of the CPU storage (the GPU storage is bf16 whatever this says)
  // > 0: the per-sequence state can be checkpointed after any token count,
  // and results do not depend on how a prompt was split at multiples of
  // this (Gated DeltaNet's chunk); prefix caching snapshots it (above).
  int64_t state_align = 0;
  int64_t k_floats() const { return k_token_floats >= 0 ? k_token_floats : kv_heads * head_dim; }
  int64_t v_floats() const { return v_token_floats >= 0 ? v_token_floats : kv_heads * head_dim; }
};

struct KvCacheOptions {
  bool prefix_caching = false;
  uint64_t salt = 0;        // mixed into every block hash (model and settings that change numerics)
  int64_t host_blocks = 0;  // second-tier blocks (0: no second tier; needs prefix_caching)
  int64_t state_snapshots = 0;  // snapshot slots of layouts with a checkpointable state (0: no prefix caching for them)
};

// A request to copy a sequence's state after `pos` tokens into dst (see above).
struct StateCheckpoint {
  int seq = -1;
  int64_t pos = 0;
  uint8_t* dst = nullptr;
};

// Counters since construction.
struct KvCacheStats {
  int64_t queries = 0, queried_tokens = 0;            // attach_prefix calls and the tokens they asked for
  int64_t hit_tokens = 0, host_hit_tokens = 0;        // tokens reused from the first tier / restored from the host tier
  int64_t hits = 0;                                   // queries that reused at least one block
  int64_t evictions = 0;                              // cached first-tier blocks taken for reuse
  int64_t offloaded_blocks = 0, restored_blocks = 0;  // copies first tier -> host and back
  int64_t offloaded_bytes = 0, restored_bytes = 0;
  int64_t host_dropped = 0;                           // host blocks dropped (LRU) for room
  int64_t host_used = 0;                              // host blocks holding a cached block now
  // State snapshots (layouts with state_align > 0).
  int64_t snapshots_taken = 0;        // written by a step and hung on a block
  int64_t snapshots_restored = 0;     // copied into a sequence by attach_prefix
  int64_t snapshots_dropped = 0;      // lost their slot (pool full) or their block
  int64_t snapshots_held = 0;         // slots holding one now
  int64_t snapshot_short_tokens = 0;  // matched tokens attach_prefix could not reuse: no snapshot at their end
};

class KvCache {
 public:
  // storage null: a CpuKvStorage sized for num_blocks and opt.host_blocks.
  KvCache(const KvLayout& layout, int64_t num_blocks, int64_t block_size = 16, const KvCacheOptions& opt = {},
          std::unique_ptr<KvStorage> storage = nullptr);

  // Replaces the storage; only while no block has been committed or
  // offloaded (throws Error(internal) otherwise): contents are not carried over.
  void set_storage(std::unique_ptr<KvStorage> storage);
  KvStorage* storage() { return storage_.get(); }

  // Prefix caching. attach_prefix: `seq` must be empty; shares the cached
  // full blocks that start `tokens`, at most max_tokens tokens' worth (whole
  // blocks), restoring host-tier blocks while first-tier blocks are free.
  // Returns the number of tokens whose K/V the sequence now has.
  int64_t attach_prefix(int seq, std::span<const int32_t> tokens, int64_t max_tokens);
  // Registers the full blocks of `seq` in [0, computed) (tokens: its ids).
  void commit(int seq, std::span<const int32_t> tokens, int64_t computed);
  bool prefix_caching() const { return opt_.prefix_caching; }
  // Tokens of the last attach_prefix()'s query covered by cached blocks,
  // whether or not a snapshot let it reuse them all.
  int64_t last_match_tokens() const { return last_match_; }
  // Layouts with a checkpointable state: positions snapshots may be taken
  // at are multiples of this (0: none are taken).
  int64_t snapshot_align() const { return snap_align_; }
  int64_t state_snapshots() const { return static_cast<int64_t>(snap_slot_block_.size()); }
  // Plans a snapshot of `seq` (whose ids are `tokens`) after `pos` tokens,
  // to be written by the next forward and kept by commit(); pos must be a
  // positive multiple of snapshot_align() within tokens. False (nothing
  // planned) when prefix caching is off, the block ending at pos already has
  // one, or no slot is free or reusable.
  bool plan_state_snapshot(int seq, std::span<const int32_t> tokens, int64_t pos);

  // State checkpoints of the next forward (see above).
  void add_state_checkpoint(int seq, int64_t pos, uint8_t* dst) { checkpoints_.push_back({seq, pos, dst}); }
  const std::vector<StateCheckpoint>& state_checkpoints() const { return checkpoints_; }
  void clear_state_checkpoints() { checkpoints_.clear(); }
  int64_t host_blocks() const { return opt_.host_blocks; }
  const KvCacheStats& stats() const { return stats_; }

  // Returns a new sequence id (reuses freed ones).
  int add_sequence();
  void free_sequence(int seq);
  // Makes room for positions [0, len) of `seq`.
  void reserve(int seq, int64_t len);
  int64_t capacity(int seq) const;
  // Truncates a sequence to `len` tokens, freeing whole blocks past it.
  void truncate(int seq, int64_t len);

  // Row-major layouts (own token widths: the latent cache) in fp32 only:
  // pointer to layout().k_floats() / v_floats() floats for (layer, seq,
  // pos); pos < capacity. v() must not be used when v_floats() is 0. Throws
  // Error(internal) on a head-major (GQA) layout, whose rows are not
  // contiguous (use store() / load()).
  float* k(int64_t layer, int seq, int64_t pos) {
    row_check();
    return reinterpret_cast<float*>(cpu_->k_tile(layer, 0, block_of(seq, pos), pos % block_size_));
  }
  float* v(int64_t layer, int seq, int64_t pos) {
    row_check();
    return reinterpret_cast<float*>(cpu_->v_row(layer, 0, block_of(seq, pos), pos % block_size_));
  }
  // Writes one token's keys (k_floats() values) and values (v_floats(); v may
  // be null when that is 0), converted once to the dtype; load() converts
  // them back to fp32. CPU storage only.
  void store(int64_t layer, int seq, int64_t pos, const float* k, const float* v) {
    cpu_->store(layer, block_of(seq, pos), pos % block_size_, k, v);
  }
  void load(int64_t layer, int seq, int64_t pos, float* k, float* v) { cpu_->load(layer, block_of(seq, pos), pos % block_size_, k, v); }
  // The stored bytes as the attention reads them (CPU storage only;
  // engine/kv/kv_storage.h, KvGeometry): the key tile holding (seq, pos) of
  // `part` (kv head; its lane is pos % tile) and the part's value row.
  const KvGeometry& geometry() const { return cpu_->geometry(); }
  const uint8_t* k_tile(int64_t layer, int seq, int64_t pos, int64_t part) {
    return cpu_->k_tile(layer, part, block_of(seq, pos), pos % block_size_);
  }
  const uint8_t* v_row(int64_t layer, int seq, int64_t pos, int64_t part) {
    return cpu_->v_row(layer, part, block_of(seq, pos), pos % block_size_);
  }
  KvDtype dtype() const { return layout_.dtype; }

  // The layout's seq_state_bytes of per-sequence state (nullptr when 0).
  uint8_t* seq_state(int seq) { return layout_.seq_state_bytes ? seq_state_.at(static_cast<size_t>(seq)).data() : nullptr; }

  // Flat index of (seq, pos) in [0, num_blocks * block_size): GPU caches
  // mirror this layout and share the block tables.
  int64_t slot_index(int seq, int64_t pos) const {
    return tables_[static_cast<size_t>(seq)][static_cast<size_t>(pos / block_size_)] * block_size_ + pos % block_size_;
  }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  // Blocks a reserve() can take: free plus cached-but-unreferenced.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  // Cached-but-unreferenced blocks (a subset of free_blocks()).
  int64_t cached_free_blocks() const { return static_cast<int64_t>(lru_.size()); }
  const KvLayout& layout() const { return layout_; }
  // Bytes of one block in the CPU storage (in the layout's dtype).
  static int64_t bytes_per_block(const KvLayout& l, int64_t block_size) { return kv_block_bytes(l, block_size); }

 private:
  int64_t block_of(int seq, int64_t pos) const { return tables_[static_cast<size_t>(seq)][static_cast<size_t>(pos / block_size_)]; }
  void row_check() const;

  // Identity of a cached full block: its chained hash, the parent's hash and its tokens.
  struct BlockId {
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
    bool same(uint64_t p, const int32_t* t) const;
  };
  struct HostEntry {
    BlockId id;
    std::list<int64_t>::iterator lru;
  };
  uint64_t block_hash(uint64_t parent, const int32_t* t) const;
  int64_t attach_with_snapshot(int seq, std::span<const int32_t> tokens, int64_t nblocks);
  int64_t find_cached(uint64_t parent, const int32_t* t, uint64_t h) const;  // -1: none
  void drop_snapshot(int64_t b);  // frees block b's snapshot slot, if any
  int64_t take_snapshot_slot();   // a free slot, or the oldest held one (-1: none)
  uint8_t* snapshot(int64_t slot);
  int64_t take_block();              // a free block, evicting the LRU cached one when needed
  void release_block(int64_t b);     // drops one reference
  void uncache(int64_t b);           // forgets b's hash (b must be unreferenced or about to be rewritten)
  void offload(int64_t b);           // copies cached block b to the host tier
  int64_t find_host(uint64_t parent, const int32_t* t, uint64_t h) const;

  KvLayout layout_;
  int64_t num_blocks_, block_size_, k_floats_, v_floats_;
  KvCacheOptions opt_;
  std::unique_ptr<KvStorage> storage_;
  CpuKvStorage* cpu_ = nullptr;  // storage_ when it is the CPU one
  std::vector<int64_t> free_;
  // Prefix caching: per block its references and identity; hash -> block.
  std::vector<int32_t> refs_;
  std::vector<BlockId> ids_;     // ids_[b].tokens empty: b is not cached
  std::vector<std::list<int64_t>::iterator> lru_pos_;
  std::list<int64_t> lru_;       // unreferenced cached blocks, oldest first
  std::unordered_multimap<uint64_t, int64_t> cached_;
  std::vector<std::vector<uint64_t>> seq_hashes_;  // per sequence: hashes of its committed full blocks
  // Host tier (its bytes are in storage_).
  std::vector<HostEntry> host_;  // per slot; id.tokens empty: free slot
  std::vector<int64_t> host_free_;
  std::list<int64_t> host_lru_;  // occupied slots, oldest first
  std::unordered_multimap<uint64_t, int64_t> host_map_;
  int64_t host_pinned_ = -1;     // slot being restored: never dropped meanwhile
  KvCacheStats stats_;
  std::vector<std::vector<int64_t>> tables_;
  std::vector<bool> live_;
  std::vector<std::vector<uint8_t>> seq_state_;
  // State snapshots: per slot its block (-1: free, -2: planned, not yet
  // committed) and bytes (allocated on first use); per block its slot.
  int64_t snap_align_ = 0;
  int64_t last_match_ = 0;
  std::vector<int64_t> snap_slot_block_, block_snap_;
  std::vector<std::vector<uint8_t>> snap_bytes_;
  std::vector<int64_t> snap_free_;
  std::list<int64_t> snap_lru_;  // slots holding a committed snapshot, oldest first
  std::vector<std::list<int64_t>::iterator> snap_lru_pos_;
  struct PlannedSnapshot {
    int seq;
    int64_t pos, slot;
  };
  std::vector<PlannedSnapshot> planned_;
  std::vector<StateCheckpoint> checkpoints_;
};

}  // namespace hmoe
