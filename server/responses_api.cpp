#include "server/responses_api.h"

#include "engine/serving/random_id.h"
#include "engine/text/json_guard.h"
#include "server/api_error.h"
#include "server/json_body.h"

namespace hmoe::server {

using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "invalid_value") {
  throw ApiError(400, msg, param, code);
}

const ojson* field(const ojson& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string str_field(const ojson& j, const char* key, const std::string& param, bool required) {
  const ojson* v = field(j, key);
  if (!v) {
    if (required) bad(param + "." + key, "'" + param + "." + key + "' is required", "missing_required_parameter");
    return {};
  }
  if (!v->is_string()) bad(param + "." + key, "'" + param + "." + key + "' must be a string", "invalid_type");
  return v->get<std::string>();
}

// A message item's content: a string or input_text / output_text parts.
std::string item_text(const ojson& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(param, "'" + param + "' must be a string or an array of content parts", "invalid_type");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    if (!p.is_object()) bad(pp, "'" + pp + "' must be an object", "invalid_type");
    const std::string type = str_field(p, "type", pp, true);
    if (type != "input_text" && type != "output_text" && type != "text")
      bad(pp + ".type", "content part type '" + type + "' is not supported (input_text and output_text only)", "unsupported_value");
    out += str_field(p, "text", pp, true);
  }
  return out;
}

ojson chat_messages(const ojson& j) {
  ojson msgs = ojson::array();
  if (const ojson* ins = field(j, "instructions")) {
    if (!ins->is_string()) bad("instructions", "'instructions' must be a string", "invalid_type");
    msgs.push_back(ojson{{"role", "system"}, {"content", ins->get<std::string>()}});
  }
  const ojson* input = field(j, "input");
  if (!input) bad("input", "'input' is required", "missing_required_parameter");
  if (input->is_string()) {
    msgs.push_back(ojson{{"role", "user"}, {"content", input->get<std::string>()}});
    return msgs;
  }
  if (!input->is_array()) bad("input", "'input' must be a string or an array of items", "invalid_type");
  if (input->empty()) bad("input", "'input' must not be empty");
  for (size_t i = 0; i < input->size(); ++i) {
    const ojson& it = (*input)[i];
    const std::string p = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) bad(p, "'" + p + "' must be an object", "invalid_type");
    const std::string type = field(it, "type") ? str_field(it, "type", p, true) : "message";
    if (type == "message") {
      std::string role = str_field(it, "role", p, true);
      if (role == "developer") role = "system";
      if (role != "user" && role != "system" && role != "assistant")
        bad(p + ".role", "'" + p + ".role' must be user, system, developer or assistant; got '" + role + "'");
      const ojson* c = field(it, "content");
      if (!c) bad(p + ".content", "'" + p + ".content' is required", "missing_required_parameter");
      msgs.push_back(ojson{{"role", role}, {"content", item_text(*c, p + ".content")}});
    } else if (type == "function_call") {
      ojson call{{"id", str_field(it, "call_id", p, true)},
                 {"type", "function"},
                 {"function", {{"name", str_field(it, "name", p, true)}, {"arguments", str_field(it, "arguments", p, true)}}}};
      // Consecutive calls belong to one assistant turn.
      if (!msgs.empty() && msgs.back()["role"] == "assistant") {
        ojson& last = msgs.back();
        if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
        last["tool_calls"].push_back(std::move(call));
      } else {
        msgs.push_back(ojson{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({std::move(call)})}});
      }
    } else if (type == "function_call_output") {
      const ojson* out = field(it, "output");
      if (!out) bad(p + ".output", "'" + p + ".output' is required", "missing_required_parameter");
      const std::string text = out->is_string() ? out->get<std::string>() : item_text(*out, p + ".output");
      msgs.push_back(ojson{{"role", "tool"}, {"tool_call_id", str_field(it, "call_id", p, true)}, {"content", text}});
    } else if (type == "reasoning") {
      continue;  // the template drops earlier turns' reasoning anyway
    } else {
      bad(p + ".type", "input item type '" + type + "' is not supported (message, function_call, function_call_output, reasoning)",
          "unsupported_value");
    }
  }
  return msgs;
}

}  // namespace

