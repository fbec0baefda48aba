#include "server/request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "configs/error.h"
#include "engine/text/json_guard.h"
#include "engine/text/chat/chat_template.h"
#include "engine/text/output_parser.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "server/api_error.h"
#include "server/json_body.h"
#include "server/structured.h"

namespace hmoe::server {

using ojson = nlohmann::ordered_json;

std::string error_body(int status, const std::string& message, const std::string& param, const std::string& code, const std::string& type) {
  nlohmann::ordered_json e;
  e["message"] = message;
  e["type"] = type.empty() ? ApiError::default_type(status) : type;
  e["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  e["code"] = code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code);
  return nlohmann::ordered_json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg, const std::string& code = "invalid_value") {
  throw ApiError(400, msg, param, code);
}

const char* type_name(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return "a boolean";
    case ojson::value_t::string: return "a string";
    case ojson::value_t::array: return "an array";
    case ojson::value_t::object: return "an object";
    default: return "a number";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const char* want, const ojson& v) {
  bad(param, "'" + param + "' must be " + want + ", got " + type_name(v), "invalid_type");
}

// Present and not null.
const ojson* field(const ojson& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

double get_number(const ojson& j, const char* key, double def, double lo, double hi, bool lo_open = false) {
  const ojson* v = field(j, key);
  if (!v) return def;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad(key, "'" + std::string(key) + "' must be in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                 v->dump());
  return x;
}

int64_t get_int(const ojson& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const ojson* v = field(j, key);
  if (!v) return def;
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d)) wrong_type(key, "an integer", *v);
    // double(INT64_MAX) rounds up to 2^63, which no int64_t holds: compare against 2^63 itself.
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi) || d >= 0x1p63)
      bad(key, "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
    return static_cast<int64_t>(d);
  }
  if (!v->is_number_integer()) wrong_type(key, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad(key, "'" + std::string(key) + "' is too large: " + v->dump());
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad(key, "'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
  return x;
}

bool get_bool(const ojson& j, const char* key, bool def) {
  const ojson* v = field(j, key);
  if (!v) return def;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

ojson parse_body(std::string_view body) {
  // Depth, NUL bytes and duplicate keys are checked on the raw bytes: no deep value is ever built.
  check_json_body(body);
  ojson j;
  try {
    j = ojson::parse(body.begin(), body.end());
  } catch (const ojson::exception& e) {
    // Syntax errors, invalid UTF-8, lone surrogates, numbers out of range (1e999).
    throw ApiError(400, std::string("request body is not valid JSON: ") + e.what(), json_error_path(body), "invalid_json");
  }
  if (!j.is_object()) throw ApiError(400, std::string("request body must be a JSON object, got ") + type_name(j), "", "invalid_json");
  return j;
}

void check_model(const ojson& j, const ModelInfo& m) {
  const ojson* v = field(j, "model");
  if (!v) return;  // optional, as in vLLM: the one served model
  if (!v->is_string()) wrong_type("model", "a string", *v);
  if (v->get<std::string>() != m.name)
    throw ApiError(404, "The model '" + v->get<std::string>() + "' does not exist; this server serves '" + m.name + "'", "model",
                   "model_not_found");
}

// Fields shared by both endpoints.
void parse_common(const ojson& j, const ModelInfo& m, uint64_t request_seq, GenSpec& g) {
  check_model(j, m);
  g.n = get_int(j, "n", 1, 1, kMaxChoices);
  if (get_int(j, "best_of", 1, 1, 1 << 20) != 1) bad("best_of", "only best_of=1 is supported");
  g.stream = get_bool(j, "stream", false);
  if (const ojson* so = field(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    g.include_usage = get_bool(*so, "include_usage", false);
  }
  SamplingParams& s = g.sampling;
  const SamplingParams& d = m.defaults;
  s.temperature = get_number(j, "temperature", d.temperature, 0.0, 2.0);
  s.top_p = get_number(j, "top_p", d.top_p, 0.0, 1.0, true);
  s.top_k = get_int(j, "top_k", d.top_k, -1, std::numeric_limits<int32_t>::max());
  s.min_p = get_number(j, "min_p", d.min_p, 0.0, 1.0);
  s.presence_penalty = get_number(j, "presence_penalty", d.presence_penalty, -2.0, 2.0);
  s.frequency_penalty = get_number(j, "frequency_penalty", d.frequency_penalty, -2.0, 2.0);
  s.repetition_penalty = get_number(j, "repetition_penalty", d.repetition_penalty, 0.0, 2.0, true);
  const int64_t seed = get_int(j, "seed", 0, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  s.seed = field(j, "seed") ? static_cast<uint64_t>(seed) : (m.default_seed * 0x9e3779b97f4a7c15ull) ^ (request_seq + 1) * 0xbf58476d1ce4e5b9ull;
  if (const ojson* lb = field(j, "logit_bias")) {
    if (!lb->is_object()) wrong_type("logit_bias", "an object of token id -> bias", *lb);
    if (lb->size() > 1024) bad("logit_bias", "'logit_bias' has more than 1024 entries");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      int64_t id = -1;
      const bool digits = !it.key().empty() && it.key().size() <= 10 &&
                          std::all_of(it.key().begin(), it.key().end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) try {
        size_t used = 0;
        id = std::stoll(it.key(), &used);
        if (used != it.key().size()) id = -1;
      } catch (...) {
        id = -1;
      }
      if (id < 0 || id >= m.vocab) bad("logit_bias", "'logit_bias' key '" + it.key() + "' is not a token id in [0, " + std::to_string(m.vocab) + ")");
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) || std::fabs(it.value().get<double>()) > 100)
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
    }
  }
  // stop strings
  if (const ojson* st = field(j, "stop")) {
    if (st->is_string()) {
      g.stop.push_back(st->get<std::string>());
    } else if (st->is_array()) {
      for (const auto& e : *st) {
        if (!e.is_string()) wrong_type("stop", "a string or an array of strings", *st);
        g.stop.push_back(e.get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *st);
    }
    if (g.stop.size() > 16) bad("stop", "at most 16 stop strings are supported");
    for (const auto& x : g.stop)
      if (x.empty() || x.size() > 1024) bad("stop", "stop strings must be 1..1024 bytes");
  }
  const bool ignore_eos = get_bool(j, "ignore_eos", false);
  if (!ignore_eos) g.stop_ids = m.eos_ids;
  if (const ojson* st = field(j, "stop_token_ids")) {
    if (!st->is_array()) wrong_type("stop_token_ids", "an array of token ids", *st);
    if (st->size() > 1024) bad("stop_token_ids", "'stop_token_ids' has more than 1024 entries");
    for (const auto& e : *st) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= m.vocab)
        bad("stop_token_ids", "'stop_token_ids' entries must be token ids in [0, " + std::to_string(m.vocab) + ")");
      g.stop_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
  }
  g.skip_special = get_bool(j, "skip_special_tokens", true);
  if (const ojson* rf = field(j, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    const ojson* t = field(*rf, "type");
    const std::string type = t && t->is_string() ? t->get<std::string>() : "";
    if (type == "json_object") {
      if (!m.json_vocab) bad("response_format", "JSON mode is not available on this server", "unsupported_value");
      g.sampling.json = m.json_vocab->get();
      g.sampling.json_end_ids = g.stop_ids;
    } else if (type == "json_schema") {
      const ojson* js = field(*rf, "json_schema");
      if (!js) bad("response_format", "response_format json_schema needs a 'json_schema' object", "missing_required_parameter");
      apply_json_schema(*js, m, g, "response_format");
    } else if (type != "text") {
      bad("response_format", "response_format type must be \"text\", \"json_object\" or \"json_schema\", got '" + type + "'", "unsupported_value");
    }
  }
}

void finish_lengths(const ojson& j, const ModelInfo& m, GenSpec& g) {
  const int64_t n = static_cast<int64_t>(g.prompt.size());
  if (n == 0) bad(g.chat ? "messages" : "prompt", "the prompt is empty");
  if (n >= m.context)
    bad(g.chat ? "messages" : "prompt", "This model's maximum context length is " + std::to_string(m.context) + " tokens. However, your prompt has " +
                                            std::to_string(n) + " tokens (no room for output).",
        "context_length_exceeded");
  const char* key = field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  g.max_tokens = get_int(j, key, m.context - n, 1, std::numeric_limits<int64_t>::max());
  if (g.max_tokens > m.context - n)
    bad(key, "This model's maximum context length is " + std::to_string(m.context) + " tokens. However, you requested " +
                 std::to_string(static_cast<uint64_t>(n) + static_cast<uint64_t>(g.max_tokens)) + " tokens (" + std::to_string(n) + " in the prompt, " + std::to_string(g.max_tokens) +
                 " for the completion).",
        "context_length_exceeded");
}

std::string content_text(const ojson& c, const std::string& param) {
  if (c.is_null()) return {};
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) wrong_type(param, "a string, null or an array of content parts", c);
  std::string out;
  for (const auto& part : c) {
    if (!part.is_object()) wrong_type(param, "an array of content parts", c);
    const ojson* t = field(part, "type");
    if (!t || !t->is_string()) bad(param, "content parts need a 'type'");
    if (t->get<std::string>() != "text") bad(param, "content part type '" + t->get<std::string>() + "' is not supported (text only)", "unsupported_value");
    const ojson* tx = field(part, "text");
    if (!tx || !tx->is_string()) bad(param, "a text content part needs a string 'text'");
    out += tx->get<std::string>();
  }
  return out;
}

}  // namespace

// messages (+ tools, chat_template_kwargs, add_generation_prompt) -> g's
// prompt text and ids through the model's chat template.
void render_chat(const ojson& j, const ModelInfo& m, GenSpec& g) {
  if (!m.chat_template) throw ApiError(400, "this model has no chat template; use /v1/completions", "", "no_chat_template");

  const ojson* msgs = field(j, "messages");
  if (!msgs) bad("messages", "'messages' is required", "missing_required_parameter");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) bad("messages", "'messages' must not be empty");
  ojson req = ojson::object();
  ojson out_msgs = ojson::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& msg = (*msgs)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) wrong_type(p, "an object", msg);
    const ojson* role = field(msg, "role");
    if (!role || !role->is_string()) bad(p + ".role", "'" + p + ".role' must be a string", "invalid_type");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad(p + ".role", "'" + p + ".role' must be one of system, developer, user, assistant, tool; got '" + r + "'");
    ojson o = msg;
    o["role"] = r;
    auto c = msg.find("content");
    o["content"] = content_text(c == msg.end() ? ojson(nullptr) : *c, p + ".content");
    if (const ojson* tc = field(msg, "tool_calls")) {
      if (r != "assistant") bad(p + ".tool_calls", "only assistant messages carry tool_calls");
      if (!tc->is_array()) wrong_type(p + ".tool_calls", "an array", *tc);
      for (size_t k = 0; k < tc->size(); ++k) {
        const ojson& call = (*tc)[k];
        const ojson* fn = call.is_object() ? field(call, "function") : nullptr;
        if (!fn || !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string())
          bad(p + ".tool_calls", "each tool call needs function.name");
        // The template parses a JSON arguments string: it must nest no deeper than a body may.
        const ojson* args = field(*fn, "arguments");
        if (args && args->is_string() && !json_depth_ok(args->get_ref<const std::string&>(), kMaxJsonDepth))
          bad(p + ".tool_calls[" + std::to_string(k) + "].function.arguments",
              "the arguments JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels", "json_too_deep");
      }
    } else if (r == "tool" && (!field(msg, "tool_call_id") || !msg["tool_call_id"].is_string())) {
      bad(p + ".tool_call_id", "'" + p + ".tool_call_id' (a string: the id of the call this message answers) is required for role tool",
          "missing_required_parameter");
    } else if ((r == "user" || r == "system") && (c == msg.end() || c->is_null())) {
      bad(p + ".content", "'" + p + ".content' is required for role " + r, "missing_required_parameter");
    }
    out_msgs.push_back(std::move(o));
  }
  req["messages"] = std::move(out_msgs);

  // tool_choice: "auto", "none", "required", or {"type": "function", "function": {"name": NAME}}.
  std::string tool_choice = "auto", forced_name;
  if (const ojson* tc = field(j, "tool_choice")) {
    if (tc->is_object()) {
      const ojson* fn = field(*tc, "function");
      const ojson* nm = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!nm || !nm->is_string() || nm->get<std::string>().empty())
        bad("tool_choice", "a tool_choice object must be {\"type\": \"function\", \"function\": {\"name\": NAME}}");
      tool_choice = "named";
      forced_name = nm->get<std::string>();
    } else if (tc->is_string()) {
      tool_choice = tc->get<std::string>();
      if (tool_choice != "auto" && tool_choice != "none" && tool_choice != "required")
        bad("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or a function object, got '" + tool_choice + "'", "unsupported_value");
    } else {
      wrong_type("tool_choice", "a string or an object", *tc);
    }
  }
  if (const ojson* tools = field(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) wrong_type(p, "an object", t);
      const ojson* fn = field(t, "function");
      if (!fn || !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string())
        bad(p + ".function.name", "'" + p + ".function.name' must be a string", "invalid_type");
    }
    if (!tools->empty()) {
      req["tools"] = *tools;
      g.parse_tools = tool_choice != "none";
    }
    if (tool_choice == "named") {
      bool found = false;
      for (const auto& t : *tools) found = found || t["function"]["name"].get<std::string>() == forced_name;
      if (!found) bad("tool_choice", "tool_choice names function '" + forced_name + "', which is not in 'tools'");
    }
  }
  if ((tool_choice == "required" || tool_choice == "named") && !g.parse_tools)
    bad("tool_choice", "tool_choice \"" + (tool_choice == "named" ? forced_name : tool_choice) + "\" needs a non-empty 'tools' list");
  if (const ojson* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    for (auto it = kw->begin(); it != kw->end(); ++it)
      if (chat::ChatTemplate::reserved_variable(it.key()))
        bad("chat_template_kwargs." + it.key(), "'chat_template_kwargs' may not set '" + it.key() + "': the server sets it from the request");
    req["chat_template_kwargs"] = *kw;
  }
  req["add_generation_prompt"] = get_bool(j, "add_generation_prompt", true);

  try {
    g.prompt_text = m.chat_template->render(req);
  } catch (const Error& e) {
    throw ApiError(400, std::string("chat template: ") + e.what(), "messages", "template_error");
  }
  g.parse_reasoning = true;
  g.start_in_reasoning = prompt_opens_think(g.prompt_text);
  const bool forced_call = tool_choice == "required" || tool_choice == "named";
  const bool structured = g.sampling.json != nullptr;
  if (structured) {  // JSON mode constrains the reply from its first token: no reasoning block
    if (forced_call) bad("response_format", "response_format " + std::string(g.sampling.grammar ? "json_schema" : "json_object") +
                                                " cannot be combined with tool_choice \"" + tool_choice + "\"");
    if (g.start_in_reasoning) {
      g.forced_prefix = "\n</think>\n\n";
      g.prompt_text += g.forced_prefix;
    }
  }
  if (forced_call) {
    // Forced tool call: the reply starts inside a Hermes <tool_call> block (after closing an open
    // think block), so the model only writes the call. Templates that do not describe
    // <tool_call> calls to the model cannot be forced this way.
    if (g.prompt_text.find("<tool_call>") == std::string::npos)
      bad("tool_choice", "tool_choice \"" + tool_choice + "\" needs a chat template that uses <tool_call> (Hermes) tool calls; this model's does not",
          "unsupported_value");
    if (g.start_in_reasoning) g.forced_prefix = "\n</think>\n\n";
    g.forced_prefix += "<tool_call>\n";
    g.prompt_text += g.forced_prefix;
  }
  // The call itself (forced) or one the model starts (auto) is constrained to an offered
  // tool's name and its parameters' schema (server/structured.h).
  if (g.parse_tools && !structured && (forced_call || g.prompt_text.find("<tool_call>") != std::string::npos))
    constrain_tool_calls(*field(j, "tools"), tool_choice, forced_name, m, g);
  g.prompt = m.tokenizer->encode(g.prompt_text, true);
}

