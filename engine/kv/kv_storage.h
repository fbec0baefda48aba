// KvStorage: where a KvCache's key/value bytes live. KvCache decides which
// block holds what (block tables, prefix sharing, LRU, the host tier); its
// storage moves the bytes when a block is copied, offloaded to a host slot or
// restored from one. Two storages:
// - CpuKvStorage (here): arrays in RAM for both tiers in the layout's
//   KvDtype (fp32, bf16 or q8_0), head-major with keys in transposed tiles
//   for GQA layouts (KvGeometry), written once per token through
//   KvCache::store() and read by ops::attention in that dtype; copies are
//   memcpy.
// - GpuKvStorage (engine/kv/kv_storage_gpu.h): bf16 blocks on the GPU and a
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
#include <string>

namespace hmoe {

struct KvLayout;

// Element format of the CPU KV cache (setting kv_cache_dtype).
// - f32: 4 bytes a value (exact; what the fixture tests against Hugging Face use).
// - bf16: 2 bytes a value, round-to-nearest-even (relative error <= 2^-9).
// - q8_0: per row, blocks of 32 values as int8 with one fp32 scale each
//   (amax / 127, round to nearest): 1.125 bytes a value, like llama.cpp's
//   q8_0 cache (which keeps an fp16 scale per 32).
enum class KvDtype { f32, bf16, q8_0 };

const char* kv_dtype_name(KvDtype d);
// Bytes of one token's row of `width` values in dtype d (q8_0: the int8
// values, padded to 4 bytes, then ceil(width / 32) fp32 scales).
int64_t kv_row_bytes(KvDtype d, int64_t width);
// q8_0 rows: byte offset of the first fp32 scale (the scale of values
// [32 b, 32 b + 32) is the b-th float there).
inline int64_t kv_q8_scale_offset(int64_t width) { return (width + 3) / 4 * 4; }
// The setting's value for a model: auto, fp32 (f32, float32), bf16
// (bfloat16) or q8_0 (int8). auto is fp32 for Hugging Face checkpoints
// (runs that must match the fp32 reference) and bf16 for GGUF files
// (weights already quantized; llama.cpp caches f16 by default).
// `latent`: the model keeps a multi-head-latent cache that is read in fp32
// (only fp32 and auto are accepted). Throws Error(invalid_argument) naming
// the value and the accepted ones.
KvDtype resolve_kv_dtype(const std::string& setting, bool gguf, bool latent);

// Row conversions. width values of `src` into a row of dtype d at `dst`
// (kv_row_bytes(d, width) bytes); and values [first, first + count) of such
// a row back to fp32.
void kv_encode_row(KvDtype d, const float* src, int64_t width, uint8_t* dst);
void kv_decode_row(KvDtype d, const uint8_t* row, int64_t width, int64_t first, int64_t count, float* out);

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  virtual void copy_block(int64_t dst, int64_t src) = 0;       // first tier to first tier
  virtual void offload(int64_t block, int64_t host_slot) = 0;  // first tier to host tier
  virtual void restore(int64_t host_slot, int64_t block) = 0;  // host tier to first tier
  virtual int64_t bytes_per_block() const = 0;                 // bytes one block copy moves
  // The sequence was freed (KvCache::free_sequence): per-sequence storage it
  // held (the GPU's recurrent states) may go to a later sequence.
  virtual void free_sequence(int) {}
};

// Where the CPU storage puts a layout's bytes. Two shapes:
// - head-major (plain GQA layouts: kv_heads x head_dim per token): each
//   (layer, kv head) owns a plane [block][...], so one head's keys and values
//   are contiguous block after block (blocks a sequence takes in order are
//   adjacent), which lets the decode attention stream them. Keys are stored
//   transposed in tiles of `tile` tokens (min(16, block_size)): a tile is
//   [head_dim][tile] values (a key dimension for `tile` tokens is one vector),
//   then, in q8_0, [head_dim / 32 groups][tile] fp32 scales. Values are rows
//   of head_dim values per token (kv_row_bytes(dtype, head_dim)).
// - row-major (layouts with their own token widths: the multi-head latent
//   cache): one part of the full width, tile 1 (a key tile is a row), so a
//   token's K row is contiguous and rows follow each other within a block.
struct KvGeometry {
  bool head_major = false;
  int64_t parts = 1;                   // kv heads (head-major) or 1
  int64_t k_width = 0, v_width = 0;    // values per part and token
  int64_t tile = 1;                    // tokens per key tile
  int64_t k_tile_bytes = 0;            // one key tile
  int64_t k_scale_offset = 0;          // q8_0: byte offset of a key tile's scales
  int64_t v_row_bytes = 0;             // one token's values of one part
  int64_t k_block_bytes = 0, v_block_bytes = 0;  // one part's block
  int64_t esz = 4;                     // bytes per stored value (q8_0: 1, plus scales)
};
KvGeometry kv_geometry(const KvLayout& l, int64_t block_size);
// Bytes one block takes over all layers (K and V).
int64_t kv_block_bytes(const KvLayout& l, int64_t block_size);

// Both tiers as arrays [layer][part][block][part's block bytes] (KvGeometry)
// in the layout's dtype. The memory comes from calloc, so pages never
// written (a GPU run, an unused host tier) cost no RAM.
class CpuKvStorage final : public KvStorage {
 public:
  CpuKvStorage(const KvLayout& l, int64_t num_blocks, int64_t block_size, int64_t host_blocks);
  void copy_block(int64_t dst, int64_t src) override;
  void offload(int64_t block, int64_t host_slot) override;
  void restore(int64_t host_slot, int64_t block) override;
  int64_t bytes_per_block() const override;

  KvDtype dtype() const { return dtype_; }
  const KvGeometry& geometry() const { return g_; }
  // The key tile holding token `off` of `block` for `part` (its lane is off % tile).
  uint8_t* k_tile(int64_t layer, int64_t part, int64_t block, int64_t off) {
    return keys_.get() + ((layer * g_.parts + part) * blocks_ + block) * g_.k_block_bytes + off / g_.tile * g_.k_tile_bytes;
  }
  // The values of token `off` of `block` for `part` (v_row_bytes).
  uint8_t* v_row(int64_t layer, int64_t part, int64_t block, int64_t off) {
    return values_.get() + ((layer * g_.parts + part) * blocks_ + block) * g_.v_block_bytes + off * g_.v_row_bytes;
  }
  // One token's keys (all parts, k_floats values) and values, converted to
  // the dtype / back to fp32 (v may be null when v_floats is 0).
  void store(int64_t layer, int64_t block, int64_t off, const float* k, const float* v);
  void load(int64_t layer, int64_t block, int64_t off, float* k, float* v);

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  using Array = std::unique_ptr<uint8_t[], Free>;
  static Array zeros(int64_t bytes);
  // Copies every (layer, part)'s block `src` of (sbuf, sblocks) to block `dst` of (dbuf, dblocks).
  void copy(uint8_t* dbuf, int64_t dblocks, int64_t dst, const uint8_t* sbuf, int64_t sblocks, int64_t src, int64_t part_block_bytes);

  KvDtype dtype_;
  KvGeometry g_;
  int64_t layers_, blocks_, host_blocks_;
  Array keys_, values_, host_keys_, host_values_;
};

}  // namespace hmoe
