// WeightBinder (see weights.h).
#include "engine/layers/weights.h"

#include <sys/mman.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <unistd.h>

#include "configs/error.h"

namespace hmoe {

namespace {

void check_float_dtype(const io::TensorView& t, const std::string& name) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16 && t.dtype != DType::f32)
    fail(ErrorKind::bad_model, *t.file + ": tensor '" + name + "' has dtype " + dtype_name(t.dtype) + "; supported: BF16, F16, F32");
}

}  // namespace

std::optional<DType> parse_weight_dtype(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "f32") return DType::f32;
  if (s == "auto") return std::nullopt;
  fail(ErrorKind::internal, "weight_dtype='" + s + "' was not validated (Settings::validate)");
}

cpu::Mat WeightBinder::taken(const cpu::Mat& m) {
  if (m.data) live_[m.data] = m.bytes();
  return m;
}

cpu::Mat WeightBinder::convert(const io::TensorView& t, int64_t rows, int64_t cols) {
  if (!dtype_ || *dtype_ == t.dtype) return cpu::Mat{t.dtype, t.data, rows, cols};
  // In chunks, each chunk's checkpoint pages released once converted, so
  // that the host never holds the tensor twice.
  const int64_t n = rows * cols, chunk = int64_t{1} << 20;
  const size_t in_size = dtype_size(t.dtype);
  std::vector<uint8_t> buf(static_cast<size_t>(n) * dtype_size(*dtype_));
  std::vector<float> f(static_cast<size_t>(std::min(n, chunk)));
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    const int64_t m = std::min(chunk, n - i0);
    const auto* src = static_cast<const uint8_t*>(t.data) + static_cast<size_t>(i0) * in_size;
    cpu::to_f32(t.dtype, src, f.data(), m);
    if (*dtype_ == DType::f32) {
      std::memcpy(buf.data() + static_cast<size_t>(i0) * 4, f.data(), static_cast<size_t>(m) * 4);
    } else {
      auto* o = reinterpret_cast<uint16_t*>(buf.data()) + i0;
      for (int64_t i = 0; i < m; ++i) o[i] = f32_to_bf16(f[static_cast<size_t>(i)]);
    }
    drop_pages(src, static_cast<size_t>(m) * in_size);
  }
  released_.insert(t.data);
  const void* p = buf.data();
  converted_[p] = std::move(buf);
  return cpu::Mat{*dtype_, p, rows, cols};
}

uint64_t WeightBinder::host_bytes() const {
  uint64_t b = 0;
  for (const auto& [p, n] : live_) b += n;
  return b;
}

cpu::Mat WeightBinder::mat(const std::string& name, int64_t rows, int64_t cols) {
  if (lookup_) return lookup_(name, {rows, cols});
  if (source_) return taken(source_->mat(name, rows, cols));
  const io::TensorView& t = store_->get(name, {rows, cols});
  check_float_dtype(t, name);
  used_.insert(name);
  return taken(convert(t, rows, cols));
}

cpu::Mat WeightBinder::vec(const std::string& name, int64_t n) {
  if (lookup_) {
    cpu::Mat m = lookup_(name, {n});
    return cpu::Mat{m.dtype, m.data, 1, n};
  }
  if (source_) return taken(source_->vec(name, n));
  const io::TensorView& t = store_->get(name, {n});
  check_float_dtype(t, name);
  used_.insert(name);
  return taken(convert(t, 1, n));
}

cpu::Mat WeightBinder::mat_shaped(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.empty()) fail(ErrorKind::internal, "mat_shaped: empty shape for '" + name + "'");
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  if (lookup_) {
    cpu::Mat m = lookup_(name, shape);
    return cpu::Mat{m.dtype, m.data, shape[0], cols};
  }
  if (source_) return taken(source_->mat(name, shape[0], cols));
  const io::TensorView& t = store_->get(name, shape);
  check_float_dtype(t, name);
  used_.insert(name);
  return taken(convert(t, shape[0], cols));
}

void WeightBinder::skip_prefix(const std::string& prefix) {
  if (!store_ || source_ || lookup_) return;
  for (const auto& [name, t] : store_->all())
    if (name.rfind(prefix, 0) == 0) used_.insert(name);
}

bool WeightBinder::has(const std::string& name) const {
  if (lookup_) {
    try {
      lookup_(name, {});
      return true;
    } catch (const Error&) {
      return false;
    }
  }
  return source_ ? source_->has(name) : store_->find(name) != nullptr;
}

