// Expert deferral (setting defer_experts, `--defer-experts N`): of each
// token's routed experts that run on the CPU in MoE layer l, the N with the
// lowest routing weights are computed later and their weighted sum is added
// to the residual one layer later, together with layer l+1's MoE output.
// Layer l+1's attention and router therefore see the residual without them
// (the approximation; bench/README.md has its quality cost), and the CPU
// computes them while the GPU runs layer l+1 (KTransformers' idea).
//
// Who does what: the runtime says, per step, which layers may defer
// (begin_step): layer l only when the next host-expert run of the step is
// layer l+1's (its sum has somewhere to go one layer later) - the CPU runtime
// when layer l+1 is MoE too, the GPU runtime when layer l+1 also hands off
// in a one-micro-batch step. RoutedExperts::run_host calls run(), which adds
// the pending sum of layer l-1, runs the experts kept for now and queues the
// deferred ones. At least one expert per token always runs now.
//
// Contract: one step at a time (the runtime's thread calls begin_step,
// run, end_step). With async, the deferred experts run on a worker thread
// that uses the expert engine's pools; the caller must not use those pools
// until the next run() or end_step() (which wait for it). An exception of the
// deferred work is rethrown by the call that waits. N = 0 never calls
// anything new (results bit-identical to no deferral).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hmoe {

class ExpertDeferral {
 public:
  // x, n rows, ids/w k per row -> out += weighted expert sums.
  using RunFn = std::function<void(const float* x, int64_t n, const int32_t* ids, const float* w, int64_t k, float* out)>;

  ExpertDeferral(int64_t defer, int64_t hidden, bool async);
  ~ExpertDeferral();
  ExpertDeferral(const ExpertDeferral&) = delete;
  ExpertDeferral& operator=(const ExpertDeferral&) = delete;

  int64_t defer() const { return defer_; }
  // may_defer[l]: layer l may defer this step. Drops anything pending (a step that threw).
  void begin_step(std::vector<bool> may_defer);
  // Layer `layer`'s host experts for n rows (see above); `run_now` computes.
  void run(int64_t layer, const float* x, int64_t n, const int32_t* ids, const float* w, int64_t k, float* out, const RunFn& run_now);
  // Waits for deferred work; Error(internal) when a deferred sum was never added.
  void end_step();
  // Token-expert pairs deferred since construction (for tests and /metrics-style counts).
  int64_t deferred_pairs() const { return deferred_pairs_; }

 private:
  void wait();
  void worker();

  int64_t defer_, hidden_;
  bool async_;
  std::vector<bool> may_;
  // The pending deferred work of one layer.
  int64_t pending_layer_ = -1, pending_n_ = 0;
  std::vector<float> px_, pout_, pw_, now_w_;
  std::vector<int32_t> pids_, now_ids_;
  int64_t pk_ = 0;
  RunFn pfn_;
  int64_t deferred_pairs_ = 0;
  // Worker thread (async).
  std::mutex mu_;
  std::condition_variable cv_;
  bool has_job_ = false, busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace hmoe