GenSpec parse_chat_request(std::string_view body, const ModelInfo& m, uint64_t request_seq) {
  ojson j = parse_body(body);
  GenSpec g;
  g.chat = true;
  parse_common(j, m, request_seq, g);
  g.sampling.logprobs = get_bool(j, "logprobs", false);
  g.sampling.top_logprobs = static_cast<int>(get_int(j, "top_logprobs", 0, 0, 20));
  if (g.sampling.top_logprobs > 0 && !g.sampling.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  render_chat(j, m, g);
  finish_lengths(j, m, g);
  return g;
}

GenSpec parse_completion_request(std::string_view body, const ModelInfo& m, uint64_t request_seq) {
  ojson j = parse_body(body);
  GenSpec g;
  g.chat = false;
  parse_common(j, m, request_seq, g);
  const ojson* p = field(j, "prompt");
  if (!p) bad("prompt", "'prompt' is required", "missing_required_parameter");
  const ojson* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1) bad("prompt", "only one prompt per request is supported", "unsupported_value");
    one = &p->front();
  }
  if (one->is_string()) {
    g.prompt_text = one->get<std::string>();
    g.prompt = m.tokenizer->encode(g.prompt_text, true);
  } else if (one->is_array()) {
    for (const auto& e : *one) {
      if (!e.is_number_integer()) wrong_type("prompt", "a string or an array of token ids", *one);
      const int64_t id = e.get<int64_t>();
      if (id < 0 || id >= m.vocab) bad("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(m.vocab) + ")");
      g.prompt.push_back(static_cast<int32_t>(id));
    }
    try {
      g.prompt_text = m.tokenizer->decode(g.prompt);
    } catch (const Error& e) {
      bad("prompt", e.what());
    }
  } else {
    wrong_type("prompt", "a string or an array of token ids", *one);
  }
  g.echo = get_bool(j, "echo", false);
  if (const ojson* sfx = field(j, "suffix")) {
    if (!sfx->is_string()) wrong_type("suffix", "a string", *sfx);
    if (!sfx->get<std::string>().empty()) bad("suffix", "'suffix' is not supported", "unsupported_value");
  }
  const int64_t lp = get_int(j, "logprobs", 0, 0, 20);
  g.sampling.logprobs = field(j, "logprobs") != nullptr;
  g.sampling.top_logprobs = static_cast<int>(lp);
  finish_lengths(j, m, g);
  return g;
}

