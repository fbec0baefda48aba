// Batch: one step's tokens, from any number of sequences (prefill chunks and
// decode tokens mixed), with the rows that need logits.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/ops/cpu_ops.h"

namespace hmoe {

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<ops::TokenSlot> slots;  // same length as tokens
  std::vector<int64_t> logit_rows;    // rows (indices into tokens) that need logits
  void add(int32_t token, int seq, int64_t pos, bool want_logits) {
    tokens.push_back(token);
    slots.push_back({seq, pos});
    if (want_logits) logit_rows.push_back(static_cast<int64_t>(tokens.size()) - 1);
  }
  void clear() { tokens.clear(); slots.clear(); logit_rows.clear(); }
};

}  // namespace hmoe
