// WHATWG UTF-8 decoding with replacement, and NFC from generated tables
// (unicode_nfc_tables.h). NFC only touches the spans around code points that
// can change (combining marks, decomposables, composition seconds), so
// already-normalized text costs one table probe per non-ASCII code point.
#include "engine/text/tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "engine/text/tokenizer/unicode_nfc_tables.h"

namespace hmoe::tok {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Length of the sequence a lead byte starts (0: not a lead byte), and the
// valid range of the second byte (WHATWG "lower/upper boundary").
inline int lead_len(unsigned char b, unsigned char& lo, unsigned char& hi) {
  lo = 0x80;
  hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) {
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
    return 3;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

}  // namespace

void utf8_put(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_append_lossy(std::string_view in, std::string& out, bool final) {
  const auto* p = reinterpret_cast<const unsigned char*>(in.data());
  size_t n = in.size(), i = 0, run = 0;  // [run, i) is valid text not yet copied
  while (i < n) {
    if (p[i] < 0x80) { ++i; continue; }
    unsigned char lo, hi;
    int len = lead_len(p[i], lo, hi);
    if (len == 0) {
      out.append(in.data() + run, i - run);
      out.append(kReplacement);
      run = ++i;
      continue;
    }
    int k = 1;
    while (k < len && i + k < n) {
      unsigned char c = p[i + k];
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) break;
      ++k;
    }
    if (k == len) { i += len; continue; }
    if (i + k == n && !final) {  // incomplete so far: hold back
      out.append(in.data() + run, i - run);
      return i;
    }
    out.append(in.data() + run, i - run);
    out.append(kReplacement);
    i += k;
    run = i;
  }
  out.append(in.data() + run, n - run);
  return n;
}

bool utf8_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    while (i + 8 <= n) {  // ASCII fast path, 8 bytes at a time
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) { ++i; continue; }
    unsigned char lo, hi;
    int len = lead_len(p[i], lo, hi);
    if (len == 0 || i + len > n) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (int k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

// --- NFC ---------------------------------------------------------------------
namespace {
using namespace nfc_data;

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

bool suspicious(uint32_t cp) {
  if (cp < 0x300) return false;
  auto it = std::upper_bound(std::begin(kSuspicious), std::end(kSuspicious), cp,
                             [](uint32_t c, const Range& r) { return c < r.lo; });
  return it != std::begin(kSuspicious) && cp <= (it - 1)->hi;
}

uint8_t ccc_of(uint32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(std::begin(kCcc), std::end(kCcc), cp, [](const Ccc& c, uint32_t v) { return c.cp < v; });
  return it != std::end(kCcc) && it->cp == cp ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp, [](const Decomp& d, uint32_t v) { return d.cp < v; });
  if (it == std::end(kDecomp) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second) decompose(it->second, out);
}

uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kComp), std::end(kComp), std::pair{a, b}, [](const Comp& c, std::pair<uint32_t, uint32_t> v) {
    return c.first < v.first || (c.first == v.first && c.second < v.second);
  });
  return it != std::end(kComp) && it->first == a && it->second == b ? it->composite : 0;
}

// Full NFC of a span that starts at a safe starter (or the text start) and
// ends before the next one.
void nfc_span(std::string_view s, std::string& out, std::vector<uint32_t>& cps, std::vector<uint8_t>& cls) {
  cps.clear();
  for (size_t i = 0; i < s.size();) decompose(utf8_next(s, i), cps);
  cls.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = ccc_of(cps[i]);
  for (size_t i = 1; i < cps.size(); ++i) {  // canonical ordering: stable insertion sort of non-starter runs
    for (size_t j = i; j > 0 && cls[j] != 0 && cls[j - 1] > cls[j]; --j) {
      std::swap(cps[j], cps[j - 1]);
      std::swap(cls[j], cls[j - 1]);
    }
  }
  // Canonical composition: c joins the last starter unless blocked (an
  // intervening char of ccc 0 or >= ccc(c)). last_cc is -1 while adjacent.
  size_t starter = SIZE_MAX, w = 0;
  int last_cc = -1;
  for (size_t i = 0; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    int cc = cls[i];
    if (starter != SIZE_MAX && (last_cc == -1 || (last_cc != 0 && last_cc < cc))) {
      if (uint32_t comp = compose_pair(cps[starter], c)) {
        cps[starter] = comp;
        continue;
      }
    }
    if (cc == 0) {
      starter = w;
      last_cc = -1;
    } else {
      last_cc = cc;
    }
    cps[w++] = c;
  }
  for (size_t i = 0; i < w; ++i) utf8_put(cps[i], out);
}

}  // namespace

void nfc_append(std::string_view s, std::string& out) {
  size_t i = 0, copied = 0, safe = 0;  // safe: start of the last safe starter
  std::vector<uint32_t> cps;
  std::vector<uint8_t> cls;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      safe = i++;
      continue;
    }
    size_t at = i;
    uint32_t cp = utf8_next(s, i);
    if (!suspicious(cp)) {
      safe = at;
      continue;
    }
    size_t end = i;  // extend to the next safe starter
    while (end < s.size()) {
      size_t j = end;
      uint32_t c = utf8_next(s, j);
      if (!suspicious(c)) break;
      end = j;
    }
    size_t begin = std::max(safe, copied);
    out.append(s.data() + copied, begin - copied);
    nfc_span(s.substr(begin, end - begin), out, cps, cls);
    copied = end;
    safe = end;
    i = end;
  }
  out.append(s.data() + copied, s.size() - copied);
}

}  // namespace hmoe::tok