std::vector<int32_t> parse_tokenize_request(std::string_view body, const ModelInfo& m) {
  ojson j = parse_body(body);
  check_model(j, m);
  const ojson* p = field(j, "prompt");
  if (!p) p = field(j, "content");  // llama.cpp's name
  const ojson* msgs = field(j, "messages");
  if ((p != nullptr) == (msgs != nullptr)) bad("prompt", "send either 'prompt' (a string) or 'messages' (a chat)", "missing_required_parameter");
  GenSpec g;
  if (msgs) {
    render_chat(j, m, g);
    return g.prompt;
  }
  if (!p->is_string()) wrong_type("prompt", "a string", *p);
  return m.tokenizer->encode(p->get<std::string>(), true);
}

std::string parse_detokenize_request(std::string_view body, const ModelInfo& m) {
  ojson j = parse_body(body);
  check_model(j, m);
  const ojson* t = field(j, "tokens");
  if (!t) bad("tokens", "'tokens' is required", "missing_required_parameter");
  if (!t->is_array()) wrong_type("tokens", "an array of token ids", *t);
  std::vector<int32_t> ids;
  for (const auto& e : *t) {
    if (!e.is_number_integer()) wrong_type("tokens", "an array of token ids", *t);
    const int64_t id = e.get<int64_t>();
    if (id < 0 || id >= m.vocab) bad("tokens", "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(m.vocab) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  try {
    return m.tokenizer->decode(ids);
  } catch (const Error& e) {
    bad("tokens", e.what());
  }
}

}  // namespace hmoe::server
