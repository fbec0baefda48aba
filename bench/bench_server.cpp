// bench_server: load driver for `hmoe serve`. Starts the server in-process on
// a free port, runs C concurrent streaming clients (C = 1, 8, 32) over raw
// sockets, and prints output tokens/s with time-to-first-token and
// inter-token latency percentiles. Then it runs the same work (same prompts,
// same number of greedy tokens, waves of C sequences) directly on the
// engine - the loop `hmoe generate` runs, batched - and prints the server's
// overhead against it. Both figures are also set against the weight-read
// bound of decoding (every step reads all weights once: bytes/step over the
// measured memory bandwidth).
//
// Usage: bench_server [MODEL] [--prompt-tokens 32] [--gen-tokens 64] [--streams 1,8,32]
// MODEL defaults to the built-in demo model. Settings flags (--threads ...) apply.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "configs/error.h"
#include "engine/loading/demo_model.h"
#include "engine/serving/logits.h"
#include "server/server.h"

using namespace hmoe;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double cpu_secs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct StreamStats {
  double ttft = 0;
  std::vector<double> itl;
  int tokens = 0;
  bool ok = false;
};

// One streaming /v1/completions request; timestamps every SSE event.
StreamStats stream_request(uint16_t port, const std::string& body) {
  StreamStats st;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return st;
  }
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: b\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  const auto t0 = Clock::now();
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return st;
  }
  std::string buf;
  size_t scan = 0;
  auto last = t0;
  bool first = true;
  char tmp[16384];
  for (;;) {
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
    const auto now = Clock::now();
    size_t p;
    while ((p = buf.find("data: {", scan)) != std::string::npos) {
      size_t e = buf.find("\n\n", p);
      if (e == std::string::npos) break;
      scan = e;
      auto j = nlohmann::json::parse(buf.substr(p + 6, e - p - 6), nullptr, false);
      if (!j.is_object()) continue;
      if (j.contains("usage") && j["usage"].is_object()) st.tokens = j["usage"]["completion_tokens"].get<int>();
      if (!j.contains("choices") || j["choices"].empty() || j["choices"][0]["text"].get<std::string>().empty()) continue;
      if (first) st.ttft = secs(now - t0);
      else st.itl.push_back(secs(now - last));
      first = false;
      last = now;
    }
    if (buf.find("data: [DONE]") != std::string::npos) {
      st.ok = true;
      break;
    }
  }
  ::close(fd);
  return st;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())))];
}

// Streaming memory read bandwidth (one thread per pool worker is not needed
// for a rough bound; this is a single-stream sum over 256 MiB).
double measure_bandwidth_gbs() {
  std::vector<float> a((256u << 20) / sizeof(float), 1.0f);
  volatile float sink = 0;
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    float s = 0;
    for (size_t i = 0; i < a.size(); i += 16) s += a[i];
    sink = sink + s;
    best = std::max(best, static_cast<double>(a.size() * sizeof(float)) / secs(Clock::now() - t0) / 1e9);
  }
  return best;
}

