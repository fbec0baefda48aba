// Top-1 agreement of a model with a Hugging Face reference fixture
// (hf_reference.json: per chat the prompt ids, the top 10 logits of every
// prompt position, greedy ids and their top 10), shared by the CPU
// emulation test of the GPU's roundings (tests/engine) and the GPU fixture
// tests (tests/gpu). Prompt rows from one forward of the prompt, then the
// reference's greedy ids teacher-forced one decode step at a time. A row
// counts where the reference's top-1/top-2 margin exceeds `min_margin`;
// per row it records the margin, whether our top-1 is the reference's, and
// the largest |our logit - reference logit| over the reference's top 10.
// No doctest checks here: callers assert on the result.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/loading/model.h"
#include "engine/serving/logits.h"

namespace hmoe::test {

struct AgreementRow {
  std::string where;   // "chat C prompt P" / "chat C step S"
  double margin = 0;   // reference top-1 minus top-2
  double worst = 0;    // max |diff| over the reference's top-10 ids
  bool agree = false;  // our top-1 is the reference's
};

struct Agreement {
  std::vector<AgreementRow> rows;  // rows with margin > min_margin
  double worst = 0;                // over every row, whatever its margin
  int64_t checked = 0, agree = 0;
  int64_t clear = 0, clear_agree = 0;  // margin > 2
  double worst_missed_margin = 0;
  int64_t greedy_same = 0;  // steps our own greedy id equals the reference's, up to the first difference, summed over chats

  // "A/B rows with margin > m (C/D with margin > 2), worst |diff| W; misses: where (margin, |diff|) ..."
  std::string summary(size_t max_misses = 64) const {
    std::ostringstream o;
    o << agree << "/" << checked << " rows of margin > 0.5 (" << clear_agree << "/" << clear << " of margin > 2), max |diff| over the top 10s " << worst;
    size_t shown = 0;
    for (const AgreementRow& r : rows)
      if (!r.agree && shown++ < max_misses) o << "\n  miss: " << r.where << " margin " << r.margin << " max |diff| " << r.worst;
    return o.str();
  }
};

inline Agreement reference_agreement(Model& model, const nlohmann::json& ref, double min_margin = 0.5) {
  Agreement a;
  const int64_t V = model.config().vocab_size;
  auto row = [&](const float* lg, const nlohmann::json& ids, const nlohmann::json& vals, const std::string& where) {
    double worst = 0;
    for (size_t r = 0; r < ids.size(); ++r) worst = std::max(worst, std::fabs(static_cast<double>(lg[ids[r].get<int32_t>()]) - vals[r].get<double>()));
    a.worst = std::max(a.worst, worst);
    const double margin = vals[0].get<double>() - vals[1].get<double>();
    if (margin <= min_margin) return;
    const bool same = argmax(lg, V) == ids[0].get<int32_t>();
    a.rows.push_back({where, margin, worst, same});
    ++a.checked;
    a.agree += same;
    if (margin > 2) {
      ++a.clear;
      a.clear_agree += same;
    }
    if (!same) a.worst_missed_margin = std::max(a.worst_missed_margin, margin);
  };
  for (size_t c = 0; c < ref["chats"].size(); ++c) {
    const auto& chat = ref["chats"][c];
    const auto ids = chat["ids"].get<std::vector<int32_t>>();
    const auto greedy = chat["greedy_ids"].get<std::vector<int32_t>>();
    const int64_t total = static_cast<int64_t>(ids.size() + greedy.size());
    KvCache kv(model.kv_layout(), total / 16 + 2, 16);
    const int seq = kv.add_sequence();
    kv.reserve(seq, total);
    Batch b;
    for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
    std::vector<float> logits;
    model.forward(b, kv, logits);
    for (size_t p = 0; p < ids.size(); ++p)
      row(logits.data() + p * static_cast<size_t>(V), chat["top10_ids"][p], chat["top10_logits"][p], "chat " + std::to_string(c) + " prompt " + std::to_string(p));
    std::vector<float> last(logits.end() - V, logits.end());
    int64_t pos = static_cast<int64_t>(ids.size());
    bool same = true;
    for (size_t step = 0; step < greedy.size(); ++step) {
      row(last.data(), chat["greedy_top10_ids"][step], chat["greedy_top10_logits"][step], "chat " + std::to_string(c) + " step " + std::to_string(step));
      same = same && argmax(last.data(), V) == greedy[step];
      a.greedy_same += same;
      if (step + 1 == greedy.size()) break;
      b.clear();
      b.add(greedy[step], seq, pos++, true);
      model.forward(b, kv, last);
    }
  }
  return a;
}

}  // namespace hmoe::test
