// Comparison of one row of logits against a reference fixture's top-10
// (Hugging Face transformers' fp32 outputs), shared by the fixture tests.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/serving/logits.h"

namespace hmoe::test {

// Checks every reference id's logit and every rank's value within tol, and
// the same id at a rank wherever the reference's neighbours are more than
// 2*tol apart. max_diff accumulates the largest |logit - reference|.
inline void check_top10(const float* row, int64_t vocab, const nlohmann::json& ref_ids, const nlohmann::json& ref_logits,
                        const std::string& where, double& max_diff, double tol = 2e-3) {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  top_k(row, vocab, 10, ids, vals);
  REQUIRE(ref_ids.size() == 10);
  for (size_t r = 0; r < 10; ++r) {
    const double ref = ref_logits[r].get<double>();
    const int32_t rid = ref_ids[r].get<int32_t>();
    REQUIRE(rid >= 0);
    REQUIRE(rid < vocab);
    const double mine = row[rid];
    max_diff = std::max(max_diff, std::fabs(mine - ref));
    CHECK_MESSAGE(std::fabs(mine - ref) <= tol, where << " rank " << r << " id " << rid << ": " << mine << " vs " << ref);
    CHECK_MESSAGE(std::fabs(vals[r] - ref) <= tol, where << " rank " << r << " value " << vals[r] << " vs " << ref);
    const double gap_prev = r > 0 ? ref_logits[r - 1].get<double>() - ref : 1e9;
    const double gap_next = r < 9 ? ref - ref_logits[r + 1].get<double>() : 1e9;
    if (gap_prev > 2 * tol && gap_next > 2 * tol) CHECK_MESSAGE(ids[r] == rid, where << " rank " << r);
  }
}

}  // namespace hmoe::test
