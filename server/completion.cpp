#include "server/completion.h"

#include "server/api_error.h"

namespace hmoe::server {

using ojson = nlohmann::ordered_json;

namespace {
// Ids the model can produce but the tokenizer has no token for (padding rows
// of the embedding) decode to nothing, as in Hugging Face tokenizers.
std::string token_text(const tok::Tokenizer& t, int32_t id) {
  try {
    return t.decode({id});
  } catch (const std::exception&) {
    return {};
  }
}
std::string token_bytes(const tok::Tokenizer& t, int32_t id) {
  try {
    return t.id_to_piece(id);
  } catch (const std::exception&) {
    return {};
  }
}
ojson bytes_of(const std::string& s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}
}  // namespace

CompletionBuilder::CompletionBuilder(const GenSpec& spec, const ModelInfo& m, std::string id, int64_t created, uint64_t tool_id_seed)
    : spec_(spec), m_(m), id_(std::move(id)), created_(created), decoder_(*m.tokenizer, spec.skip_special), stop_(spec.stop),
      parser_(spec.chat && spec.parse_tools, spec.chat && spec.parse_reasoning, spec.start_in_reasoning, tool_id_seed) {
  if (!spec.forced_prefix.empty()) parser_.push(spec.forced_prefix);  // the opened tool call: nothing to emit yet
}

std::string CompletionBuilder::finish_reason(FinishReason r) const {
  if (stop_.stopped()) return parser_.tool_call_count() > 0 ? "tool_calls" : "stop";
  switch (r) {
    case FinishReason::eos: return parser_.tool_call_count() > 0 ? "tool_calls" : "stop";
    case FinishReason::length: return "length";
    // Only OpenAI's values: an interrupted generation ends with an error event instead (on_finish).
    default: return "stop";
  }
}

ParsedDelta CompletionBuilder::feed(const std::vector<TokenEvent>& tokens, std::vector<const TokenEvent*>& used) {
  ParsedDelta d;
  for (const TokenEvent& ev : tokens) {
    if (stop_.stopped()) break;
    ++completion_tokens_;
    used.push_back(&ev);
    std::string piece;
    try {
      piece = decoder_.push(ev.token);
    } catch (const std::exception&) {
      // no text for this id
    }
    std::string text = stop_.push(piece);
    if (!spec_.chat) d.content += text;
    else if (!text.empty()) d.append(parser_.push(text));
  }
  return d;
}

ParsedDelta CompletionBuilder::flush() {
  ParsedDelta d;
  if (!stop_.stopped()) {
    std::string text = stop_.push(decoder_.finish());
    text += stop_.finish();
    if (!spec_.chat) d.content += text;
    else d.append(parser_.push(text));
  }
  if (spec_.chat) d.append(parser_.finish());
  return d;
}

ojson CompletionBuilder::chunk_base() const {
  ojson j;
  j["id"] = id_;
  j["object"] = spec_.chat ? "chat.completion.chunk" : "text_completion";
  j["created"] = created_;
  j["model"] = m_.name;
  return j;
}

ojson CompletionBuilder::usage() const {
  return ojson{{"prompt_tokens", prompt_tokens()},
               {"completion_tokens", completion_tokens_},
               {"total_tokens", prompt_tokens() + completion_tokens_},
               {"prompt_tokens_details", ojson{{"cached_tokens", cached_tokens_}}}};
}

ojson CompletionBuilder::chat_logprobs(const std::vector<const TokenEvent*>& evs) const {
  ojson content = ojson::array();
  for (const TokenEvent* ev : evs) {
    ojson e{{"token", token_text(*m_.tokenizer, ev->token)}, {"logprob", ev->logprob}, {"bytes", bytes_of(token_bytes(*m_.tokenizer, ev->token))}};
    ojson top = ojson::array();
    for (const auto& t : ev->top)
      top.push_back(ojson{{"token", token_text(*m_.tokenizer, t.id)}, {"logprob", t.logprob}, {"bytes", bytes_of(token_bytes(*m_.tokenizer, t.id))}});
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return ojson{{"content", std::move(content)}};
}

ojson CompletionBuilder::completion_logprobs(const std::vector<const TokenEvent*>& evs, size_t text_offset) const {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  size_t off = text_offset;
  for (const TokenEvent* ev : evs) {
    std::string t = token_text(*m_.tokenizer, ev->token);
    tokens.push_back(t);
    lps.push_back(ev->logprob);
    offs.push_back(off);
    off += t.size();
    ojson top = ojson::object();
    for (const auto& x : ev->top) top[token_text(*m_.tokenizer, x.id)] = x.logprob;
    tops.push_back(spec_.sampling.top_logprobs > 0 ? top : ojson(nullptr));
  }
  return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

void CompletionBuilder::add_prompt_logprobs(std::vector<TokenEvent>&& evs) {
  for (auto& e : evs) prompt_events_.push_back(std::move(e));
}

// The prompt's tokens (the first with null scores), then evs.
ojson CompletionBuilder::echo_logprobs(const std::vector<const TokenEvent*>& evs) const {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offs = ojson::array();
  size_t off = 0;
  for (size_t i = 0; i < spec_.prompt.size(); ++i) {
    std::string t = token_text(*m_.tokenizer, spec_.prompt[i]);
    tokens.push_back(t);
    offs.push_back(off);
    off += t.size();
    const TokenEvent* ev = i > 0 && i - 1 < prompt_events_.size() ? &prompt_events_[i - 1] : nullptr;
    lps.push_back(ev ? ojson(ev->logprob) : ojson(nullptr));
    ojson top = ojson::object();
    if (ev)
      for (const auto& x : ev->top) top[token_text(*m_.tokenizer, x.id)] = x.logprob;
    tops.push_back(ev && spec_.sampling.top_logprobs > 0 ? top : ojson(nullptr));
  }
  ojson gen = completion_logprobs(evs, spec_.prompt_text.size());
  for (auto& x : gen["tokens"]) tokens.push_back(x);
  for (auto& x : gen["token_logprobs"]) lps.push_back(x);
  for (auto& x : gen["top_logprobs"]) tops.push_back(x);
  for (auto& x : gen["text_offset"]) offs.push_back(x);
  return ojson{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

std::string CompletionBuilder::sse(const ojson& j) const {
  return "data: " + j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

std::string CompletionBuilder::stream_delta(ParsedDelta&& d, const std::vector<const TokenEvent*>& evs, const char* finish) {
  const bool lp = spec_.sampling.logprobs && !evs.empty();
  if (d.empty() && !lp && !finish) return {};
  ojson j = chunk_base();
  ojson choice;
  choice["index"] = index_;
  if (spec_.chat) {
    ojson delta = ojson::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (auto& tc : d.tool_calls)
        calls.push_back(ojson{{"index", tool_index_++}, {"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = std::move(delta);
    choice["logprobs"] = lp ? chat_logprobs(evs) : ojson(nullptr);
  } else {
    choice["text"] = d.content;
    choice["logprobs"] = lp ? completion_logprobs(evs, text_len_) : ojson(nullptr);
    text_len_ += d.content.size();
  }
  choice["finish_reason"] = finish ? ojson(finish) : ojson(nullptr);
  j["choices"] = ojson::array({std::move(choice)});
  if (spec_.include_usage) j["usage"] = nullptr;
  return sse(j);
}

std::string CompletionBuilder::on_tokens(const std::vector<TokenEvent>& tokens) {
  std::string out;
  if (spec_.chat && !sent_role_) {
    sent_role_ = true;
    ojson j = chunk_base();
    j["choices"] = ojson::array({ojson{{"index", index_}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    if (spec_.include_usage) j["usage"] = nullptr;
    out += sse(j);
  }
  if (!spec_.chat && spec_.echo && !sent_role_) {
    sent_role_ = true;
    std::vector<const TokenEvent*> none;
    if (spec_.sampling.logprobs) {  // the echoed prompt with its scores (text_offset from 0)
      ojson j = chunk_base();
      j["choices"] = ojson::array({ojson{{"index", index_}, {"text", spec_.prompt_text}, {"logprobs", echo_logprobs(none)}, {"finish_reason", nullptr}}});
      if (spec_.include_usage) j["usage"] = nullptr;
      out += sse(j);
      text_len_ = spec_.prompt_text.size();
    } else {
      out += stream_delta(ParsedDelta{spec_.prompt_text, {}, {}}, none, nullptr);
    }
  }
  std::vector<const TokenEvent*> used;
  ParsedDelta d = feed(tokens, used);
  if (stop_.stopped()) d.append(flush());
  out += stream_delta(std::move(d), used, nullptr);
  return out;
}

std::string CompletionBuilder::on_finish_choice(FinishReason reason, const std::string& error) {
  std::string out = on_tokens({});
  if (reason == FinishReason::error) {
    out += "data: " + error_body(500, "generation failed: " + error, "", "generation_error") + "\n\n";
  } else if (reason == FinishReason::shutdown || reason == FinishReason::cancelled) {
    // OpenAI has no finish_reason for this ("abort" is vLLM's): clients see an error event.
    out += "data: " + error_body(503, "the server is shutting down; the generation was interrupted", "", "shutting_down") + "\n\n";
  } else {
    ParsedDelta d = stop_.stopped() ? ParsedDelta{} : flush();
    std::vector<const TokenEvent*> none;
    std::string fr = finish_reason(reason);
    out += stream_delta(std::move(d), none, fr.c_str());
  }
  return out;
}

std::string CompletionBuilder::on_end(const ojson& usage) const {
  std::string out;
  if (spec_.include_usage) {
    ojson j = chunk_base();
    j["choices"] = ojson::array();
    j["usage"] = usage;
    out += sse(j);
  }
  return out + "data: [DONE]\n\n";
}

std::string CompletionBuilder::on_finish(FinishReason reason, const std::string& error) {
  std::string out = on_finish_choice(reason, error);
  return out + on_end(usage());
}

ParsedDelta CompletionBuilder::take(const std::vector<TokenEvent>& tokens) {
  std::vector<const TokenEvent*> used;
  return feed(tokens, used);
}

void CompletionBuilder::add_tokens(const std::vector<TokenEvent>& tokens) {
  std::vector<const TokenEvent*> used;
  all_.append(feed(tokens, used));
  for (const TokenEvent* e : used) all_events_.push_back(*e);
}

ojson CompletionBuilder::body(FinishReason reason) {
  all_.append(flush());
  std::vector<const TokenEvent*> evs;
  for (const auto& e : all_events_) evs.push_back(&e);
  ojson j;
  j["id"] = id_;
  j["object"] = spec_.chat ? "chat.completion" : "text_completion";
  j["created"] = created_;
  j["model"] = m_.name;
  ojson choice;
  choice["index"] = index_;
  if (spec_.chat) {
    ojson msg;
    msg["role"] = "assistant";
    msg["content"] = all_.content.empty() && !all_.tool_calls.empty() ? ojson(nullptr) : ojson(all_.content);
    if (!all_.reasoning.empty()) msg["reasoning_content"] = all_.reasoning;
    if (!all_.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (auto& tc : all_.tool_calls)
        calls.push_back(ojson{{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
      msg["tool_calls"] = std::move(calls);
    }
    choice["message"] = std::move(msg);
    choice["logprobs"] = spec_.sampling.logprobs ? chat_logprobs(evs) : ojson(nullptr);
  } else {
    choice["text"] = (spec_.echo ? spec_.prompt_text : std::string()) + all_.content;
    choice["logprobs"] = !spec_.sampling.logprobs ? ojson(nullptr) : spec_.echo ? echo_logprobs(evs) : completion_logprobs(evs, 0);
  }
  choice["finish_reason"] = finish_reason(reason);
  j["choices"] = ojson::array({std::move(choice)});
  j["usage"] = usage();
  return j;
}

}  // namespace hmoe::server