// The same work without HTTP: waves of `c` prompts, prefill in one batch,
// then greedy decode steps over the wave, as `hmoe generate` does per sequence.
double direct_seconds(Model& m, const std::vector<std::vector<int32_t>>& prompts, int gen, int c) {
  const int64_t V = m.config().vocab_size;
  const auto t0 = Clock::now();
  for (size_t w = 0; w < prompts.size(); w += static_cast<size_t>(c)) {
    const size_t n = std::min(prompts.size() - w, static_cast<size_t>(c));
    KvCache kv(m.kv_layout(), static_cast<int64_t>(n) * ((static_cast<int64_t>(prompts[w].size()) + gen) / 16 + 2), 16);
    std::vector<int> seqs;
    Batch b;
    std::vector<int64_t> pos(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& p = prompts[w + i];
      seqs.push_back(kv.add_sequence());
      kv.reserve(seqs[i], static_cast<int64_t>(p.size()) + gen);
      for (size_t k = 0; k < p.size(); ++k) b.add(p[k], seqs[i], static_cast<int64_t>(k), k + 1 == p.size());
      pos[i] = static_cast<int64_t>(p.size());
    }
    std::vector<float> logits;
    m.forward(b, kv, logits);
    for (int g = 1; g < gen; ++g) {
      b.clear();
      for (size_t i = 0; i < n; ++i) b.add(argmax(logits.data() + static_cast<int64_t>(i) * V, V), seqs[i], pos[i]++, true);
      m.forward(b, kv, logits);
    }
    for (size_t i = 0; i < n; ++i) (void)argmax(logits.data() + static_cast<int64_t>(i) * V, V);
  }
  return secs(Clock::now() - t0);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    Settings s = Settings::load(args);
    int prompt_tokens = 32, gen = 64;
    std::vector<int> streams = {1, 8, 32};
    for (size_t i = 0; i + 1 < args.size();) {
      if (args[i] == "--prompt-tokens") prompt_tokens = std::stoi(args[i + 1]);
      else if (args[i] == "--gen-tokens") gen = std::stoi(args[i + 1]);
      else if (args[i] == "--streams") {
        streams.clear();
        for (size_t p = 0; p < args[i + 1].size();) {
          size_t c = args[i + 1].find(',', p);
          streams.push_back(std::stoi(args[i + 1].substr(p, c - p)));
          p = c == std::string::npos ? args[i + 1].size() : c + 1;
        }
      } else {
        ++i;
        continue;
      }
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    }
    s.port = 0;
    s.progress = "none";
    if (s.kv_cache_memory_bytes == 0) s.kv_cache_memory_bytes = 256ull << 20;
    const std::string dir = args.empty() ? ensure_demo_model(s) : args[0];
    auto stack = server::make_server(s, dir);
    std::thread io([&] { stack->http->run(false); });
    const uint16_t port = stack->http->port();
    clockid_t io_clock;
    if (pthread_getcpuclockid(io.native_handle(), &io_clock) != 0) fail(ErrorKind::internal, "no CPU clock for the io thread");
    Model& model = *stack->model;
    const double bw = measure_bandwidth_gbs();
    const double wbytes = static_cast<double>(model.weight_bytes());
    std::printf("bench_server: %s, %d CPU threads, prompt %d tokens, %d generated tokens per request (greedy, ignore_eos)\n", dir.c_str(),
                model.pool().size(), prompt_tokens, gen);
    std::printf("weights %.1f MB read per decode step; measured read bandwidth %.1f GB/s -> single-stream decode bound %.0f tok/s\n\n", wbytes / 1e6, bw,
                bw * 1e9 / wbytes);
    std::printf("%7s %9s %10s %10s %9s %9s %9s %9s %9s %9s %11s\n", "streams", "requests", "server", "direct", "wall", "cpu", "io cpu", "ttft p50",
                "ttft p99", "itl p50", "itl p90/p99");
    std::printf("%7s %9s %10s %10s %9s %9s %9s %9s %9s %9s %11s\n", "", "", "tok/s", "tok/s", "overhead", "overhead", "share", "ms", "ms", "ms", "ms");
    std::mt19937_64 rng(1);
    for (int c : streams) {
      const int requests = c == 1 ? 4 : 2 * c;
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(requests));
      for (auto& p : prompts) {
        p.resize(static_cast<size_t>(prompt_tokens));
        for (auto& t : p) t = static_cast<int32_t>(rng() % 150000);
      }
      // Warm-up request (first-touch of buffers).
      stream_request(port, nlohmann::json{{"prompt", prompts[0]}, {"max_tokens", 4}, {"temperature", 0}, {"stream", true}}.dump());
      std::vector<StreamStats> res(static_cast<size_t>(requests));
      double server_s = 1e30, direct_s = 1e30, io_cpu = 1e30, direct_cpu = 1e30, serve_cpu = 1e30;
      for (int rep = 0; rep < 2; ++rep) {  // interleaved, best of two: the box is shared
        const double pc0 = cpu_secs(CLOCK_PROCESS_CPUTIME_ID);
        direct_s = std::min(direct_s, direct_seconds(model, prompts, gen, c));
        direct_cpu = std::min(direct_cpu, cpu_secs(CLOCK_PROCESS_CPUTIME_ID) - pc0);
        const double io0 = cpu_secs(io_clock), proc0 = cpu_secs(CLOCK_PROCESS_CPUTIME_ID);
        std::atomic<double> client_cpu{0};
        std::vector<StreamStats> r(static_cast<size_t>(requests));
        std::atomic<int> next{0};
        const auto t0 = Clock::now();
        std::vector<std::thread> clients;
        for (int k = 0; k < c; ++k)
          clients.emplace_back([&] {
            for (int i; (i = next++) < requests;) {
              nlohmann::json b = {{"prompt", prompts[static_cast<size_t>(i)]}, {"max_tokens", gen}, {"temperature", 0}, {"ignore_eos", true},
                                  {"stream", true}, {"stream_options", {{"include_usage", true}}}};
              r[static_cast<size_t>(i)] = stream_request(port, b.dump());
            }
            double mine = cpu_secs(CLOCK_THREAD_CPUTIME_ID);
            for (double cur = client_cpu.load(); !client_cpu.compare_exchange_weak(cur, cur + mine);) {
            }
          });
        for (auto& t : clients) t.join();
        const double el = secs(Clock::now() - t0);
        io_cpu = std::min(io_cpu, cpu_secs(io_clock) - io0);
        serve_cpu = std::min(serve_cpu, cpu_secs(CLOCK_PROCESS_CPUTIME_ID) - proc0 - client_cpu.load());
        if (el < server_s) {
          server_s = el;
          res = std::move(r);
        }
      }
      std::vector<double> ttft, itl;
      int tokens = 0, failed = 0;
      for (auto& r : res) {
        if (!r.ok) ++failed;
        ttft.push_back(r.ttft * 1e3);
        for (double x : r.itl) itl.push_back(x * 1e3);
        tokens += r.tokens;
      }
      const double total = static_cast<double>(requests) * gen;
      char itl_s[32];
      std::snprintf(itl_s, sizeof itl_s, "%.2f/%.2f", pct(itl, 90), pct(itl, 99));
      std::printf("%7d %9d %10.1f %10.1f %8.1f%% %8.1f%% %8.1f%% %9.2f %9.2f %9.2f %11s%s\n", c, requests, tokens / server_s, total / direct_s,
                  (server_s / direct_s - 1) * 100, (serve_cpu / direct_cpu - 1) * 100, io_cpu / serve_cpu * 100, pct(ttft, 50), pct(ttft, 99),
                  pct(itl, 50), itl_s,
                  failed || tokens != static_cast<int>(total) ? "  (incomplete streams!)" : "");
    }
    std::printf("\nwall overhead: server wall time / direct wall time - 1 (negative when the box is shared: more runnable threads get more CPU).\n"
                "cpu overhead: CPU seconds of the server process (engine + io thread, clients excluded) / CPU seconds of the direct run - 1\n"
                "  (spin-waiting pool workers count as CPU in both).\n"
                "io cpu share: the io thread's part (HTTP, JSON, detokenizer, SSE) of the server's CPU seconds.\n");
    stack->http->stop();
    io.join();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_server: %s\n", e.what());
    return 1;
  }
}
