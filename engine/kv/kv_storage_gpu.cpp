#include "engine/kv/kv_storage_gpu.h"

#include <climits>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"

namespace hmoe {

GpuKvStorage::GpuKvStorage(int64_t layers, int64_t num_blocks, int64_t block_size, int64_t k_width, int64_t v_width, int64_t host_blocks)
    : layers_(layers), blocks_(num_blocks), bs_(block_size), kw_(k_width), vw_(v_width), host_blocks_(host_blocks) {
  if (layers <= 0 || num_blocks <= 0 || block_size <= 0 || k_width <= 0 || v_width < 0 || host_blocks < 0)
    fail(ErrorKind::invalid_argument, "GPU KV storage: bad geometry");
  const size_t tokens = static_cast<size_t>(layers * num_blocks * block_size), htokens = static_cast<size_t>(layers * host_blocks * block_size);
  kc_ = gpu::DeviceBuffer(tokens * static_cast<size_t>(kw_) * 2);
  vc_ = gpu::DeviceBuffer(tokens * static_cast<size_t>(vw_) * 2);
  if (host_blocks > 0) {
    hk_ = gpu::PinnedBuffer(htokens * static_cast<size_t>(kw_) * 2);
    if (vw_) hv_ = gpu::PinnedBuffer(htokens * static_cast<size_t>(vw_) * 2);
  }
}

GpuKvStorage::~GpuKvStorage() {
  try {
    copy_.synchronize();  // no copy may still read or write the buffers freed next
  } catch (...) {
  }
}

void GpuKvStorage::queue(Kind k, int64_t src, int64_t dst) {
  if (k != Kind::device && !ops_.empty()) {  // extend a run of consecutive blocks and slots
    Op& o = ops_.back();
    if (o.kind == k && o.src + o.count == src && o.dst + o.count == dst) {
      ++o.count;
      return;
    }
  }
  ops_.push_back({k, src, dst, 1});
}

void GpuKvStorage::copy_block(int64_t dst, int64_t src) { queue(Kind::device, src, dst); }
void GpuKvStorage::offload(int64_t block, int64_t host_slot) { queue(Kind::offload, block, host_slot); }
void GpuKvStorage::restore(int64_t host_slot, int64_t block) { queue(Kind::restore, host_slot, block); }

void GpuKvStorage::issue() {
  if (ops_.empty()) return;
  copy_start_.record(copy_);
  for (const Op& o : ops_) {
    for (int plane = 0; plane < 2; ++plane) {
      const int64_t w = plane ? vw_ : kw_;
      if (w == 0) continue;
      uint16_t* dev = (plane ? vc_ : kc_).as<uint16_t>();
      uint16_t* host = (plane ? hv_ : hk_).as<uint16_t>();
      const int64_t blk = bs_ * w;  // values per block and layer
      // Per layer: one row of o.count blocks; rows are a plane-layer apart.
      uint16_t *dst, *src;
      int64_t dpitch, spitch;
      if (o.kind == Kind::offload) {
        dst = host + o.dst * blk, dpitch = host_blocks_ * blk;
        src = dev + o.src * blk, spitch = blocks_ * blk;
      } else if (o.kind == Kind::restore) {
        dst = dev + o.dst * blk, dpitch = blocks_ * blk;
        src = host + o.src * blk, spitch = host_blocks_ * blk;
      } else {
        dst = dev + o.dst * blk, dpitch = blocks_ * blk;
        src = dev + o.src * blk, spitch = blocks_ * blk;
      }
      const size_t width = static_cast<size_t>(o.count * blk * 2);
      if (dpitch * 2 <= INT_MAX && spitch * 2 <= INT_MAX) {  // the pitch limit of 2-D copies
        gpu::copy_2d(dst, static_cast<size_t>(dpitch * 2), src, static_cast<size_t>(spitch * 2), width, static_cast<size_t>(layers_), copy_);
        ++copy_calls_;
      } else {
        for (int64_t l = 0; l < layers_; ++l) {
          gpu::copy_2d(dst + l * dpitch, width, src + l * spitch, width, width, 1, copy_);
          ++copy_calls_;
        }
      }
    }
  }
  ops_.clear();
  copy_end_.record(copy_);
  timing_ = true;
  unwaited_ = true;
}

void GpuKvStorage::begin_step(gpu::Stream& s) {
  if (!ops_.empty()) {
    step_done_.record(s);  // everything the earlier steps enqueued
    copy_.wait(step_done_);
    issue();
  }
  if (unwaited_) {
    s.wait(copy_end_);
    unwaited_ = false;
  }
}

void GpuKvStorage::end_step() {
  if (!timing_) return;
  copy_end_.synchronize();
  copy_s_ += copy_end_.elapsed_ms(copy_start_) * 1e-3;
  timing_ = false;
}

void GpuKvStorage::synchronize() {
  issue();  // callers sync their own step stream first: the previous steps are done
  copy_.synchronize();
  unwaited_ = false;
  end_step();
}

void* GpuKvStorage::seq_state(int seq, int64_t bytes) {
  if (seq < 0 || bytes <= 0 || (state_bytes_ && bytes != state_bytes_))
    fail(ErrorKind::internal, "GPU KV storage: sequence state of " + std::to_string(bytes) + " bytes asked for sequence " + std::to_string(seq));
  state_bytes_ = bytes;
  if (static_cast<size_t>(seq) >= states_.size()) states_.resize(static_cast<size_t>(seq) + 1);
  gpu::DeviceBuffer& b = states_[static_cast<size_t>(seq)];
  if (!b.data()) {
    if (!free_states_.empty()) {
      b = std::move(free_states_.back());
      free_states_.pop_back();
    } else {
      b = gpu::DeviceBuffer(static_cast<size_t>(bytes));
      ++states_allocated_;
    }
  }
  return b.data();
}

void GpuKvStorage::free_sequence(int seq) {
  if (seq < 0 || static_cast<size_t>(seq) >= states_.size() || !states_[static_cast<size_t>(seq)].data()) return;
  free_states_.push_back(std::move(states_[static_cast<size_t>(seq)]));
  states_[static_cast<size_t>(seq)] = gpu::DeviceBuffer();
}

int64_t GpuKvStorage::seq_states_live() const {
  int64_t n = 0;
  for (const auto& b : states_) n += b.data() != nullptr;
  return n;
}

GpuKvStorage& gpu_kv_storage(KvCache& kv, int64_t k_width, int64_t v_width) {
  auto* g = dynamic_cast<GpuKvStorage*>(kv.storage());
  if (!g) {
    auto made = std::make_unique<GpuKvStorage>(kv.layout().layers, kv.num_blocks(), kv.block_size(), k_width, v_width, kv.host_blocks());
    g = made.get();
    kv.set_storage(std::move(made));
  }
  if (g->k_width() != k_width || g->v_width() != v_width || g->num_blocks() != kv.num_blocks() || g->block_size() != kv.block_size())
    fail(ErrorKind::internal, "the KV cache's GPU storage has another geometry than this model's");
  return *g;
}

}  // namespace hmoe
