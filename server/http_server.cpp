// The listening side of the HTTP server: accept, per-client and total
// connection caps (evicting idle keep-alive connections first), graceful
// shutdown. One connection's work is in http_session.cpp.
#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "configs/error.h"
#include "server/http_server_impl.h"

namespace hmoe::server {

void HttpServer::Impl::do_accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket sock) {
    if (ec) {
      if (shutting_down || ec == net::error::operation_aborted) return;
      // EMFILE and friends: try again shortly rather than spinning.
      grace.expires_after(std::chrono::milliseconds(50));
      grace.async_wait([this](boost::system::error_code) { if (!shutting_down) do_accept(); });
      return;
    }
    boost::system::error_code ig;
    sock.set_option(tcp::no_delay(true), ig);
    const auto remote = sock.remote_endpoint(ig);
    std::string ip = ig ? std::string("?") : remote.address().to_string();
    std::erase_if(sessions, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
    std::string why;
    const bool ok = admit(ip, why);
    auto s = make_session(std::move(sock), *this, std::move(ip));
    sessions.push_back(s);
    s->start(ok ? std::string() : why);
    do_accept();
  });
}

bool HttpServer::Impl::admit(const std::string& ip, std::string& why) {
  auto oldest_idle = [&](const std::string* only) {
    std::shared_ptr<Connection> best;
    for (auto& w : sessions)
      if (auto s = w.lock(); s && s->evictable() && (!only || s->ip() == *only) && (!best || s->idle_since() < best->idle_since())) best = s;
    return best;
  };
  if (opt.max_connections_per_client > 0) {
    auto it = per_client.find(ip);
    if (it != per_client.end() && it->second >= opt.max_connections_per_client) {
      auto victim = oldest_idle(&ip);
      if (!victim) {
        why = "too many open connections from " + ip + " (" + std::to_string(it->second) + ", --max-connections-per-client); retry later";
        return false;
      }
      victim->evict();
    }
  }
  if (slots >= opt.max_connections) {
    auto victim = oldest_idle(nullptr);
    if (!victim) {
      why = "too many open connections (" + std::to_string(slots) + " busy, --max-connections); retry later";
      return false;
    }
    victim->evict();
  }
  return true;
}

void HttpServer::Impl::begin_shutdown() {
  if (shutting_down) return;
  shutting_down = true;
  shutdown_at = Clock::now();
  std::fprintf(stderr, "hmoe serve: shutting down (finishing %lld open connections)\n", static_cast<long long>(open));
  boost::system::error_code ig;
  acceptor.close(ig);
  signals.cancel(ig);
  sched.shutdown();  // every sequence finishes now; their sessions send the final events
  for (auto& w : sessions)
    if (auto s = w.lock()) s->on_shutdown();
  check_done();
}

void HttpServer::Impl::check_done() {
  if (open <= 0 || Clock::now() - shutdown_at > std::chrono::seconds(10)) {
    ioc.stop();
    return;
  }
  grace.expires_after(std::chrono::milliseconds(20));
  grace.async_wait([this](boost::system::error_code) {
    for (auto& w : sessions)
      if (auto s = w.lock()) s->on_shutdown();
    check_done();
  });
}

HttpServer::HttpServer(const HttpOptions& opt, Scheduler& scheduler, const ModelInfo& model)
    : impl_(std::make_unique<Impl>(opt, scheduler, model)) {
  if (opt.port < 0 || opt.port > 65535) fail(ErrorKind::invalid_argument, "--port must be in 0..65535, got " + std::to_string(opt.port));
  boost::system::error_code ec;
  auto addr = net::ip::make_address(opt.host, ec);
  if (ec) fail(ErrorKind::invalid_argument, "--host '" + opt.host + "' is not an IP address");
  tcp::endpoint ep(addr, static_cast<uint16_t>(opt.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail(ErrorKind::io, "cannot listen on " + opt.host + ":" + std::to_string(opt.port) + ": " + ec.message());
  impl_->port = a.local_endpoint().port();
  // Each connection is a descriptor: make room for the caps (plus the
  // model's files and a margin) when the soft limit is lower.
  rlimit rl{};
  const rlim_t want = static_cast<rlim_t>(opt.max_connections) + 256;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
    rl.rlim_cur = std::min(want, rl.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
      std::fprintf(stderr, "hmoe serve: warning: --max-connections %lld needs about %llu open files, but the limit is %llu (ulimit -n)\n",
                   static_cast<long long>(opt.max_connections), static_cast<unsigned long long>(want), static_cast<unsigned long long>(rl.rlim_cur));
  }
}

HttpServer::~HttpServer() = default;

uint16_t HttpServer::port() const { return impl_->port; }
Metrics& HttpServer::metrics() { return impl_->metrics; }

void HttpServer::run(bool handle_signals) {
  Impl& i = *impl_;
  if (handle_signals) {
    i.signals.add(SIGINT);
    i.signals.add(SIGTERM);
    i.signals.async_wait([&i](boost::system::error_code ec, int) {
      if (!ec) i.begin_shutdown();
    });
  }
  i.do_accept();
  for (;;) {
    try {
      i.ioc.run();
      break;
    } catch (const std::exception& e) {  // a bug in a handler: log it, keep serving
      std::fprintf(stderr, "hmoe serve: internal error in a connection handler: %s\n", e.what());
    }
  }
}

void HttpServer::stop() {
  net::post(impl_->ioc, [this] { impl_->begin_shutdown(); });
}

}  // namespace hmoe::server
