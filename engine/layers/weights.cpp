// WeightBinder (see weights.h).
#include "engine/layers/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include "configs/error.h"

namespace hmoe {

namespace {

void check_float_dtype(const io::TensorView& t, const std::string& name) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16 && t.dtype != DType::f32)
    fail(ErrorKind::bad_model, *t.file + ": tensor '" + name + "' has dtype " + dtype_name(t.dtype) + "; supported: BF16, F16, F32");
}

}  // namespace

cpu::Mat WeightBinder::mat(const std::string& name, int64_t rows, int64_t cols) {
  if (lookup_) return lookup_(name, {rows, cols});
  if (source_) return source_->mat(name, rows, cols);
  const io::TensorView& t = store_->get(name, {rows, cols});
  check_float_dtype(t, name);
  used_.insert(name);
  return cpu::Mat{t.dtype, t.data, rows, cols};
}

cpu::Mat WeightBinder::vec(const std::string& name, int64_t n) {
  if (lookup_) {
    cpu::Mat m = lookup_(name, {n});
    return cpu::Mat{m.dtype, m.data, 1, n};
  }
  if (source_) return source_->vec(name, n);
  const io::TensorView& t = store_->get(name, {n});
  check_float_dtype(t, name);
  used_.insert(name);
  return cpu::Mat{t.dtype, t.data, 1, n};
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

void WeightBinder::release(const cpu::Mat& m) {
  // Only plain safetensors are file mappings of the checkpoint; GGUF and
  // quantized sources may hand out repacked host buffers that other views share.
  if (!store_ || source_ || lookup_ || !m.data) return;
  released_.insert(m.data);
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(m.data), b = a + m.bytes();
  const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace hmoe