ResponsesRequest parse_responses_request(std::string_view body, const ModelInfo& m, uint64_t request_seq) {
  // Depth, NUL bytes and duplicate keys are checked on the raw bytes: no deep value is ever built.
  check_json_body(body);
  ojson j;
  try {
    j = ojson::parse(body.begin(), body.end());
  } catch (const ojson::exception& e) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what(), json_error_path(body), "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object", "", "invalid_json");
  if (field(j, "previous_response_id"))
    bad("previous_response_id", "'previous_response_id' is not supported: this server does not store responses; send the whole conversation in 'input'",
        "unsupported_value");
  if (field(j, "conversation"))
    bad("conversation", "'conversation' is not supported: this server does not store conversations", "unsupported_value");
  ojson chat = ojson::object();
  for (const char* k : {"model", "temperature", "top_p", "stream", "seed", "top_k", "min_p", "stop", "presence_penalty", "frequency_penalty",
                        "repetition_penalty", "chat_template_kwargs", "logit_bias"})
    if (auto it = j.find(k); it != j.end()) chat[k] = *it;
  chat["messages"] = chat_messages(j);
  if (const ojson* mo = field(j, "max_output_tokens")) chat["max_completion_tokens"] = *mo;
  if (const ojson* tools = field(j, "tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array", "invalid_type");
    ojson list = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) bad(p, "'" + p + "' must be an object", "invalid_type");
      const std::string type = str_field(t, "type", p, true);
      if (type != "function") bad(p + ".type", "tool type '" + type + "' is not supported (function tools only)", "unsupported_value");
      ojson fn{{"name", str_field(t, "name", p, true)}};
      for (const char* k : {"description", "parameters", "strict"})
        if (const ojson* v = field(t, k)) fn[k] = *v;
      list.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(list);
  }
  if (const ojson* tc = field(j, "tool_choice")) {
    if (tc->is_object()) {
      const std::string type = str_field(*tc, "type", "tool_choice", true);
      if (type != "function") bad("tool_choice", "tool_choice type '" + type + "' is not supported (function only)", "unsupported_value");
      chat["tool_choice"] = ojson{{"type", "function"}, {"function", {{"name", str_field(*tc, "name", "tool_choice", true)}}}};
    } else {
      chat["tool_choice"] = *tc;
    }
  }
  if (const ojson* text = field(j, "text")) {
    if (!text->is_object()) bad("text", "'text' must be an object", "invalid_type");
    if (const ojson* f = field(*text, "format")) {
      if (!f->is_object()) bad("text.format", "'text.format' must be an object", "invalid_type");
      const std::string type = str_field(*f, "type", "text.format", true);
      if (type == "json_schema") {
        ojson js = *f;
        js.erase("type");
        chat["response_format"] = ojson{{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else {
        chat["response_format"] = ojson{{"type", type}};
      }
    }
  }
  ResponsesRequest r;
  try {
    r.spec = parse_chat_request(chat.dump(), m, request_seq);
  } catch (ApiError& e) {  // name the Responses fields, not their chat equivalents
    if (e.param == "response_format") e.param = "text.format";
    else if (e.param == "max_completion_tokens") e.param = "max_output_tokens";
    else if (e.param.starts_with("messages")) e.param = "input";
    throw;
  }
  r.spec.include_usage = false;
  ojson& echo = r.echo;
  echo["instructions"] = j.contains("instructions") ? j["instructions"] : ojson(nullptr);
  echo["max_output_tokens"] = j.contains("max_output_tokens") ? j["max_output_tokens"] : ojson(nullptr);
  echo["parallel_tool_calls"] = true;
  echo["previous_response_id"] = nullptr;
  echo["temperature"] = r.spec.sampling.temperature;
  echo["top_p"] = r.spec.sampling.top_p;
  echo["tool_choice"] = j.contains("tool_choice") ? j["tool_choice"] : ojson("auto");
  echo["tools"] = j.contains("tools") && j["tools"].is_array() ? j["tools"] : ojson::array();
  echo["text"] = j.contains("text") && j["text"].is_object() ? j["text"] : ojson{{"format", {{"type", "text"}}}};
  echo["metadata"] = j.contains("metadata") && j["metadata"].is_object() ? j["metadata"] : ojson::object();
  echo["store"] = false;
  return r;
}

ResponsesReply::ResponsesReply(const ResponsesRequest& req, const ModelInfo& m, std::string id, int64_t created)
    : req_(req), m_(m), b_(req.spec, m, id, created), id_(std::move(id)), created_(created), streaming_(req.spec.stream) {}

// Item ids (msg_, fc_, rs_) from the kernel's CSPRNG, like every other id (engine/serving/random_id.h).
std::string ResponsesReply::item_id(const char* prefix) { return prefix + random_alnum(24); }

std::string ResponsesReply::event(const char* type, ojson j) {
  ojson e{{"type", type}, {"sequence_number", seq_++}};
  for (auto it = j.begin(); it != j.end(); ++it) e[it.key()] = std::move(it.value());
  return std::string("event: ") + type + "\ndata: " + e.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

ojson ResponsesReply::response(const std::string& status, const std::string& incomplete) const {
  ojson r{{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", status}, {"error", nullptr}};
  r["incomplete_details"] = incomplete.empty() ? ojson(nullptr) : ojson{{"reason", incomplete}};
  for (auto it = req_.echo.begin(); it != req_.echo.end(); ++it) r[it.key()] = it.value();
  r["model"] = m_.name;
  r["output"] = ojson::array();
  for (const auto& it : items_) r["output"].push_back(it);
  if (status == "in_progress") {
    r["output"] = ojson::array();
    r["usage"] = nullptr;
  } else {
    r["usage"] = ojson{{"input_tokens", b_.prompt_tokens()},
                       {"input_tokens_details", {{"cached_tokens", b_.cached_tokens()}}},
                       {"output_tokens", b_.completion_tokens()},
                       {"output_tokens_details", {{"reasoning_tokens", 0}}},
                       {"total_tokens", b_.prompt_tokens() + b_.completion_tokens()}};
  }
  return r;
}

std::string ResponsesReply::start() {
  if (started_) return {};
  started_ = true;
  if (!streaming_) return {};
  std::string out = event("response.created", ojson{{"response", response("in_progress", "")}});
  return out + event("response.in_progress", ojson{{"response", response("in_progress", "")}});
}

std::string ResponsesReply::close_reasoning() {
  if (reasoning_.empty()) return {};
  ojson item{{"id", item_id("rs_")}, {"type", "reasoning"}, {"summary", ojson::array()},
             {"content", ojson::array({ojson{{"type", "reasoning_text"}, {"text", reasoning_}}})}};
  reasoning_.clear();
  const int64_t index = static_cast<int64_t>(items_.size());
  items_.push_back(item);
  if (!streaming_) return {};
  std::string out = event("response.output_item.added", ojson{{"output_index", index}, {"item", item}});
  return out + event("response.output_item.done", ojson{{"output_index", index}, {"item", item}});
}

std::string ResponsesReply::close_message() {
  if (!msg_open_) return {};
  msg_open_ = false;
  const ojson part{{"type", "output_text"}, {"text", msg_text_}, {"annotations", ojson::array()}};
  ojson item{{"id", msg_id_}, {"type", "message"}, {"status", "completed"}, {"role", "assistant"}, {"content", ojson::array({part})}};
  items_.push_back(item);
  if (!streaming_) return {};
  std::string out = event("response.output_text.done",
                          ojson{{"item_id", msg_id_}, {"output_index", msg_index_}, {"content_index", 0}, {"text", msg_text_}, {"logprobs", ojson::array()}});
  out += event("response.content_part.done", ojson{{"item_id", msg_id_}, {"output_index", msg_index_}, {"content_index", 0}, {"part", part}});
  return out + event("response.output_item.done", ojson{{"output_index", msg_index_}, {"item", item}});
}

std::string ResponsesReply::process(ParsedDelta&& d) {
  std::string out;
  reasoning_ += d.reasoning;
  if (!d.content.empty()) {
    out += close_reasoning();
    if (!msg_open_) {
      msg_open_ = true;
      msg_id_ = item_id("msg_");
      msg_text_.clear();
      msg_index_ = static_cast<int64_t>(items_.size());
      if (streaming_) {
        const ojson item{{"id", msg_id_}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"}, {"content", ojson::array()}};
        out += event("response.output_item.added", ojson{{"output_index", msg_index_}, {"item", item}});
        out += event("response.content_part.added", ojson{{"item_id", msg_id_},
                                                          {"output_index", msg_index_},
                                                          {"content_index", 0},
                                                          {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}});
      }
    }
    msg_text_ += d.content;
    if (streaming_)
      out += event("response.output_text.delta",
                   ojson{{"item_id", msg_id_}, {"output_index", msg_index_}, {"content_index", 0}, {"delta", d.content}, {"logprobs", ojson::array()}});
  }
  for (ToolCall& tc : d.tool_calls) {
    out += close_reasoning();
    out += close_message();
    const std::string fid = item_id("fc_");
    const int64_t index = static_cast<int64_t>(items_.size());
    ojson item{{"id", fid}, {"type", "function_call"}, {"status", "completed"}, {"arguments", tc.arguments}, {"call_id", tc.id}, {"name", tc.name}};
    items_.push_back(item);
    if (!streaming_) continue;
    ojson open = item;
    open["status"] = "in_progress";
    open["arguments"] = "";
    out += event("response.output_item.added", ojson{{"output_index", index}, {"item", open}});
    out += event("response.function_call_arguments.delta", ojson{{"item_id", fid}, {"output_index", index}, {"delta", tc.arguments}});
    out += event("response.function_call_arguments.done", ojson{{"item_id", fid}, {"output_index", index}, {"name", tc.name}, {"arguments", tc.arguments}});
    out += event("response.output_item.done", ojson{{"output_index", index}, {"item", item}});
  }
  return out;
}

std::string ResponsesReply::on_tokens(size_t, const std::vector<TokenEvent>& tokens) {
  std::string out = start();
  return out + process(b_.take(tokens));
}

void ResponsesReply::add_tokens(size_t, const std::vector<TokenEvent>& tokens) {
  start();
  process(b_.take(tokens));
}

std::string ResponsesReply::on_choice_finish(size_t, FinishReason reason, const std::string& error) {
  std::string out = start();
  if (reason == FinishReason::error) {
    ojson r = response("failed", "");
    r["error"] = ojson{{"code", "server_error"}, {"message", "generation failed: " + error}};
    return out + event("response.failed", ojson{{"response", std::move(r)}});
  }
  if (reason == FinishReason::shutdown || reason == FinishReason::cancelled) {
    // Interrupted, not finished: no response.completed / finish reason, an error event (as chat streams get).
    return out + event("error", ojson{{"code", "shutting_down"}, {"message", "the server is shutting down; the generation was interrupted"}, {"param", nullptr}});
  }
  out += process(b_.take_rest());
  out += close_reasoning();
  out += close_message();
  const bool cut = b_.finish_reason(reason) == "length";
  return out + event(cut ? "response.incomplete" : "response.completed", ojson{{"response", response(cut ? "incomplete" : "completed", cut ? "max_output_tokens" : "")}});
}

ojson ResponsesReply::body(const std::vector<FinishReason>& reasons) {
  start();
  process(b_.take_rest());
  close_reasoning();
  close_message();
  const bool cut = b_.finish_reason(reasons[0]) == "length";
  return response(cut ? "incomplete" : "completed", cut ? "max_output_tokens" : "");
}

}  // namespace hmoe::server
