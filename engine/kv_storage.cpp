#include "engine/kv_storage.h"

#include <cstring>

#include "configs/error.h"
#include "engine/kv_cache.h"

namespace hmoe {

CpuKvStorage::Array CpuKvStorage::zeros(int64_t floats) {
  if (floats <= 0) return nullptr;
  float* p = static_cast<float*>(std::calloc(static_cast<size_t>(floats), sizeof(float)));
  if (!p) fail(ErrorKind::out_of_memory, "KV cache: cannot allocate " + std::to_string(floats * 4 >> 20) + " MiB");
  return Array(p);
}

CpuKvStorage::CpuKvStorage(const KvLayout& l, int64_t num_blocks, int64_t block_size, int64_t host_blocks)
    : layers_(l.layers), blocks_(num_blocks), bs_(block_size), kw_(l.k_floats()), vw_(l.v_floats()), host_blocks_(host_blocks) {
  keys_ = zeros(layers_ * blocks_ * bs_ * kw_);
  values_ = zeros(layers_ * blocks_ * bs_ * vw_);
  host_keys_ = zeros(layers_ * host_blocks_ * bs_ * kw_);
  host_values_ = zeros(layers_ * host_blocks_ * bs_ * vw_);
}

int64_t CpuKvStorage::bytes_per_block() const { return layers_ * bs_ * (kw_ + vw_) * static_cast<int64_t>(sizeof(float)); }

void CpuKvStorage::copy(float* dbuf, int64_t dblocks, int64_t dst, const float* sbuf, int64_t sblocks, int64_t src, int64_t width) {
  if (width == 0) return;
  const size_t n = static_cast<size_t>(bs_ * width);
  for (int64_t l = 0; l < layers_; ++l)
    std::memcpy(dbuf + static_cast<size_t>(l * dblocks + dst) * n, sbuf + static_cast<size_t>(l * sblocks + src) * n, n * sizeof(float));
}

void CpuKvStorage::copy_block(int64_t dst, int64_t src) {
  copy(keys_.get(), blocks_, dst, keys_.get(), blocks_, src, kw_);
  copy(values_.get(), blocks_, dst, values_.get(), blocks_, src, vw_);
}

void CpuKvStorage::offload(int64_t block, int64_t host_slot) {
  copy(host_keys_.get(), host_blocks_, host_slot, keys_.get(), blocks_, block, kw_);
  copy(host_values_.get(), host_blocks_, host_slot, values_.get(), blocks_, block, vw_);
}

void CpuKvStorage::restore(int64_t host_slot, int64_t block) {
  copy(keys_.get(), blocks_, block, host_keys_.get(), host_blocks_, host_slot, kw_);
  copy(values_.get(), blocks_, block, host_values_.get(), host_blocks_, host_slot, vw_);
}

}  // namespace hmoe
