// Qwen3-Next's real full-attention shape (16 query / 2 KV heads of 256, 64
// rotary dimensions, output gate) through the whole GPU model: a small
// random qwen3_next model (4 layers: Gated DeltaNet and gated attention in
// turn, 16 experts) run on the GPU runtime, all-GPU, against the fp32 CPU
// runtime on the same bf16 weights. A prompt of 700 tokens in two pieces
// (query tiles on tensor cores over a cached prefix of 400; then the
// per-token kernel, gpu_tiled_attention off) and four decode steps at
// context ~700 (split-K: one sequence of 16 heads past 512 keys). The
// tiny fixture (head_dim 32) covers the rest of the model against
// transformers; here the check is the 256-wide attention wired into the
// layer: the logits within 5% (relative L2) and the top-1 of >= 95% of the
// rows whose CPU margin exceeds 0.5. Skips without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "configs/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/models/model_graph.h"
#include "engine/runtime/cpu_runtime.h"
#include "engine/runtime/gpu_runtime.h"
#include "engine/serving/logits.h"
#include "gpu/kernels.h"
#include "io/dtype.h"
#include "numa/node_pools.h"
#include "tests/gpu/clear_top1.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/model_run.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

ModelConfig hd256_config() {
  const nlohmann::json j = {{"model_type", "qwen3_next"},
                            {"vocab_size", 2048},
                            {"hidden_size", 256},
                            {"intermediate_size", 512},
                            {"moe_intermediate_size", 64},
                            {"shared_expert_intermediate_size", 64},
                            {"num_hidden_layers", 4},
                            {"num_attention_heads", 16},
                            {"num_key_value_heads", 2},
                            {"head_dim", 256},
                            {"linear_conv_kernel_dim", 4},
                            {"linear_key_head_dim", 64},
                            {"linear_value_head_dim", 64},
                            {"linear_num_key_heads", 2},
                            {"linear_num_value_heads", 4},
                            {"full_attention_interval", 2},
                            {"num_experts", 16},
                            {"num_experts_per_tok", 4},
                            {"norm_topk_prob", true},
                            {"decoder_sparse_step", 1},
                            {"mlp_only_layers", nlohmann::json::array()},
                            {"hidden_act", "silu"},
                            {"rms_norm_eps", 1e-6},
                            {"rope_theta", 10000000},
                            {"partial_rotary_factor", 0.25},
                            {"max_position_embeddings", 4096},
                            {"tie_word_embeddings", false},
                            {"attention_bias", false}};
  return ModelConfig::from_json(j, "test_gpu_qwen3next_hd256");
}

// Every tensor made on first request, normal bf16 from a seed of its name:
// matrices of scale 0.05 (lm_head 0.2: logits of a few units), zero-centred
// norm weights near 0 (the model scales by 1 + w), the DeltaNet output norm
// near 1. No mtp.* tensors.
class RandomWeights {
 public:
  cpu::Mat get(const std::string& name, const std::vector<int64_t>& shape) {
    if (name.rfind("mtp.", 0) == 0) fail(ErrorKind::bad_model, "no " + name);
    if (shape.empty()) return cpu::Mat{DType::bf16, nullptr, 0, 0};  // WeightBinder::has
    auto it = mats_.find(name);
    if (it != mats_.end()) return it->second;
    int64_t n = 1, cols = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      n *= shape[i];
      if (i > 0) cols *= shape[i];
    }
    const bool norm = name.find("norm.weight") != std::string::npos;
    const float scale = name == "lm_head.weight" ? 0.2f : norm ? 0.1f : 0.05f;
    std::mt19937_64 rng(std::hash<std::string>{}(name));
    std::normal_distribution<float> nd(0.0f, scale);
    auto& buf = owned_.emplace_back(static_cast<size_t>(n));
    const bool one = name.find("linear_attn.norm.weight") != std::string::npos;
    for (auto& v : buf) v = f32_to_bf16((one ? 1.0f : 0.0f) + nd(rng));
    return mats_[name] = cpu::Mat{DType::bf16, buf.data(), shape.size() == 1 ? 1 : shape[0], shape.size() == 1 ? n : cols};
  }

 private:
  std::map<std::string, cpu::Mat> mats_;
  std::vector<std::vector<uint16_t>> owned_;
};

