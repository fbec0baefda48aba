// JSON guard: a pre-scan of JSON text, on the raw bytes, before
// nlohmann::json builds anything from it.
//
// Why: nlohmann::json's parser is iterative, but copying, comparing, dumping
// and (in older releases) destroying a value recurse once per nesting level,
// so a body nested 100,000 levels deep anywhere (a message's extra key, a
// tool's parameters, chat_template_kwargs, a tool call's arguments string
// that is parsed later) overflows the stack. Checking the depth while the
// bytes are scanned means no deep value is ever built. The same pass finds
// raw NUL bytes (nlohmann's lexer takes '\0' for the end of the input, so a
// NUL would silently cut the body short) and duplicate object keys (parsers
// disagree on which one wins; a proxy that checked the first would be
// fooled by a second).
//
// The scan does not validate JSON: malformed text passes through to the real
// parser, which rejects it. Cost: one pass over the bytes; a set of keys per
// open object when duplicates are checked.
//
// Thread safety: pure functions.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace hmoe {

struct JsonScanIssue {
  enum class Kind { none, too_deep, nul_byte, duplicate_key };
  Kind kind = Kind::none;
  size_t offset = 0;  // byte offset of the offending character
  // Where in the document: "messages[0].tool_calls[0].function" (at most
  // a few components, then "..."); empty at the top level.
  std::string path;
  std::string key;  // duplicate_key: the repeated key
  explicit operator bool() const { return kind != Kind::none; }
};

// The first issue in text, or Kind::none. Depth counts open objects and
// arrays: "{}" is depth 1, "{\"a\":[1]}" depth 2.
JsonScanIssue scan_json(std::string_view text, int max_depth, bool check_duplicate_keys);

// True when text nests no deeper than max_depth (NUL bytes and duplicates
// are not checked): the guard for JSON found inside strings (tool call
// arguments) before it is parsed.
bool json_depth_ok(std::string_view text, int max_depth);

// Where nlohmann::json's parser fails on text (a number out of range,
// invalid UTF-8, a lone surrogate escape, a syntax error), as a path like
// scan_json's ("messages[0].content"); empty when it fails at the top level
// or does not fail. Call it only with text that passed scan_json (it parses
// again, with a callback per value).
std::string json_error_path(std::string_view text);

}  // namespace hmoe
