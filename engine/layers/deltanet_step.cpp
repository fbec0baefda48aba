// The step's sequences for the GPU Gated DeltaNet layers (see hybrid_gpu.h):
// the plan on the host, its upload with each sequence's state buffer.
#include <algorithm>
#include <cstring>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_storage_gpu.h"
#include "engine/layers/hybrid_gpu.h"

namespace hmoe {

namespace {

int64_t& consumed(KvCache& kv, int seq) {
  uint8_t* s = kv.seq_state(seq);
  if (!s || kv.layout().seq_state_bytes < static_cast<int64_t>(sizeof(int64_t)))
    fail(ErrorKind::internal, "gated deltanet (GPU): the KV cache keeps no per-sequence state (build it with Model::kv_layout())");
  return *reinterpret_cast<int64_t*>(s);
}

}  // namespace

gpu::DeltaNetShape deltanet_shape(const HybridConfig& h) {
  gpu::DeltaNetShape sh;
  sh.nk = h.linear_num_key_heads;
  sh.nv = h.linear_num_value_heads;
  sh.dk = h.linear_key_head_dim;
  sh.dv = h.linear_value_head_dim;
  sh.conv_k = h.linear_conv_kernel_dim;
  return sh;
}

DeltaNetPlan plan_deltanet_step(const Batch& b, KvCache& kv) {
  DeltaNetPlan p;
  const int64_t n = static_cast<int64_t>(b.slots.size());
  std::vector<std::vector<int32_t>> rows;
  for (int64_t t = 0; t < n; ++t) {
    const int seq = b.slots[static_cast<size_t>(t)].seq;
    const auto it = std::find(p.seq.begin(), p.seq.end(), seq);
    const size_t g = static_cast<size_t>(it - p.seq.begin());
    if (it == p.seq.end()) {
      p.seq.push_back(seq);
      rows.emplace_back();
    }
    rows[g].push_back(static_cast<int32_t>(t));
  }
  for (size_t g = 0; g < p.seq.size(); ++g) {
    const int64_t done = consumed(kv, p.seq[g]);
    for (size_t j = 0; j < rows[g].size(); ++j) {
      const int64_t pos = b.slots[static_cast<size_t>(rows[g][j])].pos;
      if (pos != done + static_cast<int64_t>(j))
        fail(ErrorKind::internal, "gated deltanet (GPU): sequence " + std::to_string(p.seq[g]) + " gets position " + std::to_string(pos) +
                                      " but its recurrent state stands at " + std::to_string(done + static_cast<int64_t>(j)) +
                                      " (linear attention runs its tokens in order)");
    }
    p.start.push_back(static_cast<int32_t>(p.order.size()));
    p.count.push_back(static_cast<int32_t>(rows[g].size()));
    p.fresh.push_back(done == 0 ? 1 : 0);
    p.multi = p.multi || rows[g].size() > 1;
    p.single = p.single || rows[g].size() == 1;
    p.order.insert(p.order.end(), rows[g].begin(), rows[g].end());
    p.tok_group.insert(p.tok_group.end(), rows[g].size(), static_cast<int32_t>(g));
  }
  return p;
}

void DeltaNetStep::begin(const Batch& b, KvCache& kv, GpuKvStorage& kvs, gpu::Stream& s) {
  plan_ = plan_deltanet_step(b, kv);
  const int64_t G = count(), n = static_cast<int64_t>(plan_.order.size());
  // [state pointers (8 bytes each)] [order] [tok_group] [start] [count] [fresh]
  const size_t bytes = static_cast<size_t>(G) * 8 + static_cast<size_t>(2 * n + 3 * G) * 4;
  if (bytes > buf_.bytes()) {  // with headroom: a replayed graph needs the same address
    host_.reserve(bytes * 2);
    buf_.reserve(bytes * 2);
  }
  auto* ptrs = host_.as<uint64_t>();
  for (int64_t g = 0; g < G; ++g)
    ptrs[g] = reinterpret_cast<uint64_t>(kvs.seq_state(plan_.seq[static_cast<size_t>(g)], state_bytes_));
  int32_t* ints = reinterpret_cast<int32_t*>(ptrs + G);
  auto put = [&ints](const std::vector<int32_t>& v) {
    std::memcpy(ints, v.data(), v.size() * 4);
    ints += v.size();
  };
  put(plan_.order);
  put(plan_.tok_group);
  put(plan_.start);
  put(plan_.count);
  put(plan_.fresh);
  gpu::copy_to_device(buf_.data(), host_.as<void>(), bytes, s);
  const auto* dp = buf_.as<uint64_t>();
  const auto* di = reinterpret_cast<const int32_t*>(dp + G);
  dev_.state = dp;
  dev_.order = di;
  dev_.tok_group = di + n;
  dev_.start = di + 2 * n;
  dev_.count = di + 2 * n + G;
  dev_.fresh = di + 2 * n + 2 * G;
}

void DeltaNetStep::end(KvCache& kv) {
  for (size_t g = 0; g < plan_.seq.size(); ++g) consumed(kv, plan_.seq[g]) += plan_.count[g];
}

void DeltaNetStep::range(const Rows& r, int64_t n, int64_t& g0, int64_t& gn) const {
  if (r.r0 == 0 && r.rn == n) {
    g0 = 0;
    gn = count();
    return;
  }
  if (count() != n) fail(ErrorKind::internal, "gated deltanet (GPU): micro-batches need one token per sequence");
  g0 = r.r0;
  gn = r.rn;
}

gpu::DeviceBuffer upload_norm(GpuUploader& up, const cpu::Mat& w, bool zero_centred, bool f32) {
  if (!zero_centred && !f32) return up.bf16({w});
  std::vector<float> f = mat_f32(w);
  if (zero_centred)
    for (float& x : f) x += 1.0f;
  up.bind().release(w);
  if (f32) return up.raw(f.data(), f.size() * sizeof(float));
  std::vector<uint16_t> h(f.size());
  write_bf16(cpu::Mat{DType::f32, f.data(), 1, static_cast<int64_t>(f.size())}, h.data());
  return up.raw(h.data(), h.size() * 2);
}

}  // namespace hmoe