const io::TensorView& WeightBinder::tensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype) {
  if (!store_ || source_ || lookup_)
    fail(ErrorKind::unsupported, "tensor '" + name + "': this checkpoint format has no such tensor table (GGUF)");
  const io::TensorView& t = store_->get(name, shape);
  if (t.dtype != dtype)
    fail(ErrorKind::bad_model, *t.file + ": tensor '" + name + "' has dtype " + dtype_name(t.dtype) + ", expected " + dtype_name(dtype));
  used_.insert(name);
  return t;
}

void WeightBinder::check_all_used(const std::string& dir) const {
  if (lookup_) return;
  if (source_) return source_->check_all_used(dir);
  for (const auto& [name, t] : store_->all())
    if (!used_.count(name)) fail(ErrorKind::bad_model, *t->file + ": unexpected tensor '" + name + "' (not part of this architecture in " + dir + ")");
}

void WeightBinder::drop_pages(const void* p, size_t bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + bytes;
  const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

bool WeightSource::drop_pages(const void* p, size_t bytes) {
  if (!p || !bytes || !file_backed(p, bytes)) return false;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + bytes;
  const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
  if (hi <= lo) return true;
  madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  evict(reinterpret_cast<const void*>(lo), hi - lo);
  auto it = std::lower_bound(dropped_.begin(), dropped_.end(), std::make_pair(lo, hi));
  it = dropped_.insert(it, {lo, hi});
  // Merge with the neighbours.
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& r : dropped_) {
    if (!merged.empty() && r.first <= merged.back().second) merged.back().second = std::max(merged.back().second, r.second);
    else merged.push_back(r);
  }
  dropped_ = std::move(merged);
  return true;
}

bool WeightSource::dropped(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(dropped_.begin(), dropped_.end(), std::make_pair(a, UINTPTR_MAX));
  if (it == dropped_.begin()) return false;
  --it;
  return a >= it->first && a < it->second;
}

bool WeightBinder::file_backed(const cpu::Mat& m) const {
  if (lookup_ || !m.data) return false;
  const size_t data = static_cast<size_t>(m.rows) * m.row_bytes(), groups = static_cast<size_t>(m.rows * m.groups()) * sizeof(float);
  auto fb = [&](const void* p, size_t n) {
    if (!p || !n) return false;
    return source_ ? source_->file_backed(p, n) : store_ && !converted_.count(p) && store_->maps(p, n);
  };
  return fb(m.data, data) || fb(m.scales, groups) || fb(m.zeros, groups);
}

uint64_t WeightBinder::drop_copied(const std::vector<cpu::Mat>& mats) {
  if (lookup_) return 0;
  // File-backed ranges of the views (data, scales, zeros), merged where they touch.
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  uint64_t file_bytes = 0;
  auto add = [&](const void* p, size_t n) {
    if (!p || !n) return false;
    const bool fb = source_ ? source_->file_backed(p, n) : store_ && !converted_.count(p) && store_->maps(p, n);
    if (fb) r.push_back({reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n});
    return fb;
  };
  for (const cpu::Mat& m : mats) {
    if (!m.data) continue;
    const size_t data = static_cast<size_t>(m.rows) * m.row_bytes(), groups = static_cast<size_t>(m.rows * m.groups()) * sizeof(float);
    const bool fb = add(m.data, data);
    if (m.scales) add(m.scales, groups);
    if (m.zeros) add(m.zeros, groups);
    if (fb) {
      file_bytes += m.bytes();
      if (!source_) released_.insert(m.data);  // plain safetensors: the load's touch skips released tensors
    }
  }
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first <= merged.back().second) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  for (const auto& x : merged) {
    if (source_) source_->drop_pages(reinterpret_cast<const void*>(x.first), x.second - x.first);
    else drop_pages(reinterpret_cast<const void*>(x.first), x.second - x.first);
  }
  return file_bytes;
}

void WeightBinder::release(const cpu::Mat& m) {
  if (!m.data) return;
  live_.erase(m.data);
  if (converted_.erase(m.data)) return;  // a --dtype copy: freed
  // Only plain safetensors are file mappings of the checkpoint; GGUF and
  // quantized sources may hand out repacked host buffers that other views share.
  if (!store_ || source_ || lookup_) return;
  released_.insert(m.data);
  drop_pages(m.data, m.bytes());
}

}  // namespace hmoe
