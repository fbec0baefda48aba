// bench_fairness: does one hostile or heavy client slow everyone else down?
// Starts the server in-process on a free port, then measures 32 streaming
// clients' inter-token latency (ITL, the gap between consecutive SSE token
// events as the client sees them) and /health round trips twice:
//   quiet:  the 32 streams alone;
//   loaded: the same 32 streams while one client keeps posting a 7 MB prompt
//           (parsed and tokenized, then refused for its length) and 2,000
//           idle sockets are held open from 8 other client addresses
//           (127.0.1.x; reopened when the server closes them).
// Quiet and loaded runs alternate (--reps times; the box may be shared and
// its load drifts). Prints p50/p99 ITL and /health latency of each run, and
// of all runs pooled with the loaded/quiet ratio; the
// target (issue 22) is a loaded p99 ITL within 1.5x of the quiet one. It
// times nothing it does not print, and never passes or fails.
//
// Usage: bench_fairness [MODEL] [--streams 32] [--gen-tokens 64]
//                       [--idle-sockets 2000] [--big-mb 7] [--reps 3]
// MODEL defaults to the built-in demo model; settings flags apply (with
// --max-connections below the idle sockets, the server evicts idle ones and
// the flood reopens them as fast as it can: a connection-rate flood).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "configs/error.h"
#include "engine/loading/demo_model.h"
#include "server/server.h"

