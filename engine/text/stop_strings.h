// StopMatcher: finds stop strings in streamed text, also when a stop string
// spans several tokens, and never lets any part of it reach the client.
//
// push() receives each piece of newly decoded text and returns the part that
// is certainly not the start of a stop string; the longest tail that could
// still grow into one is held back. When a stop string appears, the text
// before it is returned, stopped() becomes true and everything after is
// dropped. finish() returns the held-back tail when the stream ends without a
// stop. Stop strings must be non-empty valid UTF-8, so a held-back boundary
// always falls between whole characters.
//
// One matcher per stream; not thread-safe.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace hmoe {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace hmoe
