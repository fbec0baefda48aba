// RoutedExperts (see routed_experts.h).
#include "engine/layers/routed_experts.h"

#include <algorithm>
#include <chrono>

#include "configs/error.h"
#include "engine/layers/expert_deferral.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/gpu_experts.h"
#include "engine/layers/routing_trace.h"

namespace hmoe {

RoutedExperts::RoutedExperts(WeightBinder& bind, const ModelConfig& c, int64_t layer, const std::string& prefix, Home home,
                             numa::NodePools& pools, ExpertHomeOptions& opt, gpu::Stream* s)
    : home_(home), layer_(layer), experts_(c.num_experts), hidden_(c.hidden_size), inter_(c.moe_intermediate_size) {
  const int64_t H = hidden_, I = inter_;
  std::vector<numa::ExpertWeights> ex;
  for (int64_t e = 0; e < experts_; ++e) {
    const std::string ep = prefix + "experts." + std::to_string(e) + ".";
    ex.push_back({bind.mat(ep + "gate_proj.weight", I, H), bind.mat(ep + "up_proj.weight", I, H), bind.mat(ep + "down_proj.weight", H, I)});
  }
  const std::string what = "layer " + std::to_string(layer) + " routed experts";
  if (home == Home::gpu) {
    if (!s) fail(ErrorKind::internal, what + ": GPU home without a stream");
    gpu_ = std::make_unique<GpuResidentExperts>(ex, opt.keep_quantized, *s, what);
    split_act_ = opt.split_act && !gpu_->quantized();  // only the bf16 grouped kernels take act_lo
    for (const auto& w : ex) {
      bind.release(w.gate);
      bind.release(w.up);
      bind.release(w.down);
    }
    return;
  }
  host_ = std::move(ex);
  trace_ = opt.trace;
  deferral_ = opt.deferral;
  opt.engine.name = what + (s ? " (CPU)" : "");
  numa::EngineOptions eo = opt.engine;
  // Copy residence: experts that view a checkpoint file map are copied into the engine's node memory (even on
  // one node: the one copy the GPU reads too); experts in the loader's own buffers are anonymous memory
  // already and are registered where they are.
  std::vector<cpu::Mat> mats;
  uint64_t total = 0;
  bool any_file = false;
  for (const auto& w : host_)
    for (const cpu::Mat* m : {&w.gate, &w.up, &w.down}) {
      mats.push_back(*m);
      total += m->bytes();
      any_file = any_file || bind.file_backed(*m);
    }
  const bool residence = opt.residence == HostResidence::copy;
  const bool copy = residence && any_file;
  if (copy) eo.copy_to_nodes = 1;
  const auto t0 = std::chrono::steady_clock::now();
  engine_ = std::make_unique<numa::ExpertEngine>(host_, pools, eo);
  opt.engine.print_memory = false;  // the first host layer speaks for all
  if (!residence) return;
  const auto t1 = std::chrono::steady_clock::now();
  std::string why;
  std::vector<numa::ExpertEngine::Buffer> bufs;
  if (copy) {
    pieces_ = engine_->pieces();
    bufs = engine_->buffers();
  } else {
    bufs = host_ranges(mats);
  }
  const bool registered = register_host_buffers(bufs, pins_, &why);
  const auto t2 = std::chrono::steady_clock::now();
  // The checkpoint's pages of what was copied (file maps) leave the process.
  const uint64_t dropped = copy ? bind.drop_copied(mats) : 0;
  const auto t3 = std::chrono::steady_clock::now();
  HostResidenceStats* st = opt.residence_stats;
  if (!st) return;
  ++st->layers;
  if (copy) {
    for (const auto& b : bufs) st->copied_bytes += b.bytes;
    st->copy_s += std::chrono::duration<double>(t1 - t0).count();
  } else {
    ++st->in_place_layers;
    st->in_place_bytes += total;
  }
  if (registered) {
    for (const auto& b : bufs) st->registered_bytes += b.bytes;
    st->registrations += static_cast<int64_t>(pins_.size());
  } else if (st->refused.empty()) {
    st->refused = what + ": " + why;
  }
  st->dropped_bytes += dropped;
  st->register_s += std::chrono::duration<double>(t2 - t1).count();
  st->drop_s += std::chrono::duration<double>(t3 - t2).count();
}

RoutedExperts::~RoutedExperts() = default;

uint64_t RoutedExperts::gpu_bytes() const { return gpu_ ? gpu_->bytes() : 0; }

void RoutedExperts::record_routing(int64_t n, const int32_t* ids, int64_t k) {
  if (trace_) trace_->record(layer_, n, k, ids);
}

void RoutedExperts::run_host(const float* x, int64_t n, const int32_t* ids, const float* w, int64_t k, float* out, bool record) {
  if (!engine_) fail(ErrorKind::internal, "layer " + std::to_string(layer_) + ": routed experts are not in host memory");
  if (record) record_routing(n, ids, k);
  if (!deferral_ || deferral_->defer() == 0) return engine_->forward(x, n, ids, w, k, out);
  deferral_->run(layer_, x, n, ids, w, k, out,
                 [this](const float* xx, int64_t nn, const int32_t* ii, const float* ww, int64_t kk, float* oo) { engine_->forward(xx, nn, ii, ww, kk, oo); });
}

void RoutedExperts::reserve(GpuCtx& ctx, int64_t k) const {
  const int64_t n = ctx.step.n;
  ctx.scratch.fit("moe.route_off", (experts_ + 1) * 4);
  ctx.scratch.fit("moe.pair_list", n * k * 4);
  ctx.scratch.fit("moe.act", n * k * inter_ * 2 * (split_act_ ? 2 : 1));
  ctx.scratch.fit("moe.partial", n * k * std::max(hidden_, 2 * inter_) * 4);  // also the GGUF kernels' gate/up products
}

void RoutedExperts::enqueue(GpuCtx& ctx, const gpu::bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* w, float* out) {
  if (gpu_) {
    int32_t* off = ctx.scratch.get<int32_t>("moe.route_off");
    int32_t* pairs = ctx.scratch.get<int32_t>("moe.pair_list");
    if (gpu_->needs_routing(n, k)) gpu::moe_route(ids, n * k, experts_, off, pairs, ctx.s);
    gpu::bf16_t* act = ctx.scratch.get<gpu::bf16_t>("moe.act");
    gpu_->run(x, n, k, ids, w, off, pairs, act, ctx.scratch.get<float>("moe.partial"), out, ctx.blas, ctx.expert_scratch, ctx.s,
              split_act_ ? act + n * k * inter_ : nullptr);
    return;
  }
  if (!ctx.stream || !ctx.step.stream_pass)
    fail(ErrorKind::internal, "layer " + std::to_string(layer_) + ": host experts enqueued on the GPU outside a streamed pass");
  ctx.stream->layer(layer_, x, n, ids, w, out);
}

}  // namespace hmoe
