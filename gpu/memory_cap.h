// The GPU memory cap (settings gpu_memory and gpu_memory_utilization): a
// process-wide ledger of the device bytes hmoe's buffers hold, which every
// device allocation (gpu::DeviceBuffer, the cuBLAS workspace) passes
// through. With a cap set, an allocation that would take the total past it
// throws Error(out_of_memory) naming what was being allocated (the
// innermost MemoryUse label of the allocating thread), its size, what is
// already held and the cap with where the cap came from - before CUDA is
// asked, so a capped run behaves as on a card of that size.
//
// Header-only and CUDA-free, so that the CPU-only build and its tests have
// the same accounting. Thread-safe (a mutex).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "configs/error.h"

namespace hmoe::gpu {

class MemoryLedger {
 public:
  // cap 0: no cap. origin: where the cap came from ("--gpu-memory 24 GiB x --gpu-memory-utilization 0.90").
  void set_cap(uint64_t cap, std::string origin) {
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = cap;
    origin_ = std::move(origin);
  }
  uint64_t cap() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cap_;
  }
  uint64_t held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }
  uint64_t peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }
  // Bytes still allowed (UINT64_MAX without a cap).
  uint64_t room() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cap_ == 0 ? UINT64_MAX : (held_ >= cap_ ? 0 : cap_ - held_);
  }
  void acquire(uint64_t bytes, const std::string& what);
  void release(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = bytes > held_ ? 0 : held_ - bytes;
  }

 private:
  mutable std::mutex mu_;
  uint64_t cap_ = 0, held_ = 0, peak_ = 0;
  std::string origin_;
};

inline MemoryLedger& memory_ledger() {
  static MemoryLedger l;
  return l;
}

// Labels this thread's device allocations while in scope (nested: the innermost wins).
class MemoryUse {
 public:
  explicit MemoryUse(std::string what) { stack().push_back(std::move(what)); }
  ~MemoryUse() { stack().pop_back(); }
  MemoryUse(const MemoryUse&) = delete;
  MemoryUse& operator=(const MemoryUse&) = delete;
  static std::string current() { return stack().empty() ? std::string("GPU buffer") : stack().back(); }

 private:
  static std::vector<std::string>& stack() {
    thread_local std::vector<std::string> s;
    return s;
  }
};

inline std::string ledger_bytes(uint64_t b) {
  const double g = static_cast<double>(b) / (1024.0 * 1024 * 1024);
  if (g >= 1) return std::to_string(static_cast<int64_t>(g * 100 + 0.5) / 100) + "." + std::to_string(static_cast<int64_t>(g * 100 + 0.5) % 100 / 10) +
                     std::to_string(static_cast<int64_t>(g * 100 + 0.5) % 10) + " GiB";
  return std::to_string((b + (1 << 20) - 1) >> 20) + " MiB";
}

inline void MemoryLedger::acquire(uint64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cap_ > 0 && held_ + bytes > cap_)
    fail(ErrorKind::out_of_memory, "GPU memory cap: " + what + " needs " + ledger_bytes(bytes) + " but " + ledger_bytes(held_) +
                                       " of the " + ledger_bytes(cap_) + " cap are already held (" + origin_ + "); " +
                                       ledger_bytes(held_ + bytes - cap_) + " missing");
  held_ += bytes;
  if (held_ > peak_) peak_ = held_;
}

}  // namespace hmoe::gpu
