// Internals shared by http_server.cpp (accepting, admission, shutdown) and
// http_session.cpp (one connection's request/response cycle). Not a public
// header: only those two files include it.
#pragma once
#include <boost/asio.hpp>

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "server/http_headers.h"
#include "server/http_server.h"
#include "server/worker_pool.h"

namespace hmoe::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// What the server needs from a live connection (Session implements it).
class Connection {
 public:
  virtual ~Connection() = default;
  // Starts reading; `rejected` non-empty answers 503 with that reason and closes.
  virtual void start(const std::string& rejected) = 0;
  virtual void on_shutdown() = 0;
  // Idle (between requests, holding a connection slot): may be closed to admit another.
  virtual bool evictable() const = 0;
  virtual Clock::time_point idle_since() const = 0;
  virtual const std::string& ip() const = 0;
  virtual void evict() = 0;
};

struct HttpServer::Impl {
  Impl(const HttpOptions& o, Scheduler& s, const ModelInfo& m)
      : opt(o), sched(s), model(m), acceptor(ioc), signals(ioc), grace(ioc), cors(o.cors_origins),
        pool(std::make_unique<WorkerPool>(static_cast<int>(std::max<int64_t>(o.worker_threads, 1)), static_cast<int>(o.worker_nice))) {}
  HttpOptions opt;
  Scheduler& sched;
  const ModelInfo& model;
  Metrics metrics;
  net::io_context ioc{1};
  tcp::acceptor acceptor;
  net::signal_set signals;
  net::steady_timer grace;
  Cors cors;
  std::list<std::weak_ptr<Connection>> sessions;
  int64_t open = 0;   // Session objects alive (shutdown waits for 0)
  int64_t slots = 0;  // connections counted against --max-connections
  std::unordered_map<std::string, int64_t> per_client;  // slots by client address
  uint64_t request_seq = 0;
  bool shutting_down = false;
  uint16_t port = 0;
  Clock::time_point shutdown_at;

  // Declared last: destroyed (stopped and joined) first, while the rest is alive.
  std::unique_ptr<WorkerPool> pool;  // request parsing, templates, tokenization

  void do_accept();
  // Makes room for a connection from ip: closes the oldest idle connection
  // (that client's when it is at its cap); false when none can be closed.
  bool admit(const std::string& ip, std::string& why);
  void begin_shutdown();
  void check_done();
};

// A connection's session, counted in srv.open while alive.
std::shared_ptr<Connection> make_session(tcp::socket sock, HttpServer::Impl& srv, std::string ip);

}  // namespace hmoe::server
