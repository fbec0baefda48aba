// hmoe serve: the OpenAI-compatible HTTP server (server/). Prints
// "hmoe serve: listening on http://HOST:PORT" on stderr once it accepts
// connections (--port 0 picks a free port), and exits 0 after SIGINT/SIGTERM.
#include <cstdio>

#include "configs/error.h"
#include "engine/loading/demo_model.h"
#include "server/server.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {

int run_serve(const Settings& s, std::vector<std::string>& args) {
  reject_unknown_flags(args, "serve");
  if (args.size() > 1) fail(ErrorKind::invalid_argument, "serve takes one MODEL, got " + std::to_string(args.size()) + " positional arguments");
  const std::string dir = args.empty() ? ensure_demo_model(s) : args[0];
  auto st = server::make_server(s, dir);
  const SchedulerConfig& sc = st->scheduler->config();
  std::fprintf(stderr, "hmoe serve: model '%s' (%s), context %lld, max %lld sequences, KV cache %lld blocks of %lld tokens\n", st->info.name.c_str(),
               dir.c_str(), static_cast<long long>(st->info.context), static_cast<long long>(sc.max_num_seqs),
               static_cast<long long>(sc.kv_blocks), static_cast<long long>(sc.block_size));
  std::fprintf(stderr, "hmoe serve: listening on http://%s:%u\n", s.host.find(':') != std::string::npos ? ("[" + s.host + "]").c_str() : s.host.c_str(),
               static_cast<unsigned>(st->http->port()));
  std::fflush(stderr);
  st->http->run(true);
  st.reset();
  std::fprintf(stderr, "hmoe serve: stopped\n");
  return 0;
}

}  // namespace
HMOE_COMMAND(serve_cmd, "serve", "serve [MODEL] [--host H] [--port P|0] [--api-key K] [--served-model-name N] ...",
             "OpenAI-compatible HTTP server with continuous batching (MODEL defaults to the built-in random demo model)", run_serve);
}  // namespace hmoe::cli
