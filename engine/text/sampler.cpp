#include "engine/text/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/serving/logits.h"

namespace hmoe {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  if (p_.grammar && p_.json && p_.grammar_trigger.empty()) {
    grammar_ = GrammarState(p_.grammar.get());
    grammar_on_ = true;
  }
}

void Sampler::grammar_feed(int32_t token) {
  if (!p_.grammar || !p_.json || token >= p_.json->size() || p_.json->special(token)) return;
  const std::string& b = p_.json->bytes(token);
  if (grammar_on_) {
    if (std::find(p_.json_end_ids.begin(), p_.json_end_ids.end(), token) != p_.json_end_ids.end()) return;
    grammar_.feed(b);
    if (!p_.grammar_trigger.empty() && grammar_.complete()) grammar_on_ = false;  // the call is closed: free again
    return;
  }
  if (p_.grammar_trigger.empty()) return;
  const size_t keep = p_.grammar_trigger.size() - 1;
  const size_t from = tail_.size() > keep ? tail_.size() - keep : 0;
  tail_.erase(0, from);
  const size_t start = tail_.size();
  tail_ += b;
  const size_t at = tail_.find(p_.grammar_trigger);
  if (at == std::string::npos || at + p_.grammar_trigger.size() <= start) return;
  grammar_ = GrammarState(p_.grammar.get());
  grammar_on_ = grammar_.feed(std::string_view(tail_).substr(at + p_.grammar_trigger.size()));
  tail_.clear();
}

SampleResult Sampler::sample(const float* logits, int64_t vocab, std::span<const int32_t> prompt, std::span<const int32_t> output) {
  SampleResult res;
  const bool penalties = !p_.logit_bias.empty() || p_.repetition_penalty != 1.0 || p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0;
  const float* row = logits;
  if (penalties) {
    work_.assign(logits, logits + vocab);
    for (auto [t, b] : p_.logit_bias)
      if (t >= 0 && t < vocab) work_[static_cast<size_t>(t)] += b;
    if (p_.repetition_penalty != 1.0) {
      std::vector<bool> seen(static_cast<size_t>(vocab), false);
      auto mark = [&](int32_t t) {
        if (t >= 0 && t < vocab && !seen[static_cast<size_t>(t)]) {
          seen[static_cast<size_t>(t)] = true;
          float& x = work_[static_cast<size_t>(t)];
          x = x > 0 ? static_cast<float>(x / p_.repetition_penalty) : static_cast<float>(x * p_.repetition_penalty);
        }
      };
      for (int32_t t : prompt) mark(t);
      for (int32_t t : output) mark(t);
    }
    if (p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0) {
      std::unordered_map<int32_t, int64_t> counts;
      for (int32_t t : output)
        if (t >= 0 && t < vocab) ++counts[t];
      for (auto [t, c] : counts)
        work_[static_cast<size_t>(t)] -= static_cast<float>(p_.frequency_penalty * static_cast<double>(c) + p_.presence_penalty);
    }
    row = work_.data();
  }
  if (p_.json && grammar_on_) {
    if (!penalties) work_.assign(logits, logits + vocab);
    static const std::vector<int32_t> kNone;  // a triggered grammar never ends the sequence
    grammar_mask(*p_.json, grammar_, p_.grammar_trigger.empty() ? p_.json_end_ids : kNone, work_.data(), vocab);
    row = work_.data();
  } else if (p_.json && !p_.grammar) {
    if (!penalties) work_.assign(logits, logits + vocab);
    json_mask(*p_.json, json_, p_.json_end_ids, work_.data(), vocab);  // nothing allowed: the row stays as it was
    row = work_.data();
  }

  if (p_.temperature <= 0.0) {
    res.token = argmax(row, vocab);
  } else {
    // Candidates: all ids, or the top_k; ordered by (logit desc, id asc)
    // where an order matters. top_p sorts only as far as needed: the k best
    // by partial sort, growing k until their mass reaches top_p.
    const int64_t k = p_.top_k > 0 ? std::min<int64_t>(p_.top_k, vocab) : vocab;
    cand_.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) cand_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    auto better = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
    if (k < vocab) {
      std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), better);
      cand_.resize(static_cast<size_t>(k));
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (int32_t id : cand_) mx = std::max(mx, static_cast<double>(row[id]));
    double sum = 0;
    for (int32_t id : cand_) sum += std::exp((static_cast<double>(row[id]) - mx) / p_.temperature);
    const double pmax = 1.0;  // the best candidate's weight, exp(0)
    size_t n = cand_.size();
    if (p_.top_p < 1.0) {  // smallest prefix whose mass reaches top_p (at least one)
      size_t sorted = k < vocab ? cand_.size() : 0;
      for (size_t want = 64;; want *= 4) {
        if (sorted < std::min(want, cand_.size())) {
          sorted = std::min(want, cand_.size());
          std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(sorted), cand_.end(), better);
        }
        double acc = 0;
        size_t keep = 0;
        while (keep < sorted) {
          acc += std::exp((static_cast<double>(row[cand_[keep++]]) - mx) / p_.temperature) / sum;
          if (acc >= p_.top_p) break;
        }
        if (acc >= p_.top_p || sorted == cand_.size()) {
          n = keep;
          break;
        }
      }
    }
    probs_.resize(n);
    for (size_t i = 0; i < n; ++i) probs_[i] = std::exp((static_cast<double>(row[cand_[i]]) - mx) / p_.temperature);
    if (p_.min_p > 0.0) {
      const double floor = p_.min_p * pmax;
      size_t w = 0;
      for (size_t i = 0; i < n; ++i)
        if (probs_[i] >= floor) {
          cand_[w] = cand_[i];
          probs_[w++] = probs_[i];
        }
      n = std::max<size_t>(w, 1);
    }
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += probs_[i];
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * total;
    double acc = 0;
    res.token = cand_[n - 1];
    for (size_t i = 0; i < n; ++i) {
      acc += probs_[i];
      if (u < acc) {
        res.token = cand_[i];
        break;
      }
    }
  }

  if (p_.grammar) grammar_feed(res.token);
  else if (p_.json && res.token < p_.json->size() &&
      std::find(p_.json_end_ids.begin(), p_.json_end_ids.end(), res.token) == p_.json_end_ids.end())
    json_.feed(p_.json->bytes(res.token));
  if (p_.logprobs || p_.top_logprobs > 0) {
    const double lse = logsumexp(logits, vocab);
    res.logprob = static_cast<float>(static_cast<double>(logits[res.token]) - lse);
    if (p_.top_logprobs > 0) {
      std::vector<int32_t> ids;
      std::vector<float> vals;
      top_k(logits, vocab, p_.top_logprobs, ids, vals);
      for (size_t i = 0; i < ids.size(); ++i) res.top.push_back({ids[i], static_cast<float>(static_cast<double>(vals[i]) - lse)});
    }
  }
  return res;
}

}  // namespace hmoe
