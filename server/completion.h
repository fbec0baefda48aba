// CompletionBuilder: turns the token events of one request into OpenAI
// responses - SSE chunks while streaming, or one JSON body at the end.
//
// Per token: incremental detokenization (never a partial UTF-8 character),
// stop strings (held back across token boundaries, never emitted), then the
// output parser (<think> -> reasoning_content, <tool_call> -> tool_calls).
// When a stop string matches, stop_hit() becomes true: the caller cancels
// the sequence; tokens that arrive after it are ignored.
//
// Not thread-safe: one builder per request, used on its connection's thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/serving/scheduler.h"
#include "engine/text/output_parser.h"
#include "engine/text/stop_strings.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "server/request.h"

namespace hmoe::server {

class CompletionBuilder {
 public:
  CompletionBuilder(const GenSpec& spec, const ModelInfo& m, std::string id, int64_t created, uint64_t tool_id_seed = 0);

  // Streaming: SSE text ("data: ...\n\n" events) for these tokens; may be empty.
  std::string on_tokens(const std::vector<TokenEvent>& tokens);
  // Streaming: the final events (finish chunk, usage chunk, [DONE]). A
  // generation ended by an error or shutdown gets an error event instead of
  // a finish chunk: finish_reason only takes OpenAI's values.
  std::string on_finish(FinishReason reason, const std::string& error);
  // Streaming with several choices: this choice's last events (its finish
  // chunk, or an error event), then once for the request on_end(usage).
  std::string on_finish_choice(FinishReason reason, const std::string& error);
  std::string on_end(const nlohmann::ordered_json& usage) const;
  // Choice index of the chunks and body (n > 1).
  void set_index(int i) { index_ = i; }
  // Parsed text without OpenAI chat framing (the Responses API): the delta
  // of these tokens, and what is left at the end.
  ParsedDelta take(const std::vector<TokenEvent>& tokens);
  ParsedDelta take_rest() { return flush(); }
  // Non-streaming: feed everything, then body().
  void add_tokens(const std::vector<TokenEvent>& tokens);
  nlohmann::ordered_json body(FinishReason reason);

  // Completions with echo and logprobs: the prompt's scores (SeqChannel's
  // prompt events, all of them before the first token), reported ahead of the
  // generated tokens' with a null first entry, as OpenAI and vLLM do.
  void add_prompt_logprobs(std::vector<TokenEvent>&& evs);

  bool stop_hit() const { return stop_.stopped(); }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t prompt_tokens() const { return static_cast<int64_t>(spec_.prompt.size()); }
  // Prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens).
  void set_cached_tokens(int64_t n) { cached_tokens_ = n; }
  int64_t cached_tokens() const { return cached_tokens_; }
  std::string finish_reason(FinishReason r) const;

 private:
  ParsedDelta feed(const std::vector<TokenEvent>& tokens, std::vector<const TokenEvent*>& used);
  ParsedDelta flush();
  nlohmann::ordered_json chunk_base() const;

 public:
  nlohmann::ordered_json usage() const;

 private:
  nlohmann::ordered_json chat_logprobs(const std::vector<const TokenEvent*>& evs) const;
  nlohmann::ordered_json completion_logprobs(const std::vector<const TokenEvent*>& evs, size_t text_offset) const;
  nlohmann::ordered_json echo_logprobs(const std::vector<const TokenEvent*>& evs) const;
  std::string sse(const nlohmann::ordered_json& j) const;
  std::string stream_delta(ParsedDelta&& d, const std::vector<const TokenEvent*>& evs, const char* finish);

  GenSpec spec_;
  const ModelInfo& m_;
  std::string id_;
  int64_t created_;
  tok::IncrementalDecoder decoder_;
  StopMatcher stop_;
  OutputParser parser_;
  int64_t completion_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  bool sent_role_ = false;
  int index_ = 0;
  int tool_index_ = 0;
  size_t text_len_ = 0;  // completions: bytes of text sent so far (logprobs text_offset)
  // Non-streaming accumulation.
  ParsedDelta all_;
  std::vector<TokenEvent> all_events_;
  std::vector<TokenEvent> prompt_events_;
};

}  // namespace hmoe::server
