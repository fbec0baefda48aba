// Encoding and decoding. The hot path is: added-token scan (one table probe
// per byte), regex split (PCRE2 JIT), then per piece a word-cache probe and,
// on a miss, BPE over the piece's bytes with the merge-rank hash table.
// Scratch buffers live in one EncodeState per call: no per-byte allocation.
#include <algorithm>
#include <climits>
#include <functional>

#include "configs/error.h"
#include "engine/text/tokenizer/tokenizer_impl.h"
#include "engine/text/tokenizer/unicode.h"

namespace hmoe::tok {

// --- byte-level alphabet ----------------------------------------------------
namespace {
struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points < 324 only
  ByteAlphabet() {
    from_cp.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = direct ? uint32_t(b) : extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

uint32_t byte_to_cp(uint8_t b) { return alphabet().to_cp[b]; }

bool byte_level_decode(std::string_view token, std::string& out) {
  out.clear();
  const auto& a = alphabet();
  for (size_t i = 0; i < token.size();) {
    uint32_t cp = utf8_next(token, i);
    if (cp >= a.from_cp.size() || a.from_cp[cp] < 0) {
      out.assign(token);
      return false;
    }
    out.push_back(static_cast<char>(a.from_cp[cp]));
  }
  return true;
}

// --- merge table ------------------------------------------------------------
void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  int bits = 4;
  while (cap < n * 2) cap <<= 1, ++bits;
  table_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

void MergeTable::insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
  if ((size_ + 1) * 2 > table_.size()) {
    std::vector<Entry> old;
    old.swap(table_);
    reserve(std::max<size_t>(16, size_ * 2 + 2));
    for (const Entry& e : old)
      if (e.key != kEmpty) insert(int32_t(e.key >> 32), int32_t(uint32_t(e.key)), e.rank, e.id);
  }
  uint64_t key = pack(a, b);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = table_[i];
    if (e.key == key) {
      e.rank = rank;
      e.id = id;
      return;
    }
    if (e.key == kEmpty) {
      e = Entry{key, rank, id};
      ++size_;
      return;
    }
  }
}

// --- added-token trie ---------------------------------------------------------
void AddedTrie::build(const std::vector<AddedToken>& tokens, bool include_special) {
  nodes_.assign(1, Node{});
  first_.fill(false);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto& tok = tokens[t];
    if ((tok.special && !include_special) || tok.content.empty()) continue;
    first_[static_cast<unsigned char>(tok.content[0])] = true;
    int32_t n = 0;
    for (unsigned char c : tok.content) {
      int32_t next = -1;
      for (auto& [b, child] : nodes_[n].next)
        if (b == c) next = child;
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[n].next.emplace_back(c, next);
        nodes_.emplace_back();
      }
      n = next;
    }
    nodes_[n].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTrie::match(std::string_view s, size_t pos, size_t& len) const {
  int32_t n = 0, best = -1;
  for (size_t j = pos; j < s.size(); ++j) {
    int32_t next = -1;
    for (const auto& [b, child] : nodes_[n].next)
      if (b == static_cast<unsigned char>(s[j])) {
        next = child;
        break;
      }
    if (next < 0) break;
    n = next;
    if (nodes_[n].token >= 0) {
      best = nodes_[n].token;
      len = j + 1 - pos;
    }
  }
  return best;
}

// --- encode -------------------------------------------------------------------
namespace {

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// JavaScript's String.prototype.trim set, used for added tokens' lstrip/rstrip.
bool is_js_space(uint32_t c) {
  return c == 9 || c == 10 || c == 11 || c == 12 || c == 13 || c == 32 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}
std::string_view trim_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_js_space(utf8_next(s, j))) break;
    i = j;
  }
  return s.substr(i);
}
std::string_view trim_end(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    uint32_t c = utf8_next(s, i);
    if (!is_js_space(c)) end = i;
  }
  return s.substr(0, end);
}

struct Cand {
  int32_t rank, pos, id;
  bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

constexpr size_t kCacheMaxWords = 1 << 16;
constexpr size_t kScanMaxLen = 64;  // longer words use the heap-ordered BPE

class Encoder {
 public:
  Encoder(const Tokenizer::Impl& t, std::vector<int32_t>& out) : t_(t), out_(out) {
    md_.reset(pcre2_match_data_create(4, nullptr));
    if (!md_) throw std::bad_alloc();
  }

