// Python str methods. Strip, split and whitespace follow Python on code
// points; case mapping is ASCII-only, which is what chat templates use it for
// (role names, keywords).
#include "engine/text/chat/strings.h"

#include <algorithm>

#include "engine/text/chat/value.h"

namespace hmoe::chat {

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  if (chars == nullptr && is_ascii(s)) {
    size_t b = 0, e = s.size();
    auto ws = [](char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); };
    if (left)
      while (b < e && ws(s[b])) ++b;
    if (right)
      while (e > b && ws(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
  }
  std::u32string cps = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : py_isspace(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(std::u32string_view(cps).substr(b, e - b));
}

static std::vector<std::string> split_ws(std::string_view s, int64_t maxsplit, bool from_right) {
  std::u32string cps = utf8_decode(s);
  std::vector<std::u32string> parts;
  if (!from_right) {
    size_t i = 0, n = cps.size();
    while (true) {
      while (i < n && py_isspace(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t e = n;
        while (e > i && py_isspace(cps[e - 1])) --e;
        parts.push_back(cps.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < n && !py_isspace(cps[j])) ++j;
      parts.push_back(cps.substr(i, j - i));
      i = j;
    }
  } else {
    size_t e = cps.size();
    while (true) {
      while (e > 0 && py_isspace(cps[e - 1])) --e;
      if (e == 0) break;
      if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && py_isspace(cps[b])) ++b;
        parts.push_back(cps.substr(b, e - b));
        break;
      }
      size_t b = e;
      while (b > 0 && !py_isspace(cps[b - 1])) --b;
      parts.push_back(cps.substr(b, e - b));
      e = b;
    }
    std::reverse(parts.begin(), parts.end());
  }
  std::vector<std::string> out;
  for (auto& p : parts) out.push_back(utf8_encode(p));
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (!sep) return split_ws(s, maxsplit, false);
  std::vector<std::string> out;
  size_t pos = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    size_t hit = s.find(*sep, pos);
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep->size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (!sep) return split_ws(s, maxsplit, true);
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t b = 0, i = 0;
  while (i < s.size()) {
    size_t eol = 0;
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') eol = 2;
    else if (s[i] == '\n' || s[i] == '\r' || s[i] == '\v' || s[i] == '\f' || (s[i] >= 0x1c && s[i] <= 0x1e)) eol = 1;
    if (eol) {
      out.emplace_back(s.substr(b, (keepends ? i + eol : i) - b));
      i += eol;
      b = i;
    } else {
      ++i;
    }
  }
  if (b < s.size()) out.emplace_back(s.substr(b));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts repl between every character
    std::u32string cps = utf8_decode(s);
    int64_t n = 0;
    for (char32_t c : cps) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
      }
      utf8_append(out, c);
    }
    if (count < 0 || n < count) out += repl;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(repl);
    pos = hit + old.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

std::string py_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = char(c - 32);
  return out;
}

std::string py_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = py_lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = char(out[0] - 32);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = char(c - 32);
    else if (upper && prev_cased) c = char(c + 32);
    prev_cased = lower || upper || (unsigned char)c >= 0x80;
  }
  return out;
}

int64_t py_count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return int64_t(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

}  // namespace hmoe::chat
