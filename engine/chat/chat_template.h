// ChatTemplate: renders a Hugging Face chat template (Jinja2) into the exact
// prompt text transformers' apply_chat_template produces.
//
// Why our own interpreter: the server must not run Python, and the templates
// in the wild depend on Jinja2 details (trim_blocks/lstrip_blocks as
// transformers sets them, Python str()/json.dumps formatting, undefined
// semantics) that a "mostly Jinja" engine gets subtly wrong.
//
// Contract:
// - Construction parses the template once; a parse error throws hmoe::Error
//   (ErrorKind::bad_model) naming line:col and the construct.
// - render() is const and thread-safe: every call owns its own interpreter
//   state. Render errors (raise_exception, type errors, limits) throw
//   hmoe::Error(ErrorKind::invalid_argument); rendering never crashes and is
//   bounded (loop iterations, output and string size, recursion depth).
// - Key order matters (tojson of tools must keep the client's order): pass
//   the request as nlohmann::ordered_json when you have it. The
//   nlohmann::json overload works but its objects are already key-sorted.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace hmoe::chat {

class Template;  // parsed Jinja2 program (engine/chat/interpreter.h)

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;     // also the largest string a template may build
  size_t max_loop_iterations = 1u << 22;   // summed over all loops of one render
  size_t max_heap_items = 1u << 24;        // list/dict elements created by one render
  int max_call_depth = 128;                // macro recursion
  int max_value_depth = 512;               // nesting of request JSON and built values
};

class ChatTemplate {
 public:
  // Parses the template now; a parse error throws hmoe::Error(bad_model) with line:col.
  // An empty bos/eos token is passed to the template as undefined (as
  // transformers leaves out special tokens that are null).
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // From a HF model dir's tokenizer_config.json: chat_template as a string or
  // a list of {name, template} (uses "default"); bos_token/eos_token as
  // strings or {content: ...} objects. Throws hmoe::Error(bad_model/io).
  static std::unique_ptr<ChatTemplate> from_dir(const std::string& dir);

  // request: an OpenAI chat request body: messages, tools,
  // chat_template_kwargs (spread into the template's variables),
  // add_generation_prompt (default true). Normalizes like vLLM before
  // rendering: null message content becomes "", and an assistant tool call's
  // function.arguments given as a JSON string is parsed into an object.
  std::string render(const nlohmann::ordered_json& request) const;
  std::string render(const nlohmann::json& request) const;
  // Variables chat_template_kwargs may not set (render() refuses them):
  // those the renderer sets itself (messages, tools, documents,
  // add_generation_prompt, bos_token, eos_token) and the global functions.
  static bool reserved_variable(const std::string& name);

  // As render() but without the normalization: exactly what transformers'
  // apply_chat_template renders for these messages (tests compare with it).
  std::string render_verbatim(const nlohmann::ordered_json& request) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  void set_limits(const RenderLimits& limits) { limits_ = limits; }

 private:
  std::string render_impl(const nlohmann::ordered_json& request, bool normalize) const;

  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  RenderLimits limits_;
  std::unique_ptr<Template> program_;
};

}  // namespace hmoe::chat