  void section(std::string_view s) {
    if (s.empty()) return;
    if (t_.nfc) {
      norm_.clear();
      nfc_append(s, norm_);
      s = norm_;
    }
    split(0, s);
  }

 private:
  void split(size_t level, std::string_view s) {
    if (level == t_.splits.size()) {
      word(s);
      return;
    }
    const SplitRegex& re = t_.splits[level];
    auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t off = 0, prev = 0;
    while (off <= s.size()) {
      int rc = re.jit ? pcre2_jit_match(re.code.get(), subject, s.size(), off, 0, md_.get(), nullptr)
                      : PCRE2_ERROR_JIT_STACKLIMIT;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re.code.get(), subject, s.size(), off, PCRE2_NO_UTF_CHECK, md_.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        fail(ErrorKind::internal, "tokenizer: regex match failed: " + std::string(reinterpret_cast<char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_.get());
      size_t b = ov[0], e = ov[1];
      if (b > prev) split(level + 1, s.substr(prev, b - prev));
      if (e > b) split(level + 1, s.substr(b, e - b));
      prev = e;
      if (e == b) {  // empty match: step one code point, as JavaScript does
        if (e >= s.size()) break;
        size_t j = e;
        utf8_next(s, j);
        off = j;
      } else {
        off = e;
      }
    }
    if (prev < s.size()) split(level + 1, s.substr(prev));
  }

  void word(std::string_view w) {
    if (w.size() == 1) {
      out_.push_back(t_.byte_id[static_cast<unsigned char>(w[0])]);
      return;
    }
    auto it = cache_.find(w);
    if (it != cache_.end()) {
      out_.insert(out_.end(), pool_.begin() + it->second.first, pool_.begin() + it->second.first + it->second.second);
      return;
    }
    size_t before = out_.size();
    bpe(w);
    if (cache_.size() >= kCacheMaxWords) {
      cache_.clear();
      pool_.clear();
    }
    cache_.emplace(std::string(w), std::pair<uint32_t, uint32_t>(uint32_t(pool_.size()), uint32_t(out_.size() - before)));
    pool_.insert(pool_.end(), out_.begin() + before, out_.end());
  }

  void bpe(std::string_view w) {
    if (t_.ignore_merges) {
      auto it = t_.vocab_bytes.find(w);
      if (it != t_.vocab_bytes.end()) {
        out_.push_back(it->second);
        return;
      }
    }
    size_t n = w.size();
    ids_.resize(n);
    for (size_t i = 0; i < n; ++i) ids_[i] = t_.byte_id[static_cast<unsigned char>(w[i])];
    if (n <= kScanMaxLen) bpe_scan(n);
    else bpe_heap(n);
  }

  // Small words: keep the rank of every adjacent pair, merge the lowest
  // (leftmost on ties), update the two neighbouring pairs.
  void bpe_scan(size_t n) {
    ranks_.resize(n);
    merged_.resize(n);
    auto rank_at = [&](size_t i) {
      const MergeTable::Entry* e = t_.merges.find(ids_[i], ids_[i + 1]);
      ranks_[i] = e ? e->rank : INT_MAX;
      merged_[i] = e ? e->id : -1;
    };
    for (size_t i = 0; i + 1 < n; ++i) rank_at(i);
    while (n > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < n; ++i)
        if (ranks_[i] < ranks_[best]) best = i;
      if (ranks_[best] == INT_MAX) break;
      ids_[best] = merged_[best];
      for (size_t i = best + 1; i + 1 < n; ++i) {
        ids_[i] = ids_[i + 1];
        ranks_[i] = ranks_[i + 1];
        merged_[i] = merged_[i + 1];
      }
      --n;
      if (best > 0) rank_at(best - 1);
      if (best + 1 < n) rank_at(best);
    }
    out_.insert(out_.end(), ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  // Long words: Hugging Face's algorithm (word.rs merge_all): a min-heap of
  // (rank, position) over a linked list of symbols; stale entries skipped.
  void bpe_heap(size_t n) {
    prev_.resize(n);
    next_.resize(n);
    alive_.assign(n, 1);
    for (size_t i = 0; i < n; ++i) {
      prev_[i] = int32_t(i) - 1;
      next_[i] = i + 1 < n ? int32_t(i + 1) : -1;
    }
    heap_.clear();
    auto cmp = std::greater<Cand>{};
    auto push = [&](int32_t i) {
      if (i < 0 || next_[i] < 0) return;
      if (const MergeTable::Entry* e = t_.merges.find(ids_[i], ids_[next_[i]])) {
        heap_.push_back(Cand{e->rank, i, e->id});
        std::push_heap(heap_.begin(), heap_.end(), cmp);
      }
    };
    for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), cmp);
      Cand c = heap_.back();
      heap_.pop_back();
      if (!alive_[c.pos] || next_[c.pos] < 0) continue;
      int32_t r = next_[c.pos];
      const MergeTable::Entry* e = t_.merges.find(ids_[c.pos], ids_[r]);
      if (!e || e->id != c.id) continue;
      ids_[c.pos] = c.id;
      alive_[r] = 0;
      next_[c.pos] = next_[r];
      if (next_[r] >= 0) prev_[next_[r]] = c.pos;
      push(prev_[c.pos]);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = next_[i]) out_.push_back(ids_[i]);
  }

