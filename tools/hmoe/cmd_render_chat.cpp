// hmoe render-chat: the exact prompt text a chat request becomes, rendered
// by the model's chat template (tokenizer_config.json) as the server would.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "configs/error.h"
#include "engine/text/chat/chat_template.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {
int run_render_chat(const Settings&, std::vector<std::string>& args) {
  std::string request_path;
  if (!take_option(args, "--request", request_path))
    fail(ErrorKind::invalid_argument, "render-chat: --request FILE is required");
  reject_unknown_flags(args, "render-chat");
  if (args.size() != 1) fail(ErrorKind::invalid_argument, "render-chat: expected exactly one MODEL directory");
  std::string body;
  if (request_path == "-") {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    body = ss.str();
  } else {
    std::ifstream f(request_path, std::ios::binary);
    if (!f) fail(ErrorKind::io, "render-chat: cannot open " + request_path);
    std::ostringstream ss;
    ss << f.rdbuf();
    body = ss.str();
  }
  nlohmann::ordered_json request = nlohmann::ordered_json::parse(body, nullptr, false);
  if (request.is_discarded()) fail(ErrorKind::invalid_argument, "render-chat: " + request_path + " is not valid JSON");
  auto tmpl = chat::ChatTemplate::from_dir(args[0]);
  std::string text = tmpl->render(request);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}
}  // namespace
HMOE_COMMAND(render_chat_cmd, "render-chat", "render-chat MODEL --request FILE|-",
             "print the prompt text the model's chat template makes of an OpenAI chat request",
             run_render_chat);
}  // namespace hmoe::cli
