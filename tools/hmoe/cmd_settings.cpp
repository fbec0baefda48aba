// hmoe settings: print the settings table (markdown for configs/SETTINGS.md)
// or the values in force after environment and flags.
#include <cstdio>

#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {
int run_settings(const Settings& s, std::vector<std::string>& args) {
  bool md = take_flag(args, "--markdown");
  reject_unknown_flags(args, "settings");
  std::fputs(md ? settings_markdown().c_str() : s.describe().c_str(), stdout);
  return 0;
}
}  // namespace
HMOE_COMMAND(settings_cmd, "settings", "settings [--markdown] [SETTINGS]",
             "print the settings in force, or the whole table as markdown", run_settings);
}  // namespace hmoe::cli
