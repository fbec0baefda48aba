// ChatTemplate: reads the template from a model directory, builds the
// variables transformers passes (messages, tools, documents,
// add_generation_prompt, special tokens, chat_template_kwargs) and renders.
#include "engine/text/chat/chat_template.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "engine/text/json_guard.h"

#include "configs/error.h"
#include "engine/text/chat/interpreter.h"

namespace hmoe::chat {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(ErrorKind::io, "cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// bos_token/eos_token: a string, an {"content": ...} object, or null.
std::string token_text(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail(ErrorKind::bad_model, std::string("tokenizer_config.json: '") + key + "' is neither a string nor {content: ...}");
}

// nlohmann's copy and conversion recurse, so a hostile request nested
// 100000 deep must be refused before it is copied; this walk is iterative.
template <class Json>
void check_depth(const Json& root, int limit) {
  std::vector<std::pair<const Json*, int>> stack{{&root, 0}};
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    if (d > limit)
      fail(ErrorKind::invalid_argument,
           "chat request nested deeper than " + std::to_string(limit) + " levels");
    if (j->is_array() || j->is_object())
      for (auto it = j->begin(); it != j->end(); ++it) stack.emplace_back(&*it, d + 1);
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)),
      program_(std::make_unique<Template>(source_)) {}

ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::from_dir(const std::string& dir) {
  std::string path = dir + "/tokenizer_config.json";
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::bad_model, path + ": " + e.what());
  }
  std::string source;
  auto it = cfg.find("chat_template");
  if (it != cfg.end() && it->is_string()) {
    source = it->get<std::string>();
  } else if (it != cfg.end() && it->is_array()) {
    for (auto& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        source = t["template"].get<std::string>();
    if (source.empty()) fail(ErrorKind::bad_model, path + ": chat_template list has no 'default' template");
  } else if (std::ifstream(dir + "/chat_template.jinja")) {
    source = read_file(dir + "/chat_template.jinja");  // newer transformers save it beside the config
  } else {
    fail(ErrorKind::bad_model, path + ": no chat_template (and no chat_template.jinja)");
  }
  try {
    return std::make_unique<ChatTemplate>(source, token_text(cfg, "bos_token"), token_text(cfg, "eos_token"));
  } catch (const Error& e) {
    throw Error(e.kind(), path + ": " + e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& request) const {
  return render_impl(request, true);
}

std::string ChatTemplate::render(const nlohmann::json& request) const {
  check_depth(request, limits_.max_value_depth);
  return render_impl(nlohmann::ordered_json(request), true);
}

bool ChatTemplate::reserved_variable(const std::string& name) {
  static const char* const kNames[] = {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
                                       "range", "namespace", "dict", "raise_exception", "strftime_now", "lipsum", "zip",
                                       "loop", "true", "false", "none", "True", "False", "None"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

std::string ChatTemplate::render_verbatim(const nlohmann::ordered_json& request) const {
  return render_impl(request, false);
}

std::string ChatTemplate::render_impl(const nlohmann::ordered_json& request, bool normalize) const {
  using ojson = nlohmann::ordered_json;
  if (!request.is_object()) fail(ErrorKind::invalid_argument, "chat request must be a JSON object");
  check_depth(request, limits_.max_value_depth);
  auto msgs = request.find("messages");
  if (msgs == request.end() || !msgs->is_array())
    fail(ErrorKind::invalid_argument, "chat request: 'messages' must be an array");
  ojson ctx = ojson::object();
  ojson messages = *msgs;
  if (normalize) {
    for (auto& m : messages) {
      if (!m.is_object()) continue;
      auto c = m.find("content");
      if (c != m.end() && c->is_null()) *c = "";
      auto calls = m.find("tool_calls");
      if (m.value("role", "") != "assistant" || calls == m.end() || !calls->is_array()) continue;
      for (auto& call : *calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
        auto& fn = call["function"];
        auto args = fn.find("arguments");
        if (args == fn.end() || !args->is_string()) continue;
        if (!json_depth_ok(args->get<std::string>(), limits_.max_value_depth / 2)) continue;  // stays a string: never build a deep value
        ojson parsed = ojson::parse(args->get<std::string>(), nullptr, false);
        if (!parsed.is_discarded()) *args = std::move(parsed);
      }
    }
  }
  ctx["messages"] = std::move(messages);
  auto tools = request.find("tools");
  ctx["tools"] = tools != request.end() ? *tools : ojson(nullptr);
  ctx["documents"] = nullptr;
  auto agp = request.find("add_generation_prompt");
  ctx["add_generation_prompt"] = agp != request.end() ? *agp : ojson(true);
  if (!bos_token_.empty()) ctx["bos_token"] = bos_token_;
  if (!eos_token_.empty()) ctx["eos_token"] = eos_token_;
  auto kwargs = request.find("chat_template_kwargs");
  if (kwargs != request.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) fail(ErrorKind::invalid_argument, "chat request: 'chat_template_kwargs' must be an object");
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      if (reserved_variable(it.key()))
        fail(ErrorKind::invalid_argument, "chat request: 'chat_template_kwargs' may not set '" + it.key() + "' (the renderer sets it)");
      ctx[it.key()] = it.value();
    }
  }
  try {
    return program_->render(ctx, limits_);
  } catch (const Error&) {
    throw;
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::invalid_argument, std::string("chat template: ") + e.what());
  }
}

}  // namespace hmoe::chat
