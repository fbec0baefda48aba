// Structured outputs (engine/grammar.h, engine/json_schema.h): the schema
// automaton against valid and invalid documents, unsupported keywords, the
// trie-walk mask against the scalar reference (every token fed from
// scratch) on random walks with random logits, and the Sampler on random
// logits: every run's output validates against its schema.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "engine/text/json_schema.h"
#include "engine/text/sampler.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "tests/schema_validator.h"
#include "tests/test_util.h"

using namespace hmoe;
using ojson = nlohmann::ordered_json;

namespace {

const tok::Tokenizer& tokenizer() {
  static auto t = tok::Tokenizer::from_dir(test::fixture_model("tiny-qwen3moe"));
  return *t;
}
const JsonVocab& vocab() {
  static JsonVocab v(tokenizer());
  return v;
}

bool accepts(const Grammar& g, const std::string& s, bool* complete = nullptr) {
  GrammarState st(&g);
  const bool ok = st.feed(s);
  if (complete) *complete = ok && st.complete();
  return ok;
}

const ojson kPerson = ojson::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer"},
    "role": {"enum": ["admin", "user", 3, null]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "boss": {"anyOf": [{"$ref": "#/$defs/ref"}, {"type": "null"}]},
    "score": {"type": ["number", "boolean"]}
  },
  "required": ["name", "age"],
  "additionalProperties": false,
  "$defs": {"ref": {"type": "object", "properties": {"id": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/ref"}, {"const": "end"}]}}, "required": ["id"], "additionalProperties": false}}
})");

const ojson kList = ojson::parse(R"({
  "type": "object",
  "properties": {
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {"k": {"type": "string", "minLength": 1, "maxLength": 3}, "v": {"type": "boolean"}}, "required": ["k", "v"], "additionalProperties": false}},
    "kind": {"const": "list"}
  },
  "required": ["items", "kind"],
  "additionalProperties": false
})");

}  // namespace

TEST_CASE("grammar: a schema's automaton takes valid documents and refuses invalid ones") {
  auto g = json_schema_grammar(kPerson);
  const std::vector<std::string> good = {
      R"({"name": "Al", "age": 30})",
      R"({"name":"","age":-0,"role":"admin"})",
      R"( {"name": "x", "age": 1, "role": 3, "tags": ["a", "bc"], "boss": null, "score": 1.5e3} )",
      R"({"name": "x", "age": 1, "boss": {"id": 2, "next": {"id": 3, "next": "end"}}, "score": true})",
      R"({"name": "\u00e9\n", "age": 12345})",
  };
  for (const auto& s : good) {
    CAPTURE(s);
    bool complete = false;
    CHECK(accepts(*g, s, &complete));
    CHECK(complete);
    CHECK(test::schema_violation(nlohmann::json::parse(s), nlohmann::json::parse(kPerson.dump())) == "");
    for (size_t i = 0; i < s.size(); ++i) CHECK(accepts(*g, s.substr(0, i)));  // every prefix
  }
  const std::vector<std::string> bad = {
      R"({"age": 30, "name": "Al"})",            // schema order
      R"({"name": "Al"})",                        // required age missing at '}'
      R"({"name": "Alice123", "age": 1})",        // maxLength
      R"({"name": "A", "age": 1.5})",             // integer
      R"({"name": "A", "age": 1, "x": 1})",       // additionalProperties false
      R"({"name": "A", "age": 1, "role": "root"})",  // enum
      R"({"name": "A", "age": 1, "tags": ["a","b","c","d"]})",  // maxItems
      R"({"name": "A", "age": 1, "score": "1"})",  // type array
      R"({"name": "A", "age": 1, "boss": {"next": "end"}})",  // required id in $ref
      R"([1])",
      R"({"name": "A", "age": 0123})",
  };
  for (const auto& s : bad) {
    CAPTURE(s);
    bool complete = false;
    CHECK(!(accepts(*g, s, &complete) && complete));
  }
  bool complete = false;
  CHECK(accepts(*g, R"({"name": "Al", "age": 30)", &complete));
  CHECK(!complete);
  auto top_int = json_schema_grammar(ojson{{"type", "integer"}});
  CHECK(accepts(*top_int, "42", &complete));
  CHECK(complete);  // a top-level number is whole without a byte after it
  CHECK(!accepts(*top_int, "4.2"));
}

