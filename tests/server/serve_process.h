// ServeProcess: `hmoe serve` on the tiny fixture as a child process, on a
// free port (read from its "listening on" line), with its stderr collected.
// A crash of the server is then the child's death, seen by the test, not the
// test's own. The destructor kills it (SIGKILL) if it is still running.
#pragma once
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace hmoe::test {

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

}  // namespace hmoe::test
