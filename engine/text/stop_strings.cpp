#include "engine/text/stop_strings.h"

#include <algorithm>
#include <utility>

namespace hmoe {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  // Earliest occurrence of any stop string (the longest one at a tie).
  size_t best = std::string::npos, best_len = 0;
  for (const auto& s : stops_) {
    size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > best_len))) {
      best = at;
      best_len = s.size();
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    matched_ = held_.substr(best, best_len);
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace hmoe
