// Running the built binaries from a test: the command's exit code and its
// stdout + stderr together (blocking; one popen per call).
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace hmoe::test {

struct Run {
  int code;
  std::string out;
};

inline Run run_cmd(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// build/bin/hmoe with `args`.
inline Run run(const std::string& args) { return run_cmd(std::string(HMOE_BINARY_DIR) + "/bin/hmoe " + args); }

// run() with extra environment assignments ("A=1 B=2").
inline Run run_env(const std::string& env, const std::string& args) {
  return run_cmd("env " + env + " " + std::string(HMOE_BINARY_DIR) + "/bin/hmoe " + args);
}

inline bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

}  // namespace hmoe::test
