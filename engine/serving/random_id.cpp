#include "engine/serving/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <random>

namespace hmoe {

namespace {
void fill_random(unsigned char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r < 0 && errno != EINTR) {
      std::random_device rd;  // the kernel's generator through another door
      for (; got < n; ++got) p[got] = static_cast<unsigned char>(rd());
    }
  }
}
}  // namespace

std::string random_alnum(size_t n) {
  static constexpr char kAlpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string out;
  out.reserve(n);
  unsigned char buf[64];
  while (out.size() < n) {
    fill_random(buf, sizeof buf);
    for (unsigned char b : buf) {
      if (b >= 248) continue;  // 248 = 4 * 62: keeps the draw uniform
      out += kAlpha[b % 62];
      if (out.size() == n) break;
    }
  }
  return out;
}

}  // namespace hmoe
