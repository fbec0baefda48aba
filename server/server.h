// ServerStack: everything `hmoe serve` runs, assembled from Settings - the
// model, its tokenizer and chat template, the scheduler (engine thread) and
// the HTTP server. Tests and the load benchmark build the same stack
// in-process.
//
// KV cache size: --kv-cache-memory-bytes when set; otherwise enough for
// max_num_seqs full contexts, capped at 512 MiB (sequences are preempted and
// recomputed when it runs out), and never less than one full context.
#pragma once
#include <memory>
#include <string>

#include "configs/settings.h"
#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"
#include "engine/text/chat/chat_template.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "server/http_server.h"
#include "server/request.h"

namespace hmoe::server {

struct ServerStack {
  std::unique_ptr<Model> model;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::unique_ptr<chat::ChatTemplate> chat_template;  // null when the model has none
  ModelInfo info;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<HttpServer> http;  // bound and listening

  ~ServerStack();
};

// --max-model-len checked against the model: negative or above
// max_position_embeddings is an error (as in vLLM); 0 means the model's.
int64_t context_length(const Settings& s, const ModelConfig& c);
SchedulerConfig scheduler_config(const Settings& s, const Model& m);
HttpOptions http_options(const Settings& s);
// Loads model_dir and binds the listener (port 0: a free port).
std::unique_ptr<ServerStack> make_server(const Settings& s, const std::string& model_dir);

}  // namespace hmoe::server