using namespace hmoe;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int connect_from(uint16_t port, uint32_t src_ip) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (src_ip) {
    sockaddr_in s{};
    s.sin_family = AF_INET;
    s.sin_addr.s_addr = htonl(src_ip);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&s), sizeof s) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& s) {
  for (size_t off = 0; off < s.size();) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string post_req(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: b\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// One streaming completion; the client-side gaps between token events.
struct Stream {
  std::vector<double> itl_ms;  // between events with text (a token without text merges into the next gap)
  int events = 0;
  int tokens = 0;  // usage.completion_tokens
  bool ok = false;
};
Stream stream_request(uint16_t port, const std::string& body) {
  Stream st;
  int fd = connect_from(port, 0);
  if (fd < 0 || !send_all(fd, post_req("/v1/completions", body))) {
    if (fd >= 0) ::close(fd);
    return st;
  }
  std::string buf;
  size_t scan = 0;
  Clock::time_point last{};
  char tmp[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
    const auto now = Clock::now();
    size_t p;
    while ((p = buf.find("data: {", scan)) != std::string::npos) {
      const size_t e = buf.find("\n\n", p);
      if (e == std::string::npos) break;
      scan = e;
      auto j = nlohmann::json::parse(buf.substr(p + 6, e - p - 6), nullptr, false);
      if (!j.is_object()) continue;
      if (j.contains("usage") && j["usage"].is_object()) st.tokens = j["usage"]["completion_tokens"].get<int>();
      if (!j.contains("choices") || j["choices"].empty() || j["choices"][0]["text"].get<std::string>().empty()) continue;
      if (st.events > 0) st.itl_ms.push_back(ms(now - last));
      last = now;
      ++st.events;
    }
    if (buf.find("data: [DONE]") != std::string::npos) {
      st.ok = true;
      break;
    }
  }
  ::close(fd);
  return st;
}

double health_ms(uint16_t port) {
  const auto t0 = Clock::now();
  int fd = connect_from(port, 0);
  if (fd < 0) return -1;
  send_all(fd, "GET /health HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n");
  char tmp[1024];
  std::string got;
  for (ssize_t n; (n = ::recv(fd, tmp, sizeof tmp, 0)) > 0;) got.append(tmp, static_cast<size_t>(n));
  ::close(fd);
  return got.rfind("HTTP/1.1 200", 0) == 0 ? ms(Clock::now() - t0) : -1;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

struct Run {
  std::vector<double> itl, health;
  int streams_ok = 0, tokens = 0;
  double seconds = 0;
};

// The 32 streams (one request each) with a /health probe every 20 ms.
Run run_streams(uint16_t port, int streams, int gen, std::mt19937_64& rng) {
  std::vector<std::string> bodies;
  for (int i = 0; i < streams; ++i) {
    std::vector<int32_t> prompt(32);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 150000);
    bodies.push_back(nlohmann::json{{"prompt", prompt}, {"max_tokens", gen}, {"temperature", 0}, {"ignore_eos", true}, {"stream", true},
                                   {"stream_options", {{"include_usage", true}}}}.dump());
  }
  Run r;
  std::vector<Stream> res(static_cast<size_t>(streams));
  std::atomic<bool> done{false};
  std::thread probe([&] {
    while (!done) {
      r.health.push_back(health_ms(port));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int i = 0; i < streams; ++i) ts.emplace_back([&, i] { res[static_cast<size_t>(i)] = stream_request(port, bodies[static_cast<size_t>(i)]); });
  for (auto& t : ts) t.join();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  probe.join();
  for (auto& s : res) {
    r.streams_ok += s.ok && s.tokens == gen;
    r.tokens += s.tokens;
    r.itl.insert(r.itl.end(), s.itl_ms.begin(), s.itl_ms.end());
  }
  return r;
}

// Holds `count` idle connections from 127.0.1.1..8, reopening those the server closes.
class IdleFlood {
 public:
  IdleFlood(uint16_t port, int count) : port_(port), fds_(static_cast<size_t>(count), -1) {
    thread_ = std::thread([this] { loop(); });
  }
  ~IdleFlood() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  int64_t reopened() const { return reopened_; }
  int open_now() const { return open_; }

 private:
  void loop() {
    while (!stop_) {
      int open = 0;
      std::vector<pollfd> pf;
      for (size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i] < 0) {
          fds_[i] = connect_from(port_, (127u << 24) | (0u << 16) | (1u << 8) | static_cast<uint32_t>(1 + i % 8));
          if (fds_[i] >= 0) ++reopened_;
        }
        if (fds_[i] >= 0) {
          ++open;
          pf.push_back({fds_[i], POLLIN, 0});
        }
      }
      open_ = open;
      ::poll(pf.data(), pf.size(), 50);
      for (const auto& p : pf)
        if (p.revents)  // closed by the server (or a reply): reopen next round
          for (auto& fd : fds_)
            if (fd == p.fd) {
              ::close(fd);
              fd = -1;
            }
    }
  }
  uint16_t port_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> reopened_{0};
  std::atomic<int> open_{0};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    Settings s = Settings::load(args);
    int streams = 32, gen = 64, idle = 2000, big_mb = 7, reps = 3;
    for (size_t i = 0; i + 1 < args.size();) {
      int* dst = args[i] == "--streams" ? &streams : args[i] == "--gen-tokens" ? &gen : args[i] == "--idle-sockets" ? &idle : args[i] == "--big-mb" ? &big_mb : args[i] == "--reps" ? &reps : nullptr;
      if (!dst) {
        ++i;
        continue;
      }
      *dst = static_cast<int>(parse_int(args[i], args[i + 1]));
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    }
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
    const rlim_t need = static_cast<rlim_t>(2 * idle + 4 * streams + 256);
    if (rl.rlim_cur < need)
      fail(ErrorKind::invalid_argument, "the open-file limit (" + std::to_string(rl.rlim_cur) + ", ulimit -n) is below the " + std::to_string(need) +
                                            " descriptors this run needs (client and server ends of every socket); lower --idle-sockets");
    s.port = 0;
    s.progress = "none";
    if (s.max_body_bytes < static_cast<uint64_t>(big_mb + 1) << 20) s.max_body_bytes = static_cast<uint64_t>(big_mb + 1) << 20;
    if (s.kv_cache_memory_bytes == 0) s.kv_cache_memory_bytes = 256ull << 20;
    const std::string dir = args.empty() ? ensure_demo_model(s) : args[0];
    auto stack = server::make_server(s, dir);
    std::thread io([&] { stack->http->run(false); });
    const uint16_t port = stack->http->port();

    std::string text;
    text.reserve(static_cast<size_t>(big_mb) << 20);
    while (text.size() < (static_cast<size_t>(big_mb) << 20)) text += "The quick brown fox jumps over the lazy dog, again and again. ";
    const std::string big_req = post_req("/v1/completions", nlohmann::json{{"prompt", text}, {"max_tokens", 1}}.dump());

    std::printf("bench_fairness: %s, %u hardware threads, %lld CPU worker threads, %lld HTTP worker threads (nice %lld), --max-connections %lld\n",
                dir.c_str(), std::thread::hardware_concurrency(), static_cast<long long>(s.threads), static_cast<long long>(s.http_worker_threads),
                static_cast<long long>(s.http_worker_nice), static_cast<long long>(s.max_connections));
    std::printf("%d streams x %d greedy tokens (32-token prompts); load: a %.1f MB prompt posted in a loop + %d idle sockets from 8 addresses\n\n",
                streams, gen, static_cast<double>(big_req.size()) / 1e6, idle);
    std::mt19937_64 rng(7);
    (void)run_streams(port, 4, 8, rng);  // warm-up

    auto row = [&](const std::string& name, const Run& r) {
      std::printf("%-9s %8d/%-3d %9.1f %9.2f %9.2f %9.2f %10.2f %10.2f %10.2f\n", name.c_str(), r.streams_ok, streams, r.tokens / r.seconds,
                  pct(r.itl, 50), pct(r.itl, 99), pct(r.itl, 100), pct(r.health, 50), pct(r.health, 99), pct(r.health, 100));
    };
    std::printf("%-9s %12s %9s %9s %9s %9s %10s %10s %10s\n", "run", "streams ok", "tok/s", "itl p50", "itl p99", "itl max", "health p50", "health p99",
                "health max");
    std::printf("%-9s %12s %9s %9s %9s %9s %10s %10s %10s\n", "", "", "", "ms", "ms", "ms", "ms", "ms", "ms");
    Run quiet, loaded;  // all repetitions pooled
    int big_done = 0, idle_open = idle;
    int64_t reopened = 0;
    std::vector<double> big_ms;
    auto pool = [](Run& into, const Run& r) {
      into.itl.insert(into.itl.end(), r.itl.begin(), r.itl.end());
      into.health.insert(into.health.end(), r.health.begin(), r.health.end());
      into.streams_ok += r.streams_ok;
      into.tokens += r.tokens;
      into.seconds += r.seconds;
    };
    for (int rep = 0; rep < reps; ++rep) {  // interleaved: the box is shared, its load drifts
      Run q = run_streams(port, streams, gen, rng);
      row("quiet " + std::to_string(rep + 1), q);
      pool(quiet, q);
      // Load: the idle flood and the big-prompt client, running until the streams finish.
      std::atomic<bool> stop_big{false};
      IdleFlood flood(port, idle);
      for (int i = 0; i < 100 && flood.open_now() < idle; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      idle_open = std::min(idle_open, flood.open_now());
      std::thread big([&] {
        while (!stop_big) {
          const auto t0 = Clock::now();
          int fd = connect_from(port, 0);
          if (fd < 0) continue;
          send_all(fd, big_req);
          char tmp[4096];
          std::string got;
          for (ssize_t n; (n = ::recv(fd, tmp, sizeof tmp, 0)) > 0;) got.append(tmp, static_cast<size_t>(n));
          ::close(fd);
          big_ms.push_back(ms(Clock::now() - t0));
          if (got.find("context_length_exceeded") != std::string::npos) ++big_done;
        }
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first big body is in flight
      Run l = run_streams(port, streams, gen, rng);
      stop_big = true;
      big.join();
      reopened += flood.reopened();
      row("loaded " + std::to_string(rep + 1), l);
      pool(loaded, l);
    }
    quiet.streams_ok /= reps;
    loaded.streams_ok /= reps;
    row("quiet", quiet);
    row("loaded", loaded);
    std::printf("\nall %d repetitions pooled: loaded/quiet p99 inter-token latency %.2fx (target <= 1.5x); p50 %.2fx; /health p50 %.2f ms loaded vs %.2f "
                "ms quiet, p99 %.2f vs %.2f ms\n",
                reps, pct(loaded.itl, 99) / pct(quiet.itl, 99), pct(loaded.itl, 50) / pct(quiet.itl, 50), pct(loaded.health, 50), pct(quiet.health, 50),
                pct(loaded.health, 99), pct(quiet.health, 99));
    std::printf("during the loaded runs: %d big prompts answered (%.0f ms each, median; 400 context_length_exceeded after tokenizing), >= %d idle "
                "sockets open at each start, %lld (re)opened in all\n",
                big_done, pct(big_ms, 50), idle_open, static_cast<long long>(reopened));
    if (quiet.streams_ok != streams || loaded.streams_ok != streams) std::printf("(incomplete streams!)\n");
    stack->http->stop();
    io.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fairness: %s\n", e.what());
    return 1;
  }
}