// Logits of every position: the prompt in `pieces`, then the remaining ids as one-token (decode) steps.
template <class Runtime>
std::vector<float> run(Runtime& rt, KvLayout layout, const std::vector<int32_t>& ids, const std::vector<int64_t>& pieces) {
  const int64_t n = static_cast<int64_t>(ids.size());
  KvCache kv(layout, n / 16 + 4, 16);
  const int seq = kv.add_sequence();
  kv.reserve(seq, n);
  std::vector<float> all, part;
  int64_t pos = 0;
  for (size_t p = 0; pos < n; ++p) {
    const int64_t len = p < pieces.size() ? std::min(pieces[p], n - pos) : 1;
    Batch b;
    for (int64_t i = 0; i < len; ++i) b.add(ids[static_cast<size_t>(pos + i)], seq, pos + i, true);
    rt.forward(b, kv, part);
    all.insert(all.end(), part.begin(), part.end());
    pos += len;
  }
  return all;
}

// The top-1 agreement on rows whose reference margin exceeds 0.5, and the relative L2 of the whole.
void check_close(const std::vector<float>& gpu, const std::vector<float>& cpu, int64_t V, const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  const auto [rows, agree] = test::clear_top1(gpu, cpu, V);
  const double rel = test::rel_error(gpu, cpu);
  MESSAGE(what << ": relative L2 " << rel << ", top-1 " << agree << "/" << rows << " rows of margin > 0.5");
  CHECK(rel <= 5e-2);
  CHECK(rows >= 50);
  CHECK(agree * 100 >= rows * 95);
}

}  // namespace

TEST_CASE("qwen3_next with head_dim 256 (16/2 heads, partial rotary) on the GPU agrees with the fp32 CPU runtime: tiles, per-token kernel, split-K decode") {
  if (!test::have_gpu()) return;
  const ModelConfig c = hd256_config();
  RandomWeights w;
  const WeightLookup get = [&w](const std::string& n, const std::vector<int64_t>& s) { return w.get(n, s); };
  const ModelGraph g = model_graph(c, [](const std::string& n) { return n.rfind("mtp.", 0) != 0; });
  numa::PoolOptions po;
  numa::NodePools pools(po);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < 704; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % c.vocab_size));
  const std::vector<int64_t> pieces = {400, 300};  // then 4 decode steps
  std::vector<float> ref;
  {
    WeightBinder bind(get);
    CpuRuntime cpu(c, g, bind, pools, CpuRuntimeOptions{});
    ref = run(cpu, g.kv, ids, pieces);
  }
  GpuRuntimeOptions o;
  o.resident.assign(static_cast<size_t>(c.num_hidden_layers), true);
  auto gpu = GpuRuntime::from_lookup(c, get, pools, o);
  KvLayout kl = g.kv;  // as Model::load sets it up for the GPU path: states on the GPU, no state checkpoints
  if (gpu->seq_state_bytes() > 0) kl.seq_state_bytes = gpu->seq_state_bytes();
  kl.state_align = 0;
  REQUIRE(gpu::attention_splits(1, c.num_attention_heads, 701) > 1);
  for (const bool tiles : {true, false}) {
    gpu->set_tiled_attention(tiles);
    const std::vector<float> out = run(*gpu, kl, ids, pieces);
    check_close(out, ref, c.vocab_size, tiles ? "GPU, prompt in query tiles" : "GPU, prompt through the per-token kernel");
    // The decode steps alone (split-K at context 701..704).
    const size_t dec = static_cast<size_t>(4 * c.vocab_size);
    const std::vector<float> od(out.end() - static_cast<std::ptrdiff_t>(dec), out.end()), rd(ref.end() - static_cast<std::ptrdiff_t>(dec), ref.end());
    const double rel = test::rel_error(od, rd);
    MESSAGE("  decode steps at context 701-704: relative L2 " << rel);
    CHECK(rel <= 5e-2);
  }
}
