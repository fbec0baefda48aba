// Model loading and the step loop. The per-layer blocks live in
// engine/blocks_*.cpp; this file binds tensors and runs them in order.
#include "engine/model.h"

#include "engine/gpu_experts.h"

#include <cmath>
#include <set>

#include "configs/error.h"
#include "engine/blocks.h"
#include "engine/blocks_gpu.h"
#include "engine/blocks_deepseek_moe.h"
#include "engine/blocks_mla.h"
#include "engine/engram.h"
#include "engine/gguf_model.h"
#include "engine/quant_config.h"
#include "numa/quant_gguf_q8.h"
#include "engine/progress.h"

namespace hmoe {

Model::~Model() = default;

int64_t Model::weight_bytes() const {
  return static_cast<int64_t>(store_ ? store_->total_bytes() : source_->total_bytes());
}

KvLayout Model::kv_layout() const {
  if (config_.arch == Arch::deepseek_v3) return mla_kv_layout(config_);
  KvLayout l{config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim};
  if (engram_) l.seq_state_bytes = engram_->seq_state_bytes();
  return l;
}

std::unique_ptr<Model> Model::load(const std::string& dir, const Settings& settings) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  // MODEL is a Hugging Face directory or a .gguf file (engine/gguf_model.h).
  if (is_gguf_path(dir)) m->source_ = open_gguf_source(dir, m->config_);
  else m->config_ = ModelConfig::from_dir(dir);
  const ModelConfig& c = m->config_;
  if (c.arch != Arch::qwen3_moe && c.arch != Arch::qwen3_moe_engram && c.arch != Arch::deepseek_v3)
    fail(ErrorKind::unsupported, dir + "/config.json: model_type '" + c.model_type + "' is recognised but its graph is not implemented yet");
  if (!m->source_) {
    m->store_ = std::make_unique<io::TensorStore>(dir);
    m->source_ = open_hf_quant_source(dir, *m->store_);  // null unless config.json has a quantization_config
    if (m->source_) set_expert_bytes_from(m->config_, *m->source_);
  }
  WeightBinder bind(m->store_.get(), m->source_.get());

  m->embed_ = bind.mat("model.embed_tokens.weight", c.vocab_size, c.hidden_size);
  m->final_norm_ = bind.vec("model.norm.weight", c.hidden_size);
  if (c.tie_word_embeddings && !bind.has("lm_head.weight")) m->lm_head_ = m->embed_;
  else m->lm_head_ = bind.mat("lm_head.weight", c.vocab_size, c.hidden_size);

  cpu::set_round_activations_bf16(settings.cpu_emulate_gpu_bf16);
  cpu::set_gguf_int8(settings.cpu_gguf_int8);
  cpu::set_split_inputs_bf16(settings.gpu_mla_split_inputs);
  m->pools_ = std::make_unique<numa::NodePools>(numa::PoolOptions::from_settings(settings));
  m->pool_ = &m->pools_->pool(0);
  numa::EngineOptions experts_opt = numa::EngineOptions::from_settings(settings);
  m->ws_ = std::make_unique<Workspace>();

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer layer;
    layer.input_norm = bind.vec(p + "input_layernorm.weight", c.hidden_size);
    layer.post_attention_norm = bind.vec(p + "post_attention_layernorm.weight", c.hidden_size);
    if (c.arch == Arch::deepseek_v3) {
      layer.attn = make_mla_attention(bind_mla_weights(bind, c, p + "self_attn."), c, l, *m->pool_, parse_mla_mode(settings.mla_attention));
      experts_opt.name = "layer " + std::to_string(l) + " routed experts";
      if (c.is_moe_layer(l)) layer.ffn = make_deepseek_moe(bind, c, p + "mlp.", *m->pools_, experts_opt);
      else layer.ffn = make_dense_mlp(bind, c.hidden_size, c.intermediate_size, p + "mlp.", *m->pool_);
      if (c.is_moe_layer(l)) experts_opt.print_memory = false;
      m->layers_.push_back(std::move(layer));
      continue;
    }
    layer.attn = make_gqa_attention(bind, c, l, p + "self_attn.", *m->pool_);
    if (c.is_moe_layer(l)) {
      experts_opt.name = "layer " + std::to_string(l) + " routed experts";
      layer.ffn = make_moe_block(bind, c, p + "mlp.", *m->pools_, experts_opt);
      experts_opt.print_memory = false;  // the first MoE layer speaks for all
    }
    else layer.ffn = make_dense_mlp(bind, c.hidden_size, c.intermediate_size, p + "mlp.", *m->pool_);
    m->layers_.push_back(std::move(layer));
  }
  if (c.arch == Arch::qwen3_moe_engram) m->engram_ = EngramModules::load(bind, c, dir, settings, *m->pool_);
  bind.check_all_used(dir);
  m->gpu_ = make_gpu_stack(c, m->source_ ? nullptr : m->store_.get(), m->source_.get(), settings, *m->pools_, m->engram_.get());  // nullptr: CPU path
  if (!m->store_) {  // GGUF: the source reads its own map
    m->source_->touch("loading " + dir, settings.progress);
    return m;
  }
  // PLE tables are served from their own file (or copied to RAM): not touched here.
  std::set<std::string> untouched;
  uint64_t touch_bytes = m->store_->total_bytes();
  if (m->engram_)
    for (const auto& name : m->engram_->table_tensor_names()) {
      untouched.insert(name);
      touch_bytes -= m->store_->get(name).nbytes;
    }

  // Read every weight once so that the first request does not pay for page
  // faults, with a progress display.
  Progress progress("loading " + dir, touch_bytes, settings.progress);
  volatile uint8_t sink = 0;
  for (const auto& [name, t] : m->store_->all()) {
    if (untouched.count(name)) continue;
    uint8_t acc = 0;
    for (size_t off = 0; off < t->nbytes; off += 4096) acc ^= t->data[off];
    sink = sink ^ acc;
    progress.add(t->nbytes);
  }
  progress.finish();
  return m;
}

