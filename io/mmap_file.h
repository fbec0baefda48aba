// MappedFile: a read-only, memory-mapped file (RAII). The mapping lives as
// long as the object; pointers into it must not outlive it. Thread-safe to
// read from many threads. Errors name the path and the OS reason.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace hmoe::io {

class MappedFile {
 public:
  // Maps the whole file read-only. Empty files map to size 0, data nullptr.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Hints the kernel to read [offset, offset+len) ahead (madvise WILLNEED).
  void prefetch(size_t offset, size_t len) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) file into a string; errors name the path.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace hmoe::io
