#include "engine/kv/kv_storage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

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

KvGeometry kv_geometry(const KvLayout& l, int64_t block_size) {
  KvGeometry g;
  g.head_major = l.k_token_floats < 0 && l.v_token_floats < 0 && l.kv_heads > 0 && l.head_dim > 0;
  g.parts = g.head_major ? l.kv_heads : 1;
  g.k_width = g.head_major ? l.head_dim : l.k_floats();
  g.v_width = g.head_major ? l.head_dim : l.v_floats();
  g.tile = g.head_major ? std::gcd<int64_t>(16, block_size) : 1;  // divides the block: tiles never straddle two
  g.esz = l.dtype == KvDtype::f32 ? 4 : l.dtype == KvDtype::bf16 ? 2 : 1;
  if (g.k_width > 0) {
    g.k_scale_offset = (g.k_width * g.tile * g.esz + 3) / 4 * 4;
    g.k_tile_bytes = g.k_scale_offset + (l.dtype == KvDtype::q8_0 ? (g.k_width + kQ8Block - 1) / kQ8Block * g.tile * 4 : 0);
  }
  g.v_row_bytes = kv_row_bytes(l.dtype, g.v_width);
  g.k_block_bytes = (block_size + g.tile - 1) / g.tile * g.k_tile_bytes;
  g.v_block_bytes = block_size * g.v_row_bytes;
  return g;
}

int64_t kv_block_bytes(const KvLayout& l, int64_t block_size) {
  const KvGeometry g = kv_geometry(l, block_size);
  return l.layers * g.parts * (g.k_block_bytes + g.v_block_bytes);
}

CpuKvStorage::Array CpuKvStorage::zeros(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  auto* p = static_cast<uint8_t*>(std::calloc(static_cast<size_t>(bytes), 1));
  if (!p) fail(ErrorKind::out_of_memory, "KV cache: cannot allocate " + std::to_string(bytes >> 20) + " MiB");
  return Array(p);
}

CpuKvStorage::CpuKvStorage(const KvLayout& l, int64_t num_blocks, int64_t block_size, int64_t host_blocks)
    : dtype_(l.dtype), g_(kv_geometry(l, block_size)), layers_(l.layers), blocks_(num_blocks), host_blocks_(host_blocks) {
  const int64_t lp = layers_ * g_.parts;
  keys_ = zeros(lp * blocks_ * g_.k_block_bytes);
  values_ = zeros(lp * blocks_ * g_.v_block_bytes);
  host_keys_ = zeros(lp * host_blocks_ * g_.k_block_bytes);
  host_values_ = zeros(lp * host_blocks_ * g_.v_block_bytes);
}

int64_t CpuKvStorage::bytes_per_block() const { return layers_ * g_.parts * (g_.k_block_bytes + g_.v_block_bytes); }

void CpuKvStorage::store(int64_t layer, int64_t block, int64_t off, const float* k, const float* v) {
  const int64_t W = g_.tile, lane = off % W, kw = g_.k_width;
  for (int64_t p = 0; p < g_.parts; ++p) {
    if (v && g_.v_width > 0) kv_encode_row(dtype_, v + p * g_.v_width, g_.v_width, v_row(layer, p, block, off));
    if (kw == 0) continue;
    uint8_t* t = k_tile(layer, p, block, off);
    const float* x = k + p * kw;
    if (W == 1) {
      kv_encode_row(dtype_, x, kw, t);
      continue;
    }
    // transposed: dimension d of this token at [d][lane]
    switch (dtype_) {
      case KvDtype::f32:
        for (int64_t d = 0; d < kw; ++d) std::memcpy(t + (d * W + lane) * 4, x + d, 4);
        break;
      case KvDtype::bf16:
        for (int64_t d = 0; d < kw; ++d) {
          const uint16_t h = f32_to_bf16(x[d]);
          std::memcpy(t + (d * W + lane) * 2, &h, 2);
        }
        break;
      case KvDtype::q8_0: {
        // the same values and scales as kv_encode_row gives the head's row
        uint8_t row[4096];
        std::vector<uint8_t> big;
        uint8_t* r = row;
        if (kv_row_bytes(dtype_, kw) > static_cast<int64_t>(sizeof row)) big.resize(static_cast<size_t>(kv_row_bytes(dtype_, kw))), r = big.data();
        kv_encode_row(dtype_, x, kw, r);
        for (int64_t d = 0; d < kw; ++d) t[d * W + lane] = r[d];
        const uint8_t* sc = r + kv_q8_scale_offset(kw);
        for (int64_t b = 0; b * kQ8Block < kw; ++b) std::memcpy(t + g_.k_scale_offset + (b * W + lane) * 4, sc + b * 4, 4);
        break;
      }
    }
  }
}

void CpuKvStorage::load(int64_t layer, int64_t block, int64_t off, float* k, float* v) {
  const int64_t W = g_.tile, lane = off % W, kw = g_.k_width;
  for (int64_t p = 0; p < g_.parts; ++p) {
    if (v && g_.v_width > 0) kv_decode_row(dtype_, v_row(layer, p, block, off), g_.v_width, 0, g_.v_width, v + p * g_.v_width);
    if (kw == 0) continue;
    const uint8_t* t = k_tile(layer, p, block, off);
    float* x = k + p * kw;
    if (W == 1) {
      kv_decode_row(dtype_, t, kw, 0, kw, x);
      continue;
    }
    for (int64_t d = 0; d < kw; ++d) {
      switch (dtype_) {
        case KvDtype::f32: std::memcpy(x + d, t + (d * W + lane) * 4, 4); break;
        case KvDtype::bf16: {
          uint16_t h;
          std::memcpy(&h, t + (d * W + lane) * 2, 2);
          x[d] = bf16_to_f32(h);
          break;
        }
        case KvDtype::q8_0: {
          float s;
          std::memcpy(&s, t + g_.k_scale_offset + (d / kQ8Block * W + lane) * 4, 4);
          x[d] = static_cast<float>(static_cast<int8_t>(t[d * W + lane])) * s;
          break;
        }
      }
    }
  }
}

void CpuKvStorage::copy(uint8_t* dbuf, int64_t dblocks, int64_t dst, const uint8_t* sbuf, int64_t sblocks, int64_t src, int64_t n) {
  if (n == 0) return;
  for (int64_t lp = 0; lp < layers_ * g_.parts; ++lp)
    std::memcpy(dbuf + static_cast<size_t>(lp * dblocks + dst) * static_cast<size_t>(n), sbuf + static_cast<size_t>(lp * sblocks + src) * static_cast<size_t>(n),
                static_cast<size_t>(n));
}

void CpuKvStorage::copy_block(int64_t dst, int64_t src) {
  copy(keys_.get(), blocks_, dst, keys_.get(), blocks_, src, g_.k_block_bytes);
  copy(values_.get(), blocks_, dst, values_.get(), blocks_, src, g_.v_block_bytes);
}

void CpuKvStorage::offload(int64_t block, int64_t host_slot) {
  copy(host_keys_.get(), host_blocks_, host_slot, keys_.get(), blocks_, block, g_.k_block_bytes);
  copy(host_values_.get(), host_blocks_, host_slot, values_.get(), blocks_, block, g_.v_block_bytes);
}

void CpuKvStorage::restore(int64_t host_slot, int64_t block) {
  copy(keys_.get(), blocks_, block, host_keys_.get(), host_blocks_, host_slot, g_.k_block_bytes);
  copy(values_.get(), blocks_, block, host_values_.get(), host_blocks_, host_slot, g_.v_block_bytes);
}

}  // namespace hmoe
