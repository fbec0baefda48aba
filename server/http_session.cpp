// One HTTP connection: reads requests (keep-alive, header/body timeouts,
// size caps), parses them off the I/O thread, routes /v1/* to the scheduler
// and streams the reply (SSE or JSON), and answers errors as OpenAI-style
// JSON. Runs on the server's single I/O thread.
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <optional>

#include "configs/error.h"
#include "engine/serving/random_id.h"
#include "server/api_error.h"
#include "server/completion.h"
#include "server/http_server_impl.h"
#include "server/reply.h"
#include "server/responses_api.h"

namespace hmoe::server {

namespace http = boost::beast::http;

namespace {
std::string fmt_hex(size_t n) {
  char b[32];
  std::snprintf(b, sizeof b, "%zx", n);
  return b;
}
// %XX escapes of a path segment (/v1/models/{id}).
std::string url_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() + 0 && std::isxdigit(static_cast<unsigned char>(s[i + 1])) && std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}
std::string random_id(const char* prefix) { return prefix + random_alnum(24); }
}  // namespace

class Session final : public Connection, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket sock, HttpServer::Impl& srv, std::string ip) : sock_(std::move(sock)), srv_(srv), timer_(srv.ioc), ip_(std::move(ip)) {
    ++srv_.open;
  }
  ~Session() {
    for (auto& c : chans_) c->cancel();
    release_slot();
    --srv_.open;
  }

  // rejected: the reason the connection is over a limit (503), or empty.
  void start(const std::string& rejected) override {
    if (!rejected.empty()) {
      keep_alive_ = false;
      send_error(ApiError(503, rejected, "", "too_many_connections"), "1");
      return;
    }
    has_slot_ = true;
    ++srv_.slots;
    ++srv_.per_client[ip_];
    read_request(true);
  }

  // Shutdown: close connections that are between requests.
  void on_shutdown() override {
    if (evictable()) close();
  }
  // Idle (between requests) or still sending its request header: what the
  // connection caps may close to make room for a new connection.
  bool evictable() const override { return has_slot_ && (state_ == State::idle || state_ == State::header); }
  Clock::time_point idle_since() const override { return idle_since_; }
  const std::string& ip() const override { return ip_; }
  void evict() override { close(); }

 private:
  enum class State { idle, header, body, parsing, generating, closing };

  void release_slot() {
    if (!has_slot_) return;
    has_slot_ = false;
    --srv_.slots;
    auto it = srv_.per_client.find(ip_);
    if (it != srv_.per_client.end() && --it->second <= 0) srv_.per_client.erase(it);
  }

  void arm(double seconds) {
    const uint64_t gen = ++arm_gen_;
    timer_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    timer_.async_wait([self = shared_from_this(), gen](boost::system::error_code ec) {
      if (ec || gen != self->arm_gen_) return;
      self->timed_out_ = true;
      boost::system::error_code ig;
      if (self->state_ == State::closing) self->sock_.close(ig);
      else self->sock_.cancel(ig);
    });
  }
  void disarm() {
    ++arm_gen_;
    timer_.cancel();
  }
  void close() {
    state_ = State::closing;
    hold_.reset();
    release_slot();
    disarm();
    boost::system::error_code ig;
    sock_.shutdown(tcp::socket::shutdown_both, ig);
    sock_.close(ig);
  }

  // Waits for the next request: first byte within the idle timeout, then the
  // whole header within the header timeout.
  void read_request(bool first) {
    if (srv_.shutting_down && !first) return close();
    state_ = State::idle;
    idle_since_ = Clock::now();
    timed_out_ = false;
    request_id_.clear();
    if (buf_.size() == 0) {
      arm(first ? srv_.opt.header_timeout_s : srv_.opt.idle_timeout_s);
      sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
        if (ec) return self->close();
        self->read_header();
      });
    } else {
      read_header();
    }
  }

  void read_header() {
    if (srv_.shutting_down) return close();
    state_ = State::header;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<uint64_t>(srv_.opt.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(srv_.opt.max_body_bytes);
    arm(srv_.opt.header_timeout_s);
    http::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](boost::system::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(boost::system::error_code ec) {
    if (ec) {
      keep_alive_ = false;
      if (timed_out_) return send_error(ApiError(408, "request header not received in time", "", "header_timeout"));
      if (ec == http::error::body_limit)
        return send_error(ApiError(413, "request body exceeds the limit of " + std::to_string(srv_.opt.max_body_bytes) + " bytes (--max-body-bytes)", "",
                                   "body_too_large"));
      if (ec == http::error::header_limit)
        return send_error(ApiError(431, "request header larger than " + std::to_string(srv_.opt.max_header_bytes) + " bytes", "", "header_too_large"));
      if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset || ec == net::error::operation_aborted)
        return close();
      return send_error(ApiError(400, std::string("malformed HTTP request: ") + ec.message(), "", "bad_request"));
    }
    int64_t fields = 0;
    for (auto it = parser_->get().begin(); it != parser_->get().end(); ++it) ++fields;
    if (fields > srv_.opt.max_header_fields) {
      keep_alive_ = false;
      return send_error(ApiError(431, "too many header fields (" + std::to_string(fields) + " > " + std::to_string(srv_.opt.max_header_fields) + ")",
                                 "", "header_too_large"));
    }
    const auto len = parser_->content_length();
    if (len && *len > srv_.opt.max_body_bytes) {
      keep_alive_ = false;
      return send_error(ApiError(413, "request body of " + std::to_string(*len) + " bytes exceeds the limit of " +
                                          std::to_string(srv_.opt.max_body_bytes) + " bytes (--max-body-bytes)",
                                 "", "body_too_large"));
    }
    state_ = State::body;
    arm(srv_.opt.body_timeout_s);
    auto expect = parser_->get().find(http::field::expect);
    if (expect != parser_->get().end() && boost::beast::iequals(expect->value(), "100-continue") && !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(sock_, net::buffer(kContinue), [self = shared_from_this()](boost::system::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
    }
    read_body();
  }

  void read_body() {
    http::async_read(sock_, buf_, *parser_, [self = shared_from_this()](boost::system::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(boost::system::error_code ec) {
    disarm();
    if (ec) {
      keep_alive_ = false;
      if (timed_out_) return send_error(ApiError(408, "request body not received in time", "", "body_timeout"));
      if (ec == http::error::body_limit)
        return send_error(ApiError(413, "request body exceeds the limit of " + std::to_string(srv_.opt.max_body_bytes) + " bytes (--max-body-bytes)", "",
                                   "body_too_large"));
      if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset) return close();
      return send_error(ApiError(400, std::string("malformed HTTP request: ") + ec.message(), "", "bad_request"));
    }
    req_ = parser_->release();
    parser_.reset();
    keep_alive_ = req_.keep_alive() && !srv_.shutting_down;
    http10_ = req_.version() < 11;
    arrival_ = Clock::now();
    auto rid = req_.find("x-request-id");
    request_id_ = request_id(rid == req_.end() ? std::string_view() : std::string_view(rid->value()));
    auto origin = req_.find(http::field::origin);
    cors_ = origin == req_.end() ? std::string() : srv_.cors.response_headers(std::string_view(origin->value()));
    guarded([&] { route(); });
  }

  // Runs f; an exception becomes this request's error reply.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const ApiError& e) {
      send_error(e);
    } catch (const Error& e) {
      send_error(ApiError(e.kind() == ErrorKind::invalid_argument ? 400 : 500, e.what()));
    } catch (const std::exception& e) {
      send_error(ApiError(500, std::string("internal error: ") + e.what()));
    }
  }

  // What a worker thread made of a request body.
  enum class Work { tokenize, detokenize, chat, completion, responses };
  struct Parsed {
    Work work;
    uint64_t seq = 0;
    GenSpec spec;
    std::string reply;  // tokenize/detokenize: the JSON body
    std::unique_ptr<ResponsesRequest> responses;  // /v1/responses: its fields beyond the GenSpec
    std::optional<ApiError> error;
  };

  // Parsing, chat template rendering and tokenization of a body run on the
  // worker pool; the I/O thread keeps serving every other connection.
  void parse_off_thread(Work work) {
    state_ = State::parsing;
    disarm();
    auto body = std::make_shared<std::string>(std::move(req_.body()));
    const uint64_t seq = ++srv_.request_seq;
    net::post(srv_.pool->executor(), [self = shared_from_this(), body, work, seq] {
      auto p = std::make_shared<Parsed>();
      p->work = work;
      p->seq = seq;
      const ModelInfo& m = self->srv_.model;
      try {
        switch (work) {
          case Work::tokenize: {
            const std::vector<int32_t> ids = parse_tokenize_request(*body, m);
            p->reply = nlohmann::ordered_json{{"count", ids.size()}, {"max_model_len", m.context}, {"tokens", ids}}.dump();
            break;
          }
          case Work::detokenize:
            p->reply = nlohmann::ordered_json{{"prompt", parse_detokenize_request(*body, m)}}.dump(-1, ' ', false,
                                                                                                  nlohmann::ordered_json::error_handler_t::replace);
            break;
          case Work::chat: p->spec = parse_chat_request(*body, m, seq); break;
          case Work::completion: p->spec = parse_completion_request(*body, m, seq); break;
          case Work::responses:
            p->responses = std::make_unique<ResponsesRequest>(parse_responses_request(*body, m, seq));
            p->spec = p->responses->spec;
            break;
        }
      } catch (const ApiError& e) {
        p->error = e;
      } catch (const Error& e) {
        p->error = ApiError(e.kind() == ErrorKind::invalid_argument ? 400 : 500, e.what());
      } catch (const std::exception& e) {
        p->error = ApiError(500, std::string("internal error: ") + e.what());
      }
      body->clear();
      body->shrink_to_fit();
      net::post(self->srv_.ioc, [self, p] { self->on_parsed(*p); });
    });
  }

  void on_parsed(Parsed& p) {
    if (state_ != State::parsing) return;  // closed meanwhile
    guarded([&] {
      if (p.error) throw *p.error;
      if (p.work == Work::tokenize || p.work == Work::detokenize) return send(200, "application/json", p.reply);
      spec_ = std::move(p.spec);
      responses_ = std::move(p.responses);
      start_generation(p.work == Work::chat || p.work == Work::responses);
    });
  }

  void route() {
    std::string_view target = req_.target();
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    endpoint_ = std::string(target);
    if (req_.method() == http::verb::options && srv_.cors.enabled()) return preflight();
    const bool get = req_.method() == http::verb::get, post = req_.method() == http::verb::post;
    auto need = [&](bool ok, const char* allow) {
      if (!ok) throw ApiError(405, "method " + std::string(req_.method_string()) + " is not allowed on " + endpoint_ + " (allowed: " + allow + ")", "",
                              "method_not_allowed");
    };
    if (target == "/health") {
      need(get, "GET");
      if (srv_.shutting_down) throw ApiError(503, "the server is shutting down", "", "shutting_down");
      return send(200, "application/json", "{\"status\":\"ok\"}");
    }
    if (target == "/metrics") {
      need(get, "GET");
      return send(200, "text/plain; version=0.0.4", srv_.metrics.render(srv_.sched.stats(), srv_.open));
    }
    if (target == "/tokenize" || target == "/detokenize") {  // vLLM's (and llama.cpp's) tokenizer endpoints
      check_auth();
      need(post, "POST");
      return parse_off_thread(target == "/tokenize" ? Work::tokenize : Work::detokenize);
    }
    if (!target.starts_with("/v1/")) throw ApiError(404, "no route " + endpoint_, "", "not_found");
    check_auth();
    if (target == "/v1/models" || target.starts_with("/v1/models/")) {
      need(get, "GET");
      nlohmann::ordered_json m{{"id", srv_.model.name}, {"object", "model"}, {"created", 0}, {"owned_by", "hmoe"}, {"max_model_len", srv_.model.context}};
      if (target == "/v1/models")
        return send(200, "application/json", nlohmann::ordered_json{{"object", "list"}, {"data", nlohmann::ordered_json::array({m})}}.dump());
      const std::string id = url_decode(target.substr(11));
      if (id != srv_.model.name)
        throw ApiError(404, "The model '" + id + "' does not exist; this server serves '" + srv_.model.name + "'", "model", "model_not_found");
      return send(200, "application/json", m.dump());
    }
    const bool chat = target == "/v1/chat/completions", responses = target == "/v1/responses";
    if (!chat && !responses && target != "/v1/completions") throw ApiError(404, "no route " + endpoint_, "", "not_found");
    need(post, "POST");
    parse_off_thread(responses ? Work::responses : chat ? Work::chat : Work::completion);
  }

  // OPTIONS with CORS on: a preflight from an allowed origin gets 204 and
  // the Access-Control-Allow-* headers; others 403. No API key (browsers
  // send none on preflights).
  void preflight() {
    auto origin = req_.find(http::field::origin);
    auto hdrs = req_.find(http::field::access_control_request_headers);
    const std::string h = origin == req_.end() ? std::string()
                                               : srv_.cors.preflight_headers(std::string_view(origin->value()), hdrs == req_.end() ? std::string_view() : std::string_view(hdrs->value()));
    if (h.empty()) throw ApiError(403, "CORS: origin not allowed (--cors-origins)", "", "cors_origin_not_allowed");
    cors_.clear();  // preflight headers already carry Access-Control-Allow-Origin
    send(204, "", "", h);
  }

  void check_auth() {
    if (srv_.opt.api_key.empty()) return;
    auto it = req_.find(http::field::authorization);
    if (it == req_.end()) throw ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", "", "invalid_api_key");
    if (!bearer_matches(std::string_view(it->value()), srv_.opt.api_key)) throw ApiError(401, "invalid API key", "", "invalid_api_key");
  }

  // Streamed body bytes: a chunk of chunked transfer encoding, or raw for an
  // HTTP/1.0 client (its reply is delimited by closing the connection).
  std::string frame(const std::string& data) const {
    if (http10_) return data;
    return fmt_hex(data.size()) + "\r\n" + data + "\r\n";
  }
  std::string common_headers() const { return "X-Request-Id: " + (request_id_.empty() ? request_id(std::string_view()) : request_id_) + "\r\n" + cors_; }

  void start_generation(bool chat) {
    const uint64_t gen = ++gen_id_;
    std::weak_ptr<Session> weak = weak_from_this();
    net::io_context& ioc = srv_.ioc;
    const size_t n = responses_ ? 1 : static_cast<size_t>(std::max<int64_t>(spec_.n, 1));
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    if (responses_) builder_ = std::make_unique<ResponsesReply>(*responses_, srv_.model, random_id("resp_"), created);
    else builder_ = std::make_unique<ChatReply>(spec_, srv_.model, random_id(chat ? "chatcmpl-" : "cmpl-"), created);
    chans_.clear();
    fins_.assign(n, FinishReason::none);
    errors_.assign(n, std::string());
    for (size_t i = 0; i < n; ++i) {
      chans_.push_back(std::make_shared<SeqChannel>([weak, gen, &ioc] {
        net::post(ioc, [weak, gen] {
          if (auto s = weak.lock(); s && s->gen_id_ == gen) {
            try {
              s->on_events();
            } catch (const std::exception& e) {
              s->generation_failed(e.what());
            }
          }
        });
      }));
      auto req = std::make_unique<SeqRequest>();
      req->prompt = spec_.prompt;
      req->max_tokens = spec_.max_tokens;
      req->sampling = spec_.sampling;
      req->sampling.seed += i * 0x9e3779b97f4a7c15ull;  // choices differ, reproducibly under a seed
      req->stop_ids = spec_.stop_ids;
      if (!spec_.chat && spec_.echo && spec_.sampling.logprobs) req->prompt_logprobs = spec_.sampling.top_logprobs;  // echo scores the prompt (each choice its own)
      req->channel = chans_.back();
      if (i > 0) req->after = chans_[0];
      Scheduler::Submit r = srv_.sched.submit(std::move(req));
      if (r == Scheduler::Submit::ok) continue;
      for (auto& c : chans_) c->cancel();
      chans_.clear();
      builder_.reset();
      if (r == Scheduler::Submit::queue_full) throw ApiError(503, "the server is busy: the request queue is full; retry later", "", "queue_full");
      throw ApiError(503, "the server is shutting down", "", "shutting_down");
    }
    state_ = State::generating;
    first_token_ = true;
    if (spec_.stream) {
      if (http10_) keep_alive_ = false;
      write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" + common_headers() +
            (http10_ ? "" : "Transfer-Encoding: chunked\r\n") + "Connection: " + std::string(keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n");
    }
    watch_disconnect(gen);
  }

  // While generating, a readable socket with nothing to read means the
  // client went away: cancel its sequence.
  void watch_disconnect(uint64_t gen) {
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen](boost::system::error_code ec) {
      if (gen != self->gen_id_ || self->state_ != State::generating) return;
      if (ec == net::error::operation_aborted && !self->timed_out_) return;
      if (!ec) {
        // Readiness can be stale (an edge already drained by the request
        // read); only a peek that sees end-of-stream or an error means gone.
        char c;
        const ssize_t n = ::recv(self->sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) return;  // pipelined request: read after this response
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_disconnect(gen);
        if (n == 0) {
          // End of stream: the client shut its write side (half-close) and may
          // still read the reply; it is not cancelled. A client that is really
          // gone makes a later write fail (streams) or gets the reply dropped.
          self->keep_alive_ = false;
          self->hold_ = self;  // no read pending now: stay alive until the reply is done
          return;
        }
      }
      self->client_gone();
    });
  }

  void client_gone() {
    for (auto& c : chans_) c->cancel();
    srv_.metrics.request_done(endpoint_, 499);
    end_generation();
    close();
  }

  void end_generation() {
    hold_.reset();
    ++gen_id_;
    chans_.clear();
    builder_.reset();
  }

  void on_events() {
    if (chans_.empty() || state_ != State::generating) return;
    const auto now = Clock::now();
    std::string out;
    size_t new_tokens = 0;
    for (size_t i = 0; i < chans_.size(); ++i) {
      if (fins_[i] != FinishReason::none) continue;
      SeqChannel::Drained d = chans_[i]->drain();
      if (i == 0) builder_->set_cached_tokens(chans_[0]->cached_tokens());
      if (!d.prompt.empty()) builder_->add_prompt_logprobs(i, std::move(d.prompt));
      // Prompt scores alone (echo + logprobs, 128 positions a step): nothing to send until its first token.
      if (d.tokens.empty() && d.finish == FinishReason::none) continue;
      new_tokens += d.tokens.size();
      FinishReason fin = d.finish;
      if (spec_.stream) out += builder_->on_tokens(i, d.tokens);
      else builder_->add_tokens(i, d.tokens);
      if (builder_->stop_hit(i) && fin == FinishReason::none) {
        chans_[i]->cancel();
        fin = FinishReason::eos;
      }
      if (fin == FinishReason::none) continue;
      fins_[i] = fin;
      errors_[i] = d.error;
      if (spec_.stream) out += builder_->on_choice_finish(i, fin, d.error);
    }
    if (new_tokens > 0) {
      if (first_token_) {
        srv_.metrics.ttft.observe(std::chrono::duration<double>(now - arrival_).count());
        first_token_ = false;
      } else {
        const double dt = std::chrono::duration<double>(now - last_token_).count() / static_cast<double>(new_tokens);
        for (size_t i = 0; i < new_tokens; ++i) srv_.metrics.tpot.observe(dt);
      }
      last_token_ = now;
    }
    const bool all_done = std::none_of(fins_.begin(), fins_.end(), [](FinishReason f) { return f == FinishReason::none; });
    if (spec_.stream) {
      if (all_done) out += builder_->on_end();
      if (!out.empty()) write(frame(out));
      if (state_ != State::generating) return;  // the client was dropped
      if (all_done) {
        if (!http10_) write("0\r\n\r\n");
        finish_metrics(200);
        end_generation();
        state_ = State::closing;  // until the writes drain
        after_writes_ = true;
      }
      return;
    }
    if (!all_done) return;
    for (size_t i = 0; i < fins_.size(); ++i)
      if (fins_[i] == FinishReason::error) {
        end_generation();
        return send_error(ApiError(500, "generation failed: " + errors_[i], "", "generation_error"));
      }
    for (FinishReason f : fins_)
      if (f == FinishReason::shutdown || f == FinishReason::cancelled) {
        end_generation();
        keep_alive_ = false;
        return send_error(ApiError(503, "the server is shutting down", "", "shutting_down"));
      }
    std::string body = builder_->body(fins_).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    finish_metrics(200);
    end_generation();
    send(200, "application/json", body, {}, false);
  }

  // An exception while turning tokens into a reply: end this request only.
  void generation_failed(const std::string& what) {
    for (auto& c : chans_) c->cancel();
    const bool streaming = spec_.stream;
    end_generation();
    keep_alive_ = false;
    if (!streaming) return send_error(ApiError(500, "internal error: " + what, "", "internal_error"));
    std::string ev = "data: " + error_body(500, "internal error: " + what, "", "internal_error") + "\n\ndata: [DONE]\n\n";
    srv_.metrics.request_done(endpoint_, 500);
    state_ = State::closing;
    write(frame(ev) + (http10_ ? "" : "0\r\n\r\n"));
    after_writes_ = true;
  }

  void finish_metrics(int status) {
    srv_.metrics.request_done(endpoint_, status);
    srv_.metrics.add_tokens(builder_->prompt_tokens(), builder_->completion_tokens(), builder_->cached_tokens());
    srv_.metrics.e2e.observe(std::chrono::duration<double>(Clock::now() - arrival_).count());
  }

  void send_error(const ApiError& e, const std::string& retry_after = {}) {
    std::string extra;
    if (e.status == 503 || e.status == 429) extra = "Retry-After: " + (retry_after.empty() ? std::string("1") : retry_after) + "\r\n";
    if (e.status == 401) extra += "WWW-Authenticate: Bearer\r\n";
    if (e.status == 405) extra += "Allow: " + std::string(srv_.cors.enabled() ? "GET, POST, OPTIONS" : "GET, POST") + "\r\n";
    send(e.status, "application/json", error_body(e), extra);
  }

  void send(int status, const std::string& type, const std::string& body, const std::string& extra = {}, bool count = true) {
    if (count) srv_.metrics.request_done(endpoint_.empty() ? "-" : endpoint_, status);
    if (status >= 400 && status != 404 && status != 401 && status != 403 && status != 405 && status != 400 && status != 503) keep_alive_ = false;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + std::string(http::obsolete_reason(static_cast<http::status>(status))) + "\r\n";
    if (!type.empty()) head += "Content-Type: " + type + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n" + common_headers() + extra;
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    if (state_ == State::generating) ++gen_id_;  // no more events for this response
    state_ = State::closing;
    arm(srv_.opt.idle_timeout_s);  // a client that does not read its reply is dropped
    write(head + body);
    after_writes_ = true;
  }

  // A client that stops reading while its stream is generating would make the
  // queue grow without bound: past kMaxQueued bytes it counts as gone.
  static constexpr size_t kMaxQueued = 8u << 20;
  void write(std::string data) {
    queued_bytes_ += data.size();
    queue_.push_back(std::move(data));
    if (queued_bytes_ > kMaxQueued && state_ == State::generating) return client_gone();
    if (!writing_) do_write();
  }

  // After the last reply: shut our sending side and read (and drop) what the
  // client still sends for up to a second, so that a client whose request
  // was refused mid-upload (413, 431) reads its error instead of a reset.
  void linger_close() {
    state_ = State::closing;
    hold_.reset();
    release_slot();
    boost::system::error_code ig;
    sock_.cancel(ig);
    sock_.shutdown(tcp::socket::shutdown_send, ig);
    if (ig) return close();
    arm(1.0);  // then the socket is closed
    if (!drain_buf_) drain_buf_ = std::make_unique<std::array<char, 16384>>();
    drain(0);
  }
  void drain(size_t total) {
    sock_.async_read_some(net::buffer(*drain_buf_), [self = shared_from_this(), total](boost::system::error_code ec, size_t n) {
      if (ec || total + n > (16u << 20)) return self->close();
      self->drain(total + n);
    });
  }

  void do_write() {
    if (queue_.empty()) {
      writing_ = false;
      if (after_writes_) {
        after_writes_ = false;
        if (keep_alive_ && !srv_.shutting_down) {
          boost::system::error_code ig;
          sock_.cancel(ig);  // the disconnect watch
          endpoint_.clear();
          return net::post(srv_.ioc, [self = shared_from_this()] { self->read_request(false); });
        }
        return linger_close();
      }
      return;
    }
    writing_ = true;
    net::async_write(sock_, net::buffer(queue_.front()), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      if (ec) {
        self->queue_.clear();
        self->queued_bytes_ = 0;
        self->writing_ = false;
        if (self->state_ == State::generating) return self->client_gone();
        return self->close();
      }
      self->queued_bytes_ -= self->queue_.front().size();
      self->queue_.pop_front();
      self->do_write();
    });
  }

  tcp::socket sock_;
  HttpServer::Impl& srv_;
  net::steady_timer timer_;
  boost::beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  State state_ = State::idle;
  uint64_t arm_gen_ = 0, gen_id_ = 0;
  bool timed_out_ = false, keep_alive_ = true, writing_ = false, after_writes_ = false, first_token_ = true;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  std::string endpoint_;
  std::string ip_, request_id_, cors_;
  std::shared_ptr<Session> hold_;
  std::unique_ptr<std::array<char, 16384>> drain_buf_;  // self-reference of a half-closed connection while it generates
  bool has_slot_ = false, http10_ = false;
  Clock::time_point idle_since_ = Clock::now();
  GenSpec spec_;
  std::vector<std::shared_ptr<SeqChannel>> chans_;  // one per choice
  std::vector<FinishReason> fins_;
  std::vector<std::string> errors_;
  std::unique_ptr<ResponsesRequest> responses_;  // /v1/responses: its fields beyond the GenSpec
  std::unique_ptr<ReplyBuilder> builder_;
  Clock::time_point arrival_, last_token_;
};

std::shared_ptr<Connection> make_session(tcp::socket sock, HttpServer::Impl& srv, std::string ip) {
  return std::make_shared<Session>(std::move(sock), srv, std::move(ip));
}

}  // namespace hmoe::server
