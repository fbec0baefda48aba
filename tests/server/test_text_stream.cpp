// Sampler, stop strings and the output parser against plain references, on
// random data and random token boundaries.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/text/output_parser.h"
#include "engine/text/sampler.h"
#include "engine/text/stop_strings.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

// Splits s into random pieces (1..5 bytes).
std::vector<std::string> random_split(const std::string& s, std::mt19937_64& rng) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t n = std::min<size_t>(1 + rng() % 5, s.size() - p);
    out.push_back(s.substr(p, n));
    p += n;
  }
  return out;
}

std::vector<double> softmax_ref(const std::vector<float>& x, double temp) {
  double mx = -1e300;
  for (float v : x) mx = std::max(mx, static_cast<double>(v));
  std::vector<double> p(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += (p[i] = std::exp((x[i] - mx) / temp));
  for (auto& v : p) v /= s;
  return p;
}

}  // namespace

TEST_CASE("sampler: greedy is arg-max with ties to the lower id, after penalties") {
  const int64_t V = 1000;
  auto logits = test::random_floats(V, 11);
  logits[700] = logits[300] = 50.0f;  // tie
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  CHECK(s.sample(logits.data(), V, {}, {}).token == 300);

  // Repetition penalty (prompt + output) and presence/frequency (output only),
  // checked against the formula applied by hand.
  p.repetition_penalty = 1.7;
  p.presence_penalty = 0.9;
  p.frequency_penalty = 0.4;
  std::vector<int32_t> prompt = {5, 6, 7, 300}, output = {8, 8, 9, 700, 700, 700};
  std::vector<float> ref = logits;
  std::map<int32_t, int> cnt;
  for (int32_t t : output) ++cnt[t];
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  for (int32_t t : seen) ref[t] = ref[t] > 0 ? static_cast<float>(ref[t] / 1.7) : static_cast<float>(ref[t] * 1.7);
  for (auto [t, c] : cnt) ref[t] -= static_cast<float>(0.4 * c + 0.9);
  int32_t want = 0;
  for (int32_t i = 1; i < V; ++i)
    if (ref[i] > ref[want]) want = i;
  Sampler s2(p);
  CHECK(s2.sample(logits.data(), V, prompt, output).token == want);

  // logit_bias moves the arg-max.
  SamplingParams b;
  b.temperature = 0;
  b.logit_bias = {{42, 100.0f}};
  Sampler s3(b);
  CHECK(s3.sample(logits.data(), V, {}, {}).token == 42);
}

TEST_CASE("sampler: temperature draws follow softmax(logits / T); seeds reproduce") {
  const int64_t V = 8;
  std::vector<float> logits = {1.0f, 0.5f, -0.3f, 2.0f, 0.1f, -1.0f, 1.5f, 0.7f};
  SamplingParams p;
  p.temperature = 0.8;
  p.seed = 1234;
  Sampler s(p);
  const int N = 40000;
  std::vector<int> hist(V);
  for (int i = 0; i < N; ++i) ++hist[static_cast<size_t>(s.sample(logits.data(), V, {}, {}).token)];
  auto ref = softmax_ref(logits, 0.8);
  for (int64_t i = 0; i < V; ++i) {
    const double f = hist[static_cast<size_t>(i)] / static_cast<double>(N);
    const double sd = std::sqrt(ref[i] * (1 - ref[i]) / N);
    CHECK(std::fabs(f - ref[i]) < 5 * sd + 1e-4);
  }
  Sampler a(p), b2(p);
  p.seed = 99;
  Sampler c(p);
  std::vector<int32_t> xa, xb, xc;
  for (int i = 0; i < 64; ++i) {
    xa.push_back(a.sample(logits.data(), V, {}, {}).token);
    xb.push_back(b2.sample(logits.data(), V, {}, {}).token);
    xc.push_back(c.sample(logits.data(), V, {}, {}).token);
  }
  CHECK(xa == xb);
  CHECK(xa != xc);
}

