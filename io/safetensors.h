// Safetensors reader: one file (SafetensorsFile) or a sharded checkpoint
// through model.safetensors.index.json (TensorStore). Tensors are views into
// memory-mapped files; nothing is copied.
//
// Validation (every failure is hmoe::Error(bad_model) naming the file and the
// problem): header length past the file or over 100 MiB, header not JSON or
// not an object, unknown dtype, shape/byte-count mismatch, offsets past the
// data section, overlapping tensors, index naming a missing shard or a tensor
// the shard lacks.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/mmap_file.h"

namespace hmoe::io {

struct TensorView {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the shard it lives in, for messages

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::string shape_str() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const MappedFile& file() const { return *file_; }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors.index.json when
// present, else model.safetensors, else every *.safetensors in the directory.
class TensorStore {
 public:
  explicit TensorStore(const std::string& dir);
  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  // Throws bad_model naming the tensor when absent, or when its shape differs
  // from `shape` (if given).
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape = {}) const;
  const std::map<std::string, const TensorView*>& all() const { return index_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  size_t total_bytes() const;
  // Whether [p, p + bytes) lies in one of the files' maps.
  bool maps(const void* p, size_t bytes) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace hmoe::io
