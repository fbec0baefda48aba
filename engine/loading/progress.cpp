#include "engine/loading/progress.h"

#include <unistd.h>

#include <cstdio>

namespace hmoe {

Progress::Progress(std::string label, uint64_t total, const std::string& mode)
    : label_(std::move(label)), total_(total ? total : 1), start_(std::chrono::steady_clock::now()), last_draw_(start_) {
  quiet_ = mode == "none";
  bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO));
}

Progress::~Progress() { finish(); }

void Progress::add(uint64_t n) {
  done_ += n;
  draw(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  done_ = total_;
  draw(true);
}

void Progress::draw(bool final) {
  if (quiet_) return;
  const double frac = static_cast<double>(done_) / static_cast<double>(total_);
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double mib = static_cast<double>(done_) / (1 << 20);
  if (bar_) {
    if (!final && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const int width = 30, fill = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.0f MiB %.1f s", label_.c_str(), fill, "==============================",
                 width - fill, "", static_cast<int>(frac * 100), mib, secs);
    if (final) std::fputc('\n', stderr);
    std::fflush(stderr);
    return;
  }
  const int decile = static_cast<int>(frac * 10);
  if (decile == last_decile_ && !final) return;
  if (final && last_decile_ == 10) return;
  last_decile_ = decile;
  std::fprintf(stderr, "%s: %d%% (%.0f MiB, %.1f s)\n", label_.c_str(), decile * 10, mib, secs);
}

}  // namespace hmoe
