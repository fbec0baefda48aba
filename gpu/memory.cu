#include <cxxabi.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "gpu/check.h"
#include "gpu/common.cuh"
#include "gpu/memory.h"
#include "gpu/memory_cap.h"

namespace hmoe::gpu {

namespace detail {
bool pdl_supported() {
  static std::array<std::atomic<int>, 64> known{};  // per device: 0 unknown, 1 no, 2 yes
  int dev = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= static_cast<int>(known.size())) return false;
  int k = known[static_cast<size_t>(dev)].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    k = major >= 9 ? 2 : 1;
    known[static_cast<size_t>(dev)].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}
int64_t smem_optin_limit() {
  static const int64_t limit = [] {
    int dev = 0, v = 0;
    HMOE_CUDA_CHECK(cudaGetDevice(&dev));
    HMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<int64_t>(v);
  }();
  return limit;
}
}  // namespace detail

using detail::cs;

Stream::Stream() {
  cudaStream_t s = nullptr;
  HMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  handle_ = s;
}
Stream::~Stream() {
  if (handle_) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}
void Stream::synchronize() { HMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_))); }
bool Stream::query() {
  const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(handle_));
  if (e == cudaErrorNotReady) return false;
  HMOE_CUDA_CHECK(e);
  return true;
}
void Stream::wait(const Event& e) { HMOE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(handle_), static_cast<cudaEvent_t>(e.handle()), 0)); }

DeviceBuffer::DeviceBuffer(size_t bytes) { reserve(bytes); }
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) {
    cudaFree(ptr_);
    memory_ledger().release(bytes_);
  }
}
void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  if (ptr_) {
    HMOE_CUDA_CHECK(cudaFree(ptr_));
    memory_ledger().release(bytes_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
  memory_ledger().acquire(bytes, MemoryUse::current());  // the cap (gpu/memory_cap.h): throws before CUDA is asked
  cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) memory_ledger().release(bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(ErrorKind::out_of_memory, "GPU allocation of " + std::to_string(bytes >> 20) + " MiB for " + MemoryUse::current() + " failed (" + std::to_string(free_b >> 20) +
                                       " MiB free of " + std::to_string(total_b >> 20) + " MiB)");
  }
  if (e != cudaSuccess) detail::cuda_fail(e, "cudaMalloc", __FILE__, __LINE__);
  bytes_ = bytes;
}

PinnedBuffer::PinnedBuffer(size_t bytes) { reserve(bytes); }
PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}
void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  if (ptr_) HMOE_CUDA_CHECK(cudaFreeHost(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
  HMOE_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocPortable));
  bytes_ = bytes;
}

MappedBuffer::~MappedBuffer() {
  if (host_) cudaFreeHost(host_);
}
void MappedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  if (host_) HMOE_CUDA_CHECK(cudaFreeHost(host_));
  host_ = device_ = nullptr;
  bytes_ = 0;
  HMOE_CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  std::memset(host_, 0, bytes);
  bytes_ = bytes;
  HMOE_CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
}

Event::Event() {
  cudaEvent_t e = nullptr;
  HMOE_CUDA_CHECK(cudaEventCreate(&e));
  handle_ = e;
}
Event::~Event() {
  if (handle_) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}
void Event::record(Stream& s) { HMOE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), cs(s))); }
void Event::synchronize() { HMOE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_))); }
float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  HMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle_), static_cast<cudaEvent_t>(handle_)));
  return ms;
}

Graph::~Graph() { reset(); }
void Graph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
}
void Graph::begin_capture(Stream& s) { HMOE_CUDA_CHECK(cudaStreamBeginCapture(cs(s), cudaStreamCaptureModeThreadLocal)); }
void Graph::end_capture(Stream& s) {
  cudaGraph_t g = nullptr;
  HMOE_CUDA_CHECK(cudaStreamEndCapture(cs(s), &g));
  reset();
  kernels_.clear();
  nodes_ = 0;
  size_t count = 0;
  if (cudaGraphGetNodes(g, nullptr, &count) == cudaSuccess && count > 0) {
    std::vector<cudaGraphNode_t> nodes(count);
    if (cudaGraphGetNodes(g, nodes.data(), &count) == cudaSuccess) {
      nodes_ = count;
      for (size_t i = 0; i < count; ++i) {
        cudaGraphNodeType t{};
        if (cudaGraphNodeGetType(nodes[i], &t) != cudaSuccess || t != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeParams kp{};
        const char* name = nullptr;
        if (cudaGraphKernelNodeGetParams(nodes[i], &kp) != cudaSuccess || cudaFuncGetName(&name, kp.func) != cudaSuccess || !name) name = "?";
        int st = 0;
        char* dm = abi::__cxa_demangle(name, nullptr, nullptr, &st);
        kernels_.emplace_back(st == 0 && dm ? dm : name);
        std::free(dm);
      }
    }
  }
  (void)cudaGetLastError();  // a kernel the runtime could not name (a library's) is not an error
  cudaGraphExec_t e = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  cudaGraphDestroy(g);
  if (err != cudaSuccess) detail::cuda_fail(err, "cudaGraphInstantiate", __FILE__, __LINE__);
  exec_ = e;
}
void Graph::launch(Stream& s) { HMOE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cs(s))); }

void copy_to_device(void* dst, const void* src, size_t bytes, Stream& s) {
  if (bytes) HMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs(s)));
}
void copy_to_host(void* dst, const void* src, size_t bytes, Stream& s) {
  if (bytes) HMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs(s)));
}
void copy_on_device(void* dst, const void* src, size_t bytes, Stream& s) {
  if (bytes) HMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cs(s)));
}
void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, Stream& s) {
  if (width && rows) HMOE_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, cs(s)));
}
void memset_device(void* dst, int value, size_t bytes, Stream& s) {
  if (bytes) HMOE_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, cs(s)));
}
void device_synchronize() { HMOE_CUDA_CHECK(cudaDeviceSynchronize()); }
std::pair<size_t, size_t> memory_info() {
  size_t f = 0, t = 0;
  HMOE_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return {f, t};
}

}  // namespace hmoe::gpu