void Model::forward(const Batch& b, KvCache& kv, std::vector<float>& logits) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(b.tokens.size()), H = c.hidden_size;
  if (b.slots.size() != b.tokens.size()) fail(ErrorKind::internal, "batch tokens and slots differ in length");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = b.tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= c.vocab_size)
      fail(ErrorKind::invalid_argument, "token id " + std::to_string(t) + " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) + ")");
    const auto& s = b.slots[static_cast<size_t>(i)];
    if (s.pos < 0 || s.pos >= kv.capacity(s.seq))
      fail(ErrorKind::internal, "position " + std::to_string(s.pos) + " has no KV slot reserved");
  }
  for (auto r : b.logit_rows)
    if (r < 0 || r >= n) fail(ErrorKind::internal, "logit row outside the batch");
  if (n == 0) {
    logits.clear();
    return;
  }
  if (gpu_) {
    gpu_->forward(b, kv, logits);
    return;
  }
  Workspace& ws = *ws_;
  ws.resize(n, c);
  float* x = ws.hidden.data();
  float* h = ws.normed.data();
  float* o = ws.block_out.data();
  for (int64_t i = 0; i < n; ++i) cpu::row_to_f32(embed_, b.tokens[static_cast<size_t>(i)], x + i * H);
  if (engram_) engram_->begin_step(b, kv);  // starts the PLE row reads for every module
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    if (engram_)
      if (int em = engram_->module_before(static_cast<int64_t>(l)); em >= 0) engram_->apply(em, x, b, kv);
    ops::rms_norm(x, n, H, layer.input_norm, c.rms_norm_eps, h);
    layer.attn->forward(h, n, b.slots.data(), kv, o, ws);
    for (int64_t i = 0; i < n * H; ++i) x[i] += o[i];
    ops::rms_norm(x, n, H, layer.post_attention_norm, c.rms_norm_eps, h);
    layer.ffn->forward(h, n, o, ws);
    for (int64_t i = 0; i < n * H; ++i) x[i] += o[i];
  }
  const int64_t m = static_cast<int64_t>(b.logit_rows.size());
  std::vector<float> last(static_cast<size_t>(m * H));
  for (int64_t i = 0; i < m; ++i) {
    const float* src = x + b.logit_rows[static_cast<size_t>(i)] * H;
    std::copy(src, src + H, last.begin() + i * H);
  }
  ops::rms_norm(last.data(), m, H, final_norm_, c.rms_norm_eps, last.data());
  logits.resize(static_cast<size_t>(m * c.vocab_size));
  cpu::gemm(last.data(), m, lm_head_, logits.data(), pool_);
}

}  // namespace hmoe
