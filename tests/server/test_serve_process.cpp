// `hmoe serve` as a process: the "listening on" line with --port 0, the
// official openai npm client (tests/server/openai_client.cjs), curl, and
// SIGTERM ending an open stream with a final event and exit code 0.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <thread>

#include "tests/server/server_fixture.h"

using namespace hmoe::test;
using nlohmann::json;

namespace {

struct ServeProcess {
  pid_t pid = -1;
  int err_fd = -1;
  std::string err;
  uint16_t port = 0;

  explicit ServeProcess(const std::vector<std::string>& extra) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    std::vector<std::string> args = {std::string(HMOE_BINARY_DIR) + "/bin/hmoe", "serve", fixture_model("tiny-qwen3moe"), "--port", "0",
                                     "--threads", "2", "--progress", "none", "--kv-cache-memory-bytes", "64MiB"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::dup2(p[1], 2);
      ::close(p[0]);
      ::close(p[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    err_fd = p[0];
    std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    std::smatch m;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::regex_search(err, m, re) && std::chrono::steady_clock::now() < deadline) {
      if (!read_some(1000)) break;
    }
    if (std::regex_search(err, m, re)) port = static_cast<uint16_t>(std::stoi(m[1]));
  }
  bool read_some(int timeout_ms) {
    pollfd pf{err_fd, POLLIN, 0};
    if (::poll(&pf, 1, timeout_ms) <= 0) return true;
    char buf[4096];
    ssize_t n = ::read(err_fd, buf, sizeof buf);
    if (n <= 0) return false;
    err.append(buf, static_cast<size_t>(n));
    return true;
  }
  int wait_exit(int timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      read_some(10);
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    return -1;
  }
  ~ServeProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (err_fd >= 0) ::close(err_fd);
  }
};

std::string run_cmd(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  ::pclose(p);
  return out;
}

}  // namespace

TEST_CASE("hmoe serve: openai npm client, curl, and SIGTERM with an open stream") {
  ServeProcess srv({});
  CAPTURE(srv.err);
  REQUIRE(srv.port != 0);
  const std::string base = "http://127.0.0.1:" + std::to_string(srv.port);

  const std::string openai = std::string(HMOE_SOURCE_DIR) + "/.deps/npm/node_modules/openai";
  if (std::filesystem::exists(openai) && std::system("node --version > /dev/null 2>&1") == 0) {
    const std::string out = run_cmd("node " + std::string(HMOE_SOURCE_DIR) + "/tests/server/openai_client.cjs " + base + "/v1 " +
                                    fixture_ref("tiny-qwen3moe/hf_reference.json") + " " + openai + " 2>&1");
    CAPTURE(out);
    CHECK(out.find("ALL OK") != std::string::npos);
    CHECK(out.find("FAIL") == std::string::npos);
  } else {
    MESSAGE("skipped the openai npm client test: node or .deps/npm/node_modules/openai missing (run scripts/install-deps)");
  }

  if (std::system("curl --version > /dev/null 2>&1") == 0) {
    json body = chat_body(3);
    const std::string path = std::string(HMOE_BINARY_DIR) + "/tmp-serve-req.json";
    write_file(path, body.dump());
    const std::string out = run_cmd("curl -s -H 'Content-Type: application/json' --data-binary @" + path + " " + base + "/v1/chat/completions");
    std::filesystem::remove(path);
    json j = json::parse(out, nullptr, false);
    REQUIRE(j.is_object());
    CHECK(j["choices"][0]["message"]["content"] == hf_reference()["chats"][3]["greedy_text"]);
    CHECK(j["usage"]["prompt_tokens"] == hf_reference()["chats"][3]["ids"].size());
    const std::string code = run_cmd("curl -s -o /dev/null -w '%{http_code}' -d '{bad' " + base + "/v1/chat/completions");
    CHECK(code == "400");
  }

  // An open stream, then SIGTERM: the stream ends with an error event
  // (code shutting_down; finish_reason only takes OpenAI's values) and
  // [DONE], and the process exits 0.
  json b = chat_body(0, 3000);
  b["stream"] = true;
  int fd = connect_raw(srv.port);
  send_all(fd, make_request("POST", "/v1/chat/completions", b.dump()));
  std::string got;
  char buf[4096];
  while (got.find("motifs") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    got.append(buf, static_cast<size_t>(n));
  }
  REQUIRE(::kill(srv.pid, SIGTERM) == 0);
  got += recv_all(fd, 20000);
  ::close(fd);
  HttpReply r = parse_reply(got);
  StreamResult s = collect_stream(r);
  CHECK(s.done);
  CHECK(s.finish_reason.empty());
  CHECK(s.error_code == "shutting_down");
  CHECK(srv.wait_exit(30) == 0);
  CHECK(srv.err.find("stopped") != std::string::npos);
}

TEST_CASE("hmoe serve: bad flags and a taken port fail with a message") {
  ServeProcess a({});
  REQUIRE(a.port != 0);
  ServeProcess b({"--port", std::to_string(a.port)});
  CHECK(b.wait_exit(60) == 1);
  CHECK(b.err.find("cannot listen") != std::string::npos);
  ServeProcess c({"--port", "70000"});
  CHECK(c.wait_exit(60) == 1);
  CHECK(c.err.find("--port") != std::string::npos);
  ::kill(a.pid, SIGINT);
  CHECK(a.wait_exit(30) == 0);
}
