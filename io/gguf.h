// GGUF (v2/v3) reader: header, metadata key/values of every type (arrays
// included), the tensor table and the aligned data section, read from a
// read-only memory map of the file. Nothing is copied: strings and arrays are
// views into the map, valid as long as the GgufFile lives. Every structural
// problem (bad magic, truncation, counts that overrun the file, unknown
// types, misaligned or out-of-file tensor data) throws hmoe::Error
// (ErrorKind::bad_model, ErrorKind::io for the OS) naming the file, the item
// and the byte offset. A GgufFile is immutable after open(): safe to read from
// several threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hmoe::io {

enum class GgufType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Scalars are held by value; strings and arrays point
// into the mapped file.
struct GgufValue {
  GgufType type = GgufType::u8;
  GgufType elem_type = GgufType::u8;  // arrays only
  uint64_t count = 0;                 // arrays only
  union {
    uint64_t u;
    int64_t i;
    double f;
  } num{};
  std::string_view str;                   // type string
  const uint8_t* data = nullptr;          // arrays of numbers: packed little-endian elements
  std::vector<std::string_view> strings;  // arrays of strings

  // Checked conversions; throw bad_model naming `key` when the type does not fit.
  uint64_t as_u64(std::string_view key) const;  // any integer type >= 0, bool
  int64_t as_i64(std::string_view key) const;   // any integer type
  double as_f64(std::string_view key) const;    // any number
  std::string_view as_string(std::string_view key) const;
  // Arrays of numbers converted to T (any integer or float element type).
  template <class T> std::vector<T> as_array(std::string_view key) const;
  const std::vector<std::string_view>& as_strings(std::string_view key) const;
};

struct GgufKv {
  std::string_view key;
  GgufValue value;
};

// ggml tensor types (ggml.h `enum ggml_type`) with their block geometry.
struct GgmlTypeInfo {
  const char* name;
  uint32_t block_elems;  // elements per block
  uint32_t block_bytes;  // bytes per block
};
// nullptr for a type id this reader does not know.
const GgmlTypeInfo* ggml_type_info(uint32_t type);

struct GgufTensor {
  std::string_view name;
  uint32_t type = 0;               // ggml_type
  std::vector<uint64_t> shape;     // ne[0] (fastest) first, as ggml stores it
  uint64_t offset = 0;             // from the start of the data section
  uint64_t bytes = 0;              // size of the data
  const uint8_t* data = nullptr;   // into the map
  uint64_t elements() const;
};

class GgufFile {
 public:
  // Maps and parses `path`; throws hmoe::Error on any problem.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t file_size() const { return size_; }
  const uint8_t* file_data() const { return base_; }
  // Whether [p, p + bytes) lies in the file's map.
  bool maps(const void* p, size_t bytes) const;
  // Evicts the file's pages of [p, p + bytes) (a range of the map) from the
  // page cache (POSIX_FADV_DONTNEED on the file, kept open for this; pages
  // this process still maps stay: drop them with MADV_DONTNEED first). The
  // map stays valid: a later read faults them in from disk.
  void evict(const void* p, size_t bytes) const;

  const std::vector<GgufKv>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  const GgufValue& get(std::string_view key) const;   // throws bad_model naming the key if absent
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;  // kept open for evict()
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKv> kv_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace hmoe::io
