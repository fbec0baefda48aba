// HttpServer: the OpenAI-compatible HTTP front end (Boost.Beast over one
// Asio io_context thread). Routes: GET /health, GET /metrics, GET /v1/models,
// GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions,
// POST /v1/responses (server/responses_api.h), POST /tokenize,
// POST /detokenize; OPTIONS preflights when CORS is on. A request with n
// choices runs n sequences (server/reply.h).
//
// Threads: the I/O thread only moves bytes and runs bounded per-event work.
// Request bodies are parsed, chat templates rendered and prompts tokenized
// on a worker pool (--http-worker-threads, at --http-worker-nice), so a 7 MB
// prompt does not delay
// /health or other streams; the result comes back to the I/O thread, which
// submits it to the Scheduler (engine thread). Each request's tokens come
// back through its SeqChannel, whose notify posts to the I/O thread, which
// detokenizes (one event's tokens) and writes SSE chunks or one JSON body.
// Streams use chunked transfer encoding, or close-delimited bodies for
// HTTP/1.0 clients.
//
// Disconnects: a stream whose writes fail, or whose socket reports an
// error, is cancelled. End-of-stream alone is a half-close (the client shut
// its write side after the body): the request goes on and its reply is
// sent, then the connection closes.
//
// Limits: header bytes and count (431), body bytes (413), a deadline for the
// whole request header (408; slow clients cannot hold a connection), an idle
// timeout between keep-alive requests, a body read deadline, and the
// scheduler's bounded queue (503 + Retry-After). Connection caps: at most
// max_connections in all and max_connections_per_client per client address;
// a new connection over a cap closes the oldest connection that is idle or
// still sending its header (that client's own at the per-client cap), so idle
// and slowloris sockets never starve active clients; only when every
// connection is busy does the newcomer get 503. The open-file limit is raised
// to fit max_connections when the hard limit allows.
//
// Every reply carries X-Request-Id (the client's, when sane, else a random
// one) and, with --cors-origins, Access-Control-Allow-Origin for allowed
// origins.
//
// Shutdown (stop() from any thread, or SIGINT/SIGTERM when run() handles
// signals): the listener closes, the scheduler finishes every sequence with
// FinishReason::shutdown (streams get an error event, code "shutting_down",
// and [DONE]; waiting non-streaming requests get 503), idle
// connections are closed, and run() returns once every connection is closed
// (or after a 10 s grace period).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/serving/scheduler.h"
#include "server/metrics.h"
#include "server/request.h"

namespace hmoe::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see port())
  std::string api_key;
  uint64_t max_body_bytes = 8u << 20;
  uint64_t max_header_bytes = 16u << 10;
  int64_t max_header_fields = 100;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double idle_timeout_s = 60;
  int64_t max_connections = 4096;
  int64_t max_connections_per_client = 256;  // 0: no per-address cap
  int64_t worker_threads = 2;                // request parsing / tokenization pool
  int64_t worker_nice = 10;                  // its threads' nice value (server/worker_pool.h)
  std::string cors_origins;                  // empty: CORS off
};

class HttpServer {
 public:
  // Binds and listens now; throws hmoe::Error(io) when the address is taken.
  // scheduler and model must outlive the server.
  HttpServer(const HttpOptions& opt, Scheduler& scheduler, const ModelInfo& model);
  ~HttpServer();
  uint16_t port() const;
  // Serves until shutdown completes. Call from one thread.
  void run(bool handle_signals);
  // Any thread; idempotent.
  void stop();
  Metrics& metrics();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace hmoe::server
