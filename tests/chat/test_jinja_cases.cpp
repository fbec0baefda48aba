// Interpreter features against Python's jinja2, configured as transformers
// configures it: tests/chat/data/jinja_cases.json is made by
// tests/chat/data/make_jinja_cases.py (expected text, the render-time
// exception, or the syntax error and its line).
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "configs/error.h"
#include "engine/text/chat/interpreter.h"

using hmoe::Error;
using hmoe::ErrorKind;
using nlohmann::ordered_json;

namespace {

ordered_json load_cases() {
  std::ifstream f(std::string(HMOE_SOURCE_DIR) + "/tests/chat/data/jinja_cases.json");
  REQUIRE(f.good());
  return ordered_json::parse(f);
}

std::string py_type_of(const std::string& msg) {  // "chat template line 3: TypeError: ..." -> TypeError
  size_t colon = msg.find(": ");
  std::string rest = colon == std::string::npos ? msg : msg.substr(colon + 2);
  return rest.substr(0, rest.find(':'));
}

}  // namespace

TEST_CASE("jinja features match Python jinja2 (transformers' environment)") {
  ordered_json data = load_cases();
  hmoe::chat::RenderLimits limits;
  int text_ok = 0, error_ok = 0, rows = 0;
  for (auto& c : data["cases"]) {
    std::string tmpl = c["template"].get<std::string>();
    CAPTURE(tmpl);
    ++rows;
    if (c.contains("syntax_error")) {
      CHECK_THROWS_AS(hmoe::chat::Template{tmpl}, Error);
      continue;
    }
    hmoe::chat::Template t(tmpl);
    if (c.contains("text")) {
      std::string got;
      try {
        got = t.render(c["context"], limits);
      } catch (const Error& e) {
        FAIL_CHECK("unexpected error: " << e.what());
        continue;
      }
      CHECK(got == c["text"].get<std::string>());
      text_ok += got == c["text"].get<std::string>();
    } else {
      std::string want = c["error"].get<std::string>();
      CAPTURE(want);
      try {
        std::string got = t.render(c["context"], limits);
        FAIL_CHECK("expected an error, rendered: " << got);
      } catch (const Error& e) {
        CHECK(e.kind() == ErrorKind::invalid_argument);
        CHECK(py_type_of(e.what()) == want.substr(0, want.find(':')));
        ++error_ok;
      }
    }
  }
  MESSAGE(rows << " cases: " << text_ok << " texts equal, " << error_ok << " errors raised");
}

TEST_CASE("unparseable templates fail at construction with line:col") {
  ordered_json data = load_cases();
  for (auto& c : data["bad_templates"]) {
    std::string tmpl = c["template"].get<std::string>();
    CAPTURE(tmpl);
    try {
      hmoe::chat::Template t(tmpl);
      if (c.contains("syntax_error")) FAIL_CHECK("parsed a template jinja2 rejects");
      CHECK_THROWS_AS(t.render(ordered_json::object(), {}), Error);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::bad_model);
      std::string msg = e.what();
      CAPTURE(msg);
      if (c.contains("line"))
        CHECK(msg.find("chat template " + std::to_string(c["line"].get<int>()) + ":") != std::string::npos);
    }
  }
}
