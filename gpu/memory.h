// Device memory, pinned host memory, streams and events, as RAII handles.
// In a build without CUDA (memory_nocuda.cpp) every constructor throws
// Error(unsupported, "not built with CUDA"), so code above gpu/ compiles
// and links the same way on every machine.
//
// Contract: every failing CUDA call throws Error(device) naming the call and
// file:line. Handles are movable, not copyable; none is thread-safe. Copies
// and memsets are asynchronous on the given stream: the host memory they use
// must stay alive (and, for overlap, be pinned) until the stream is synced.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hmoe::gpu {

class Event;

class Stream {
 public:
  Stream();  // a new non-blocking stream on the current device
  ~Stream();
  Stream(Stream&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)), programmatic_(o.programmatic_) {}
  Stream& operator=(Stream&& o) noexcept {
    std::swap(handle_, o.handle_);
    std::swap(programmatic_, o.programmatic_);
    return *this;
  }
  void synchronize();
  // Whether all work enqueued so far has finished (cudaStreamQuery): never
  // blocks; throws on an error the stream's work raised.
  bool query();
  // Work enqueued on this stream after the call waits for `e` (its latest record).
  void wait(const Event& e);
  void* handle() const { return handle_; }  // cudaStream_t
  // Programmatic dependent launch (sm_90+): the decode kernels launched on
  // this stream may start while the kernel before them finishes (each waits
  // for its inputs with griddepcontrol.wait; see gpu/common.cuh). Off by
  // default; a no-op on older GPUs.
  void set_programmatic_launch(bool on) { programmatic_ = on; }
  bool programmatic_launch() const { return programmatic_; }

 private:
  void* handle_ = nullptr;
  bool programmatic_ = false;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);  // cudaMalloc; bytes == 0 gives an empty buffer
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Grows (never shrinks) to at least `bytes`, dropping the contents.
  void reserve(size_t bytes);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);  // cudaHostAlloc (portable)
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void reserve(size_t bytes);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Pinned host memory mapped into the device's address space
// (cudaHostAllocMapped): kernels read and write it over PCIe through
// device(), the host through host(). Cacheable on the host (not
// write-combined): the host reads what kernels write at memory speed.
// Contents are zeroed at allocation. Grows like PinnedBuffer (contents
// dropped); addresses change only when it grows.
class MappedBuffer {
 public:
  MappedBuffer() = default;
  explicit MappedBuffer(size_t bytes) { reserve(bytes); }
  ~MappedBuffer();
  MappedBuffer(MappedBuffer&& o) noexcept
      : host_(std::exchange(o.host_, nullptr)), device_(std::exchange(o.device_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  MappedBuffer& operator=(MappedBuffer&& o) noexcept {
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T>
  T* host() const { return static_cast<T*>(host_); }
  template <class T>
  T* device() const { return static_cast<T*>(device_); }
  size_t bytes() const { return bytes_; }
  void reserve(size_t bytes);

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

class Event {
 public:
  Event();
  ~Event();
  Event(Event&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(handle_, o.handle_);
    return *this;
  }
  void record(Stream& s);
  void synchronize();
  // Milliseconds between `start` and this event (both recorded and complete).
  float elapsed_ms(const Event& start) const;
  void* handle() const { return handle_; }  // cudaEvent_t

 private:
  void* handle_ = nullptr;
};

// A CUDA graph captured from the work enqueued on one stream between
// begin_capture() and end_capture(), replayed with launch(). Kernels whose
// arguments (pointers, sizes) change need a new capture.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin_capture(Stream& s);
  void end_capture(Stream& s);  // instantiates; replaces any earlier graph
  void launch(Stream& s);
  bool ready() const { return exec_ != nullptr; }
  void reset();
  // The captured graph's kernel nodes: the kernels' names ("?" where the
  // runtime cannot name one), in the graph's node order; and all its nodes.
  const std::vector<std::string>& kernels() const { return kernels_; }
  size_t nodes() const { return nodes_; }

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
  std::vector<std::string> kernels_;
  size_t nodes_ = 0;
};

void copy_to_device(void* dst, const void* src, size_t bytes, Stream& s);
void copy_to_host(void* dst, const void* src, size_t bytes, Stream& s);
void copy_on_device(void* dst, const void* src, size_t bytes, Stream& s);
// `rows` rows of `width` bytes, rows `spitch` / `dpitch` bytes apart, in any
// direction (host memory must be pinned for an asynchronous copy).
void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, Stream& s);
void memset_device(void* dst, int value, size_t bytes, Stream& s);
// Blocks until all work on the current device is done; throws on a sticky error.
void device_synchronize();
// Free and total bytes of the current device.
std::pair<size_t, size_t> memory_info();

}  // namespace hmoe::gpu
