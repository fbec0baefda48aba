// Progress display for long operations (loading weights). On a TTY it
// redraws one bar on stderr; otherwise it prints a plain line every 10%.
// mode: "auto", "bar", "lines" or "none" (the --progress setting).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace hmoe {

class Progress {
 public:
  Progress(std::string label, uint64_t total, const std::string& mode);
  ~Progress();
  void add(uint64_t done);
  void finish();

 private:
  void draw(bool final);
  std::string label_;
  uint64_t total_, done_ = 0;
  bool bar_ = false, quiet_ = false, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace hmoe
