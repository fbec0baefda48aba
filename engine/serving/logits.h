// Small reductions over one row of logits: arg-max, top-k and log-sum-exp.
// Ties go to the lower token id, as torch.topk and argmax do on CPU.
#pragma once
#include <cstdint>
#include <vector>

namespace hmoe {

int32_t argmax(const float* logits, int64_t n);
// The k largest, in descending order of logit.
void top_k(const float* logits, int64_t n, int64_t k, std::vector<int32_t>& ids, std::vector<float>& values);
double logsumexp(const float* logits, int64_t n);

}  // namespace hmoe
