// SegmentGraphs: the CUDA graphs of a GPU step's segments (the device work
// between two host hand-offs, per micro-batch), kept per step key.
//
// Contract: run(key, index, s, enqueue) replays graph `index` of `key` on s,
// capturing it first from the work enqueue() puts on s when that graph does
// not exist yet. The key must hold everything a captured launch depends on
// (token counts, kernel grid choices, every buffer address): a step with a
// new key gets new graphs. At most kMaxKeys keys are kept (all dropped when
// a new one would exceed it). enqueue() must only enqueue work on s (no
// synchronisation, no host reads of device results). If capture throws,
// nothing is kept and the error propagates. Not thread-safe.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/memory.h"

namespace hmoe {

class SegmentGraphs {
 public:
  static constexpr size_t kMaxKeys = 8;
  void run(const std::vector<const void*>& key, size_t index, gpu::Stream& s, const std::function<void()>& enqueue);
  void clear() {
    sets_.clear();
    last_ = nullptr;
  }
  size_t captures() const { return captures_; }  // graphs captured so far (for tests and benchmarks)
  // The graphs of the key run last (one step's segments and micro-batches):
  // how many, and their kernel nodes' names, graph after graph (for
  // benchmarks: what one replayed step launches).
  size_t last_graphs() const;
  std::vector<std::string> last_kernels() const;

 private:
  using Set = std::vector<std::unique_ptr<gpu::Graph>>;
  std::map<std::vector<const void*>, Set> sets_;
  const Set* last_ = nullptr;
  size_t captures_ = 0;
};

// A kernel's demangled name without its return type, parameter list and
// namespace qualifiers: "void hmoe::gpu::(anonymous namespace)::gg_kernel<
// hmoe::gpu::detail::gguf::Q4K, 1, 0>(hmoe::gpu::(anonymous namespace)::
// Params)" -> "gg_kernel<Q4K, 1, 0>" (benchmark tables).
std::string kernel_short_name(std::string name);

}  // namespace hmoe
