// KvCache: paged key/value storage for every layer. Memory is a pool of
// fixed-size blocks (block_size tokens each); a sequence owns a block table.
// Attention reads K/V through the table, so sequences grow without copies.
//
// Contract: not thread-safe for allocation (the step thread owns it);
// k()/v() pointers may be read and written concurrently for distinct
// (seq, pos). reserve() throws Error(out_of_memory) when the pool is empty,
// leaving the sequence unchanged.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

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
  int64_t k_floats() const { return k_token_floats >= 0 ? k_token_floats : kv_heads * head_dim; }
  int64_t v_floats() const { return v_token_floats >= 0 ? v_token_floats : kv_heads * head_dim; }
};

class KvCache {
 public:
  KvCache(const KvLayout& layout, int64_t num_blocks, int64_t block_size = 16);

  // Returns a new sequence id (reuses freed ones).
  int add_sequence();
  void free_sequence(int seq);
  // Makes room for positions [0, len) of `seq`.
  void reserve(int seq, int64_t len);
  int64_t capacity(int seq) const;
  // Truncates a sequence to `len` tokens, freeing whole blocks past it.
  void truncate(int seq, int64_t len);

  // Pointer to layout().k_floats() / v_floats() floats for (layer, seq, pos);
  // pos < capacity. v() must not be used when v_floats() is 0.
  float* k(int64_t layer, int seq, int64_t pos) { return slot(keys_, k_floats_, layer, seq, pos); }
  float* v(int64_t layer, int seq, int64_t pos) { return slot(values_, v_floats_, layer, seq, pos); }

  // The layout's seq_state_bytes of per-sequence state (nullptr when 0).
  uint8_t* seq_state(int seq) { return layout_.seq_state_bytes ? seq_state_.at(static_cast<size_t>(seq)).data() : nullptr; }

  // Flat index of (seq, pos) in [0, num_blocks * block_size): GPU caches
  // mirror this layout and share the block tables.
  int64_t slot_index(int seq, int64_t pos) const {
    return tables_[static_cast<size_t>(seq)][static_cast<size_t>(pos / block_size_)] * block_size_ + pos % block_size_;
  }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  const KvLayout& layout() const { return layout_; }
  static int64_t bytes_per_block(const KvLayout& l, int64_t block_size) {
    return l.layers * block_size * (l.k_floats() + l.v_floats()) * static_cast<int64_t>(sizeof(float));
  }

 private:
  float* slot(std::vector<float>& buf, int64_t width, int64_t layer, int seq, int64_t pos) {
    const int64_t block = tables_[static_cast<size_t>(seq)][static_cast<size_t>(pos / block_size_)];
    return buf.data() + ((layer * num_blocks_ + block) * block_size_ + pos % block_size_) * width;
  }

  KvLayout layout_;
  int64_t num_blocks_, block_size_, k_floats_, v_floats_;
  std::vector<float> keys_, values_;  // [layer][block][token][k_floats_ or v_floats_]
  std::vector<int64_t> free_;
  std::vector<std::vector<int64_t>> tables_;
  std::vector<bool> live_;
  std::vector<std::vector<uint8_t>> seq_state_;
};

}  // namespace hmoe
