// Engram n-gram memory (the PLE table), as in DeepSeek's public Engram demo
// with one residual stream: before each layer named in the config's
// `engram.layer_ids`, the hidden state x gains
//   e = table rows hashed from the last max_ngram_size compressed token ids,
//   g = sigmoid(sign(s) sqrt(max(|s|, 1e-6))), s = <RMSNorm(key_proj e), RMSNorm(x)> / sqrt(hidden),
//   v = g * value_proj(e),   y = v + SiLU(causal depthwise conv(RMSNorm(v))),
//   x <- x + y.
// The tables live in an io::PleTable (file + io_uring/mmap/pread, or RAM);
// begin_step() hashes a step's tokens and starts reading every module's
// rows at once, so the reads overlap the layers before each module, and
// apply() waits only for what is still in flight.
//
// Per-sequence state (the last max_ngram_size-1 compressed ids and the
// conv's window of past normalised values) lives in the KV cache's
// seq_state, so it follows the sequence like its keys and values. Within a
// batch a sequence's tokens come in increasing position order, each
// position following the previous step's last one; a position whose history
// is gone (rewound sequence) is Error(internal), never silently wrong.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "configs/settings.h"
#include "configs/settings.h"
#include "engine/kv/kv_cache.h"
#include "engine/loading/model_config.h"
#include "engine/runtime/batch.h"
#include "io/ple_table.h"
#include "io/safetensors.h"

namespace hmoe {

class WeightBinder;

// Per module (in layer order): whether --ple-ram-modules keeps its table in
// memory. Throws Error(invalid_argument) naming the setting.
std::vector<bool> ple_ram_modules(const Settings& s, int64_t modules);

// `hmoe plan`'s lines on the PLE tables of an Engram checkpoint (store):
// per module its layer, table bytes and where it is served from, the host
// memory for tables kept in RAM and the row cache, and the random reads per
// second the table file must serve at `tokens_per_s` decode tokens/s
// (batch 1); a hint when the first module has only a layer or two in front
// of it. Empty for models without modules.
std::string ple_plan_report(const ModelConfig& c, const io::TensorStore& store, const Settings& s, double tokens_per_s);

class EngramModules {
 public:
  // Binds every engram tensor, then opens the PLE table with the backend and
  // file given by the settings (default file: <model_dir>/ple-table.hmoe).
  static std::unique_ptr<EngramModules> load(WeightBinder& bind, const ModelConfig& c,
                                             const std::string& model_dir, const Settings& s, numa::ThreadPool& pool);
  ~EngramModules();

  // Bytes of per-sequence state the KV cache must hold (KvLayout::seq_state_bytes).
  int64_t seq_state_bytes() const;
  // Module index inserted before `layer`, or -1.
  int module_before(int64_t layer) const;
  int64_t modules() const { return static_cast<int64_t>(mods_.size()); }
  // Names of the checkpoint tensors that the table file serves.
  std::vector<std::string> table_tensor_names() const;

  // Hashes the batch's n-grams, starts every module's row reads and records
  // the compressed ids in the sequences' state.
  void begin_step(const Batch& b, KvCache& kv);
  // x[n, hidden] += module m's output (after waiting for its rows).
  void apply(int m, float* x, const Batch& b, KvCache& kv);

  // For a GPU step (engine/layers/engram_gpu.h), which does apply()'s math itself
  // between begin_step() and record_ids():
  const EngramConfig& config() const { return cfg_; }
  int64_t layer_of(int m) const;
  int64_t heads() const { return heads_; }  // table rows per token and module
  int64_t window() const { return window_; }  // positions of history kept per sequence
  // Blocks until module m's rows are readable (counted in last_step_wait_ns);
  // then table().row(m, i * heads() + h) is head h of batch row i.
  void wait_rows(int m);
  // src[i * kernel_size + j]: where conv input j of batch row i (position
  // pos - (kernel_size-1-j) * max_ngram_size) is: the batch row holding it
  // (>= 0), -1 before the start, or -2 - r for history row r = seq * window()
  // + position % window() of earlier steps (its recorded tag checked).
  void conv_sources(const Batch& b, KvCache& kv, int32_t* src);
  // Records the step's tags and compressed ids in the sequences' state (not
  // the normalised values, which the GPU keeps in its own history rows).
  void record_ids(const Batch& b, KvCache& kv);

  io::PleTable& table() { return *table_; }
  // Per-step I/O wait of the last step, ns (summed over modules).
  int64_t last_step_wait_ns() const { return last_wait_ns_; }
  // One line of PLE metrics: backend, rows requested/distinct, reads, bytes,
  // I/O wait per step and the hidden fraction.
  std::string stats_line() const;

  struct Module;

 private:
  EngramModules() = default;
  int64_t find_in_batch(int seq, int64_t pos) const;
  // The state slot of (seq, pos) in kv: [tag int64][cid int64][module vn floats...].
  uint8_t* slot(KvCache& kv, int seq, int64_t pos) const;

  EngramConfig cfg_;
  int64_t hidden_ = 0, heads_ = 0, head_dim_ = 0, d_mem_ = 0, window_ = 0, slot_bytes_ = 0;
  std::vector<int64_t> lookup_;  // token id -> compressed id
  int64_t pad_cid_ = 0;
  std::vector<std::unique_ptr<Module>> mods_;
  std::unique_ptr<io::PleTable> table_;
  numa::ThreadPool* pool_ = nullptr;
  // Per step.
  std::vector<int64_t> ctx_;  // [n, max_ngram_size] compressed ids at pos, pos-1, ...
  std::vector<std::pair<uint64_t, int64_t>> batch_index_;  // sorted (seq<<40 | pos, batch row)
  std::vector<float> e_, key_, q_, v_, vn_, conv_, hist_;
  int64_t last_wait_ns_ = 0;
};

}  // namespace hmoe
