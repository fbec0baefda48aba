// CPU-only build: every GPU handle says "not built with CUDA".
#include "configs/error.h"
#include "gpu/memory.h"

namespace hmoe::gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) { fail(ErrorKind::unsupported, std::string(what) + ": not built with CUDA"); }
}  // namespace

Stream::Stream() { no_cuda("gpu::Stream"); }
Stream::~Stream() = default;
void Stream::synchronize() { no_cuda("gpu::Stream::synchronize"); }
bool Stream::query() { no_cuda("gpu::Stream::query"); }
void Stream::wait(const Event&) { no_cuda("gpu::Stream::wait"); }
DeviceBuffer::DeviceBuffer(size_t bytes) { reserve(bytes); }
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::reserve(size_t bytes) {
  if (bytes > bytes_) no_cuda("gpu::DeviceBuffer");
}
PinnedBuffer::PinnedBuffer(size_t bytes) { reserve(bytes); }
PinnedBuffer::~PinnedBuffer() = default;
void PinnedBuffer::reserve(size_t bytes) {
  if (bytes > bytes_) no_cuda("gpu::PinnedBuffer");
}
MappedBuffer::~MappedBuffer() = default;
void MappedBuffer::reserve(size_t bytes) {
  if (bytes > bytes_) no_cuda("gpu::MappedBuffer");
}
Event::Event() { no_cuda("gpu::Event"); }
Event::~Event() = default;
void Event::record(Stream&) { no_cuda("gpu::Event::record"); }
void Event::synchronize() { no_cuda("gpu::Event::synchronize"); }
float Event::elapsed_ms(const Event&) const { no_cuda("gpu::Event::elapsed_ms"); }
Graph::~Graph() = default;
void Graph::reset() {}
void Graph::begin_capture(Stream&) { no_cuda("gpu::Graph::begin_capture"); }
void Graph::end_capture(Stream&) { no_cuda("gpu::Graph::end_capture"); }
void Graph::launch(Stream&) { no_cuda("gpu::Graph::launch"); }
void copy_to_device(void*, const void*, size_t, Stream&) { no_cuda("gpu::copy_to_device"); }
void copy_to_host(void*, const void*, size_t, Stream&) { no_cuda("gpu::copy_to_host"); }
void copy_on_device(void*, const void*, size_t, Stream&) { no_cuda("gpu::copy_on_device"); }
void copy_2d(void*, size_t, const void*, size_t, size_t, size_t, Stream&) { no_cuda("gpu::copy_2d"); }
void memset_device(void*, int, size_t, Stream&) { no_cuda("gpu::memset_device"); }
void device_synchronize() { no_cuda("gpu::device_synchronize"); }
std::pair<size_t, size_t> memory_info() { no_cuda("gpu::memory_info"); }

}  // namespace hmoe::gpu
