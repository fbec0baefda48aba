// hmoe tokenize / detokenize: the model's tokenizer on the command line, for
// checking ids against other implementations. MODEL is a Hugging Face
// directory (tokenizer.json) or a .gguf file with an embedded tokenizer.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "configs/error.h"
#include "engine/text/tokenizer/tokenizer.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {

std::unique_ptr<tok::Tokenizer> load(const std::string& model) {
  if (model.size() > 5 && model.compare(model.size() - 5, 5, ".gguf") == 0) return tok::Tokenizer::from_gguf(model);
  return tok::Tokenizer::from_dir(model);
}

std::string model_arg(std::vector<std::string>& args, const char* cmd) {
  if (args.empty()) fail(ErrorKind::invalid_argument, std::string("missing MODEL (usage: see hmoe ") + cmd + " --help)");
  if (args.size() > 1) fail(ErrorKind::invalid_argument, "unexpected argument '" + args[1] + "'");
  return args[0];
}

int run_tokenize(const Settings&, std::vector<std::string>& args) {
  std::string file;
  if (!take_option(args, "--file", file)) fail(ErrorKind::invalid_argument, "--file: required (the UTF-8 text to tokenize)");
  bool as_json = take_flag(args, "--json");
  bool no_special = take_flag(args, "--no-parse-special");
  reject_unknown_flags(args, "tokenize");
  std::string model = model_arg(args, "tokenize");
  std::ifstream f(file, std::ios::binary);
  if (!f) fail(ErrorKind::invalid_argument, "--file: cannot open '" + file + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  auto tok = load(model);
  auto ids = tok->encode(ss.str(), !no_special);
  std::string out = as_json ? "{\"ids\": [" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += as_json ? ", " : " ";
    out += std::to_string(ids[i]);
  }
  out += as_json ? "]}\n" : "\n";
  std::fputs(out.c_str(), stdout);
  return 0;
}

int run_detokenize(const Settings&, std::vector<std::string>& args) {
  std::string list;
  if (!take_option(args, "--ids", list)) fail(ErrorKind::invalid_argument, "--ids: required (comma-separated token ids)");
  bool skip = take_flag(args, "--skip-special");
  reject_unknown_flags(args, "detokenize");
  std::string model = model_arg(args, "detokenize");
  auto tok = load(model);
  std::vector<int32_t> ids;
  for (int64_t id : parse_id_list("--ids", list)) {
    if (id < 0 || id >= tok->vocab_size())
      fail(ErrorKind::invalid_argument, "--ids: token id " + std::to_string(id) + " is outside the vocabulary (size " + std::to_string(tok->vocab_size()) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  std::string text = tok->decode(ids, skip);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace
HMOE_COMMAND(tokenize_cmd, "tokenize", "tokenize MODEL --file F [--json] [--no-parse-special]",
             "print the token ids of the raw UTF-8 text in F (no BOS/EOS added)", run_tokenize);
HMOE_COMMAND(detokenize_cmd, "detokenize", "detokenize MODEL --ids 1,2,3 [--skip-special]",
             "print the text of the given token ids", run_detokenize);
}  // namespace hmoe::cli
