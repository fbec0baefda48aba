// The IQ codebooks on each device (gpu/gguf_lowbit_units.h
// device_lowbit_tables): io/tensor/gguf_iq_grids.h's arrays copied once per
// device into one allocation, then handed to the kernels by pointer. Global
// memory rather than __constant__: lanes look up different entries, which
// constant memory would serialise; the 33 KB stay in L1/L2 while a layer runs.
// Deliberately never freed (one per device for the process's life), so that
// no destructor runs after the CUDA runtime has shut down.
#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <mutex>
#include <vector>

#include "configs/error.h"
#include "gpu/check.h"
#include "gpu/gguf_lowbit_units.h"

namespace hmoe::gpu::detail::gguf {

namespace {
constexpr int kMaxDevices = 64;
std::mutex g_mu;
std::array<LowbitTables, kMaxDevices> g_tables{};
}  // namespace

LowbitTables device_lowbit_tables() {
  int dev = 0;
  HMOE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) fail(ErrorKind::unsupported, "gpu GGUF tables: device " + std::to_string(dev) + " out of range");
  std::lock_guard<std::mutex> lock(g_mu);
  LowbitTables& t = g_tables[static_cast<size_t>(dev)];
  if (t.iq1s) return t;
  const LowbitTables h = host_lowbit_tables();
  const size_t sizes[6] = {256 * 8, 512 * 8, 1024 * 8, 256 * 4, 512 * 4, 2048 * 8};
  const void* src[6] = {h.iq2xxs, h.iq2xs, h.iq2s, h.iq3xxs, h.iq3s, h.iq1s};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  std::vector<uint8_t> blob(total);
  size_t at = 0;
  for (int i = 0; i < 6; ++i) {
    std::memcpy(blob.data() + at, src[i], sizes[i]);
    at += sizes[i];
  }
  void* d = nullptr;
  HMOE_CUDA_CHECK(cudaMalloc(&d, total));
  HMOE_CUDA_CHECK(cudaMemcpy(d, blob.data(), total, cudaMemcpyHostToDevice));
  const uint8_t* p = static_cast<const uint8_t*>(d);
  LowbitTables r;
  r.iq2xxs = reinterpret_cast<const uint64_t*>(p);
  r.iq2xs = reinterpret_cast<const uint64_t*>(p + sizes[0]);
  r.iq2s = reinterpret_cast<const uint64_t*>(p + sizes[0] + sizes[1]);
  r.iq3xxs = reinterpret_cast<const uint32_t*>(p + sizes[0] + sizes[1] + sizes[2]);
  r.iq3s = reinterpret_cast<const uint32_t*>(p + sizes[0] + sizes[1] + sizes[2] + sizes[3]);
  r.iq1s = reinterpret_cast<const uint64_t*>(p + sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4]);
  t = r;
  return t;
}

}  // namespace hmoe::gpu::detail::gguf
