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

#include "tests/server/serve_process.h"
#include "tests/server/server_fixture.h"

using namespace hmoe::test;
using nlohmann::json;

namespace {

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
