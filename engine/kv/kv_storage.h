// KvStorage: where a KvCache's key/value bytes live. KvCache decides which
// block holds what (block tables, prefix sharing, LRU, the host tier); its
// storage moves the bytes when a block is copied, offloaded to a host slot or
// restored from one. Two storages:
// - CpuKvStorage (here): arrays in RAM for both tiers in the layout's
//   KvDtype (fp32, bf16 or q8_0), written once per token through
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
};

// Both tiers as arrays [layer][block][token][row bytes] in the layout's
// dtype. The memory comes from calloc, so pages never written (a GPU run, an
// unused host tier) cost no RAM.
class CpuKvStorage final : public KvStorage {
 public:
  CpuKvStorage(const KvLayout& l, int64_t num_blocks, int64_t block_size, int64_t host_blocks);
  void copy_block(int64_t dst, int64_t src) override;
  void offload(int64_t block, int64_t host_slot) override;
  void restore(int64_t host_slot, int64_t block) override;
  int64_t bytes_per_block() const override;

  KvDtype dtype() const { return dtype_; }
  int64_t k_row_bytes() const { return kb_; }
  int64_t v_row_bytes() const { return vb_; }
  uint8_t* k_row(int64_t layer, int64_t block, int64_t off) { return keys_.get() + ((layer * blocks_ + block) * bs_ + off) * kb_; }
  uint8_t* v_row(int64_t layer, int64_t block, int64_t off) { return values_.get() + ((layer * blocks_ + block) * bs_ + off) * vb_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  using Array = std::unique_ptr<uint8_t[], Free>;
  static Array zeros(int64_t bytes);
  // Copies every layer's block `src` of (sbuf, sblocks) to block `dst` of (dbuf, dblocks).
  void copy(uint8_t* dbuf, int64_t dblocks, int64_t dst, const uint8_t* sbuf, int64_t sblocks, int64_t src, int64_t row_bytes);

  KvDtype dtype_;
  int64_t layers_, blocks_, bs_, kb_, vb_, host_blocks_;
  Array keys_, values_, host_keys_, host_values_;
};

}  // namespace hmoe
