// Structured output grammars: a JSON Schema (engine/json_schema.h) or a tool
// call compiled to a Grammar, a per-sequence GrammarState that takes the
// output byte by byte, and grammar_mask(), which removes from a logits row
// every token that cannot continue the output.
//
// Grammar: a sequence of items, each raw text (exact bytes, e.g. the
// "\n</tool_call>" after a tool call) or one JSON value matching a node.
// Nodes: `value` (a set of JSON types with per-type rules: object
// properties in the schema's order - optional ones may be skipped, required
// ones may not - with additional properties after them when allowed; array
// items with min/max counts; string min/max length in code points; integer
// = digits only, no fraction or exponent), `literal` (enum/const: the compact
// JSON text of each allowed value, matched byte for byte) and `any_of`
// (alternatives, followed in parallel until the bytes tell them apart).
//
// GrammarState is a set of pushdown stacks (one per live alternative, at
// most kMaxStacks); each stack is a vector of Frames. Numbers are capped at
// 20 integer / 20 fraction / 3 exponent digits, whitespace outside strings
// at 20 bytes in a row and nesting at kMaxDepth frames, so a model cannot
// loop forever on blanks or digits.
//
// grammar_mask() walks the vocabulary as a flattened trie (JsonVocab: tokens
// sorted by bytes, each fed from the state its shared prefix with the
// previous token left; a refused prefix skips every token that starts with
// it). Inside a free string of one stack only the non-plain tokens are fed
// (plain ones are allowed when their code points fit maxLength).
// grammar_mask_reference() feeds every token from scratch: the scalar
// reference the tests compare against. bench_grammar_mask prints the cost.
//
// Thread safety: a Grammar is immutable and shared; a GrammarState belongs to
// one sequence's Sampler.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/json_constraint.h"

namespace hmoe {

struct GrammarNode {
  enum class Kind : uint8_t { value, literal, any_of };
  enum Type : uint8_t { t_null = 1, t_bool = 2, t_integer = 4, t_number = 8, t_string = 16, t_array = 32, t_object = 64, t_all = 127 };
  Kind kind = Kind::value;
  uint8_t types = t_all;
  // object
  std::vector<std::string> prop_names;  // raw key bytes (as written between the quotes)
  std::vector<int32_t> prop_nodes;
  uint64_t required = 0;   // bit i: prop i is required
  int32_t additional = -1;  // node of other keys' values; -1: no other keys
  // array
  int32_t items = -1;  // -1: any value
  uint32_t min_items = 0, max_items = UINT32_MAX;
  // string
  uint32_t min_len = 0, max_len = UINT32_MAX;
  // literal: compact JSON texts, sorted and unique
  std::vector<std::string> literals;
  // any_of
  std::vector<int32_t> alts;
};

struct Grammar {
  struct Item {
    bool raw = false;
    std::string text;  // raw
    int32_t node = -1;  // JSON value
  };
  std::vector<GrammarNode> nodes;
  std::vector<Item> items;
  int32_t any_node = -1;  // a node for "any JSON value" (added on demand)
  int32_t add(GrammarNode n) {
    nodes.push_back(std::move(n));
    return static_cast<int32_t>(nodes.size() - 1);
  }
  int32_t any();  // the any-value node (created once)
};

class GrammarState {
 public:
  static constexpr size_t kMaxStacks = 32, kMaxDepth = 64;
  GrammarState() = default;
  explicit GrammarState(const Grammar* g);
  // Copies take the live stacks; assignment reuses this state's buffers
  // (the mask assigns states per trie node and per token).
  GrammarState(const GrammarState& o);
  GrammarState& operator=(const GrammarState& o);
  // False when the byte cannot continue the output (the state is then dead).
  bool feed(uint8_t c);
  bool feed(std::string_view s);
  // The output so far is a whole sentence of the grammar.
  bool complete() const;
  bool dead() const { return n_ == 0; }
  // One stack, inside a free (non-key, non-literal) string: the number of
  // code points it may still take (UINT32_MAX: no limit); -1 otherwise.
  int64_t free_string_room() const;

  struct Frame {
    int32_t node = 0;
    int32_t child = -1;  // object: the value node of the current key
    uint32_t count = 0;  // object: next property; array: items; string: code points
    uint16_t pos = 0;    // key / literal bytes; number digits
    uint8_t phase = 0;
    uint8_t sub = 0;
    uint64_t bits = 0;   // key candidates; literal range [lo, hi)
    uint64_t bits2 = 0;  // free keys: listed names the key so far is a prefix of
    bool operator==(const Frame&) const = default;
  };
  struct Stack {
    std::vector<Frame> frames;
    uint32_t item = 0;     // current grammar item
    uint32_t raw_pos = 0;  // bytes of a raw item matched
    uint8_t ws = 0;        // whitespace run
    bool operator==(const Stack&) const = default;
  };

 private:
  bool feed_stack(Stack& s, uint8_t c, std::vector<Stack>& forks) const;
  bool start_value(Stack& s, int32_t node, uint8_t c, std::vector<Stack>& forks) const;
  bool value_done(Stack& s, uint8_t c, std::vector<Stack>& forks, bool refeed) const;
  bool stack_complete(const Stack& s) const;

  const Grammar* g_ = nullptr;
  std::vector<Stack> stacks_;  // [0, n_) are live; the rest keep their buffers for reuse
  size_t n_ = 0;
};

// Sets logits of the tokens `state` cannot take to -infinity; end_ids are
// allowed only when the state is complete. Returns the number of tokens left
// allowed (0: nothing can follow; the row is left as it was).
int64_t grammar_mask(const JsonVocab& v, const GrammarState& state, const std::vector<int32_t>& end_ids, float* logits, int64_t vocab);
// The same result, every token fed from a copy of the state (tests).
int64_t grammar_mask_reference(const JsonVocab& v, const GrammarState& state, const std::vector<int32_t>& end_ids, float* logits, int64_t vocab);

}  // namespace hmoe
