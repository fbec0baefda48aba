#include "engine/text/json_guard.h"

#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

namespace hmoe {

namespace {

struct Frame {
  bool object = false;
  bool expect_key = true;  // objects: the next string is a key
  size_t index = 0;        // arrays: the current element
  std::string key;         // objects: the current key
  std::unordered_set<std::string> keys;
};

constexpr size_t kPathParts = 6;

std::string path_of(const std::vector<Frame>& st) {
  std::string p;
  for (size_t i = 0; i < st.size(); ++i) {
    if (i == kPathParts) return p + "...";
    const Frame& f = st[i];
    if (f.object) {
      if (f.key.empty() && f.expect_key) break;  // no key read yet in this object
      if (!p.empty()) p += '.';
      p += f.key;
    } else {
      p += "[" + std::to_string(f.index) + "]";
    }
  }
  return p;
}

// The decoded key of a quoted string (escapes resolved); the raw bytes when
// it cannot be decoded (the real parser reports that).
std::string decode_key(std::string_view quoted) {
  if (quoted.find('\\') == std::string_view::npos) return std::string(quoted.substr(1, quoted.size() - 2));
  nlohmann::json j = nlohmann::json::parse(quoted.begin(), quoted.end(), nullptr, false);
  return j.is_string() ? j.get<std::string>() : std::string(quoted);
}

}  // namespace

JsonScanIssue scan_json(std::string_view t, int max_depth, bool dup) {
  std::vector<Frame> st;
  JsonScanIssue out;
  auto issue = [&](JsonScanIssue::Kind k, size_t off) {
    out.kind = k;
    out.offset = off;
    out.path = path_of(st);
    return out;
  };
  const size_t n = t.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = t[i];
    switch (c) {
      case '\0': return issue(JsonScanIssue::Kind::nul_byte, i);
      case '"': {
        const size_t start = i;
        for (++i; i < n && t[i] != '"'; ++i) {
          if (t[i] == '\0') return issue(JsonScanIssue::Kind::nul_byte, i);
          if (t[i] == '\\') ++i;
        }
        if (i >= n) return out;  // unterminated: the parser says so
        if (!st.empty() && st.back().object && st.back().expect_key) {
          Frame& f = st.back();
          f.expect_key = false;
          f.key = decode_key(t.substr(start, i - start + 1));
          if (dup && !f.keys.insert(f.key).second) {
            out.key = f.key;
            return issue(JsonScanIssue::Kind::duplicate_key, start);
          }
        }
        break;
      }
      case '{':
      case '[':
        if (static_cast<int>(st.size()) >= max_depth) return issue(JsonScanIssue::Kind::too_deep, i);
        st.emplace_back();
        st.back().object = c == '{';
        break;
      case '}':
      case ']':
        if (!st.empty()) st.pop_back();
        break;
      case ',':
        if (!st.empty()) {
          if (st.back().object) st.back().expect_key = true;
          else ++st.back().index;
        }
        break;
      default: break;
    }
  }
  return out;
}

bool json_depth_ok(std::string_view t, int max_depth) {
  int depth = 0;
  const size_t n = t.size();
  for (size_t i = 0; i < n; ++i) {
    const char c = t[i];
    if (c == '"') {
      for (++i; i < n && t[i] != '"'; ++i)
        if (t[i] == '\\') ++i;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return true;
}

std::string json_error_path(std::string_view text) {
  struct Part {
    bool object;
    std::string key;
    size_t index = 0;
  };
  std::vector<Part> st;
  auto done_value = [&] {
    if (!st.empty() && !st.back().object) ++st.back().index;
  };
  using E = nlohmann::json::parse_event_t;
  auto cb = [&](int, E ev, nlohmann::json& v) {
    switch (ev) {
      case E::object_start: st.push_back({true, {}}); break;
      case E::array_start: st.push_back({false, {}}); break;
      case E::key: st.back().key = v.is_string() ? v.get<std::string>() : std::string(); break;
      case E::object_end:
      case E::array_end:
        if (!st.empty()) st.pop_back();
        done_value();
        break;
      case E::value: done_value(); break;
    }
    // Containers are kept (their end events are only reported for kept ones; the
    // text is at most kMaxJsonDepth deep); scalar values are dropped.
    return ev != E::value;
  };
  try {
    const nlohmann::json ignored = nlohmann::json::parse(text.begin(), text.end(), cb);
    (void)ignored;
  } catch (const nlohmann::json::exception&) {
    std::string p;
    for (size_t i = 0; i < st.size(); ++i) {
      if (i == kPathParts) return p + "...";
      if (st[i].object) {
        if (st[i].key.empty()) break;
        if (!p.empty()) p += '.';
        p += st[i].key;
      } else {
        p += "[" + std::to_string(st[i].index) + "]";
      }
    }
    return p;
  }
  return {};
}

}  // namespace hmoe
