// HttpServer: the OpenAI-compatible HTTP front end (Boost.Beast over one
// Asio io_context thread). Routes: GET /health, GET /metrics, GET /v1/models,
// GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions,
// POST /v1/responses (server/responses_api.h). A request with n choices
// runs n sequences (server/reply.h).
//
// Requests are parsed and tokenized on the io thread and handed to the
// Scheduler (engine thread); each request's tokens come back through its
// SeqChannel, whose notify posts to the io thread, which detokenizes and
// writes SSE chunks (chunked transfer encoding) or one JSON body. A client
// that disconnects has its sequence cancelled.
//
// Limits: header bytes and count (431), body bytes (413), a deadline for the
// whole request header (408; slow clients cannot hold a connection), an idle
// timeout between keep-alive requests, a body read deadline, max open
// connections (503), and the scheduler's bounded queue (503 + Retry-After).
//
// Shutdown (stop() from any thread, or SIGINT/SIGTERM when run() handles
// signals): the listener closes, the scheduler finishes every sequence with
// FinishReason::shutdown (streams get a final chunk with finish_reason
// "abort" and [DONE]; waiting non-streaming requests get 503), idle
// connections are closed, and run() returns once every connection is closed
// (or after a 10 s grace period).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/scheduler.h"
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
  int64_t max_connections = 1024;
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
