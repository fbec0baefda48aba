#include "engine/text/json_constraint.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "engine/text/tokenizer/tokenizer.h"

namespace hmoe {

namespace {
// Well-formed UTF-8 (RFC 3629: no overlongs, surrogates or code points past U+10FFFF), whole characters only.
bool utf8_whole(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) n = 0;
    else if (c >= 0xC2 && c < 0xE0) n = 1;
    else if (c == 0xE0) n = 2, lo = 0xA0;
    else if (c == 0xED) n = 2, hi = 0x9F;
    else if (c > 0xE0 && c < 0xF0) n = 2;
    else if (c == 0xF0) n = 3, lo = 0x90;
    else if (c > 0xF0 && c < 0xF4) n = 3;
    else if (c == 0xF4) n = 3, hi = 0x8F;
    else return false;
    if (i + n + 1 > s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) return false;
    }
    i += n + 1;
  }
  return true;
}
}  // namespace

JsonVocab::JsonVocab(const tok::Tokenizer& t) {
  const int32_t n = t.vocab_size();
  bytes_.resize(static_cast<size_t>(n));
  special_.assign(static_cast<size_t>(n), 0);
  clean_.assign(static_cast<size_t>(n), 0);
  chars_.assign(static_cast<size_t>(n), 0);
  for (int32_t id = 0; id < n; ++id) {
    std::string b;
    try {
      b = t.id_to_piece(id);
    } catch (...) {  // an id no token has: never allowed
      special_[static_cast<size_t>(id)] = 1;
      specials_.push_back(id);
      continue;
    }
    if (t.is_special(id) || b.empty()) {
      special_[static_cast<size_t>(id)] = 1;
      specials_.push_back(id);
      continue;
    }
    bool plain = true;
    for (unsigned char c : b) plain = plain && c != '"' && c != '\\' && c >= 0x20;
    if (!plain) not_plain_.push_back(id);
    for (unsigned char c : b) chars_[static_cast<size_t>(id)] += (c & 0xC0) != 0x80 ? 1 : 0;
    const bool clean = plain && utf8_whole(b);
    clean_[static_cast<size_t>(id)] = clean ? 1 : 0;
    if (!clean) not_clean_.push_back(id);
    max_len_ = std::max(max_len_, b.size());
    bytes_[static_cast<size_t>(id)] = std::move(b);
    sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(), [this](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string &a = bytes_[static_cast<size_t>(sorted_[i - 1])], &b = bytes_[static_cast<size_t>(sorted_[i])];
    size_t l = 0;
    while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
    lcp_[i] = static_cast<uint16_t>(std::min<size_t>(l, 65535));
  }
}

std::shared_ptr<const JsonVocab> JsonVocabCache::get() {
  std::call_once(once_, [this] { v_ = std::make_shared<const JsonVocab>(*t_); });
  return v_;
}

namespace {
bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
}  // namespace

bool JsonState::ws(uint8_t c) {
  if (!is_ws(c)) {
    ws_run_ = 0;
    return false;
  }
  return ++ws_run_ <= 20;
}

bool JsonState::end_value() {
  mode_ = stack_.empty() ? Mode::done : Mode::after;
  return true;
}

bool JsonState::close(char c) {
  if (stack_.empty() || stack_.back() != (c == '}' ? '{' : '[')) return false;
  stack_.pop_back();
  return end_value();
}

bool JsonState::feed(uint8_t c) {
  switch (mode_) {
    case Mode::top:
      if (c == '{') {
        ws_run_ = 0;
        stack_.push_back('{');
        mode_ = Mode::obj_first;
        return true;
      }
      return ws(c);
    case Mode::value:
    case Mode::arr_first:
      if (is_ws(c)) return ws(c);
      ws_run_ = 0;
      if (mode_ == Mode::arr_first && c == ']') return close(']');
      switch (c) {
        case '{': stack_.push_back('{'); mode_ = Mode::obj_first; return true;
        case '[': stack_.push_back('['); mode_ = Mode::arr_first; return true;
        case '"': key_ = false; mode_ = Mode::str; return true;
        case '-': num_ = Num::minus; mode_ = Mode::num; return true;
        case 't': lit_ = "rue"; mode_ = Mode::lit; return true;
        case 'f': lit_ = "alse"; mode_ = Mode::lit; return true;
        case 'n': lit_ = "ull"; mode_ = Mode::lit; return true;
        default:
          if (!is_digit(c)) return false;
          num_ = c == '0' ? Num::zero : Num::integer;
          mode_ = Mode::num;
          return true;
      }
    case Mode::obj_first:
    case Mode::obj_key:
      if (is_ws(c)) return ws(c);
      ws_run_ = 0;
      if (c == '"') {
        key_ = true;
        mode_ = Mode::str;
        return true;
      }
      return mode_ == Mode::obj_first && c == '}' && close('}');
    case Mode::colon:
      if (is_ws(c)) return ws(c);
      ws_run_ = 0;
      if (c != ':') return false;
      mode_ = Mode::value;
      return true;
    case Mode::after:
      if (is_ws(c)) return ws(c);
      ws_run_ = 0;
      if (c == ',') {
        mode_ = stack_.back() == '{' ? Mode::obj_key : Mode::value;
        return true;
      }
      return (c == '}' || c == ']') && close(static_cast<char>(c));
    case Mode::str:
      if (c == '"') {
        if (key_) {
          mode_ = Mode::colon;
          return true;
        }
        return end_value();
      }
      if (c == '\\') mode_ = Mode::str_esc;
      return c >= 0x20;
    case Mode::str_esc:
      if (c == 'u') {
        u_left_ = 4;
        mode_ = Mode::str_u;
        return true;
      }
      mode_ = Mode::str;
      return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't';
    case Mode::str_u:
      if (!is_hex(c)) return false;
      if (--u_left_ == 0) mode_ = Mode::str;
      return true;
    case Mode::num:
      switch (num_) {
        case Num::minus:
          if (!is_digit(c)) return false;
          num_ = c == '0' ? Num::zero : Num::integer;
          return true;
        case Num::zero:
        case Num::integer:
          if (num_ == Num::integer && is_digit(c)) return true;
          if (c == '.') return num_ = Num::frac0, true;
          if (c == 'e' || c == 'E') return num_ = Num::exp0, true;
          break;
        case Num::frac0:
          if (!is_digit(c)) return false;
          num_ = Num::frac;
          return true;
        case Num::frac:
          if (is_digit(c)) return true;
          if (c == 'e' || c == 'E') return num_ = Num::exp0, true;
          break;
        case Num::exp0:
          if (c == '+' || c == '-') return num_ = Num::exp_sign, true;
          if (!is_digit(c)) return false;
          num_ = Num::exp;
          return true;
        case Num::exp_sign:
          if (!is_digit(c)) return false;
          num_ = Num::exp;
          return true;
        case Num::exp:
          if (is_digit(c)) return true;
          break;
      }
      // The number ended at a complete state: c belongs to what follows.
      end_value();
      return feed(c);
    case Mode::lit:
      if (c != static_cast<uint8_t>(*lit_)) return false;
      if (*++lit_ == '\0') return end_value();
      return true;
    case Mode::done:
      return ws(c);
  }
  return false;
}

bool JsonState::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<uint8_t>(c))) return false;
  return true;
}