  const Tokenizer::Impl& t_;
  std::vector<int32_t>& out_;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md_;
  std::string norm_;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, SvHash, std::equal_to<>> cache_;
  std::vector<int32_t> pool_;
  std::vector<int32_t> ids_, ranks_, merged_, prev_, next_;
  std::vector<uint8_t> alive_;
  std::vector<Cand> heap_;
};

}  // namespace

// --- public API -----------------------------------------------------------------
Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& t = *impl_;
  std::string clean;
  if (!utf8_valid(text)) {
    utf8_append_lossy(text, clean, true);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  Encoder enc(t, out);
  const AddedTrie& trie = parse_special ? t.trie_all : t.trie_plain;
  // Sections between added tokens; lstrip/rstrip trim the neighbours.
  size_t start = 0, pos = 0;
  bool strip_next = false;
  while (pos < text.size()) {
    size_t len = 0;
    int32_t k = trie.may_start(static_cast<unsigned char>(text[pos])) ? trie.match(text, pos, len) : -1;
    if (k < 0) {
      ++pos;
      continue;
    }
    const AddedToken& a = t.added[static_cast<size_t>(k)];
    std::string_view sec = text.substr(start, pos - start);
    if (strip_next) sec = trim_start(sec);
    if (a.lstrip) sec = trim_end(sec);
    enc.section(sec);
    out.push_back(a.id);
    strip_next = a.rstrip;
    pos += len;
    start = pos;
  }
  std::string_view sec = text.substr(start);
  if (strip_next) sec = trim_start(sec);
  enc.section(sec);
  return out;
}

static void check_id(const Tokenizer::Impl& t, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= t.kinds.size() || t.kinds[static_cast<size_t>(id)] == TokenKind::none)
    fail(ErrorKind::invalid_argument, "token id " + std::to_string(id) + " is not in the vocabulary (size " +
                                          std::to_string(t.kinds.size()) + ")");
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    check_id(*impl_, id);
    if (skip_special && impl_->kinds[static_cast<size_t>(id)] == TokenKind::special) continue;
    bytes += impl_->pieces[static_cast<size_t>(id)];
  }
  if (utf8_valid(bytes)) return bytes;
  std::string out;
  utf8_append_lossy(bytes, out, true);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->kinds.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  std::string raw;
  if (!byte_level_decode(token, raw)) return std::nullopt;
  if (auto it = impl_->vocab_bytes.find(raw); it != impl_->vocab_bytes.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kinds.size() && impl_->kinds[static_cast<size_t>(id)] == TokenKind::special;
}

std::string Tokenizer::id_to_piece(int32_t id) const {
  check_id(*impl_, id);
  return impl_->pieces[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

// --- streaming --------------------------------------------------------------------
IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special) : tok_(tok), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  check_id(tok_.impl(), id);
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.impl().pieces[static_cast<size_t>(id)];
  std::string out;
  size_t used = utf8_append_lossy(pending_, out, false);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out;
  utf8_append_lossy(pending_, out, true);
  pending_.clear();
  return out;
}

}  // namespace hmoe::tok
