// Subcommands of the hmoe binary. Each tools/hmoe/cmd_*.cpp registers itself
// with a file-scope HMOE_COMMAND(...); main.cpp dispatches on the first word.
// A command receives the arguments after its name with the settings flags
// already consumed into `settings`, and returns the process exit code.
// Errors are thrown as hmoe::Error; main prints them and exits 1.
#pragma once
#include <string>
#include <vector>

#include "configs/settings.h"

namespace hmoe::cli {

using CommandFn = int (*)(const Settings& settings, std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* usage;    // "generate MODEL --ids 1,2 [--max-tokens N] ..."
  const char* summary;  // one line
  CommandFn run;
};

void register_command(const Command& c);
const std::vector<Command>& commands();

struct CommandRegistrar {
  explicit CommandRegistrar(const Command& c) { register_command(c); }
};
#define HMOE_COMMAND(var, ...) static ::hmoe::cli::CommandRegistrar var{::hmoe::cli::Command{__VA_ARGS__}}

// Small helpers for a command's own flags (not settings).
// take_flag: removes "--name" (and returns true) if present.
bool take_flag(std::vector<std::string>& args, const std::string& name);
// take_option: removes "--name VALUE" or "--name=VALUE"; returns false if absent.
bool take_option(std::vector<std::string>& args, const std::string& name, std::string& value);
// Errors on any remaining "--x" argument, naming it.
void reject_unknown_flags(const std::vector<std::string>& args, const char* command);
// Parses "1,2,3" into ids; errors name the flag and the bad element.
std::vector<int64_t> parse_id_list(const std::string& flag, const std::string& s);

}  // namespace hmoe::cli
