#include "engine/kv/kv_storage.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "io/dtype.h"

namespace hmoe {

namespace {
constexpr int64_t kQ8Block = 32;
}  // namespace

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::f32: return "fp32";
    case KvDtype::bf16: return "bf16";
    case KvDtype::q8_0: return "q8_0";
  }
  return "?";
}

int64_t kv_row_bytes(KvDtype d, int64_t width) {
  switch (d) {
    case KvDtype::f32: return width * 4;
    case KvDtype::bf16: return width * 2;
    case KvDtype::q8_0: return width == 0 ? 0 : kv_q8_scale_offset(width) + (width + kQ8Block - 1) / kQ8Block * 4;
  }
  return 0;
}

KvDtype resolve_kv_dtype(const std::string& setting, bool gguf, bool latent) {
  std::string v = setting;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  KvDtype d;
  if (v == "auto" || v.empty()) d = (gguf && !latent) ? KvDtype::bf16 : KvDtype::f32;
  else if (v == "fp32" || v == "f32" || v == "float32" || v == "float") d = KvDtype::f32;
  else if (v == "bf16" || v == "bfloat16") d = KvDtype::bf16;
  else if (v == "q8_0" || v == "int8") d = KvDtype::q8_0;
  else
    fail(ErrorKind::invalid_argument, "--kv-cache-dtype '" + setting +
                                          "' is not supported; use auto, fp32, bf16 or q8_0 (the CPU KV cache has no fp16/fp8 storage)");
  if (latent && d != KvDtype::f32)
    fail(ErrorKind::invalid_argument, std::string("--kv-cache-dtype ") + kv_dtype_name(d) +
                                          ": this model's multi-head-latent KV cache is kept in fp32 only; use auto or fp32");
  return d;
}

void kv_encode_row(KvDtype d, const float* src, int64_t width, uint8_t* dst) {
  switch (d) {
    case KvDtype::f32: std::memcpy(dst, src, static_cast<size_t>(width) * 4); return;
    case KvDtype::bf16: {
      for (int64_t i = 0; i < width; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    }
    case KvDtype::q8_0: {
      auto* q = reinterpret_cast<int8_t*>(dst);
      auto* sc = reinterpret_cast<float*>(dst + kv_q8_scale_offset(width));
      for (int64_t b = 0; b * kQ8Block < width; ++b) {
        const int64_t i0 = b * kQ8Block, i1 = std::min(width, i0 + kQ8Block);
        float amax = 0;
        for (int64_t i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(src[i]));
        const float s = amax / 127.0f;
        const float inv = s > 0 ? 1.0f / s : 0.0f;
        sc[b] = s;
        for (int64_t i = i0; i < i1; ++i) q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(src[i] * inv), -127.0f, 127.0f));
      }
      return;
    }
  }
}

void kv_decode_row(KvDtype d, const uint8_t* row, int64_t width, int64_t first, int64_t count, float* out) {
  switch (d) {
    case KvDtype::f32: std::memcpy(out, row + first * 4, static_cast<size_t>(count) * 4); return;
    case KvDtype::bf16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * (first + i), 2);
        out[i] = bf16_to_f32(h);
      }
      return;
    case KvDtype::q8_0: {
      const auto* q = reinterpret_cast<const int8_t*>(row);
      const auto* sc = reinterpret_cast<const float*>(row + kv_q8_scale_offset(width));
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(q[first + i]) * sc[(first + i) / kQ8Block];
      return;
    }
  }
}

CpuKvStorage::Array CpuKvStorage::zeros(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  auto* p = static_cast<uint8_t*>(std::calloc(static_cast<size_t>(bytes), 1));
  if (!p) fail(ErrorKind::out_of_memory, "KV cache: cannot allocate " + std::to_string(bytes >> 20) + " MiB");
  return Array(p);
}

CpuKvStorage::CpuKvStorage(const KvLayout& l, int64_t num_blocks, int64_t block_size, int64_t host_blocks)
    : dtype_(l.dtype),
      layers_(l.layers),
      blocks_(num_blocks),
      bs_(block_size),
      kb_(kv_row_bytes(l.dtype, l.k_floats())),
      vb_(kv_row_bytes(l.dtype, l.v_floats())),
      host_blocks_(host_blocks) {
  keys_ = zeros(layers_ * blocks_ * bs_ * kb_);
  values_ = zeros(layers_ * blocks_ * bs_ * vb_);
  host_keys_ = zeros(layers_ * host_blocks_ * bs_ * kb_);
  host_values_ = zeros(layers_ * host_blocks_ * bs_ * vb_);
}

int64_t CpuKvStorage::bytes_per_block() const { return layers_ * bs_ * (kb_ + vb_); }

void CpuKvStorage::copy(uint8_t* dbuf, int64_t dblocks, int64_t dst, const uint8_t* sbuf, int64_t sblocks, int64_t src, int64_t row_bytes) {
  if (row_bytes == 0) return;
  const size_t n = static_cast<size_t>(bs_ * row_bytes);
  for (int64_t l = 0; l < layers_; ++l)
    std::memcpy(dbuf + static_cast<size_t>(l * dblocks + dst) * n, sbuf + static_cast<size_t>(l * sblocks + src) * n, n);
}

void CpuKvStorage::copy_block(int64_t dst, int64_t src) {
  copy(keys_.get(), blocks_, dst, keys_.get(), blocks_, src, kb_);
  copy(values_.get(), blocks_, dst, values_.get(), blocks_, src, vb_);
}

void CpuKvStorage::offload(int64_t block, int64_t host_slot) {
  copy(host_keys_.get(), host_blocks_, host_slot, keys_.get(), blocks_, block, kb_);
  copy(host_values_.get(), host_blocks_, host_slot, values_.get(), blocks_, block, vb_);
}

void CpuKvStorage::restore(int64_t host_slot, int64_t block) {
  copy(keys_.get(), blocks_, block, host_keys_.get(), host_blocks_, host_slot, kb_);
  copy(values_.get(), blocks_, block, host_values_.get(), host_blocks_, host_slot, vb_);
}

}  // namespace hmoe
