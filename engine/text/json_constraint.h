// JSON mode (OpenAI response_format {"type": "json_object"}): sampling is
// restricted, token by token, to continuations that keep the output a prefix
// of one JSON object (RFC 8259 syntax; the top level must be an object), and
// the end-of-sequence ids are allowed only once that object is closed.
//
// JsonVocab holds, once per model, every token's bytes, whether it is
// special (never part of JSON text), whether it is plain (no quote,
// backslash or control byte) and the tokens sorted by their bytes;
// JsonState is the per-sequence pushdown automaton. json_mask(): inside a
// string every plain token is allowed, so only the specials and the
// non-plain tokens the automaton refuses are masked; elsewhere the tokens
// are walked in byte order, each from the state its shared prefix with the
// previous token left (a flattened trie), and a prefix the automaton
// refuses skips every token that starts with it. About 0.1-0.22 ms a step
// for Qwen3's 151,669 tokens on the 2-core dev box (bench_json_mask).
//
// Whitespace outside strings is capped (20 bytes in a row) so a model cannot
// loop on blanks; after the object only the end ids (or, when there are
// none, nothing more: the mask is then lifted) may follow.
//
// Thread safety: JsonVocab is immutable and shared; a JsonState belongs to
// one sequence's Sampler.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace hmoe {

namespace tok {
class Tokenizer;
}

class JsonVocab {
 public:
  explicit JsonVocab(const tok::Tokenizer& t);
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  bool special(int32_t id) const { return special_[static_cast<size_t>(id)] != 0; }
  // Non-special tokens sorted by their bytes, and lcp[i] = the length of
  // the prefix sorted[i] shares with sorted[i - 1] (a flattened trie).
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& lcp() const { return lcp_; }
  size_t max_len() const { return max_len_; }
  // Special (or unknown) ids, and the non-special tokens that are not plain
  // (they hold a quote, backslash or control byte; inside a string every
  // other token is valid and keeps the string open).
  const std::vector<int32_t>& specials() const { return specials_; }
  const std::vector<int32_t>& not_plain() const { return not_plain_; }
  // Per id: clean (plain and whole, well-formed UTF-8: inside a string it
  // can follow any complete character) and its code points; the non-special
  // tokens that are not clean.
  bool clean(int32_t id) const { return clean_[static_cast<size_t>(id)] != 0; }
  uint32_t chars(int32_t id) const { return chars_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& not_clean() const { return not_clean_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<uint8_t> special_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::vector<int32_t> specials_, not_plain_;
  std::vector<uint8_t> clean_;
  std::vector<uint32_t> chars_;
  std::vector<int32_t> not_clean_;
  size_t max_len_ = 0;
};

// Walks v's non-special tokens as a trie from `start` (State: copyable,
// bool feed(uint8_t)) and calls accept(id) for each token whose bytes the
// automaton takes whole. Tokens sharing a prefix share its feeding; a refused
// prefix skips every token that starts with it.
template <class State, class Accept>
void walk_token_trie(const JsonVocab& v, const State& start, Accept&& accept) {
  const std::vector<int32_t>& sorted = v.sorted();
  const std::vector<uint16_t>& lcp = v.lcp();
  std::vector<State> st(v.max_len() + 1);  // st[d]: the state after the first d bytes of the current token
  st[0] = start;
  size_t have = 0;         // st[0..have] belong to the previous token's prefix
  size_t dead = SIZE_MAX;  // the previous token's prefix of this length was refused
  for (size_t i = 0; i < sorted.size(); ++i) {
    const size_t l = lcp[i];
    if (dead <= l) continue;  // starts with a refused prefix
    dead = SIZE_MAX;
    const std::string& b = v.bytes(sorted[i]);
    for (size_t d = std::min(have, l); d < b.size(); ++d) {
      st[d + 1] = st[d];
      if (!st[d + 1].feed(static_cast<uint8_t>(b[d]))) {
        dead = d + 1;
        break;
      }
    }
    have = dead == SIZE_MAX ? b.size() : dead - 1;
    if (dead == SIZE_MAX) accept(sorted[i]);
  }
}

// A tokenizer's JsonVocab, built on first use (about 0.1 s for 150k
// tokens) and shared; get() is thread-safe.
class JsonVocabCache {
 public:
  explicit JsonVocabCache(const tok::Tokenizer* t) : t_(t) {}
  std::shared_ptr<const JsonVocab> get();

 private:
  const tok::Tokenizer* t_;
  std::once_flag once_;
  std::shared_ptr<const JsonVocab> v_;
};

class JsonState {
 public:
  // False (state unspecified) when the byte cannot continue a JSON object.
  bool feed(uint8_t c);
  bool feed(std::string_view s);
  bool complete() const { return mode_ == Mode::done; }
  bool in_string() const { return mode_ == Mode::str; }

 private:
  enum class Mode : uint8_t { top, value, obj_first, obj_key, colon, arr_first, after, str, str_esc, str_u, num, lit, done };
  enum class Num : uint8_t { minus, zero, integer, frac0, frac, exp0, exp_sign, exp };
  bool end_value();
  bool close(char c);
  bool ws(uint8_t c);
  Mode mode_ = Mode::top;
  Num num_ = Num::minus;
  bool key_ = false;
  uint8_t u_left_ = 0, ws_run_ = 0;
  const char* lit_ = nullptr;
  std::string stack_;  // '{' / '['
};

// Sets logits of the tokens `state` cannot take to -infinity. end_ids: the
// sequence's end-of-sequence ids, allowed only when the object is complete.
// Returns the number of tokens left allowed (0: nothing can follow; the
// caller then leaves the row as it was).
int64_t json_mask(const JsonVocab& v, const JsonState& state, const std::vector<int32_t>& end_ids, float* logits, int64_t vocab);

}  // namespace hmoe