int64_t json_mask(const JsonVocab& v, const JsonState& state, const std::vector<int32_t>& end_ids, float* logits, int64_t vocab) {
  std::vector<int32_t> ok;
  if (state.complete()) {
    for (int32_t e : end_ids)
      if (e >= 0 && e < vocab) ok.push_back(e);
  } else {
    if (state.in_string()) {
      // Every plain token keeps the string open; only specials and the non-plain tokens that
      // the automaton refuses are masked (a short list: no pass over the allowed ones).
      std::vector<int32_t> refused;
      for (int32_t id : v.not_plain()) {
        JsonState s = state;
        if (id < vocab && !s.feed(v.bytes(id))) refused.push_back(id);
      }
      const float ninf = -std::numeric_limits<float>::infinity();
      int64_t masked = 0;
      for (int32_t id : v.specials())
        if (id < vocab) logits[id] = ninf, ++masked;
      for (int32_t id : refused) logits[id] = ninf, ++masked;
      for (int64_t id = v.size(); id < vocab; ++id) logits[id] = ninf, ++masked;  // ids past the tokenizer
      return vocab - masked;
    } else {  // the flattened trie
      walk_token_trie(v, state, [&](int32_t id) {
        if (id < vocab) ok.push_back(id);
      });
    }
  }
  if (ok.empty()) return 0;
  std::vector<uint8_t> allowed(static_cast<size_t>(vocab), 0);
  for (int32_t id : ok) allowed[static_cast<size_t>(id)] = 1;
  for (int64_t i = 0; i < vocab; ++i)
    if (!allowed[static_cast<size_t>(i)]) logits[i] = -std::numeric_limits<float>::infinity();
  return static_cast<int64_t>(ok.size());
}

}  // namespace hmoe
