// The OpenAI Responses API (POST /v1/responses) on top of the chat path.
//
// parse_responses_request() turns a Responses body into the chat request
// it means and parses that (server/request.h), so the template, tools,
// sampling and structured outputs behave exactly as in chat completions:
// `input` (a string, or items: messages with roles user / system /
// developer / assistant and input_text / output_text parts, function_call
// and function_call_output items; reasoning items are skipped),
// `instructions` (a system message first), flat function `tools`
// ({type, name, description, parameters, strict}), `tool_choice`,
// `max_output_tokens`, `temperature`, `top_p`, `text.format` (text,
// json_object, json_schema) and `stream`. Responses are not stored:
// `previous_response_id` is refused with a 400 (send the whole conversation
// in `input`), and `store` is answered as false. Other tool types and
// input parts (images, files) are refused with a 400 naming them.
//
// ResponsesReply writes the response object (output items: reasoning,
// message with output_text, function_call) or, streaming, the standard
// events: response.created, response.in_progress, output_item.added,
// content_part.added, output_text.delta / .done, content_part.done,
// function_call_arguments.delta / .done, output_item.done and
// response.completed (response.incomplete when max_output_tokens ran out,
// response.failed on an error; an "error" event, code shutting_down, when
// the server shuts down mid-generation), each "event: TYPE" + "data: JSON" with a
// sequence_number; no [DONE].
//
// Not thread-safe: one reply per request, on its connection's thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/completion.h"
#include "server/reply.h"
#include "server/request.h"

namespace hmoe::server {

struct ResponsesRequest {
  GenSpec spec;
  nlohmann::ordered_json echo;  // request fields the response object repeats (instructions, tools, ...)
};

ResponsesRequest parse_responses_request(std::string_view body, const ModelInfo& m, uint64_t request_seq);

class ResponsesReply : public ReplyBuilder {
 public:
  ResponsesReply(const ResponsesRequest& req, const ModelInfo& m, std::string id, int64_t created);
  size_t choices() const override { return 1; }
  std::string on_tokens(size_t i, const std::vector<TokenEvent>& tokens) override;
  std::string on_choice_finish(size_t i, FinishReason reason, const std::string& error) override;
  std::string on_end() override { return {}; }
  void add_tokens(size_t i, const std::vector<TokenEvent>& tokens) override;
  nlohmann::ordered_json body(const std::vector<FinishReason>& reasons) override;
  bool stop_hit(size_t) const override { return b_.stop_hit(); }
  void set_cached_tokens(int64_t n) override { b_.set_cached_tokens(n); }
  void add_prompt_logprobs(size_t, std::vector<TokenEvent>&&) override {}  // chat prompts are not scored
  int64_t prompt_tokens() const override { return b_.prompt_tokens(); }
  int64_t completion_tokens() const override { return b_.completion_tokens(); }
  int64_t cached_tokens() const override { return b_.cached_tokens(); }

 private:
  std::string start();
  std::string process(ParsedDelta&& d);
  std::string close_message();
  std::string close_reasoning();
  nlohmann::ordered_json response(const std::string& status, const std::string& incomplete) const;
  std::string event(const char* type, nlohmann::ordered_json j);
  std::string item_id(const char* prefix);

  ResponsesRequest req_;
  const ModelInfo& m_;
  CompletionBuilder b_;
  std::string id_;
  int64_t created_;
  bool streaming_;
  bool started_ = false;
  int64_t seq_ = 0;
  std::vector<nlohmann::ordered_json> items_;  // finished output items
  std::string reasoning_;                     // open reasoning text
  bool msg_open_ = false;
  std::string msg_id_, msg_text_;
  int64_t msg_index_ = 0;
};

}  // namespace hmoe::server
