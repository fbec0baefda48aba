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

  // Open streams, then SIGTERM: a chat stream ends with an error event
  // (code shutting_down; finish_reason only takes OpenAI's values) and
  // [DONE]; so does every choice of an n = 2 stream; a /v1/responses stream
  // ends with an "error" event (no response.completed). The process exits 0.
  auto read_until = [](int fd, std::string& got, auto&& done) {
    char buf[4096];
    while (!done(got)) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      REQUIRE(n > 0);
      got.append(buf, static_cast<size_t>(n));
    }
  };
  json b = chat_body(0, 3000);
  b["stream"] = true;
  int fd = connect_raw(srv.port);
  send_all(fd, make_request("POST", "/v1/chat/completions", b.dump()));
  std::string got;
  read_until(fd, got, [](const std::string& g) { return g.find("motifs") != std::string::npos; });
  json bn = b;
  bn["n"] = 2;
  int fdn = connect_raw(srv.port);
  send_all(fdn, make_request("POST", "/v1/chat/completions", bn.dump()));
  std::string gotn;
  read_until(fdn, gotn, [](const std::string& g) { return g.find("\"index\":0") != std::string::npos && g.find("\"index\":1") != std::string::npos; });
  json rb{{"input", b["messages"]}, {"max_output_tokens", 3000}, {"temperature", 0}, {"stream", true}};
  int fdr = connect_raw(srv.port);
  send_all(fdr, make_request("POST", "/v1/responses", rb.dump()));
  std::string gotr;
  read_until(fdr, gotr, [](const std::string& g) { return g.find("response.in_progress") != std::string::npos; });
  REQUIRE(::kill(srv.pid, SIGTERM) == 0);
  got += recv_all(fd, 20000);
  gotn += recv_all(fdn, 20000);
  gotr += recv_all(fdr, 20000);
  ::close(fd);
  ::close(fdn);
  ::close(fdr);
  HttpReply r = parse_reply(got);
  StreamResult s = collect_stream(r);
  CHECK(s.done);
  CHECK(s.finish_reason.empty());
  CHECK(s.error_code == "shutting_down");
  HttpReply rn = parse_reply(gotn);
  StreamResult sn = collect_stream(rn);
  CHECK(sn.done);
  CHECK(sn.finish_reason.empty());
  int errors = 0;
  for (const auto& e : rn.events)
    if (e != "[DONE]" && json::parse(e).contains("error")) {
      CHECK(json::parse(e)["error"]["code"] == "shutting_down");
      ++errors;
    }
  CHECK(errors == 2);
  HttpReply rr = parse_reply(gotr);
  REQUIRE(!rr.events.empty());
  const json last = json::parse(rr.events.back());
  CAPTURE(rr.events.back());
  CHECK(last["type"] == "error");
  CHECK(last["code"] == "shutting_down");
  for (const auto& e : rr.events) CHECK(json::parse(e)["type"] != "response.completed");
  CHECK(gotr.find("abort") == std::string::npos);
  CHECK(gotn.find("abort") == std::string::npos);
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
