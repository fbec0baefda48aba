#include "server/server.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "configs/error.h"
#include "engine/loading/generation_config.h"
#include "engine/layers/host_residence.h"
#include "engine/loading/gguf_model.h"
#include "engine/placement/placement.h"
#include "server/http_headers.h"

namespace hmoe::server {

ServerStack::~ServerStack() {
  http.reset();
  if (scheduler) scheduler->shutdown();
}

int64_t context_length(const Settings& s, const ModelConfig& c) {
  if (s.max_model_len < 0)
    fail(ErrorKind::invalid_argument, "--max-model-len must be >= 0 (0: the model's " + std::to_string(c.max_position_embeddings) + " tokens), got " +
                                          std::to_string(s.max_model_len));
  // As vLLM derives it: max_position_embeddings, or yarn's original length times its factor when larger.
  int64_t trained = c.max_position_embeddings;
  std::string how = "max_position_embeddings in config.json";
  if (c.mla.rope_scaling_type == "yarn" && c.mla.yarn_factor > 1) {
    const auto scaled = static_cast<int64_t>(static_cast<double>(c.mla.yarn_original_max_position_embeddings) * c.mla.yarn_factor);
    if (scaled > trained) {
      trained = scaled;
      how = "yarn rope scaling: original_max_position_embeddings x factor";
    }
  }
  if (trained > 0 && s.max_model_len > trained)
    fail(ErrorKind::invalid_argument, "--max-model-len " + std::to_string(s.max_model_len) + " is larger than the context the model was trained for (" +
                                          std::to_string(trained) + " tokens, " + how + ")");
  return s.max_model_len > 0 ? s.max_model_len : c.max_position_embeddings;
}

SchedulerConfig scheduler_config(const Settings& s, const Model& m) {
  SchedulerConfig c;
  c.max_num_seqs = s.max_num_seqs;
  c.max_num_batched_tokens = s.max_num_batched_tokens;
  c.max_queue = s.max_queue;
  c.block_size = s.block_size;
  c.prefix_caching = s.enable_prefix_caching;
  const int64_t ctx = context_length(s, m.config());
  const KvLayout& lay = m.kv_layout();
  const int64_t block_bytes = KvCache::bytes_per_block(lay, c.block_size);
  const int64_t ctx_blocks = (ctx + c.block_size - 1) / c.block_size + 1;
  // Per-sequence state (one per running sequence) and, for hybrid models with
  // prefix caching, its snapshots come out of the KV budget before the blocks.
  const bool snapshots = lay.seq_state_bytes > 0 && lay.state_align > 0 && c.prefix_caching;
  if (snapshots) c.state_snapshots = s.prefix_state_snapshots > 0 ? s.prefix_state_snapshots : 2 * std::max<int64_t>(s.max_num_seqs, 1);
  const int64_t state_bytes = lay.seq_state_bytes * (std::max<int64_t>(s.max_num_seqs, 1) + c.state_snapshots);
  int64_t blocks;
  if (state_bytes == 0) {
    // The automatic fit reserved its KV blocks in the GPU budget (by the same rule, default_kv_blocks); use them.
    blocks = server_kv_blocks(s, ctx, block_bytes, m.fit_kv_blocks());
  } else if (s.kv_cache_memory_bytes > 0) {
    const int64_t budget = static_cast<int64_t>(s.kv_cache_memory_bytes) - state_bytes;
    blocks = budget / block_bytes;
    if (state_bytes > 0 && blocks < ctx_blocks)
      fail(ErrorKind::invalid_argument,
           "--kv-cache-memory-bytes " + std::to_string(s.kv_cache_memory_bytes) + " leaves room for " + std::to_string(std::max<int64_t>(blocks, 0)) +
               " KV blocks after the per-sequence state (" + std::to_string(state_bytes) + " bytes: " + std::to_string(lay.seq_state_bytes) +
               " bytes for each of --max-num-seqs " + std::to_string(s.max_num_seqs) + " sequences and " + std::to_string(c.state_snapshots) +
               " --prefix-state-snapshots), but one sequence of the context length needs " + std::to_string(ctx_blocks));
    if (blocks < 1) fail(ErrorKind::invalid_argument, "--kv-cache-memory-bytes is smaller than one KV block (" + std::to_string(block_bytes) + " bytes)");
  } else {
    const int64_t budget = std::max<int64_t>((int64_t{512} << 20) - state_bytes, 0);
    blocks = std::min<int64_t>(std::max<int64_t>(s.max_num_seqs, 1) * ctx_blocks, budget / block_bytes);
    blocks = std::max(blocks, ctx_blocks);
  }
  c.kv_blocks = blocks;
  if (s.kv_offloading_size > 0) {
    const double bytes = s.kv_offloading_size * double(int64_t{1} << 30);
    const int64_t avail = mem_available_bytes();
    if (avail >= 0 && bytes > static_cast<double>(avail))
      fail(ErrorKind::invalid_argument, "--kv-offloading-size " + std::to_string(s.kv_offloading_size) + " GiB is more than the free RAM (" +
                                            std::to_string(avail >> 20) + " MiB available)");
    c.host_kv_blocks = static_cast<int64_t>(bytes / static_cast<double>(block_bytes));
    if (c.host_kv_blocks < 1)
      fail(ErrorKind::invalid_argument, "--kv-offloading-size is smaller than one KV block (" + std::to_string(block_bytes) + " bytes)");
  }
  if (lay.seq_state_bytes > 0 && c.prefix_caching && !snapshots) {
    std::fprintf(stderr, "hmoe serve: prefix caching is off: the model keeps per-sequence state that shared KV blocks cannot restore here (Engram windows; linear-attention states on the GPU, where no snapshots are taken yet)\n");
    c.prefix_caching = false;
  }
  if (lay.seq_state_bytes > 0)
    std::fprintf(stderr, "hmoe serve: each running sequence also holds %.2f MiB of per-sequence state beside its KV blocks; for --max-num-seqs %lld and %lld state snapshots for prefix caching that is %.1f MiB of the KV budget\n",
                 static_cast<double>(lay.seq_state_bytes) / (1 << 20), static_cast<long long>(s.max_num_seqs),
                 static_cast<long long>(c.state_snapshots), static_cast<double>(state_bytes) / (1 << 20));
  if (snapshots && c.host_kv_blocks > 0) {
    std::fprintf(stderr, "hmoe serve: --kv-offloading-size ignored: blocks of a hybrid model's host tier would come back without their state snapshots\n");
    c.host_kv_blocks = 0;
  }
  if (!c.prefix_caching && c.host_kv_blocks > 0) {
    std::fprintf(stderr, "hmoe serve: --kv-offloading-size ignored: the host KV tier needs prefix caching\n");
    c.host_kv_blocks = 0;
  }
  return c;
}

HttpOptions http_options(const Settings& s) {
  HttpOptions o;
  o.host = s.host;
  o.port = static_cast<int>(s.port);
  o.api_key = s.api_key;
  o.max_body_bytes = s.max_body_bytes;
  o.max_header_bytes = s.max_header_bytes;
  o.max_header_fields = s.max_header_fields;
  o.header_timeout_s = s.header_timeout;
  o.body_timeout_s = s.body_timeout;
  o.idle_timeout_s = s.idle_timeout;
  o.max_connections = s.max_connections;
  o.max_connections_per_client = s.max_connections_per_client;
  o.worker_threads = s.http_worker_threads;
  o.worker_nice = s.http_worker_nice;
  o.cors_origins = s.cors_origins;
  Cors check(o.cors_origins);  // throws for a malformed origin (the ranges: Settings::validate)
  return o;
}

std::unique_ptr<ServerStack> make_server(const Settings& s, const std::string& model_dir) {
  auto st = std::make_unique<ServerStack>();
  HttpOptions ho = http_options(s);
  st->model = Model::load(model_dir, s);
  const ModelConfig& c = st->model->config();
  const bool gguf = is_gguf_path(model_dir);  // MODEL may be a .gguf file (engine/loading/gguf_model.h)
  st->tokenizer = gguf ? tok::Tokenizer::from_gguf(model_dir) : tok::Tokenizer::from_dir(model_dir);
  try {
    st->chat_template = gguf ? gguf_chat_template(model_dir) : chat::ChatTemplate::from_dir(model_dir);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::bad_model) throw;
    std::fprintf(stderr, "hmoe serve: no usable chat template (%s); /v1/chat/completions will answer 400\n", e.what());
  }
  ModelInfo& mi = st->info;
  std::string name = s.served_model_name;
  if (name.empty()) {
    name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
  }
  mi.name = name;
  mi.context = context_length(s, c);
  mi.vocab = c.vocab_size;
  for (auto e : c.eos_token_ids) mi.eos_ids.push_back(static_cast<int32_t>(e));
  if (auto e = st->tokenizer->eos_id(); e && std::find(mi.eos_ids.begin(), mi.eos_ids.end(), *e) == mi.eos_ids.end()) mi.eos_ids.push_back(*e);
  mi.tokenizer = st->tokenizer.get();
  mi.chat_template = st->chat_template.get();
  mi.json_vocab = std::make_shared<JsonVocabCache>(mi.tokenizer);
  mi.default_seed = static_cast<uint64_t>(s.seed);
  const GenerationDefaults gen = load_generation_defaults(s.generation_config, model_dir);
  mi.defaults = gen.apply(SamplingParams{});
  if (!gen.empty() && s.progress != "none")
    std::fprintf(stderr, "hmoe serve: default sampling from %s: %s (requests override it; --generation-config none for hmoe's defaults)\n",
                 gen.source.c_str(), gen.describe().c_str());
  SchedulerConfig sc = scheduler_config(s, *st->model);
  // Cached blocks are only valid for the same weights and numerics.
  sc.prefix_salt = std::hash<std::string>{}(std::filesystem::absolute(model_dir).lexically_normal().string() + "|" + s.weight_dtype + "|" +
                                            std::to_string(s.cpu_bf16_dot) + "|" + s.mla_attention + "|" + s.device + "|" +
                                            std::to_string(s.max_model_len));
  st->scheduler = std::make_unique<Scheduler>(*st->model, sc);
  st->http = std::make_unique<HttpServer>(ho, *st->scheduler, st->info);
  return st;
}

}  // namespace hmoe::server
