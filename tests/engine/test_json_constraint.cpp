// JSON mode (engine/text/json_constraint.h): the byte automaton against valid and
// invalid documents, the token mask against a walk of every token, and the
// Sampler in JSON mode on random logits with the real Qwen3 tokenizer: every
// run ends in one parseable JSON object.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "engine/text/json_constraint.h"
#include "engine/text/sampler.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

const tok::Tokenizer& tokenizer() {
  static auto t = tok::Tokenizer::from_dir(test::fixture_model("tiny-qwen3moe"));
  return *t;
}

bool accepts(const std::string& s, bool* complete = nullptr) {
  JsonState st;
  const bool ok = st.feed(s);
  if (complete) *complete = ok && st.complete();
  return ok;
}

}  // namespace

TEST_CASE("JSON automaton: valid objects, every prefix, and refusals") {
  const std::vector<std::string> good = {
      "{}",
      " {\"a\": 1}",
      "{\"a\":[1,-2.5e+3,0,0.25,1E9,true,false,null,\"x\"],\"b\":{\"c\":{}}}",
      "{\"s\": \"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 caf\xc3\xa9\"}\n",
      "{\"nested\": [[[]], [{}], {\"k\": [1, 2]}]}",
  };
  for (const auto& g : good) {
    CAPTURE(g);
    bool complete = false;
    CHECK(accepts(g, &complete));
    CHECK(complete);
    CHECK(nlohmann::json::parse(g).is_object());
    for (size_t n = 0; n + 1 < g.size(); ++n) {  // every proper prefix is a prefix, not yet complete (or trailing blanks)
      bool c = false;
      CHECK(accepts(g.substr(0, n), &c));
      if (c) CHECK(g.substr(n).find_first_not_of(" \n\t\r") == std::string::npos);
    }
  }
  const std::vector<std::string> bad = {"[1]",        "\"s\"",      "1",          "{,}",          "{\"a\":1,}",  "{a:1}",      "{\"a\" 1}",
                                        "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}",  "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":tru}", "{} x",
                                        "{\"a\":[1,]}", "{\"a\":\"\\u12g4\"}", "{\"a\":1}}", "{]"};
  for (const auto& b : bad) {
    CAPTURE(b);
    bool complete = false;
    const bool ok = accepts(b, &complete);
    CHECK((!ok || !complete));
    if (b != "{\"a\":tru}") CHECK_FALSE(ok);  // "tru" is a prefix of true: accepted, just not complete
  }
  CHECK_FALSE(accepts("{" + std::string(21, ' ')));  // runs of blanks are capped
}

TEST_CASE("JSON mask: the allowed tokens are exactly those whose bytes the automaton takes") {
  const JsonVocab v(tokenizer());
  const int64_t V = v.size();
  const std::vector<int32_t> ends = {*tokenizer().token_to_id("<|im_end|>")};
  for (const std::string prefix : {"", "{", "{\"ke", "{\"key\": ", "{\"key\": [1, 2", "{\"key\": \"va\\", "{\"a\": {\"b\": tr", "{\"a\": 1}"}) {
    CAPTURE(prefix);
    JsonState st;
    REQUIRE(st.feed(prefix));
    std::vector<float> row(static_cast<size_t>(V), 1.0f);
    const int64_t allowed = json_mask(v, st, ends, row.data(), V);
    int64_t walked = 0;
    for (int32_t id = 0; id < V; ++id) {
      bool want;
      if (st.complete()) {
        want = id == ends[0];
      } else {
        JsonState s = st;
        want = !v.special(id) && s.feed(v.bytes(id));
      }
      walked += want;
      if (want != (row[static_cast<size_t>(id)] == 1.0f)) {
        FAIL_CHECK("token " << id << " '" << v.bytes(id) << "': mask " << (row[static_cast<size_t>(id)] == 1.0f) << ", walk " << want);
        break;
      }
    }
    CHECK(allowed == walked);
    CHECK(allowed > 0);
  }
}

TEST_CASE("Sampler in JSON mode: random logits always end in one JSON object") {
  const auto v = std::make_shared<const JsonVocab>(tokenizer());
  const int64_t V = v->size();
  const int32_t end = *tokenizer().token_to_id("<|im_end|>");
  // Nudges so that runs finish: closing quotes/braces and the end id get a bonus.
  std::vector<int32_t> nudged = {end};
  for (const char* s : {"\"", "}", "\"}", "]"})
    for (int32_t id : tokenizer().encode(s)) nudged.push_back(id);
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    SamplingParams p;
    p.temperature = seed % 3 == 0 ? 0.0 : 1.0;
    p.seed = seed;
    p.json = v;
    p.json_end_ids = {end};
    Sampler sm(p);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<int32_t> out;
    std::vector<float> logits(static_cast<size_t>(V));
    bool ended = false;
    for (int step = 0; step < 400 && !ended; ++step) {
      for (auto& x : logits) x = nd(rng);
      for (int32_t id : nudged) logits[static_cast<size_t>(id)] += 9.0f;
      const SampleResult r = sm.sample(logits.data(), V, {}, out);
      if (r.token == end) ended = true;
      else out.push_back(r.token);
    }
    CAPTURE(tokenizer().decode(out));
    REQUIRE(ended);
    const std::string text = tokenizer().decode(out);
    CAPTURE(text);
    nlohmann::json j;
    REQUIRE_NOTHROW(j = nlohmann::json::parse(text));
    CHECK(j.is_object());
  }
}
