// ReplyBuilder: what the HTTP session needs from one request's reply,
// whatever its API: the tokens of each choice in, SSE text or one JSON body
// out. ChatReply serves /v1/chat/completions and /v1/completions with n
// choices (one CompletionBuilder each: chunks carry their choice index;
// usage counts the prompt once and the completion tokens of every choice,
// as OpenAI does); ResponsesReply (server/responses_api.h) serves
// /v1/responses.
//
// Not thread-safe: one per request, used on its connection's thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/serving/scheduler.h"
#include "server/completion.h"

namespace hmoe::server {

class ReplyBuilder {
 public:
  virtual ~ReplyBuilder() = default;
  virtual size_t choices() const = 0;
  // Streaming: SSE text for new tokens of choice i; its last events; the
  // request's last events once every choice has finished.
  virtual std::string on_tokens(size_t i, const std::vector<TokenEvent>& tokens) = 0;
  virtual std::string on_choice_finish(size_t i, FinishReason reason, const std::string& error) = 0;
  virtual std::string on_end() = 0;
  // Non-streaming: feed everything, then body() with each choice's reason.
  virtual void add_tokens(size_t i, const std::vector<TokenEvent>& tokens) = 0;
  virtual nlohmann::ordered_json body(const std::vector<FinishReason>& reasons) = 0;
  // A stop string matched in choice i: the caller cancels its sequence.
  virtual bool stop_hit(size_t i) const = 0;
  virtual void set_cached_tokens(int64_t n) = 0;
  // Completions with echo + logprobs: choice i's prompt scores (SeqChannel's prompt events).
  virtual void add_prompt_logprobs(size_t i, std::vector<TokenEvent>&& evs) = 0;
  virtual int64_t prompt_tokens() const = 0;
  virtual int64_t completion_tokens() const = 0;
  virtual int64_t cached_tokens() const = 0;
};

class ChatReply : public ReplyBuilder {
 public:
  ChatReply(const GenSpec& spec, const ModelInfo& m, const std::string& id, int64_t created);
  size_t choices() const override { return b_.size(); }
  std::string on_tokens(size_t i, const std::vector<TokenEvent>& tokens) override { return b_[i]->on_tokens(tokens); }
  std::string on_choice_finish(size_t i, FinishReason reason, const std::string& error) override { return b_[i]->on_finish_choice(reason, error); }
  std::string on_end() override { return b_[0]->on_end(usage()); }
  void add_tokens(size_t i, const std::vector<TokenEvent>& tokens) override { b_[i]->add_tokens(tokens); }
  nlohmann::ordered_json body(const std::vector<FinishReason>& reasons) override;
  bool stop_hit(size_t i) const override { return b_[i]->stop_hit(); }
  void set_cached_tokens(int64_t n) override { b_[0]->set_cached_tokens(n); }
  void add_prompt_logprobs(size_t i, std::vector<TokenEvent>&& evs) override { b_[i]->add_prompt_logprobs(std::move(evs)); }
  int64_t prompt_tokens() const override { return b_[0]->prompt_tokens(); }
  int64_t completion_tokens() const override;
  int64_t cached_tokens() const override { return b_[0]->cached_tokens(); }

 private:
  nlohmann::ordered_json usage() const;
  std::vector<std::unique_ptr<CompletionBuilder>> b_;
};

}  // namespace hmoe::server
