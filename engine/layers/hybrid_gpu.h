// The CUDA side of Qwen3-Next's layer kinds (their meaning is
// gated_deltanet.h and hybrid_blocks.h; kernels gpu/deltanet.h):
//  - Gated DeltaNet: one fused input product (in_proj_qkvz and in_proj_ba),
//    conv + silu + q/k norm + gates per token, the delta rule (a chunked
//    kernel for sequences with several tokens in the step, the one-step
//    recurrence for those with one), gated RMSNorm, out_proj;
//  - gated full attention on the paged KV cache (q with its output gate,
//    zero-centred q/k norm, partial rotary);
//  - zero-centred norm weights uploaded as (1 + w);
//  - precise (setting gpu_hybrid_precise, the default): the inputs of the
//    linear-attention in_proj/out_proj and the gated attention's q/k/v and
//    o_proj are a bf16 hi + lo pair (x = hi + lo to about 16 bits), run as
//    one product over 2n rows with the halves added: the delta rule's keys
//    and gates amplify an input rounded once to 8 bits (on the tiny fixture
//    the bf16 DeltaNet in_proj alone flips clear top-1s).
//
// Recurrent state: each sequence's conv windows and delta-rule states live
// in GPU memory, in a buffer the KV cache's GPU storage lends the sequence
// while it runs (GpuKvStorage::seq_state; back to its free list on
// KvCache::free_sequence, so a later sequence reuses it). The host keeps
// only the tokens consumed, in the first 8 bytes of the KvCache's
// seq_state (zeroed by add_sequence): a sequence at 0 starts from a zero
// state whatever its buffer holds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/layers/gpu_layer.h"
#include "engine/layers/gpu_upload.h"
#include "engine/loading/model_config.h"
#include "engine/runtime/batch.h"
#include "gpu/deltanet.h"

namespace hmoe {

class KvCache;

// Host bytes of KvCache seq_state the GPU path uses per sequence.
constexpr int64_t kDeltaNetHostStateBytes = 64;

gpu::DeltaNetShape deltanet_shape(const HybridConfig& h);

// The step's tokens ordered by sequence, as the Gated DeltaNet kernels take
// them (host side, no GPU needed). Sequences in order of first appearance,
// each one's tokens in batch order; `consumed` is each sequence's count
// before the step. Throws Error(internal) naming the sequence when its
// positions do not continue its state (consumed, consumed + 1, ...).
struct DeltaNetPlan {
  std::vector<int32_t> order, tok_group;         // per ordered token: batch row, group
  std::vector<int32_t> seq, start, count, fresh;  // per group
  bool multi = false, single = false;            // some group has > 1 / exactly 1 token
};
DeltaNetPlan plan_deltanet_step(const Batch& b, KvCache& kv);

// A step's DeltaNetPlan on the device, with each sequence's state buffer.
class DeltaNetStep {
 public:
  // state_bytes: device bytes per sequence over all linear-attention layers.
  explicit DeltaNetStep(int64_t state_bytes) : state_bytes_(state_bytes) {}
  // Plans the step (throws before anything is enqueued), takes the states
  // from kvs and uploads the groups on s. The host buffer is reused: call
  // only once the previous step's work is done.
  void begin(const Batch& b, KvCache& kv, GpuKvStorage& kvs, gpu::Stream& s);
  // After the step's work is done: the sequences' counts advance.
  void end(KvCache& kv);
  const gpu::DeltaNetGroups& groups() const { return dev_; }
  const DeltaNetPlan& plan() const { return plan_; }
  int64_t count() const { return static_cast<int64_t>(plan_.seq.size()); }
  // Groups of the micro-batch r of an n-token step: all of them when r is
  // the whole step, else (steps of one token per sequence) groups r0..r0+rn,
  // which are then also the ordered tokens and batch rows.
  void range(const Rows& r, int64_t n, int64_t& g0, int64_t& gn) const;
  const void* device_address() const { return buf_.data(); }

 private:
  int64_t state_bytes_;
  DeltaNetPlan plan_;
  gpu::PinnedBuffer host_;
  gpu::DeviceBuffer buf_;
  gpu::DeltaNetGroups dev_;
};

// RMSNorm weights as bf16, as (1 + w) when zero_centred; f32: as fp32
// (zero-centred (1 + w) rounded to bf16 keeps 8 bits of 1 + w, about 2 of w).
gpu::DeviceBuffer upload_norm(GpuUploader& up, const cpu::Mat& w, bool zero_centred, bool f32 = false);

// The layers. Gated DeltaNet reads ctx.step.deltanet; its state is part
// `state_index` of each sequence's buffer (deltanet_layer_state_bytes each).
// split: the projections' inputs as a bf16 hi + lo pair (above).
std::unique_ptr<GpuAttention> make_gated_deltanet_gpu(GpuUploader& up, const ModelConfig& c, int64_t state_index, const std::string& prefix,
                                                     bool split = true);
std::unique_ptr<GpuAttention> make_gated_attention_gpu(GpuUploader& up, const ModelConfig& c, int64_t kv_layer, const std::string& prefix,
                                                     bool split = true);

}  // namespace hmoe
