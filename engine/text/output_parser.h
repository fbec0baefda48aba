// OutputParser: splits generated text into content, reasoning and tool calls
// the way vLLM's hermes tool parser and qwen3 reasoning parser do, while the
// text is still streaming.
//
// - `<think>...</think>` becomes reasoning; when the prompt already opened the
//   think block (start_in_reasoning), text up to `</think>` is reasoning.
// - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes one
//   ToolCall (arguments re-serialized as a compact JSON string). A block whose
//   body is not such an object is passed through as content, unchanged.
//   After the first tool call, whitespace-only content is dropped.
// - A tag split across pushes is held back until it is complete, so no
//   partial tag is ever emitted; finish() flushes what is left (an
//   unterminated <tool_call>, cut off by max_tokens, is dropped: raw call
//   text never reaches content).
//
// One parser per stream; not thread-safe.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hmoe {

struct ToolCall {
  std::string id;         // "call_" + 24 characters, unique per parser
  std::string name;
  std::string arguments;  // JSON text
};

struct ParsedDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  void append(ParsedDelta&& o);
};

class OutputParser {
 public:
  // Tool call ids are "call_" + 24 random [A-Za-z0-9] from the kernel's
  // CSPRNG (engine/serving/random_id.h); a nonzero id_seed makes them reproducible (tests).
  OutputParser(bool parse_tools, bool parse_reasoning, bool start_in_reasoning = false, uint64_t id_seed = 0);
  ParsedDelta push(std::string_view text);
  ParsedDelta finish();
  int tool_call_count() const { return tool_calls_; }

 private:
  enum class Mode { content, reasoning, tool };
  void emit_text(ParsedDelta& d, std::string_view s);
  void close_tool(ParsedDelta& d);
  std::string next_id();

  bool tools_, reasoning_;
  Mode mode_;
  std::string pending_;   // text not yet classified (may end in a partial tag)
  std::string tool_buf_;  // body of the open <tool_call>
  int tool_calls_ = 0;
  uint64_t id_state_;
  bool seeded_;
};

// True if the rendered prompt ends inside an open <think> block.
bool prompt_opens_think(std::string_view prompt);

}  // namespace hmoe
