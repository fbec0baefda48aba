// Private state of a Tokenizer: id tables, the merge-rank hash table, the
// added-token trie and the compiled pre-tokenizer regexes. Built once by the
// loaders (tokenizer_load.cpp), read-only afterwards.
#pragma once
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/tokenizer/tokenizer.h"

namespace hmoe::tok {

// Open-addressing map (a, b) -> (rank, merged id). Lookups are the BPE inner loop.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  void insert(int32_t a, int32_t b, int32_t rank, int32_t id);  // a later insert of the same pair wins
  const Entry* find(int32_t a, int32_t b) const {
    uint64_t key = pack(a, b);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
  std::vector<Entry> table_;
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
};

struct PcreCodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

struct SplitRegex {
  std::string source;  // as written in the model file
  std::unique_ptr<pcre2_code, PcreCodeDeleter> code;
  bool jit = false;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

// Byte trie over added-token contents; longest match at a position.
class AddedTrie {
 public:
  void build(const std::vector<AddedToken>& tokens, bool include_special);
  // Index into the token list of the longest token starting at s[pos], or -1.
  int32_t match(std::string_view s, size_t pos, size_t& len) const;
  bool may_start(unsigned char b) const { return first_[b]; }

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<uint8_t, int32_t>> next;
  };
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

enum class TokenKind : uint8_t { none, normal, added, special };

struct Tokenizer::Impl {
  std::string source;                      // file the tokenizer came from, for messages
  std::vector<std::string> pieces;         // id -> raw bytes
  std::vector<TokenKind> kinds;            // id -> kind
  StringIdMap vocab_bytes;                 // model vocab: raw bytes -> id
  StringIdMap added_ids;                   // added content -> id
  std::vector<AddedToken> added;
  AddedTrie trie_all, trie_plain;          // all added tokens / non-special ones only
  std::array<int32_t, 256> byte_id{};
  MergeTable merges;
  bool ignore_merges = false;
  bool nfc = false;
  std::vector<SplitRegex> splits;
  std::optional<int32_t> bos, eos;

  // Builders used by the loaders.
  void add_vocab(std::string_view byte_level_token, int32_t id);
  void add_added(AddedToken t);
  void add_merge(std::string_view a, std::string_view b, int32_t rank);  // byte-level spellings
  void add_split(const std::string& pattern);
  void finish();  // byte ids, tries; checks the vocabulary is complete
};

// GPT-2 byte-level alphabet: byte -> code point and back.
uint32_t byte_to_cp(uint8_t b);
// Converts a byte-level spelled token to raw bytes; false if some character
// is outside the alphabet (out then holds the token's own UTF-8).
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace hmoe::tok
