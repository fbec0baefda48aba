// Where layers take their weights from: the binder checks each tensor's
// shape and dtype as it is taken from the checkpoint (plain safetensors, a
// WeightSource for GGUF and quantized Hugging Face checkpoints, or a plain
// lookup function for synthetic benchmark models) and remembers what was
// taken, so that leftovers are reported as unexpected. Layers of both
// devices bind through it; a GPU layer drops the host pages of what it
// uploaded (release), so that an all-GPU run holds no host copy.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "numa/kernels.h"

namespace hmoe {

// A checkpoint that is not plain safetensors weights (a GGUF file,
// engine/loading/gguf_model.h; a quantized HF checkpoint, engine/loading/quant_config.h):
// answers the binder by Hugging Face tensor name with views the kernels take
// (ggml blocks, int4/int8/fp8 views), checking shapes and types itself.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols) = 0;
  virtual cpu::Mat vec(const std::string& name, int64_t n) = 0;
  virtual bool has(const std::string& name) const = 0;
  // Throws bad_model naming the first tensor nobody took.
  virtual void check_all_used(const std::string& where) const = 0;
  virtual uint64_t total_bytes() const = 0;
  // Reads every weight once (page faults now rather than on the first
  // request), skipping the pages drop_pages() dropped.
  virtual void touch(const std::string& label, const std::string& progress_mode) const = 0;
  // Whether [p, p + bytes) lies in a read-only map of the checkpoint's files
  // (its pages can be dropped and read again); false for the source's own
  // buffers (repacked or reassembled tensors).
  virtual bool file_backed(const void* /*p*/, size_t /*bytes*/) const { return false; }
  // Copy residence (engine/layers/host_residence.h): the file-backed range
  // [p, p + bytes) was copied elsewhere: its whole pages leave this process
  // (MADV_DONTNEED on the private map: a later read faults them in from the
  // file again) and, where the source keeps the file open, the page cache
  // (evict); touch() skips them. False (nothing done) when not file-backed.
  bool drop_pages(const void* p, size_t bytes);
  // Whether the page holding p was dropped (touch() does not read it).
  bool dropped(const void* p) const;

 protected:
  // POSIX_FADV_DONTNEED of the range where the source has the file open.
  virtual void evict(const void* /*p*/, size_t /*bytes*/) {}

 private:
  std::vector<std::pair<uintptr_t, uintptr_t>> dropped_;  // page ranges, sorted, merged
};

// Host view of a tensor with the given shape (throws when absent): what
// synthetic models (bench/) hand out.
using WeightLookup = std::function<cpu::Mat(const std::string& name, const std::vector<int64_t>& shape)>;

class WeightBinder {
 public:
  explicit WeightBinder(const io::TensorStore& store) : store_(&store) {}
  // store may be null (GGUF); source may be null (plain safetensors).
  WeightBinder(const io::TensorStore* store, WeightSource* source) : store_(store), source_(source) {}
  explicit WeightBinder(WeightLookup lookup) : lookup_(std::move(lookup)) {}
  // Setting weight_dtype (--dtype): plain float tensors of another float
  // dtype are converted into host buffers of `dtype` as they are taken (and
  // the checkpoint's pages of them released); nullopt ("auto"): views of the
  // checkpoint as stored. Quantized and GGUF tensors stay as stored.
  void set_dtype(std::optional<DType> dtype) { dtype_ = dtype; }
  // Bytes of the views taken and not released: what the host holds for the model.
  uint64_t host_bytes() const;
  cpu::Mat mat(const std::string& name, int64_t rows, int64_t cols);
  cpu::Mat vec(const std::string& name, int64_t n);
  // A float tensor of exactly `shape` (any rank >= 1), viewed as
  // shape[0] rows of the product of the others (conv kernels [C, 1, K]).
  cpu::Mat mat_shaped(const std::string& name, const std::vector<int64_t>& shape);
  // Marks every tensor whose name starts with `prefix` as used without
  // binding it (weights of a part that is not run, e.g. an MTP head).
  void skip_prefix(const std::string& prefix);
  bool has(const std::string& name) const;
  // Any tensor of exactly this shape and dtype (integer tables, lookups).
  const io::TensorView& tensor(const std::string& name, const std::vector<int64_t>& shape, DType dtype);
  // Throws bad_model naming the first tensor nobody took.
  void check_all_used(const std::string& dir) const;
  // The host pages of m (a view from this binder) are no longer needed:
  // dropped from this process when they are a file mapping (plain
  // safetensors), so that GPU-resident weights leave no host copy behind.
  void release(const cpu::Mat& m);
  bool released(const void* data) const { return released_.count(data) > 0; }
  // Copy residence: the bytes of `mats` (views from this binder) were
  // copied elsewhere by their user. Where they view a checkpoint file map
  // (plain safetensors, GGUF, a quantized checkpoint's plain tensors) their
  // pages are dropped (contiguous views merged first, so that no page
  // between two of them stays behind; WeightSource::drop_pages) and the
  // load's touch skips them. Returns the bytes of the views that were file
  // maps; the others (the loader's own buffers: --dtype conversions,
  // repacked quantized tensors, synthetic lookups) are kept.
  uint64_t drop_copied(const std::vector<cpu::Mat>& mats);
  // Whether any of m's bytes (data, scales, zeros) view a checkpoint file map.
  bool file_backed(const cpu::Mat& m) const;
  // Names taken so far.
  const std::set<std::string>& used() const { return used_; }

 private:
  const io::TensorStore* store_ = nullptr;
  WeightSource* source_ = nullptr;
  WeightLookup lookup_;
  std::set<std::string> used_;
  std::set<const void*> released_;
  std::optional<DType> dtype_;
  std::map<const void*, size_t> live_;                     // views handed out -> bytes
  std::map<const void*, std::vector<uint8_t>> converted_;  // --dtype copies
  cpu::Mat convert(const io::TensorView& t, int64_t rows, int64_t cols);
  static void drop_pages(const void* p, size_t bytes);  // of a read-only file mapping
  cpu::Mat taken(const cpu::Mat& m);
};

// The weight_dtype setting (validated by Settings::validate): "auto" ->
// nullopt, "bf16", "f32".
std::optional<DType> parse_weight_dtype(const std::string& s);

}  // namespace hmoe