TEST_CASE("sampler: top_k, top_p and min_p restrict the candidates") {
  const int64_t V = 500;
  auto logits = test::random_floats(V, 5, 2.0f);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  auto probs = softmax_ref(logits, 1.0);
  SUBCASE("top_k") {
    SamplingParams p;
    p.top_k = 3;
    p.seed = 7;
    Sampler s(p);
    std::set<int32_t> got;
    for (int i = 0; i < 2000; ++i) got.insert(s.sample(logits.data(), V, {}, {}).token);
    CHECK(got == std::set<int32_t>{order[0], order[1], order[2]});
  }
  SUBCASE("top_p keeps the smallest prefix reaching p") {
    SamplingParams p;
    p.top_p = 0.5;
    p.seed = 8;
    Sampler s(p);
    double acc = 0;
    std::set<int32_t> allowed;
    for (int32_t id : order) {
      allowed.insert(id);
      acc += probs[static_cast<size_t>(id)];
      if (acc >= 0.5) break;
    }
    std::set<int32_t> got;
    for (int i = 0; i < 4000; ++i) got.insert(s.sample(logits.data(), V, {}, {}).token);
    for (int32_t g : got) CHECK(allowed.count(g));
    CHECK(got.size() >= std::min<size_t>(allowed.size(), 2));
  }
  SUBCASE("min_p") {
    SamplingParams p;
    p.min_p = 0.3;
    p.seed = 9;
    Sampler s(p);
    const double pmax = probs[static_cast<size_t>(order[0])];
    for (int i = 0; i < 2000; ++i) CHECK(probs[static_cast<size_t>(s.sample(logits.data(), V, {}, {}).token)] >= 0.3 * pmax * (1 - 1e-9));
  }
  SUBCASE("logprobs are the raw log-softmax, top entries descending") {
    SamplingParams p;
    p.temperature = 0;
    p.logprobs = true;
    p.top_logprobs = 5;
    Sampler s(p);
    SampleResult r = s.sample(logits.data(), V, {}, {});
    CHECK(r.token == order[0]);
    CHECK(r.logprob == doctest::Approx(std::log(probs[static_cast<size_t>(order[0])])).epsilon(1e-5));
    REQUIRE(r.top.size() == 5);
    for (size_t i = 0; i < 5; ++i) {
      CHECK(r.top[i].id == order[i]);
      CHECK(r.top[i].logprob == doctest::Approx(std::log(probs[static_cast<size_t>(order[i])])).epsilon(1e-5));
    }
  }
}

TEST_CASE("stop strings: found across any token boundaries, never emitted") {
  std::mt19937_64 rng(3);
  const std::vector<std::string> stops = {"STOP", "\n\nUser:", "abab"};
  const std::string alphabet = "abST OP\nUser:xé";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text;
    const size_t len = rng() % 40;
    for (size_t i = 0; i < len; ++i) {
      if (rng() % 12 == 0) text += stops[rng() % stops.size()];
      else text += alphabet[rng() % alphabet.size()];
    }
    // Reference: cut at the earliest occurrence of any stop string.
    size_t cut = std::string::npos;
    for (const auto& s : stops) cut = std::min(cut, text.find(s));
    const std::string want = cut == std::string::npos ? text : text.substr(0, cut);
    StopMatcher m(stops);
    std::string got;
    for (const auto& piece : random_split(text, rng)) {
      got += m.push(piece);
      if (m.stopped()) break;
    }
    got += m.finish();
    CHECK(got == want);
    CHECK(m.stopped() == (cut != std::string::npos));
  }
  StopMatcher none({});
  CHECK(none.push("abc") == "abc");
}

TEST_CASE("output parser: think and tool_call blocks, whatever the chunking") {
  std::mt19937_64 rng(4);
  struct Case {
    std::string text;
    bool start_reasoning;
    std::string content, reasoning;
    std::vector<std::pair<std::string, std::string>> calls;
  };
  const std::vector<Case> cases = {
      {"plain text < with <b> tags", false, "plain text < with <b> tags", "", {}},
      {"<think>\nsome thought\n</think>\n\nThe answer.", false, "\n\nThe answer.", "\nsome thought\n", {}},
      {"reasoning first</think>answer", true, "answer", "reasoning first", {}},
      {"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f2\", "
       "\"arguments\": {}}\n</tool_call>",
       false,
       "Let me check.\n",
       "",
       {{"get_weather", "{\"city\":\"Paris\"}"}, {"f2", "{}"}}},
      {"<tool_call>not json</tool_call> tail", false, "<tool_call>not json</tool_call> tail", "", {}},
      {"cut <tool_call>{\"name\": \"x\"", false, "cut ", "", {}},  // a call cut off by max_tokens: dropped, never content
  };
  for (const Case& c : cases) {
    for (int rep = 0; rep < 50; ++rep) {
      OutputParser p(true, true, c.start_reasoning, 77);
      ParsedDelta all;
      for (const auto& piece : random_split(c.text, rng)) {
        ParsedDelta d = p.push(piece);
        // No partial tag ever leaks into content.
        CHECK((d.content.find("<tool_c") == d.content.npos || c.calls.empty()));
        all.append(std::move(d));
      }
      all.append(p.finish());
      CHECK(all.content == c.content);
      CHECK(all.reasoning == c.reasoning);
      REQUIRE(all.tool_calls.size() == c.calls.size());
      for (size_t i = 0; i < c.calls.size(); ++i) {
        CHECK(all.tool_calls[i].name == c.calls[i].first);
        CHECK(all.tool_calls[i].arguments == c.calls[i].second);
        CHECK(all.tool_calls[i].id.rfind("call_", 0) == 0);
      }
    }
  }
  // Tools off: tags stay text.
  OutputParser off(false, false);
  ParsedDelta d = off.push("<tool_call>{\"name\":\"a\"}</tool_call><think>x</think>");
  d.append(off.finish());
  CHECK(d.content == "<tool_call>{\"name\":\"a\"}</tool_call><think>x</think>");
  CHECK(prompt_opens_think("<|im_start|>assistant\n<think>\n"));
  CHECK(!prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}
