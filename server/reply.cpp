#include "server/reply.h"

namespace hmoe::server {

using ojson = nlohmann::ordered_json;

ChatReply::ChatReply(const GenSpec& spec, const ModelInfo& m, const std::string& id, int64_t created) {
  for (int64_t i = 0; i < std::max<int64_t>(spec.n, 1); ++i) {
    b_.push_back(std::make_unique<CompletionBuilder>(spec, m, id, created));
    b_.back()->set_index(static_cast<int>(i));
  }
}

int64_t ChatReply::completion_tokens() const {
  int64_t n = 0;
  for (const auto& b : b_) n += b->completion_tokens();
  return n;
}

ojson ChatReply::usage() const {
  ojson u = b_[0]->usage();
  u["completion_tokens"] = completion_tokens();
  u["total_tokens"] = prompt_tokens() + completion_tokens();
  return u;
}

ojson ChatReply::body(const std::vector<FinishReason>& reasons) {
  ojson j = b_[0]->body(reasons[0]);
  for (size_t i = 1; i < b_.size(); ++i) j["choices"].push_back(b_[i]->body(reasons[i])["choices"][0]);
  j["usage"] = usage();
  return j;
}

}  // namespace hmoe::server
