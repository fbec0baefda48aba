#include "engine/text/grammar.h"

#include <algorithm>
#include <limits>

namespace hmoe {

namespace {
enum Phase : uint8_t { obj_first, obj_key, obj_colon, obj_value, obj_after, obj_next, arr_first, arr_value, arr_after, str, num, word, literal };
// Number sub-states; complete ones: zero, integer, frac, exp.
enum Num : uint8_t { n_minus, n_zero, n_integer, n_frac0, n_frac, n_exp0, n_exp_sign, n_exp };
constexpr uint16_t kMaxIntDigits = 20, kMaxFracDigits = 20, kMaxExpDigits = 3;
constexpr uint8_t kMaxWs = 20;
constexpr const char* kWords[3] = {"true", "false", "null"};
constexpr uint8_t kKeyEscaped = 0x80;  // sub flag of a key: it held an escape (matches no property)

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool num_complete(uint8_t sub) { return sub == n_zero || sub == n_integer || sub == n_frac || sub == n_exp; }

// One byte inside a string. st packs the escape state (bits 0-2: 0 none, 1
// after '\', 2..5 hex digits of \u left + 1) and the UTF-8 state (bits 3-5:
// continuation bytes still due, with the narrower first-byte ranges after
// E0, ED, F0 and F4), so strings stay well-formed UTF-8. Returns -1:
// refused, 0: consumed (no new code point), 1: consumed a code point's
// first byte or an escape's backslash, 2: the closing quote.
int string_byte(uint8_t& st, uint8_t c) {
  uint8_t esc = st & 7, u = (st >> 3) & 7;
  int r = 0;
  if (u != 0) {
    static constexpr uint8_t kLo[8] = {0, 0x80, 0x80, 0x80, 0xA0, 0x80, 0x90, 0x80};
    static constexpr uint8_t kHi[8] = {0, 0xBF, 0xBF, 0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    static constexpr uint8_t kNext[8] = {0, 0, 1, 2, 1, 1, 2, 2};
    if (c < kLo[u] || c > kHi[u]) return -1;
    u = kNext[u];
  } else if (esc == 0) {
    if (c == '"') return 2;
    if (c == '\\') esc = 1, r = 1;  // an escape is one code point, counted at its backslash
    else if (c < 0x20) return -1;
    else if (c < 0x80) r = 1;
    else if (c < 0xC2) return -1;
    else if (c < 0xE0) u = 1, r = 1;
    else if (c == 0xE0) u = 4, r = 1;
    else if (c == 0xED) u = 5, r = 1;
    else if (c < 0xF0) u = 2, r = 1;
    else if (c == 0xF0) u = 6, r = 1;
    else if (c < 0xF4) u = 3, r = 1;
    else if (c == 0xF4) u = 7, r = 1;
    else return -1;
  } else if (esc == 1) {
    if (c == 'u') esc = 5;
    else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') esc = 0;
    else return -1;
  } else {
    if (!is_hex(c)) return -1;
    if (--esc == 1) esc = 0;
  }
  st = static_cast<uint8_t>(esc | u << 3);
  return r;
}

// Properties a key may name next: from `next` up to and including the first required one.
uint64_t key_candidates(const GrammarNode& n, uint32_t next) {
  uint64_t m = 0;
  for (size_t i = next; i < n.prop_names.size(); ++i) {
    m |= uint64_t{1} << i;
    if (n.required >> i & 1) break;
  }
  return m;
}
bool object_closable(const GrammarNode& n, uint32_t next) { return next >= 64 || (n.required >> next) == 0; }
}  // namespace

int32_t Grammar::any() {
  if (any_node >= 0) return any_node;
  any_node = add(GrammarNode{});
  nodes[static_cast<size_t>(any_node)].items = any_node;
  nodes[static_cast<size_t>(any_node)].additional = any_node;
  return any_node;
}

GrammarState::GrammarState(const Grammar* g) : g_(g), n_(1) { stacks_.emplace_back(); }

GrammarState::GrammarState(const GrammarState& o) : g_(o.g_), stacks_(o.stacks_.begin(), o.stacks_.begin() + static_cast<std::ptrdiff_t>(o.n_)), n_(o.n_) {}

GrammarState& GrammarState::operator=(const GrammarState& o) {
  if (this == &o) return *this;
  g_ = o.g_;
  if (stacks_.size() < o.n_) stacks_.resize(o.n_);
  for (size_t i = 0; i < o.n_; ++i) stacks_[i] = o.stacks_[i];  // element-wise: frame buffers are reused
  n_ = o.n_;
  return *this;
}

bool GrammarState::start_value(Stack& s, int32_t id, uint8_t c, std::vector<Stack>& forks) const {
  const GrammarNode& n = g_->nodes[static_cast<size_t>(id)];
  s.ws = 0;
  if (n.kind == GrammarNode::Kind::any_of) {
    for (size_t i = 1; i < n.alts.size(); ++i) {
      if (forks.size() + 1 >= kMaxStacks) break;  // nested alternatives: at most kMaxStacks are followed
      Stack copy = s;
      if (start_value(copy, n.alts[i], c, forks)) forks.push_back(std::move(copy));
    }
    return !n.alts.empty() && start_value(s, n.alts[0], c, forks);
  }
  if (s.frames.size() >= kMaxDepth) return false;
  Frame f;
  f.node = id;
  if (n.kind == GrammarNode::Kind::literal) {
    f.phase = literal;
    f.bits = static_cast<uint64_t>(n.literals.size()) << 32;
    s.frames.push_back(f);
    return feed_stack(s, c, forks);
  }
  switch (c) {
    case '{':
      if (!(n.types & GrammarNode::t_object)) return false;
      f.phase = obj_first;
      break;
    case '[':
      if (!(n.types & GrammarNode::t_array)) return false;
      f.phase = arr_first;
      break;
    case '"':
      if (!(n.types & GrammarNode::t_string)) return false;
      f.phase = str;
      break;
    case 't':
    case 'f':
    case 'n':
      if (!(n.types & (c == 'n' ? GrammarNode::t_null : GrammarNode::t_bool))) return false;
      f.phase = word;
      f.bits = c == 't' ? 0 : c == 'f' ? 1 : 2;
      f.pos = 1;
      break;
    default:
      if (!(n.types & (GrammarNode::t_integer | GrammarNode::t_number))) return false;
      if (c == '-') f.sub = n_minus;
      else if (c == '0') f.sub = n_zero, f.pos = 1;
      else if (is_digit(c)) f.sub = n_integer, f.pos = 1;
      else return false;
      f.phase = num;
  }
  s.frames.push_back(f);
  return true;
}

bool GrammarState::value_done(Stack& s, uint8_t c, std::vector<Stack>& forks, bool refeed) const {
  s.frames.pop_back();
  if (s.frames.empty()) {
    ++s.item;
    s.raw_pos = 0;
  } else {
    Frame& p = s.frames.back();
    if (p.phase == obj_value) p.phase = obj_after;
    else p.phase = arr_after, ++p.count;
  }
  return refeed ? feed_stack(s, c, forks) : true;
}

bool GrammarState::feed_stack(Stack& s, uint8_t c, std::vector<Stack>& forks) const {
  const bool ws = is_ws(c);
  auto blank = [&] { return ++s.ws <= kMaxWs; };
  if (s.frames.empty()) {
    if (s.item >= g_->items.size()) return ws && blank();  // trailing blanks
    const Grammar::Item& it = g_->items[s.item];
    if (it.raw) {
      if (static_cast<uint8_t>(it.text[s.raw_pos]) != c) return false;
      if (++s.raw_pos == it.text.size()) ++s.item, s.raw_pos = 0;
      s.ws = 0;
      return true;
    }
    if (ws) return blank();
    return start_value(s, it.node, c, forks);
  }
  Frame& f = s.frames.back();
  const GrammarNode& n = g_->nodes[static_cast<size_t>(f.node)];
  if (ws && f.phase != str && f.phase != obj_key && f.phase != literal && f.phase != word) {
    if (f.phase == num) {
      if (!num_complete(f.sub)) return false;
      return value_done(s, c, forks, true);
    }
    return blank();
  }
  if (f.phase != str && f.phase != obj_key) s.ws = 0;
  switch (f.phase) {
    case obj_first:
    case obj_next:
      if (c == '"') {
        f.bits = key_candidates(n, f.count);
        f.bits2 = n.additional >= 0 && !n.prop_names.empty() ? ~uint64_t{0} >> (64 - n.prop_names.size()) : 0;
        f.child = -1;
        f.pos = 0;
        f.sub = 0;
        if (f.bits == 0 && n.additional < 0) return false;
        f.phase = obj_key;
        return true;
      }
      return f.phase == obj_first && c == '}' && object_closable(n, f.count) && value_done(s, c, forks, false);
    case obj_key: {
      uint8_t esc = f.sub & 0x7F;
      const int r = string_byte(esc, c);
      if (r < 0) return false;
      if (r == 2) {  // the key is complete
        int32_t hit = -1;
        for (uint64_t m = f.bits; m; m &= m - 1) {
          const size_t i = static_cast<size_t>(__builtin_ctzll(m));
          if (n.prop_names[i].size() == f.pos) hit = static_cast<int32_t>(i);
        }
        if (hit >= 0) {
          f.child = n.prop_nodes[static_cast<size_t>(hit)];
          f.count = static_cast<uint32_t>(hit) + 1;
        } else {
          if (n.additional < 0) return false;
          // A listed name written out of order or twice is not an "other" key.
          for (uint64_t m = f.bits2; m; m &= m - 1)
            if (n.prop_names[static_cast<size_t>(__builtin_ctzll(m))].size() == f.pos) return false;
          f.child = n.additional;
        }
        f.phase = obj_colon;
        return true;
      }
      if ((esc & 7) != 0 || c == '\\' || (f.sub & kKeyEscaped)) {
        if (n.additional < 0) return false;  // escapes only in free keys
        f.sub = static_cast<uint8_t>(esc | kKeyEscaped);
        f.bits = f.bits2 = 0;
        return true;
      }
      auto narrow = [&](uint64_t bits) {
        uint64_t keep = 0;
        for (uint64_t m = bits; m; m &= m - 1) {
          const size_t i = static_cast<size_t>(__builtin_ctzll(m));
          const std::string& p = n.prop_names[i];
          if (p.size() > f.pos && static_cast<uint8_t>(p[f.pos]) == c) keep |= uint64_t{1} << i;
        }
        return keep;
      };
      f.sub = static_cast<uint8_t>(esc | (f.sub & kKeyEscaped));
      f.bits = narrow(f.bits);
      f.bits2 = narrow(f.bits2);
      if (f.bits == 0 && n.additional < 0) return false;
      if (f.pos == UINT16_MAX) return false;
      ++f.pos;
      return true;
    }
    case obj_colon:
      if (c != ':') return false;
      f.phase = obj_value;
      return true;
    case obj_value:
      return start_value(s, f.child, c, forks);
    case obj_after:
      if (c == ',') {
        if (key_candidates(n, f.count) == 0 && n.additional < 0) return false;
        f.phase = obj_next;
        return true;
      }
      return c == '}' && object_closable(n, f.count) && value_done(s, c, forks, false);
    case arr_first:
      if (c == ']') return n.min_items == 0 && value_done(s, c, forks, false);
      if (n.max_items == 0) return false;
      f.phase = arr_value;
      return start_value(s, n.items, c, forks);
    case arr_value:
      return start_value(s, n.items, c, forks);
    case arr_after:
      if (c == ',') {
        if (f.count >= n.max_items) return false;
        f.phase = arr_value;
        return true;
      }
      return c == ']' && f.count >= n.min_items && value_done(s, c, forks, false);
    case str: {
      const int r = string_byte(f.sub, c);
      if (r < 0) return false;
      if (r == 2) return f.count >= n.min_len && value_done(s, c, forks, false);
      if (r == 1 && ++f.count > n.max_len) return false;
      return true;
    }
    case num: {
      const bool real = n.types & GrammarNode::t_number;
      switch (f.sub) {
        case n_minus:
          if (!is_digit(c)) return false;
          f.sub = c == '0' ? n_zero : n_integer;
          f.pos = 1;
          return true;
        case n_zero:
        case n_integer:
          if (is_digit(c) && f.sub == n_integer) return ++f.pos <= kMaxIntDigits;
          if (real && c == '.') return f.sub = n_frac0, f.pos = 0, true;
          if (real && (c == 'e' || c == 'E')) return f.sub = n_exp0, f.pos = 0, true;
          break;
        case n_frac0:
        case n_frac:
          if (is_digit(c)) return f.sub = n_frac, ++f.pos <= kMaxFracDigits;
          if (f.sub == n_frac0) return false;
          if (c == 'e' || c == 'E') return f.sub = n_exp0, f.pos = 0, true;
          break;
        case n_exp0:
          if (c == '+' || c == '-') return f.sub = n_exp_sign, true;
          [[fallthrough]];
        case n_exp_sign:
        case n_exp:
          if (is_digit(c)) return f.sub = n_exp, ++f.pos <= kMaxExpDigits;
          if (f.sub != n_exp) return false;
          break;
      }
      if (is_digit(c) || c == '.' || c == 'e' || c == 'E' || c == '-' || c == '+') return false;
      return value_done(s, c, forks, true);  // the number ended: c belongs to what follows
    }
    case word: {
      const char* w = kWords[f.bits];
      if (static_cast<uint8_t>(w[f.pos]) != c) return false;
      if (w[++f.pos] == '\0') return value_done(s, c, forks, false);
      return true;
    }
    case literal: {
      const auto& lits = n.literals;
      size_t lo = f.bits & 0xFFFFFFFFu, hi = f.bits >> 32;
      const size_t p = f.pos;
      size_t a = lo;
      while (a < hi && (lits[a].size() <= p || static_cast<uint8_t>(lits[a][p]) < c)) ++a;
      size_t b = a;
      while (b < hi && lits[b].size() > p && static_cast<uint8_t>(lits[b][p]) == c) ++b;
      if (a < b && p < UINT16_MAX) {
        f.bits = (static_cast<uint64_t>(b) << 32) | a;
        ++f.pos;
        return true;
      }
      if (lits[lo].size() == p) return value_done(s, c, forks, true);  // a whole value: c follows it
      return false;
    }
  }
  return false;
}

bool GrammarState::feed(uint8_t c) {
  if (!g_) return false;
  std::vector<Stack> forks;
  size_t w = 0;
  for (size_t i = 0; i < n_; ++i) {
    if (!feed_stack(stacks_[i], c, forks)) continue;  // a dead stack keeps its buffers past n_
    if (w != i) std::swap(stacks_[w], stacks_[i]);
    ++w;
  }
  n_ = w;
  for (Stack& f : forks) {
    if (n_ >= kMaxStacks) break;
    if (std::find(stacks_.begin(), stacks_.begin() + static_cast<std::ptrdiff_t>(n_), f) != stacks_.begin() + static_cast<std::ptrdiff_t>(n_)) continue;
    if (stacks_.size() <= n_) stacks_.emplace_back();
    std::swap(stacks_[n_++], f);
  }
  if (n_ > 1) {  // alternatives that met again
    for (size_t i = 1; i < n_;) {
      const auto begin = stacks_.begin(), at = begin + static_cast<std::ptrdiff_t>(i);
      if (std::find(begin, at, stacks_[i]) != at) {
        std::swap(stacks_[i], stacks_[n_ - 1]);
        --n_;
      } else {
        ++i;
      }
    }
  }
  return n_ > 0;
}

bool GrammarState::feed(std::string_view s) {
  for (char c : s)
    if (!feed(static_cast<uint8_t>(c))) return false;
  return true;
}

bool GrammarState::stack_complete(const Stack& s) const {
  const size_t n = g_->items.size();
  if (s.frames.empty()) return s.item >= n;
  if (s.frames.size() != 1 || s.item + 1 != n) return false;
  const Frame& f = s.frames.back();
  if (f.phase == num) return num_complete(f.sub);
  if (f.phase == literal) return g_->nodes[static_cast<size_t>(f.node)].literals[f.bits & 0xFFFFFFFFu].size() == f.pos;
  return false;
}

bool GrammarState::complete() const {
  for (size_t i = 0; i < n_; ++i)
    if (stack_complete(stacks_[i])) return true;
  return false;
}

int64_t GrammarState::free_string_room() const {
  if (n_ != 1 || stacks_[0].frames.empty()) return -1;
  const Frame& f = stacks_[0].frames.back();
  if (f.phase != str || f.sub != 0) return -1;
  const GrammarNode& n = g_->nodes[static_cast<size_t>(f.node)];
  return n.max_len == UINT32_MAX ? int64_t{UINT32_MAX} : static_cast<int64_t>(n.max_len) - f.count;
}

namespace {
int64_t apply(const std::vector<uint8_t>& allowed, int64_t n_ok, float* logits, int64_t vocab) {
  if (n_ok == 0) return 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (!allowed[static_cast<size_t>(i)]) logits[i] = -std::numeric_limits<float>::infinity();
  return n_ok;
}
}  // namespace

int64_t grammar_mask(const JsonVocab& v, const GrammarState& state, const std::vector<int32_t>& end_ids, float* logits, int64_t vocab) {
  std::vector<uint8_t> allowed(static_cast<size_t>(vocab), 0);
  int64_t n_ok = 0;
  auto allow = [&](int32_t id) {
    if (id >= 0 && id < vocab && !allowed[static_cast<size_t>(id)]) allowed[static_cast<size_t>(id)] = 1, ++n_ok;
  };
  if (state.complete())
    for (int32_t e : end_ids) allow(e);
  if (state.dead()) return apply(allowed, n_ok, logits, vocab);
  const int64_t room = state.free_string_room();
  if (room >= 0) {
    // One stack in a free string: a clean token stays inside it, so only its length matters;
    // the few others are fed. One pass writes the row.
    GrammarState s = state;  // assigned, not constructed, per token: its buffers are reused
    for (int32_t id : v.not_clean()) {
      if (id >= vocab) continue;
      s = state;
      if (s.feed(v.bytes(id))) allow(id);
    }
    const int64_t n = std::min<int64_t>(vocab, v.size());
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int32_t id = 0; id < n; ++id) {
      if (allowed[static_cast<size_t>(id)]) continue;
      if (v.clean(id) && static_cast<int64_t>(v.chars(id)) <= room && !v.special(id)) ++n_ok;
      else logits[id] = ninf;
    }
    for (int64_t id = n; id < vocab; ++id)
      if (!allowed[static_cast<size_t>(id)]) logits[id] = ninf;
    return n_ok;  // never 0: a string can always take a clean character or its closing quote
  }
  walk_token_trie(v, state, allow);  // the flattened trie
  return apply(allowed, n_ok, logits, vocab);
}

int64_t grammar_mask_reference(const JsonVocab& v, const GrammarState& state, const std::vector<int32_t>& end_ids, float* logits, int64_t vocab) {
  std::vector<uint8_t> allowed(static_cast<size_t>(vocab), 0);
  int64_t n_ok = 0;
  const bool complete = state.complete();
  for (int64_t id = 0; id < vocab; ++id) {
    bool ok = false;
    if (complete && std::find(end_ids.begin(), end_ids.end(), static_cast<int32_t>(id)) != end_ids.end()) ok = true;
    else if (id < v.size() && !v.special(static_cast<int32_t>(id))) {
      GrammarState s = state;
      ok = s.feed(v.bytes(static_cast<int32_t>(id)));
    }
    if (ok) allowed[static_cast<size_t>(id)] = 1, ++n_ok;
  }
  return apply(allowed, n_ok, logits, vocab);
}

}  // namespace hmoe
