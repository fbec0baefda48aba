// Bad input must give hmoe::Error, never a crash or a hang: hostile
// templates (unbounded loops, recursion, exponential strings, cycles) and
// hostile requests (deep nesting, huge content, wrong types).
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "configs/error.h"
#include "engine/text/chat/chat_template.h"

using hmoe::Error;
using hmoe::ErrorKind;
using hmoe::chat::ChatTemplate;
using nlohmann::ordered_json;

namespace {

ordered_json simple_request() {
  return ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
}

void expect_render_error(const std::string& tmpl, const ordered_json& req = simple_request()) {
  CAPTURE(tmpl);
  ChatTemplate t(tmpl, "", "");
  auto start = std::chrono::steady_clock::now();
  try {
    t.render(req);
    FAIL_CHECK("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    MESSAGE(std::string(e.what()));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

}  // namespace

TEST_CASE("hostile templates hit limits, not the stack or the clock") {
  expect_render_error("{% for i in range(1000000000) %}x{% endfor %}");
  expect_render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  expect_render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  expect_render_error("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}");
  expect_render_error("{{ 'x' * 10000000000 }}");
  expect_render_error("{% set ns = namespace(x=none) %}{% set ns.x = ns %}{{ ns }}");
  expect_render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}");
  expect_render_error("{{ raise_exception('Only user and assistant roles are supported!') }}");
  expect_render_error("{{ messages[0].content.nope.deeper }}");
  expect_render_error("{{ 2 ** 100000000000 }}{{ [1] * 100000000000 }}");
}

TEST_CASE("raise_exception's message reaches the caller") {
  ChatTemplate t("{% if messages[0].role != 'system' %}{{ raise_exception('first must be system') }}{% endif %}", "", "");
  try {
    t.render(simple_request());
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("first must be system") != std::string::npos);
  }
}

TEST_CASE("deeply nested templates fail to parse cleanly") {
  std::string parens = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  CHECK_THROWS_AS(ChatTemplate(parens, "", ""), Error);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  for (int i = 0; i < 5000; ++i) ifs += "{% endif %}";
  CHECK_THROWS_AS(ChatTemplate(ifs, "", ""), Error);
  std::string filters = "{{ 'x'" ;
  for (int i = 0; i < 100000; ++i) filters += "|upper";
  filters += " }}";
  CHECK_THROWS_AS(ChatTemplate(filters, "", ""), Error);  // would nest 100000 deep
  std::string ok = "{{ 'x'";
  for (int i = 0; i < 1000; ++i) ok += "|upper";
  ChatTemplate t(ok + " }}", "", "");
  CHECK(t.render(simple_request()) == "X");
}

TEST_CASE("indices of more digits than 64 bits hold are template errors or keys, not std::out_of_range") {
  // str.format: a positional index of 23 digits is an IndexError like any index past the arguments.
  expect_render_error("{{ '{99999999999999999999999}'.format(1) }}");
  expect_render_error("{{ '{18446744073709551616}'.format(1) }}");
  // An attribute path part of 23 digits is looked up as a key (and is undefined), as a list index would be.
  ChatTemplate t("{{ messages | map(attribute='99999999999999999999999') | list | length }}", "", "");
  CHECK(t.render(simple_request()) == "1");
}

TEST_CASE("hostile requests") {
  ChatTemplate t("{% for m in messages %}{{ m.role }}:{{ m.content }}|{{ m.extra | tojson }}{% endfor %}", "", "");
  // Nesting far past the limit is refused, not recursed into.
  std::string deep(200000, '[');
  deep += std::string(200000, ']');
  ordered_json req = simple_request();
  req["messages"][0]["extra"] = ordered_json::parse(deep);
  CHECK_THROWS_AS(t.render(req), Error);
  // 8 MiB of content renders (and fast).
  ordered_json big = simple_request();
  big["messages"][0]["content"] = std::string(8u << 20, 'a');
  big["messages"][0]["extra"] = 1;
  CHECK(t.render(big).size() > (8u << 20));
  // Wrong shapes.
  CHECK_THROWS_AS(t.render(ordered_json::parse(R"({"messages": "nope"})")), Error);
  CHECK_THROWS_AS(t.render(ordered_json::parse(R"([1, 2])")), Error);
  CHECK_THROWS_AS(t.render(ordered_json::parse(R"({"messages": [], "chat_template_kwargs": 5})")), Error);
  ChatTemplate q("{{ messages[0].content.startswith('x') }}{{ messages | length }}", "", "");
  CHECK_THROWS_AS(q.render(ordered_json::parse(R"({"messages": [{"content": 5}]})")), Error);
  CHECK(q.render(ordered_json::parse(R"({"messages": [{"content": "xy"}]})")) == "True1");
  // Invalid UTF-8 in content passes through byte for byte; slicing never crashes.
  ChatTemplate s("{{ messages[0].content }}|{{ messages[0].content[::-1] | length }}", "", "");
  ordered_json bad = simple_request();
  bad["messages"][0]["content"] = std::string("a\xC3", 2);
  CHECK_NOTHROW(s.render(bad));
}
