// Parsing and validation of OpenAI chat/completions request bodies into a
// GenSpec the scheduler can run. Every problem throws ApiError naming the
// field (param) with status 400 (404 for an unknown model). Unknown fields
// are ignored, as vLLM and OpenAI do, so clients that send vendor fields
// keep working; known-but-unsupported options (best_of > 1) are refused
// rather than silently ignored; response_format json_object constrains
// sampling to one JSON object (engine/json_constraint.h) and json_schema to
// the schema (server/structured.h) from the reply's first token (a think
// block the prompt opened is closed first, so reasoning models answer
// without reasoning). tool_choice "required" or a named function opens the
// Hermes <tool_call> block at the end of the prompt (templates that do not
// use it refuse them) and constrains the call to an offered tool and its
// parameters' schema; under "auto" a call the model opens is constrained
// the same way. n (1..16) asks for several choices.
//
// Thread safety: the functions are pure given a const ModelInfo; the
// tokenizer and chat template are thread-safe.
#pragma once
#include <memory>

#include "engine/text/json_constraint.h"
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/sampler.h"

namespace hmoe::tok {
class Tokenizer;
}
namespace hmoe::chat {
class ChatTemplate;
}

namespace hmoe::server {

struct ModelInfo {
  std::string name;             // served model name
  int64_t context = 0;          // max tokens (prompt + output)
  int64_t vocab = 0;
  std::vector<int32_t> eos_ids;
  const tok::Tokenizer* tokenizer = nullptr;
  const chat::ChatTemplate* chat_template = nullptr;  // null: chat requests get 400
  uint64_t default_seed = 0;    // mixed with a per-request counter when no seed is given
  SamplingParams defaults;      // sampling fields a request leaves out (generation_config.json)
  std::shared_ptr<JsonVocabCache> json_vocab;  // JSON mode (null: response_format json_object is refused)
};

constexpr int64_t kMaxChoices = 16;  // n

struct GenSpec {
  bool chat = true;
  int64_t n = 1;  // choices
  bool stream = false;
  bool include_usage = false;
  std::vector<int32_t> prompt;
  std::string prompt_text;       // rendered chat prompt (chat) or the prompt string
  int64_t max_tokens = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;  // eos (unless ignore_eos) + stop_token_ids
  bool parse_tools = false;
  // Text appended to the prompt and already consumed by the output parser:
  // tool_choice "required" or a named function opens the tool call
  // ("<tool_call>\n"; the grammar then forces the name and arguments); either
  // that or JSON mode first closes a think block the prompt opened.
  std::string forced_prefix;
  bool parse_reasoning = false;
  bool start_in_reasoning = false;
  bool skip_special = true;
  bool echo = false;              // completions: prepend the prompt text
};

// body: the raw request bytes. request_seq: a per-server counter that makes
// unseeded requests differ.
GenSpec parse_chat_request(std::string_view body, const ModelInfo& m, uint64_t request_seq);
GenSpec parse_completion_request(std::string_view body, const ModelInfo& m, uint64_t request_seq);
// POST /tokenize (vLLM's schema; llama.cpp's "content" also accepted):
// {"prompt": text} -> its ids as /v1/completions would see them, or
// {"messages": [...], "tools", "chat_template_kwargs", "add_generation_prompt"}
// -> the ids of the rendered chat prompt. No length limit applies.
std::vector<int32_t> parse_tokenize_request(std::string_view body, const ModelInfo& m);
// POST /detokenize: {"tokens": [ids]} -> their text.
std::string parse_detokenize_request(std::string_view body, const ModelInfo& m);

}  // namespace hmoe::server
