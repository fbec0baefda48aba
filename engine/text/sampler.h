// Sampler: turns one row of logits into the next token of one sequence.
//
// Order of operations (as vLLM applies them): logit_bias, repetition penalty over prompt
// and output tokens, presence/frequency penalties over output tokens, the
// JSON-mode mask (when asked), then
// greedy (temperature 0: arg-max, ties to the lower id) or temperature,
// top_k, top_p, min_p and a draw from the sequence's own RNG. Logprobs are
// those of the model's raw distribution (log-softmax of the unmodified
// logits), as vLLM reports by default.
//
// Determinism: a Sampler owns its RNG, seeded from the request's seed (or a
// seed the caller picks), so the same seed gives the same tokens whatever
// else is in the batch. Candidates are ordered by (probability desc, id asc)
// before the draw, so results do not depend on sort stability.
//
// Thread safety: one Sampler per sequence; sample() is not re-entrant.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/text/grammar.h"
#include "engine/text/json_constraint.h"

namespace hmoe {

struct SamplingParams {
  double temperature = 1.0;         // 0 = greedy
  double top_p = 1.0;               // (0, 1]
  int64_t top_k = 0;                // <= 0: off
  double min_p = 0.0;               // [0, 1]
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // > 0; 1 = off
  uint64_t seed = 0;
  int top_logprobs = 0;  // alternatives reported per token (0..20)
  bool logprobs = false;  // report the chosen token's logprob
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits first (OpenAI logit_bias)
  // JSON mode (engine/json_constraint.h): after the penalties, tokens that
  // cannot continue one JSON object are masked; json_end_ids may end it.
  std::shared_ptr<const JsonVocab> json;
  std::vector<int32_t> json_end_ids;
  // Structured output (engine/grammar.h; needs `json` for the token bytes):
  // tokens that cannot continue the grammar are masked (instead of JSON
  // mode), json_end_ids only once it is complete. With a trigger, sampling
  // is free until the output ends with the trigger text; the grammar then
  // runs from there and sampling is free again once it is complete (a tool
  // call the model starts on its own under tool_choice "auto").
  std::shared_ptr<const Grammar> grammar;
  std::string grammar_trigger;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;            // of `token` under the raw distribution (when asked)
  std::vector<TokenLogprob> top;   // top_logprobs entries, descending
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  const SamplingParams& params() const { return p_; }

  // logits: one row of `vocab` floats (not modified). prompt/output: the
  // sequence's prompt and generated ids so far (for the penalties).
  SampleResult sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt, std::span<const int32_t> output);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> cand_;
  std::vector<double> probs_;
  JsonState json_;  // JSON mode: the output so far
  GrammarState grammar_;
  bool grammar_on_ = false;
  std::string tail_;  // trigger mode: the last bytes of the output
  void grammar_feed(int32_t token);
};

}  // namespace hmoe
