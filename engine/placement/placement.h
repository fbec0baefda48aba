// Placement: which device runs the step, which MoE layers keep their
// experts on the GPU, and whether that fits the GPU memory budget. Policy
// lives here; gpu/ only runs kernels.
//
// Contract: every function is pure (no allocation on any device) and throws
// hmoe::Error: invalid_argument for bad values, naming where the value came
// from (flag or environment variable) and the value; out_of_memory when a
// placement does not fit, naming how many bytes are missing. make_plan is
// what Model::load checks before it allocates anything on the GPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "engine/loading/model_config.h"

namespace hmoe {

// --gpu-resident-moe-layers / HMOE_GPU_RESIDENT_MOE_LAYERS.
struct LayerSpec {
  enum class Mode { list, all, none, automatic };
  Mode mode = Mode::automatic;
  std::vector<int64_t> layers;  // Mode::list: ascending, no repeats
};
// Parses "0-3,10,12-15", "all", "none" or "auto" for a model of num_layers
// layers. `what` names the source in errors ("environment variable X").
LayerSpec parse_layer_spec(const std::string& what, const std::string& value, int64_t num_layers);

// The GPU a plan is made for.
struct GpuTarget {
  std::string name;
  uint64_t total_bytes = 0;
  double bandwidth = 0;      // bytes/s of device memory, for the estimate
  bool assumed = false;      // no GPU was probed: described by flags or defaults
};

struct LayerPlacement {
  int64_t layer = 0;
  int device = 0;          // the GPU that runs the layer's attention and dense parts (the seam pipeline parallel fills)
  bool moe = false;        // has routed experts
  bool resident = false;   // experts on the GPU (dense layers always are)
  uint64_t expert_bytes = 0;
};

struct Plan {
  std::vector<LayerPlacement> layers;
  uint64_t gpu_budget = 0;       // total * utilization
  uint64_t gpu_fixed_bytes = 0;  // embedding, lm_head, attention, norms, routers, dense MLPs
  uint64_t gpu_expert_bytes = 0; // resident experts
  uint64_t gpu_workspace_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t kv_bytes_per_token = 0;
  int64_t kv_tokens = 0;
  uint64_t cpu_expert_bytes = 0;       // non-resident experts, in host memory
  uint64_t gpu_bytes_per_token = 0;    // weights the GPU reads per decode token (batch 1)
  uint64_t cpu_bytes_per_token = 0;    // cold expert bytes the CPU reads per decode token (batch 1)
  std::string spec;                    // the value the plan was made from
  std::string kv_tier;                 // where the KV cache lives ("GPU 0", "GPU 0 + N host blocks")
  // Set by the automatic fit (engine/placement/auto_fit.h) when it chose the
  // placement: the room it leaves for a GPU expert cache of host-layer
  // experts, and the KV blocks it kept for the target context and batch (0: not chosen).
  uint64_t expert_cache_bytes = 0;
  int64_t fit_kv_blocks = 0;
  uint64_t fit_stream_bytes = 0;  // streamed-prefill slots (whole layers or chunks) plus the step's room; 0: none reserved

  std::vector<bool> resident() const;  // per layer
  std::vector<int> devices() const;    // per layer: the GPU that runs it
  int64_t resident_moe_layers() const;
  int64_t moe_layers() const;
  // Seconds per decode token at batch 1 from bandwidths (bytes/s).
  double decode_seconds(double gpu_bandwidth, double cpu_bandwidth) const;
};

// Bytes the GPU holds for one MoE layer's experts (bf16 unless told).
uint64_t expert_layer_bytes(const ModelConfig& c, double bytes_per_weight = 2.0);
// Bytes of one multi-head latent attention layer's weights on the GPU (bf16;
// latent_path: with the transposed W_UK the absorbed path keeps).
uint64_t mla_attention_bytes(const ModelConfig& c, bool latent_path);

// The GPU memory budget: gpu_memory (when set; the card's total otherwise)
// times gpu_memory_utilization. Error(invalid_argument) naming the flag when
// gpu_memory is more than a probed card has (gpu.assumed: any size).
uint64_t gpu_memory_budget(const Settings& s, const GpuTarget& gpu);
// "0.90 (default) x --gpu-memory 24.00 GiB": the budget's terms and where they came from.
std::string gpu_memory_budget_origin(const Settings& s, const GpuTarget& gpu);
// Whether the user set a cap (gpu_memory, or gpu_memory_utilization away
// from its default): then every GPU allocation counts against the budget
// (gpu/memory_cap.h); otherwise only the plan uses it.
bool gpu_memory_capped(const Settings& s);

// Plans the placement of `c` on `gpu` from the settings
// (gpu_resident_moe_layers, gpu_memory_utilization, kv_cache_memory_bytes,
// max_model_len, max_num_batched_tokens). Throws out_of_memory naming the
// shortfall when it does not fit.
Plan make_plan(const ModelConfig& c, const Settings& s, const GpuTarget& gpu);

// --device: true to run on the GPU. "auto" picks the GPU when one is
// present; "cuda" without one (or without CUDA in the build) is an error.
// `why` receives a line saying what was chosen and why.
bool resolve_device(const Settings& s, std::string& why);

// The per-layer device indices of a plan against the machine's GPUs (the
// seam pipeline parallel, issue 10, fills; make_plan puts every layer on
// GPU 0). Throws Error(invalid_argument) naming the first layer whose index
// is not a GPU of this machine (device_count of them), and
// Error(unsupported) when the layers are on more than one GPU or on one
// other than GPU 0 (the runtime runs one GPU today).
void check_layer_devices(const std::vector<int>& devices, int device_count);

// KV blocks that hold `sequences` sequences of `context` tokens each, one
// block of headroom per sequence (block_size tokens a block).
int64_t kv_blocks_for(int64_t sequences, int64_t context, int64_t block_size);
// The KV blocks the server allocates when nothing reserved them: the
// kv_cache_memory_bytes setting's worth when set (Error(invalid_argument)
// when that is less than one block), else max_num_seqs full contexts up to
// 512 MiB, at least one context. The automatic fit reserves by this very
// rule (engine/placement/auto_fit.h, FitInputs::server_kv) and the server
// then allocates the blocks the fit reserved (Plan::fit_kv_blocks): one
// source for the KV budget under --gpu-memory.
int64_t default_kv_blocks(const Settings& s, int64_t context, int64_t block_bytes);
// The server's KV blocks: `reserved` (the fit's, > 0) when
// kv_cache_memory_bytes is not set, at least one full context; otherwise
// default_kv_blocks.
int64_t server_kv_blocks(const Settings& s, int64_t context, int64_t block_bytes, int64_t reserved);

// "1.50 GiB" style.
std::string format_bytes(uint64_t bytes);

}  // namespace hmoe