TEST_CASE("grammar: unsupported or broken schemas throw SchemaError naming the keyword") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "string", "pattern": "^a"})", "pattern"},
      {R"({"type": "string", "format": "email"})", "format"},
      {R"({"type": "integer", "minimum": 1})", "minimum"},
      {R"({"oneOf": [{"type": "string"}]})", "oneOf"},
      {R"({"type": "object", "properties": {"a": {"allOf": []}}})", "allOf"},
      {R"({"type": "array", "prefixItems": []})", "prefixItems"},
      {R"({"type": "wat"})", "type"},
      {R"({"$ref": "http://x/y"})", "$ref"},
      {R"({"$ref": "#/$defs/missing"})", "$ref"},
      {R"({"$ref": "#"})", "$ref"},
      {R"({"enum": []})", "enum"},
      {R"({"type": "object", "required": ["a"], "properties": {}})", "required"},
  };
  for (const auto& [schema, keyword] : cases) {
    CAPTURE(schema);
    try {
      json_schema_grammar(ojson::parse(schema));
      CHECK_MESSAGE(false, "accepted");
    } catch (const SchemaError& e) {
      CHECK(e.keyword == keyword);
      CHECK(std::string(e.what()).find(keyword) != std::string::npos);
    }
  }
  // Lenient (tools not marked strict): the keyword is left out, the rest enforced.
  Grammar g;
  const int32_t root = compile_json_schema(g, ojson::parse(R"({"type": "integer", "minimum": 1})"), false);
  CHECK(g.nodes[static_cast<size_t>(root)].types == GrammarNode::t_integer);
}

TEST_CASE("grammar: the trie-walk mask equals the scalar reference on random walks") {
  const JsonVocab& v = vocab();
  const int64_t V = v.size() + 7;  // a model vocabulary with padding ids past the tokenizer
  const std::vector<int32_t> ends = {151645, 151643};
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  auto tool = tool_call_grammar({{"get_weather", ojson::parse(R"({"type":"object","properties":{"city":{"type":"string","maxLength":5},"unit":{"enum":["c","f"]}},"required":["city"]})"), false},
                                 {"noop", nullptr, false}});
  const std::vector<std::shared_ptr<const Grammar>> grammars = {json_schema_grammar(kPerson), json_schema_grammar(kList), tool};
  int steps = 0;
  for (size_t gi = 0; gi < grammars.size(); ++gi) {
    for (int walk = 0; walk < 2; ++walk) {
      GrammarState st(grammars[gi].get());
      for (int step = 0; step < 12; ++step) {
        std::vector<float> logits(static_cast<size_t>(V));
        for (auto& x : logits) x = nd(rng);
        std::vector<float> a = logits, b = logits;
        const int64_t na = grammar_mask(v, st, ends, a.data(), V);
        const int64_t nb = grammar_mask_reference(v, st, ends, b.data(), V);
        CAPTURE(gi);
        CAPTURE(step);
        REQUIRE(na == nb);
        REQUIRE(na > 0);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        ++steps;
        // Follow a random allowed token (not an end id).
        std::vector<int32_t> ok;
        for (int64_t i = 0; i < V; ++i)
          if (std::isfinite(b[static_cast<size_t>(i)]) && std::find(ends.begin(), ends.end(), i) == ends.end()) ok.push_back(static_cast<int32_t>(i));
        if (ok.empty()) break;
        const int32_t t = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
        REQUIRE(st.feed(v.bytes(t)));
      }
    }
  }
  CHECK(steps >= 30);
}

TEST_CASE("grammar: the sampler on random logits writes documents that validate, and a triggered tool call") {
  const JsonVocab& v = vocab();
  auto shared = std::make_shared<const JsonVocab>(tokenizer());
  const int64_t V = v.size();
  const std::vector<int32_t> ends = {151645};
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (const ojson& schema : {kPerson, kList}) {
    const nlohmann::json plain = nlohmann::json::parse(schema.dump());
    for (int run = 0; run < 4; ++run) {
      SamplingParams p;
      p.temperature = 1.0;
      p.seed = static_cast<uint64_t>(run) + 1;
      p.json = shared;
      p.json_end_ids = ends;
      p.grammar = json_schema_grammar(schema);
      Sampler s(p);
      std::string out;
      std::vector<int32_t> prompt{1}, output;
      std::vector<float> logits(static_cast<size_t>(V));
      bool ended = false;
      for (int i = 0; i < 400 && !ended; ++i) {
        for (auto& x : logits) x = nd(rng);
        const int32_t t = s.sample(logits.data(), V, prompt, output).token;
        output.push_back(t);
        if (t == ends[0]) ended = true;
        else out += v.bytes(t);
      }
      CAPTURE(out);
      REQUIRE(ended);
      const nlohmann::json doc = nlohmann::json::parse(out);
      CHECK(test::schema_violation(doc, plain) == "");
    }
  }
  // Trigger mode: free text, then "<tool_call>" starts the grammar; after the call, free again.
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 5;
  p.json = shared;
  p.json_end_ids = ends;
  p.grammar = tool_call_grammar({{"f", ojson::parse(R"({"type":"object","properties":{"x":{"type":"boolean"}},"required":["x"]})"), false}});
  p.grammar_trigger = "<tool_call>";
  Sampler s(p);
  std::vector<int32_t> prompt{1}, output;
  std::vector<float> logits(static_cast<size_t>(V));
  const auto call = tokenizer().encode("Sure.<tool_call>", false);
  std::string out;
  for (int32_t t : call) {  // force the free part through the logits
    for (auto& x : logits) x = nd(rng);
    logits[static_cast<size_t>(t)] = 1e4f;
    const int32_t got = s.sample(logits.data(), V, prompt, output).token;
    REQUIRE(got == t);
    output.push_back(got);
    out += v.bytes(got);
  }
  for (int i = 0; i < 200 && out.find("</tool_call>") == std::string::npos; ++i) {
    for (auto& x : logits) x = nd(rng);
    const int32_t t = s.sample(logits.data(), V, prompt, output).token;
    output.push_back(t);
    out += v.bytes(t);
  }
  CAPTURE(out);
  const size_t a = out.find("<tool_call>"), b = out.find("\n</tool_call>");
  REQUIRE(b != std::string::npos);
  const nlohmann::json body = nlohmann::json::parse(out.substr(a + 11, b - a - 11));
  CHECK(body["name"] == "f");
  CHECK(body["arguments"]["x"].is_boolean());
}

TEST_CASE("grammar: nested anyOf and many tools stay bounded") {
  // 15 levels of 16-way anyOf ($defs, so the schema itself stays small) would be 16^15 stacks
  // if every alternative were followed.
  ojson defs = {{"l0", {{"type", "integer"}}}};
  for (int d = 1; d <= 15; ++d) {
    const ojson ref = {{"$ref", "#/$defs/l" + std::to_string(d - 1)}};
    ojson alts = ojson::array({ref});
    for (int a = 1; a < 16; ++a) alts.push_back(ojson{{"type", "array"}, {"items", ref}, {"maxItems", a}});
    defs["l" + std::to_string(d)] = {{"anyOf", alts}};
  }
  const ojson leaf = {{"$defs", defs}, {"$ref", "#/$defs/l15"}};
  auto g = json_schema_grammar(leaf);
  GrammarState st(g.get());
  CHECK(st.feed(std::string("[[[")));
  // More than 16 tools: the name is one of them, the arguments any object.
  std::vector<ToolSchema> tools;
  for (int i = 0; i < 40; ++i) tools.push_back({"tool_" + std::to_string(i), ojson{{"type", "object"}}, false});
  auto tg = tool_call_grammar(tools);
  bool complete = false;
  CHECK(accepts(*tg, "{\"name\": \"tool_37\", \"arguments\": {\"x\": [1, {}]}}\n</tool_call>", &complete));
  CHECK(complete);
  CHECK(!accepts(*tg, "{\"name\": \"tool_40\""));
}
